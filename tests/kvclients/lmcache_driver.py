#!/usr/bin/env python3
"""Drive the REAL LMCache engine (0.5.x, CPU-only) against an ``fs://`` directory.

Why: curvine-py must prove that an unmodified LMCache, writing through its own
``FSConnector`` onto a (curvine FUSE) directory, gets back exactly the bytes it
stored.  vLLM and a GPU are not needed for that: LMCache only talks to the
serving engine through a ``GPUConnectorInterface``, so ``CPUKVConnector`` below
plays vLLM's role with a plain CPU tensor.  Everything else (token hashing,
chunking, memory objects, the local-CPU buffer, ``RemoteBackend``, the asyncio
put/get tasks and the on-disk format) is LMCache's own code.

Usage (from the LMCache venv, which must NOT need curvine_py)::

    python lmcache_driver.py put --dir DIR --tokens N --seed S [--model-shape qwen2.5-7b]
    python lmcache_driver.py get --dir DIR --tokens N --seed S [--check-files]

Both print one JSON line on stdout.  ``get`` exits 0 when every byte matches,
1 on any data problem (miss, partial retrieve, wrong bytes, bad file) and 2 on
any other failure; ``put`` exits 0 or 2.  LMCache's own logs go to stderr
(level WARNING unless LMCACHE_LOG_LEVEL is set); on failure the last stderr
line is ``lmcache_driver: FAIL: <reason>``.

On-disk format (lmcache/v1/protocol.py ``RemoteMetadata`` +
``FSConnector.put``): one ``<key>.data`` file per chunk = 28-byte header of 7
native int32 ``(payload_len, MemoryFormat.KV_2LTD=1, dtype code bf16=3, 2,
layers, tokens_in_chunk, kv_heads*head_dim)`` followed by the memory object's
raw bytes, a contiguous ``[2, layers, tokens_in_chunk, heads*dim]`` bf16 tensor.
Our KV tensor is laid out ``[layers, 2, tokens, heads*dim]`` (vLLM-like, one
K/V pair per layer), so chunk ``[s, e)`` on disk is
``kv[:, :, s:e, :].transpose(0, 1).contiguous()``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CHUNK = 256
HEADER = 28  # 7 x int32, RemoteMetadata with one KV group
FMT_KV_2LTD, DTYPE_BF16 = 1, 3  # MemoryFormat.KV_2LTD.value, protocol.DTYPE_TO_INT[bf16]
INSTANCE = "curvine-lmcache-driver"


@dataclass(frozen=True)
class ModelShape:
    model_name: str
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def hidden(self) -> int:
        return self.kv_heads * self.head_dim

    def chunk_bytes(self, ntok: int) -> int:
        """Payload bytes of one memory object: K+V, all layers, bf16."""
        return 2 * self.layers * ntok * self.hidden * 2


SHAPES = {"qwen2.5-7b": ModelShape("Qwen/Qwen2.5-7B-Instruct", 28, 4, 128, 152064)}


class DriverError(Exception):
    """Environment/engine failure (exit 2), as opposed to a data mismatch (exit 1)."""


def _ensure_env() -> None:
    """Re-exec with a stable environment before torch/LMCache are imported.

    LMCache's default chunk hash is Python's builtin ``hash`` and it warns
    loudly unless PYTHONHASHSEED is fixed (ints would hash stably anyway, but
    any str in a key would not, and put/get must agree).  Its INFO logs are
    also very chatty, so default them to WARNING.
    """
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        env.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


# --------------------------------------------------------------------------
# Deterministic test data
# --------------------------------------------------------------------------


def make_tokens(seed: int, n: int, shape: ModelShape) -> list[int]:
    """Prompt token ids: a pure function of (seed, n) so put and get agree."""
    rng = random.Random(seed)
    return [rng.randrange(shape.vocab) for _ in range(n)]


def _mix32(x: "torch.Tensor") -> "torch.Tensor":
    """32-bit integer hash (lowbias32-style) on int64 tensors without overflow.

    Multipliers are < 2**31, so the int64 products never overflow (no UB, same
    result on every machine).
    """
    m = 0xFFFFFFFF
    x = (x ^ (x >> 16)) & m
    x = (x * 0x7FEB352D) & m
    x = (x ^ (x >> 15)) & m
    x = (x * 0x2C1B3C6D) & m
    return (x ^ (x >> 16)) & m


def expected_chunk(seed: int, shape: ModelShape, start: int, end: int) -> "torch.Tensor":
    """KV of tokens [start, end) in memory-object layout [2, layers, T, hidden], bf16.

    Each element is a function of (seed, token position, k/v, layer, channel)
    only, and is a finite, never-zero bf16 (exponent forced into 100..131,
    i.e. |v| in [2**-27, 2**5)), so a zero-filled or shifted 1 MiB run can't
    match by accident (random equal elements: ~1/8192).  A full hash per
    element is slow (~0.5 s/chunk), so hash each (pos, k/v, layer) row and
    each channel once and mix them with cheap int32 ops (~0.06 s/chunk).
    """
    import torch

    m = 0xFFFFFFFF
    k = torch.arange(2, dtype=torch.int64).view(2, 1, 1, 1)
    layer = torch.arange(shape.layers, dtype=torch.int64).view(1, -1, 1, 1)
    pos = torch.arange(start, end, dtype=torch.int64).view(1, 1, -1, 1)
    salt = _mix32(torch.tensor(seed & m))
    row = _mix32(((pos * 2 + k) * shape.layers + layer + salt) & m)
    col = _mix32(torch.arange(shape.hidden, dtype=torch.int64) * 0x3C6EF372 & m)
    row = (row & 0x7FFFFFFF).to(torch.int32)
    col = (col & 0x7FFFFFFF).to(torch.int32).view(1, 1, 1, -1)
    h = ((row ^ col) & 0xFFFF) * 0x6D2B  # < 2**31: no int32 overflow
    h = h ^ (h >> 15)
    bits = (h & 0x807F) | ((100 + ((h >> 7) & 31)) << 7)  # sign|exp 100..131|mantissa
    return ((bits ^ 0x8000) - 0x8000).to(torch.int16).view(torch.bfloat16)


def build_kv(seed: int, shape: ModelShape, n: int) -> "torch.Tensor":
    """The serving engine's KV cache for the whole prompt: [layers, 2, n, hidden]."""
    import torch

    kv = torch.empty(shape.layers, 2, n, shape.hidden, dtype=torch.bfloat16)
    for s in range(0, n, CHUNK):
        e = min(s + CHUNK, n)
        kv[:, :, s:e, :] = expected_chunk(seed, shape, s, e).transpose(0, 1)
    return kv


