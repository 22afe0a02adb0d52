"""The workloads of `cv bench`, on any directory: ours, a local disk, another filesystem.

- kvcache: LMCache's ``fs://`` pattern (BRIEF.md): each chunk written as ``<name>.tmp``
  (28-byte header, then the payload in one write), closed, renamed to ``<name>.data``; read
  back (by a fresh process, possibly through another mount) as one stat, then open, read
  4 KiB, read the rest in one call, close.
- seq: one big file written and read in 4 MiB requests; before its sequential read, the
  reader makes ``random_reads`` 128 KiB ``pread`` calls at random aligned offsets of it
  (fio's random read; Parquet footers, safetensors headers), the same offsets on every
  filesystem of a run.
- meta: create, stat, rename, unlink of many empty files, each phase timed alone.

Every byte read is verified, never a sample: the content of a file is a seeded random
buffer rotated by a per-file offset behind a header naming the file, so a block served
from the wrong file or the wrong offset changes the digest.  Verification is an xxh3 of
the bytes read (~18 GB/s here; ``memoryview ==`` runs at 0.8 GB/s) against a digest
computed before the clock starts, and its time is excluded from the figures, as the
payload generation is (one precomputed buffer, copied into a reused one per file).
"""
from __future__ import annotations

import functools
import io
import json
import math
import os
import queue
import random
import struct
import threading
import time
import typing
from dataclasses import asdict, dataclass
from pathlib import Path

import xxhash

from curvine_py.common.mounttable import mount_of, read_mounts

MiB = 1 << 20
CURVINE_FSTYPE = "fuse.curvine"                  # fuse/main.py mounts with subtype=curvine
DROP_CACHES_XATTR = "user.curvine.drop_caches"   # fuse/ops.py answers it on a mount's root
HEADER_SIZE = 28                 # LMCache's fs:// header
FIRST_READ = 4096                # LMCache reads 4 KiB, then the rest
SEQ_REQUEST = 4 * MiB
RANDOM_IO = 128 << 10            # seq: the random reads' size (and alignment)
PROMPT_FILES = 8                 # BRIEF.md's 1,925-token prompt (0.103 GB): 256-token chunks
MANIFEST = "cv-bench.json"
KV_DIR = "kvcache"
SEQ_FILE = "seq.bin"
META_DIR = "meta"
WORKLOADS = ("kvcache", "seq", "meta")
_HEADER = struct.Struct("<4sIQQI")  # magic, file index, file size, seed, zero pad
assert _HEADER.size == HEADER_SIZE


class WrongData(Exception):
    """A read returned bytes other than those written (the message names file and offset)."""