def expected_header(shape: ModelShape, ntok: int) -> bytes:
    return struct.pack("=7i", shape.chunk_bytes(ntok), FMT_KV_2LTD, DTYPE_BF16,
                       2, shape.layers, ntok, shape.hidden)


# --------------------------------------------------------------------------
# LMCache glue
# --------------------------------------------------------------------------


def _cpu_connector_class() -> type:
    """Build CPUKVConnector lazily (its base class lives in LMCache)."""
    from lmcache.v1.gpu_connector import GPUConnectorInterface
    from lmcache.v1.memory_management import MemoryFormat

    class CPUKVConnector(GPUConnectorInterface):
        """Stand-in for vLLM's paged-memory connector, on a CPU tensor.

        Like VLLMPagedMemGPUConnectorV2 it gets the engine's KV via
        ``kwargs["kvcaches"]`` and copies token range [start, end) between it
        and a KV_2LTD memory object ([2, layers, T, hidden]); our tensor is
        [layers, 2, tokens, hidden], hence the transpose.
        """

        def __init__(self, shape: ModelShape) -> None:
            self.shape = shape
            self.kvcaches = None

        def _view(self, memory_obj: Any, start: int, end: int, **kwargs: Any):
            self.initialize_kvcaches_ptr(**kwargs)
            assert self.kvcaches is not None, "pass kvcaches=<tensor>"
            fmt = memory_obj.metadata.fmt
            if fmt != MemoryFormat.KV_2LTD:
                raise ValueError(f"expected KV_2LTD memory object, got {fmt}")
            dst = memory_obj.tensor
            assert dst is not None and tuple(dst.shape) == (
                2, self.shape.layers, end - start, self.shape.hidden), dst.shape
            return dst, self.kvcaches[:, :, start:end, :].transpose(0, 1)

        def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            mo, kv = self._view(memory_obj, start, end, **kwargs)
            mo.copy_(kv)

        def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
            mo, kv = self._view(memory_obj, start, end, **kwargs)
            kv.copy_(mo)

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs) -> None:
            for m, s, e in zip(memory_objs, starts, ends, strict=True):
                self.from_gpu(m, s, e, **kwargs)

        def batched_to_gpu(self, memory_objs=None, starts=None, ends=None, **kwargs) -> None:
            for m, s, e in zip(memory_objs, starts, ends, strict=True):
                self.to_gpu(m, s, e, **kwargs)

        def get_shape(self, num_tokens: int):
            import torch

            return torch.Size([2, self.shape.layers, num_tokens, self.shape.hidden])

    return CPUKVConnector


@dataclass
class Engine:
    engine: Any
    remote: Any  # lmcache RemoteBackend
    fs: Any  # the FSConnector inside it


def build_engine(directory: Path, shape: ModelShape, cpu_gb: float, curvine: dict[str, Any] | None = None) -> Engine:
    """LMCacheEngine with local CPU + fs:// remote; fail loudly if the remote is missing.
    curvine: the pool's own remote storage plugin instead (curvine_py.kv.lmcache_connector,
    these its extra_config keys), writing the same files (directory: where they show).

    ``fs:///abs/path`` looks valid (LMCache's own docstring shows it) but
    ``parse_remote_url`` asserts a host and a port; RemoteBackend catches that,
    logs a warning and keeps ``connection=None``, so every put/get is silently
    a no-op.  Hence ``fs://localhost:0/<abs dir>`` and the checks below.
    """
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector.fs_connector import FSConnector
    from lmcache.v1.storage_backend.remote_backend import RemoteBackend

    remote: dict[str, Any] = {"remote_url": f"fs://localhost:0{directory.resolve()}"}
    if curvine is not None:
        prefix = "remote_storage_plugin.curvine."
        remote = {"remote_storage_plugins": ["curvine"], "extra_config": {
            prefix + "module_path": "curvine_py.kv.lmcache_connector", prefix + "class_name": "CurvineConnector",
            **{prefix + k: v for k, v in curvine.items()}}}
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        local_cpu=True,
        max_local_cpu_size=cpu_gb,
        remote_serde="naive",
        save_unfull_chunk=True,
        lmcache_instance_id=INSTANCE,
        **remote,
    )
    config.validate()
    metadata = LMCacheMetadata(
        model_name=shape.model_name, world_size=1, local_world_size=1, worker_id=0,
        local_worker_id=0, kv_dtype=torch.bfloat16,
        kv_shape=(shape.layers, 2, CHUNK, shape.kv_heads, shape.head_dim),
        role="worker", chunk_size=CHUNK,
    )

    def no_broadcast(*_a: Any) -> Any:
        raise DriverError("broadcast called in a single-worker driver")

    engine = LMCacheEngineBuilder.get_or_create(
        INSTANCE, config, metadata, _cpu_connector_class()(shape), no_broadcast, no_broadcast)
    engine.post_init()
    sm = engine.storage_manager
    backends = dict(sm.storage_backends) if sm is not None else {}
    remotes = [b for b in backends.values() if isinstance(b, RemoteBackend)]
    if not remotes:
        raise DriverError(f"LMCache built no RemoteBackend (backends: {list(backends)})")
    conn = remotes[0].connection
    fs = getattr(conn, "_connector", conn)  # CreateConnector wraps it in InstrumentedRemoteConnector
    if curvine is not None:
        if type(fs).__name__ != "CurvineConnector":
            raise DriverError(f"RemoteBackend has no CurvineConnector (connection={conn!r})")
        return Engine(engine, remotes[0], fs)
    if not isinstance(fs, FSConnector):
        raise DriverError(f"RemoteBackend has no FSConnector (connection={conn!r}); "
                          "remote_url rejected?")
    if [p.resolve() for p in fs.base_paths] != [directory.resolve()]:
        raise DriverError(f"FSConnector writes to {fs.base_paths}, not {directory}")
    return Engine(engine, remotes[0], fs)