@dataclass
class Plan:
    """What was written, so that a fresh process can read and verify it (the manifest)."""
    workloads: list[str]
    files: int = 32
    file_size: int = 14 * MiB
    seq_size: int = 1024 * MiB
    meta_files: int = 5000
    seed: int = 0
    writers: int = 1          # kvcache: threads writing chunks at once (LMCache's put pool)
    readers: int = 1          # kvcache: threads reading chunks at once (its retrieve)
    random_reads: int = 300   # seq: RANDOM_IO preads of the file before its sequential read
    timeout_s: float = 600.0  # kvcache with writers/readers > 1: a phase past this is a hang

    def save(self, directory: Path) -> None:
        (directory / MANIFEST).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, directory: Path) -> "Plan":
        try:
            data = json.loads((directory / MANIFEST).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(2, f"no {MANIFEST} (run the write phase first)",
                                    str(directory)) from None
        return cls(**data)


# ---------------------------------------------------------------- content


class Pattern:
    """The content of every file of one run, derived from the seed; never regenerated per file."""

    def __init__(self, seed: int, length: int) -> None:
        self.seed = seed
        self.base = random.Random(seed).randbytes(max(length, 1))
        self.view = memoryview(self.base)

    def offset(self, index: int) -> int:
        """Per-file rotation: files differ everywhere, not only in their header."""
        return (index * 1_000_003 + 7) % len(self.base)

    def fill(self, buf: memoryview, index: int) -> None:
        """buf[:] = base rotated by offset(index) (two memcpy into a reused buffer)."""
        r, n = self.offset(index), len(self.base)
        buf[:n - r] = self.view[r:]
        buf[n - r:n] = self.view[:r]

    def digest(self, prefix: bytes, index: int, length: int) -> int:
        """xxh3 of prefix + the first `length` bytes of the rotated base."""
        h = xxhash.xxh3_64(prefix)
        r = self.offset(index)
        first = self.view[r:r + length]
        h.update(first)
        if len(first) < length:
            h.update(self.view[:length - len(first)])
        return h.intdigest()

    def expected(self, prefix: bytes, index: int, length: int) -> bytes:
        """The whole expected content (only built to locate a mismatch)."""
        buf = bytearray(len(self.base))
        self.fill(memoryview(buf), index)
        return prefix + bytes(buf[:length])


def kv_header(index: int, size: int, seed: int) -> bytes:
    return _HEADER.pack(b"CVKV", index, size, seed & (2**64 - 1), 0)


def kv_name(index: int) -> str:
    """An LMCache-shaped chunk name: <model>@<world>@<rank>@<hash>@<dtype>."""
    return f"bench-model@1@0@{index:016x}@bfloat16"


def first_difference(got: memoryview, want: bytes) -> int:
    """Offset of the first differing byte (a binary search over slices that compare fast)."""
    lo, hi = 0, min(len(got), len(want))
    if bytes(got[:hi]) == want[:hi]:
        return hi
    while hi - lo > 1:   # invariant: got[:lo] == want[:lo] and got[:hi] != want[:hi]
        mid = (lo + hi) // 2
        if bytes(got[lo:mid]) == want[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def check(path: Path, got: memoryview, digest: int, want: typing.Callable[[], bytes],
          base: int = 0) -> None:
    """Raise WrongData naming the first wrong offset when the bytes' digest differs.

    base is where `got` starts in the file (a request of a sequential read).
    """
    if xxhash.xxh3_64_intdigest(got) == digest:
        return
    expected = want()
    if len(got) != len(expected):
        raise WrongData(f"{path}: read {base + len(got)} bytes, expected {base + len(expected)}"
                        " (file too short or too long)")
    at = first_difference(got, expected)
    raise WrongData(f"{path}: wrong bytes at offset {base + at} "
                    f"(read 0x{got[at]:02x}, wrote 0x{expected[at]:02x})")


# ---------------------------------------------------------------- figures


def percentile_ms(seconds: typing.Sequence[float], q: float) -> float:
    """Nearest-rank percentile of per-file times, in milliseconds."""
    if not seconds:
        return 0.0
    xs = sorted(seconds)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] * 1e3


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def per_file_figures(nbytes: int, times: list[float], prefix: str) -> dict[str, float]:
    total = sum(times)
    return {f"{prefix}_GBps": gbps(nbytes, total), f"{prefix}_s": total,
            f"{prefix}_p50_ms": percentile_ms(times, 0.50),
            f"{prefix}_p99_ms": percentile_ms(times, 0.99)}


# ---------------------------------------------------------------- kvcache


def kv_write(directory: Path, plan: Plan) -> dict[str, float]:
    """Write plan.files chunks the LMCache way; time per file from open to rename."""
    pattern = Pattern(plan.seed, plan.file_size - HEADER_SIZE)
    d = directory / KV_DIR
    d.mkdir(parents=True, exist_ok=True)
    if plan.writers > 1:
        return _kv_write_concurrent(d, plan, pattern)
    payload = memoryview(bytearray(plan.file_size - HEADER_SIZE))
    times = []
    for i in range(plan.files):
        pattern.fill(payload, i)
        header = kv_header(i, plan.file_size, plan.seed)
        tmp, final = d / f"{kv_name(i)}.tmp", d / f"{kv_name(i)}.data"
        t = time.perf_counter()
        with open(tmp, "wb", buffering=0) as f:
            f.write(header)
            _write_all(f, payload)
        os.rename(tmp, final)
        times.append(time.perf_counter() - t)
    return per_file_figures(plan.files * plan.file_size, times, "write")


def _kv_write_concurrent(d: Path, plan: Plan, pattern: Pattern) -> dict[str, float]:
    """plan.writers threads, as LMCache's put pool: every chunk opened with its header
    written first, then the payloads, then close and rename.  GB/s over the wall time."""
    n, local = plan.files, threading.local()
    files: list[io.RawIOBase | None] = [None] * n
    starts, times = [0.0] * n, [0.0] * n

    def open_with_header(i: int) -> None:
        starts[i] = time.perf_counter()
        f = files[i] = open(d / f"{kv_name(i)}.tmp", "wb", buffering=0)
        f.write(kv_header(i, plan.file_size, plan.seed))

    def payload_and_rename(i: int) -> None:
        payload = _thread_buffer(local, plan.file_size - HEADER_SIZE)
        pattern.fill(payload, i)   # two memcpy into a reused buffer: ~1% of a write
        f = files[i]
        assert f is not None
        with f:
            _write_all(f, payload)
        files[i] = None
        os.rename(d / f"{kv_name(i)}.tmp", d / f"{kv_name(i)}.data")
        times[i] = time.perf_counter() - starts[i]

    wall = _run_pool(n, open_with_header, payload_and_rename, plan.writers, plan.timeout_s, "kvcache write", files)
    return _concurrent_figures(n * plan.file_size, wall, times, "write", plan.writers)


def _run_pool(n: int, first: typing.Callable[[int], None], second: typing.Callable[[int], None], threads: int,
              timeout_s: float, what: str, files: typing.Sequence[io.RawIOBase | None]) -> float:
    """first(i) then second(i) for every file i on the pool (run_staged); what a failed or
    stalled run left open is closed; returns the wall time."""
    t = time.perf_counter()
    try:
        run_staged([(functools.partial(first, i), functools.partial(second, i)) for i in range(n)],
                   threads, timeout_s, what)
    finally:
        _close_quietly(files)
    return time.perf_counter() - t


def _thread_buffer(local: threading.local, size: int) -> memoryview:
    """One reused buffer per thread (fresh memory is slow here: BRIEF.md)."""
    buf = getattr(local, "buf", None)
    if buf is None or len(buf) < size:
        buf = local.buf = memoryview(bytearray(size))
    return buf[:size]


def _close_quietly(files: typing.Sequence[io.RawIOBase | None]) -> None:
    """Close what a failed or stalled phase left open (a hung one may block: not waited for)."""
    for f in files:
        if f is not None:
            threading.Thread(target=f.close, daemon=True).start()


def _concurrent_figures(nbytes: int, wall: float, times: list[float], prefix: str,
                        threads: int) -> dict[str, float]:
    return {f"{prefix}_GBps": gbps(nbytes, wall), f"{prefix}_s": wall,
            f"{prefix}_p50_ms": percentile_ms(times, 0.50), f"{prefix}_p99_ms": percentile_ms(times, 0.99),
            f"{prefix}_threads": threads}


def _write_all(f: io.RawIOBase, data: memoryview) -> None:
    """One write call, plus more only if the filesystem takes less (a short write)."""
    done = 0
    while done < len(data):
        n = f.write(data[done:])
        if not n:
            raise OSError(5, "write returned 0", getattr(f, "name", None))
        done += n


def _read_whole(f: io.RawIOBase, view: memoryview) -> int:
    """4 KiB, then the rest in one call (more calls only on a short read); bytes read."""
    got = f.readinto(view[:FIRST_READ]) or 0
    return got + _read_full(f, view[got:]) if got else 0


def kv_read(directory: Path, plan: Plan) -> dict[str, float]:
    """LMCache's retrieval: look every chunk up (one stat each, in prefix order), then read
    each whole (open, 4 KiB, the rest in one call, close) and verify it.

    A file's time is its stat plus its read; lookup_ms is all the stats together.
    """
    pattern = Pattern(plan.seed, plan.file_size - HEADER_SIZE)
    d = directory / KV_DIR
    payload_len = plan.file_size - HEADER_SIZE
    digests = [pattern.digest(kv_header(i, plan.file_size, plan.seed), i, payload_len)
               for i in range(plan.files)]
    paths = [d / f"{kv_name(i)}.data" for i in range(plan.files)]
    if plan.readers > 1:
        return _kv_read_concurrent(paths, plan, pattern, digests)
    buf = memoryview(bytearray(plan.file_size))
    stat_times, sizes = [], []
    for path in paths:
        t = time.perf_counter()
        sizes.append(os.stat(path).st_size)
        stat_times.append(time.perf_counter() - t)
    times = []
    for i, path in enumerate(paths):
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            got = _read_whole(f, buf)
        times.append(stat_times[i] + time.perf_counter() - t)
        if sizes[i] != plan.file_size:
            raise WrongData(f"{path}: size {sizes[i]}, expected {plan.file_size}")
        header = kv_header(i, plan.file_size, plan.seed)
        check(path, buf[:got], digests[i], lambda: pattern.expected(header, i, payload_len))
    out = per_file_figures(plan.files * plan.file_size, times, "read")
    k = min(plan.files, PROMPT_FILES)
    out["lookup_ms"] = sum(stat_times) * 1e3
    out["prompt_files"] = k
    out["prompt_ms"] = sum(times[:k]) * 1e3
    return out


def _kv_read_concurrent(paths: list[Path], plan: Plan, pattern: Pattern, digests: list[int]
                        ) -> dict[str, float]:
    """plan.readers threads, as LMCache's retrieve: every chunk stat'ed and opened first
    (all open at once), then each read whole (4 KiB, the rest), closed and verified."""
    n, local = plan.files, threading.local()
    files: list[io.RawIOBase | None] = [None] * n
    starts, times = [0.0] * n, [0.0] * n
    payload_len = plan.file_size - HEADER_SIZE

    def stat_and_open(i: int) -> None:
        starts[i] = time.perf_counter()
        size = os.stat(paths[i]).st_size
        if size != plan.file_size:
            raise WrongData(f"{paths[i]}: size {size}, expected {plan.file_size}")
        files[i] = open(paths[i], "rb", buffering=0)

    def read_and_check(i: int) -> None:
        buf = _thread_buffer(local, plan.file_size)
        f = files[i]
        assert f is not None
        with f:
            got = _read_whole(f, buf)
        files[i] = None
        times[i] = time.perf_counter() - starts[i]
        header = kv_header(i, plan.file_size, plan.seed)
        check(paths[i], buf[:got], digests[i], lambda: pattern.expected(header, i, payload_len))

    wall = _run_pool(n, stat_and_open, read_and_check, plan.readers, plan.timeout_s, "kvcache read", files)
    return _concurrent_figures(n * plan.file_size, wall, times, "read", plan.readers)


# ---------------------------------------------------------------- seq


def _seq_requests(plan: Plan) -> list[int]:
    full, rest = divmod(plan.seq_size, SEQ_REQUEST)
    return [SEQ_REQUEST] * full + ([rest] if rest else [])


def _seq_prefix(k: int) -> bytes:
    return struct.pack("<Q", k)     # each request starts with its index: no two are alike


def seq_write(directory: Path, plan: Plan) -> dict[str, float]:
    pattern = Pattern(plan.seed ^ 1, SEQ_REQUEST)
    buf = memoryview(bytearray(SEQ_REQUEST))
    buf[8:] = pattern.view[:SEQ_REQUEST - 8]
    path = directory / SEQ_FILE
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for k, n in enumerate(_seq_requests(plan)):
            buf[:8] = _seq_prefix(k)
            _write_all(f, buf[:n])
    seconds = time.perf_counter() - t
    return {"write_GBps": gbps(plan.seq_size, seconds), "write_s": seconds}


def seq_read(directory: Path, plan: Plan) -> dict[str, float]:
    pattern = Pattern(plan.seed ^ 1, SEQ_REQUEST)
    requests = _seq_requests(plan)
    tail = pattern.view[:SEQ_REQUEST - 8]
    digests = [_seq_digest(k, n, tail) for k, n in enumerate(requests)]
    buf = memoryview(bytearray(SEQ_REQUEST))
    path = directory / SEQ_FILE
    seconds = 0.0
    with open(path, "rb", buffering=0) as f:
        for k, n in enumerate(requests):
            t = time.perf_counter()
            got = _read_full(f, buf[:n])
            seconds += time.perf_counter() - t
            check(path, buf[:got], digests[k], lambda: _seq_expected(k, n, tail), k * SEQ_REQUEST)
        t = time.perf_counter()
        extra = f.read(1)
        seconds += time.perf_counter() - t
    if extra:
        raise WrongData(f"{path}: longer than the {plan.seq_size} bytes written")
    return {"read_GBps": gbps(plan.seq_size, seconds), "read_s": seconds}


def seq_random_read(directory: Path, plan: Plan) -> dict[str, float]:
    """plan.random_reads preads of RANDOM_IO bytes at random aligned offsets of the seq
    file, one at a time, each checked; then the file's pages in this reader are dropped
    (POSIX_FADV_DONTNEED), so the sequential read after it finds none of them cached."""
    slots = plan.seq_size // RANDOM_IO
    if not plan.random_reads or not slots:
        return {}
    rng = random.Random(plan.seed ^ 2)
    offsets = [rng.randrange(slots) * RANDOM_IO for _ in range(plan.random_reads)]
    tail = Pattern(plan.seed ^ 1, SEQ_REQUEST).view[:SEQ_REQUEST - 8]
    path = directory / SEQ_FILE
    times = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in offsets:
            t = time.perf_counter()
            got = os.pread(fd, RANDOM_IO, off)
            times.append(time.perf_counter() - t)
            want = _seq_range(off, tail)
            check(path, memoryview(got), xxhash.xxh3_64_intdigest(want), lambda: want, off)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return {"random_per_s": len(times) / sum(times), "random_p50_ms": percentile_ms(times, 0.5),
            "random_p99_ms": percentile_ms(times, 0.99)}


def _seq_range(off: int, tail: memoryview) -> bytes:
    """The RANDOM_IO bytes of the seq file at off (aligned: within one request)."""
    r = off % SEQ_REQUEST
    if r == 0:
        return _seq_prefix(off // SEQ_REQUEST) + bytes(tail[:RANDOM_IO - 8])
    return bytes(tail[r - 8:r - 8 + RANDOM_IO])


def _seq_digest(k: int, n: int, tail: memoryview) -> int:
    h = xxhash.xxh3_64(_seq_prefix(k))
    h.update(tail[:n - 8])
    return h.intdigest()


def _seq_expected(k: int, n: int, tail: memoryview) -> bytes:
    """A request's expected bytes (only built to locate a mismatch)."""
    return _seq_prefix(k) + bytes(tail[:n - 8])


def _read_full(f: io.RawIOBase, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


# ---------------------------------------------------------------- meta


def meta_ops(directory: Path, plan: Plan) -> dict[str, float]:
    """create / stat / rename / unlink per second over plan.meta_files empty files."""
    d = directory / META_DIR
    d.mkdir(parents=True, exist_ok=True)
    names = [str(d / f"f{i:06d}") for i in range(plan.meta_files)]
    renamed = [str(d / f"g{i:06d}") for i in range(plan.meta_files)]
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    out: dict[str, float] = {}

    def timed(op: str, fn: typing.Callable[[int], object]) -> None:
        t = time.perf_counter()
        for i in range(plan.meta_files):
            fn(i)
        out[f"{op}_per_s"] = plan.meta_files / max(time.perf_counter() - t, 1e-9)

    timed("create", lambda i: os.close(os.open(names[i], flags, 0o644)))
    timed("stat", lambda i: os.stat(names[i]))
    timed("rename", lambda i: os.rename(names[i], renamed[i]))
    timed("unlink", lambda i: os.unlink(renamed[i]))
    os.rmdir(d)
    return out


# ---------------------------------------------------------------- concurrency (LMCache's pools)


class Stalled(Exception):
    """A concurrent phase did not finish within its time limit (a hang, not a slow run)."""


def run_staged(items: typing.Sequence[typing.Sequence[typing.Callable[[], None]]], threads: int,
               timeout_s: float, what: str) -> None:
    """Run each item's stages in order on a pool of `threads` daemon threads, the way an
    asyncio program on a small executor does (LMCache's put and retrieve pools): every
    item's first stage is queued at once, and an item's next stage is queued behind
    whatever is waiting when its previous one ends.  So with more items than threads,
    many files are open at once, each part-written (or not yet read).

    Daemon threads: a stage stuck in the kernel (a hung mount) cannot keep the process
    from exiting once Stalled is raised.  The first error of any stage is raised here.
    """
    work: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
    done = threading.Semaphore(0)
    errors: list[BaseException] = []
    finished = [0]

    def worker() -> None:
        while (job := work.get()) is not None:
            item, stage = job
            try:
                items[item][stage]()
            except BaseException as e:   # reported by the caller's thread
                errors.append(e)
                done.release()
                continue
            if stage + 1 < len(items[item]):
                work.put((item, stage + 1))
            else:
                finished[0] += 1
                done.release()

    for i in range(len(items)):
        work.put((i, 0))
    pool = [threading.Thread(target=worker, name=f"bench-{what}-{k}", daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    deadline = time.monotonic() + timeout_s
    try:
        for _ in range(len(items)):
            if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise Stalled(f"{what}: {finished[0]} of {len(items)} files done after {timeout_s:.0f} s "
                              f"({threads} threads): the filesystem stopped answering")
            if errors:
                raise errors[0]
    finally:
        for _ in pool:
            work.put(None)


# ---------------------------------------------------------------- phases


def new_plan(workloads: typing.Sequence[str], files: int, file_size: int, seq_size: int,
             meta_files: int, writers: int = 1, readers: int = 1, timeout_s: float = 600.0,
             random_reads: int = 300) -> Plan:
    if file_size <= HEADER_SIZE:
        raise ValueError(f"--file-size must exceed the {HEADER_SIZE}-byte header")
    if seq_size <= 0 or seq_size % 4096:
        raise ValueError("--seq-size must be a positive multiple of 4 KiB")
    if files <= 0 or meta_files <= 0:
        raise ValueError("--files and --meta-files must be positive")
    if writers <= 0 or readers <= 0:
        raise ValueError("--writers and --readers must be positive")
    if timeout_s <= 0:
        raise ValueError("--timeout must be positive")
    if random_reads < 0:
        raise ValueError("--random-reads must not be negative")
    return Plan(workloads=list(workloads), files=files, file_size=file_size, seq_size=seq_size,
                meta_files=meta_files, seed=int.from_bytes(os.urandom(8), "little"),
                writers=writers, readers=readers, timeout_s=timeout_s, random_reads=random_reads)


def write_phase(directory: Path, plan: Plan) -> dict[str, dict[str, float]]:
    """Write what the plan asks (and run meta, which needs no reader); save the manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, dict[str, float]] = {}
    if "kvcache" in plan.workloads:
        out["kvcache"] = kv_write(directory, plan)
    if "seq" in plan.workloads:
        out["seq"] = seq_write(directory, plan)
    if "meta" in plan.workloads:
        out["meta"] = meta_ops(directory, plan)
    plan.save(directory)
    return out


def read_phase(directory: Path, only: typing.Collection[str] = WORKLOADS
               ) -> dict[str, dict[str, float]]:
    """Read back and verify what the write phase left in directory (its manifest says what)."""
    plan = Plan.load(directory)
    out: dict[str, dict[str, float]] = {}
    if "kvcache" in plan.workloads and "kvcache" in only:
        out["kvcache"] = kv_read(directory, plan)
    if "seq" in plan.workloads and "seq" in only:
        out["seq"] = {**seq_random_read(directory, plan), **seq_read(directory, plan)}
    return out


def remove_data(directory: Path) -> None:
    """Delete what the write phase created (and directory itself when it is left empty)."""
    d = directory / KV_DIR
    if d.is_dir():
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
    for name in (SEQ_FILE, MANIFEST):
        (directory / name).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass


def drop_caches(*dirs: Path) -> bool:
    """sync + drop the kernel's page, dentry and inode caches, and the block copies of the
    curvine mounts dirs lie in (staged blocks live in the mount's own memory, which the
    kernel's drop leaves: fuse/ops.py DROP_CACHES_XATTR); False when not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        mounts = read_mounts()
        for point in {m.point for d in dirs if (m := mount_of(str(d), CURVINE_FSTYPE, mounts)) is not None}:
            os.setxattr(point, DROP_CACHES_XATTR, b"1")
    except OSError:
        return False
    return True