def chunk_files(eng: Engine, tokens: list[int], directory: Path) -> list[tuple[int, int, Path]]:
    """(start, end, file in directory) per chunk, named by LMCache's own key + its connector's naming."""
    return [(s, e, directory / Path(eng.fs._get_file_path(key)).name)
            for s, e, key in eng.engine.token_database.process_tokens(tokens)]


def wait_for_puts(eng: Engine, files: list[Path], timeout: float) -> None:
    """store() returns while FSConnector.put coroutines still run on LMCache's loop.

    RemoteBackend adds each key to ``put_tasks`` synchronously inside store()
    and discards it in the future's done-callback (after the tmp->final
    rename), so "put_tasks empty and every .data present" means done, and
    "put_tasks empty but files missing" means LMCache never submitted them:
    store() silently drops the chunks that don't fit max_local_cpu_size.
    """
    deadline = time.monotonic() + timeout
    idle_since: float | None = None
    while True:
        with eng.remote.lock:
            pending = len(eng.remote.put_tasks)
        missing = [f.name for f in files if not f.exists()]
        if eng.remote.put_failed_count:  # a property in 0.5.x
            raise DriverError(f"{eng.remote.put_failed_count} LMCache put task(s) failed")
        if pending == 0 and not missing:
            return
        now = time.monotonic()
        idle_since = (idle_since or now) if pending == 0 else None
        if idle_since is not None and now - idle_since > 1.0:
            raise DriverError(
                f"LMCache wrote only {len(files) - len(missing)} of {len(files)} chunks "
                f"and has no put task left (local CPU buffer too small? --cpu-gb)")
        if now > deadline:
            raise DriverError(f"timeout after {timeout}s: {pending} put tasks pending, "
                              f"{len(missing)} files missing")
        time.sleep(0.01)


# --------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------


def diff_ranges(got: bytes | "torch.Tensor", want: "torch.Tensor", gap: int = 64,
                limit: int = 32) -> list[dict[str, Any]]:
    """Differing byte ranges as file offsets [start, end) (header included).

    ``got``/``want`` are memory-object payloads; ranges closer than ``gap``
    bytes are merged so one lost 1 MiB run reports as one range even where a
    random element happens to match.  ``zeros`` says whether the range is all
    zero bytes in ``got`` (the typical signature of a lost write / hole).
    """
    import torch

    w = want.contiguous().view(torch.uint8).flatten()
    g = (torch.frombuffer(bytearray(got), dtype=torch.uint8) if isinstance(got, (bytes, bytearray))
         else got.contiguous().view(torch.uint8).flatten())
    n = min(len(g), len(w))
    idx = torch.nonzero(g[:n] != w[:n]).flatten()
    runs: list[list[int]] = []
    if len(idx):
        cuts = torch.nonzero(idx[1:] - idx[:-1] > gap).flatten().tolist()
        starts = [0] + [c + 1 for c in cuts]
        ends = cuts + [len(idx) - 1]
        runs = [[int(idx[a]), int(idx[b]) + 1] for a, b in zip(starts, ends)]
    out: list[dict[str, Any]] = [
        {"start": HEADER + a, "end": HEADER + b, "len": b - a, "zeros": not bool(g[a:b].any())}
        for a, b in runs[:limit]]
    if len(runs) > limit:
        out.append({"more_ranges": len(runs) - limit})
    if len(g) != len(w):  # short (or long) file: the tail is absent, not zero
        out.append({"start": HEADER + n, "end": HEADER + max(len(g), len(w)),
                    "len": abs(len(g) - len(w)), "missing": len(g) < len(w)})
    return out


def check_files(seed: int, shape: ModelShape, chunks: list[tuple[int, int, Path]]) -> list[dict]:
    """Compare every .data file to what put must have written, without LMCache.

    Read pattern: 4 KiB, then the rest in one read().  (FSConnector.get itself
    reads the 28-byte header, then readinto() the whole payload; the retrieve
    path exercises that, this one a second small-then-big pattern.)
    """
    bad = []
    for i, (s, e, path) in enumerate(chunks):
        want_hdr, want = expected_header(shape, e - s), expected_chunk(seed, shape, s, e)
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
                data += f.read()
        except OSError as exc:
            bad.append({"chunk": i, "file": path.name, "error": str(exc)})
            continue
        problems: dict[str, Any] = {}
        if len(data) != HEADER + shape.chunk_bytes(e - s):
            problems["size"] = [len(data), HEADER + shape.chunk_bytes(e - s)]
        if data[:HEADER] != want_hdr:
            problems["header"] = list(struct.unpack("=7i", data[:HEADER].ljust(HEADER, b"\0")))
        ranges = diff_ranges(data[HEADER:], want)
        if ranges:
            problems["ranges"] = ranges
        if problems:
            bad.append({"chunk": i, "file": path.name, **problems})
    return bad


# --------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------


def lmcache_version() -> str:
    from importlib.metadata import version

    return version("lmcache")


def do_put(args: argparse.Namespace, shape: ModelShape) -> tuple[int, dict]:
    tokens = make_tokens(args.seed, args.tokens, shape)
    kv = build_kv(args.seed, shape, args.tokens)
    args.dir.mkdir(parents=True, exist_ok=True)
    eng = build_engine(args.dir, shape, args.cpu_gb, args.curvine)
    chunks = chunk_files(eng, tokens, args.dir)
    spawner = Spawner() if args.spawn_children else None
    t0 = time.perf_counter()
    try:
        eng.engine.store(tokens, kvcaches=kv)
        t_store = time.perf_counter() - t0
        wait_for_puts(eng, [p for _, _, p in chunks], args.timeout)
        t_total = time.perf_counter() - t0
    finally:
        children = spawner.stop() if spawner is not None else 0
    files = [{"name": p.name, "size": p.stat().st_size} for _, _, p in chunks]
    wrong = [f for f, (s, e, _) in zip(files, chunks)
             if f["size"] != HEADER + shape.chunk_bytes(e - s)]
    if wrong:
        raise DriverError(f"unexpected file sizes: {wrong}")
    return 0, {"mode": "put", "tokens": args.tokens, "chunks": len(files), "files": files,
               "bytes": sum(f["size"] for f in files), "store_call_s": round(t_store, 3),
               "store_s": round(t_total, 3), "children": children, "lmcache": lmcache_version()}


class Spawner:
    """--spawn-children: another thread of the inference process starting children while
    LMCache writes (vLLM starts workers, LMCache's own telemetry runs py-cpuinfo in a
    subprocess).  Each child inherits the open chunk files and closes them at its exec,
    so the filesystem sees a close (FUSE: a FLUSH) of every file being written."""

    def __init__(self) -> None:
        import subprocess
        import threading

        self._run = subprocess.run
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="spawner")
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run(["/bin/true"], check=False)
            self.count += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.count


def do_get(args: argparse.Namespace, shape: ModelShape) -> tuple[int, dict]:
    import torch

    tokens = make_tokens(args.seed, args.tokens, shape)
    eng = build_engine(args.dir, shape, args.cpu_gb, args.curvine)
    chunks = chunk_files(eng, tokens, args.dir)
    out: dict[str, Any] = {"mode": "get", "tokens": args.tokens, "chunks": len(chunks)}
    if args.check_files:
        t0 = time.perf_counter()
        out["file_bad_chunks"] = check_files(args.seed, shape, chunks)
        out["check_files_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    out["hit_tokens"] = eng.engine.lookup(tokens)
    out["lookup_s"] = round(time.perf_counter() - t0, 3)
    kv = torch.zeros(shape.layers, 2, args.tokens, shape.hidden, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    mask = eng.engine.retrieve(tokens, kvcaches=kv)
    out["retrieve_s"] = round(time.perf_counter() - t0, 3)
    out["retrieved_tokens"] = int(mask.sum())
    bad = []
    for i, (s, e, path) in enumerate(chunks):
        entry = {"chunk": i, "file": path.name, "tokens": [s, e]}
        if not bool(mask[s:e].all()):  # never copied in: the zeros would say nothing
            bad.append({**entry, "retrieved": False})
            continue
        got = kv[:, :, s:e, :].transpose(0, 1)
        ranges = diff_ranges(got, expected_chunk(args.seed, shape, s, e))
        if ranges:
            bad.append({**entry, "retrieved": True, "ranges": ranges})
    out["bad_chunks"] = len(bad)
    out["bad"] = bad
    out["lmcache"] = lmcache_version()
    ok = (out["hit_tokens"] == args.tokens and out["retrieved_tokens"] == args.tokens
          and not bad and not out.get("file_bad_chunks"))
    return (0 if ok else 1), out


def _start_watchdog(timeout: float, mode: str) -> None:
    """Hard deadline for the whole run: LMCache retries some failures forever
    (e.g. allocate() busy-waits when its CPU buffer is full), and a hung
    filesystem would hang us too; exit 2 instead of hanging the test."""
    import threading

    def fire() -> None:
        print(f"lmcache_driver: FAIL: {mode} did not finish within {timeout}s",
              file=sys.stderr, flush=True)
        os._exit(2)

    t = threading.Timer(timeout, fire)
    t.daemon = True
    t.start()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["put", "get"])
    p.add_argument("--dir", type=Path, required=True, help="fs:// directory (absolute or relative)")
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--model-shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    p.add_argument("--cpu-gb", type=float, default=0.5, help="LMCache max_local_cpu_size")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="put: wait this long for LMCache's writes; whole run: +30 s hard limit")
    p.add_argument("--spawn-children", action="store_true",
                   help="put: another thread starts child processes all through the store")
    p.add_argument("--curvine", type=json.loads, default=None, metavar="JSON",
                   help="the pool's remote storage plugin (its extra_config keys: base_path, config, host) "
                        "instead of fs://; --dir is a mount of base_path, where the files show")
    p.add_argument("--check-files", action="store_true",
                   help="get: also read every .data file directly and compare")
    args = p.parse_args()
    if args.tokens <= 0:
        p.error("--tokens must be > 0")
    _ensure_env()
    shape = SHAPES[args.model_shape]
    _start_watchdog(args.timeout + 30, args.mode)  # after wait_for_puts' own, clearer timeout
    code, exit_reason = 2, ""
    try:
        need = sum(shape.chunk_bytes(min(CHUNK, args.tokens - s))
                   for s in range(0, args.tokens, CHUNK))
        if need > args.cpu_gb * 2**30:
            # put would silently store a prefix, get would spin forever in allocate().
            raise DriverError(f"{args.tokens} tokens need {need / 2**30:.3f} GiB of LMCache "
                              f"local CPU buffer; raise --cpu-gb (now {args.cpu_gb})")
        code, out = (do_put if args.mode == "put" else do_get)(args, shape)
        print(json.dumps(out), flush=True)
        if code:
            exit_reason = (f"data mismatch: hit={out['hit_tokens']} retrieved="
                           f"{out['retrieved_tokens']} bad_chunks={out['bad_chunks']} "
                           f"bad_files={len(out.get('file_bad_chunks', []))}")
    except Exception as exc:  # noqa: BLE001 - one-line reason, exit 2
        code, exit_reason = 2, f"{type(exc).__name__}: {exc}".replace("\n", " ")
    finally:
        builder_mod = sys.modules.get("lmcache.v1.cache_engine")
        if builder_mod is not None:
            try:
                builder_mod.LMCacheEngineBuilder.destroy(INSTANCE)
            except Exception:  # noqa: BLE001 - teardown must not mask the result
                pass
        if exit_reason:
            print(f"lmcache_driver: FAIL: {exit_reason}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        # Without destroy() LMCache's non-daemon "storage-manager-event-loop"
        # thread keeps the process alive forever; destroy() stops it, but a
        # failed destroy or leftover asyncio executor threads must not hang us.
        os._exit(code)


if __name__ == "__main__":
    main()
