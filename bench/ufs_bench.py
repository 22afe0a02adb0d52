#!/usr/bin/env python3
"""UFS mounts (issue 22) on SeaweedFS on loopback, each figure beside a peer measured here.

Starts SeaweedFS (curvine_py.testing.s3servers) and a local cluster (1 master, 2 workers,
the FUSE mount, default settings) with three S3 mounts on it, and measures in this order:

- peer: the read set's objects (8 of --size / 8) read as ranged GETs of one pool block
  (4 MiB) by OpenDAL itself (Operator.open(offset, size) + readinto into a reused buffer,
  as curvine_py/ufs/s3.py does), serially and from `client.read_ahead_blocks` threads
  (the GETs the mount's read-ahead keeps in flight).
- cold read: the same objects read through the mount with plain Python reads of
  --read-size, never read before (run 1: a fresh mount; later runs: after
  `Client.ufs.free`, which drops every cached block).  Against the peer: target >= 0.8x.
  The same cold read through the SDK (no FUSE) is a reference row.
- warm read: the same files again, now in the pool: after `echo 1 > drop_caches` (the
  pool's block files come from the workers' disk), and after dropping only the mount's
  page cache of those files (posix_fadvise DONTNEED; block files in the page cache).
  Against the cold read: target >= 5x.  Reference rows: the same reads of files of the
  same size written into the pool by the SDK (no UFS).
- cv load: a tree of --size / 2 in 32 objects under 4 directories (never listed in run
  1), SDK load + wait as `cv load -r --wait` does, MB/s over the wall time.
- KV write: LMCache's pattern (a chunk written as `<name>.tmp`, 28-byte header then the
  payload in one write, closed, renamed `<name>.data`), --kv-chunks of 14 MiB into a
  plain pool directory and into the write-back S3 mount, in alternating order, each
  after a sync, GB/s; target >= 0.9x.  The write-back uploads start `ufs.upload_delay_s`
  (1 s) after each close, so they overlap the write pass, as they would in use.  Then how
  long after the last rename every chunk is `persisted` (the master's state, polled),
  each object then checked in S3.

Before each timed read the page cache is dropped (sync; echo 1 > /proc/sys/vm/drop_caches)
unless said otherwise, so SeaweedFS reads its volumes from disk for the peer and the cold
read alike.  Every byte read through the mount or the SDK is checked (xxh3 against the
upload's, the hashing time excluded); a cold pass must fetch the whole set from S3 and a
warm one nothing (the workers' fetch counters).  CPU-s/GB: user + system seconds of every
process involved (master, workers, mount, SeaweedFS, this script) per GB moved: on a
2-core machine that decides throughput.  Best of --runs per figure (every run in --json).
The load average is printed at the start and the end: the machine is shared.  Needs root
(the FUSE mount, `cv ufs mount`, drop_caches).

    .venv/bin/python bench/ufs_bench.py [--quick] [--size 512MiB] [--runs 2] [--read-size 4MiB]
        [--kv-chunks 32] [--dir D] [--json]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import shutil
import sys
import tempfile
import threading
import time
import typing
from pathlib import Path

import xxhash

from curvine_py.cli import output
from curvine_py.common import config as cfgmod

MiB = 1 << 20
BUCKET = "bench"
HEADER = 28                      # LMCache's fs:// header
READ_OBJECTS = 8
LOAD_OBJECTS, LOAD_DIRS = 32, 4
KV_CHUNK = 14 * MiB
COLD_TARGET, WARM_TARGET, KV_TARGET = 0.8, 5.0, 0.9
WAIT_S = 600.0                   # a load or the write-back uploads past this: a hang, reported
SETTLE_S = 0.5                   # after a pass: the last fetched blocks stored, freed ones deleted
Figures = dict[str, typing.Any]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def drop_caches() -> None:
    """sync, then drop the page cache (echo 1): the mount's, the workers' and SeaweedFS's."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def fadvise_dontneed(paths: typing.Iterable[Path]) -> None:
    """Drop the page cache of these files only (here: the mount's pages of them)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def best(name: str, values: list[float]) -> float:
    return min(values) if name.endswith("_s") else max(values)


# ---------------------------------------------------------------------- accounting
class Cpu:
    """CPU seconds (user + system, every thread) of named processes and this one, from
    /proc, around a pass: who burns the cores."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}

    def snapshot(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / self.TICK
            except (OSError, IndexError, ValueError):
                out[name] = 0.0
        t = os.times()
        out["bench"] = t.user + t.system
        out["wall"] = time.perf_counter()
        return out

    @staticmethod
    def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: round(b[k] - a[k], 3) for k in a}


def cpu_per_gb(c: dict[str, float], nbytes: float) -> float:
    return sum(v for k, v in c.items() if k != "wall") / (nbytes / 1e9)


class Counters:
    """The workers' UFS fetch counters and the mount's read sources, scraped around a pass."""

    SOURCES = ("short_circuit", "remote", "memory")

    def __init__(self, cluster: typing.Any) -> None:
        self.workers = [p.metrics for p in cluster.processes if p.role == "worker"]
        self.fuse = [p.metrics for p in cluster.processes if p.role == "fuse"]

    def snapshot(self) -> dict[str, float]:
        from curvine_py.cli.stats import scrape
        out = {"fetched_bytes": 0.0, "fetches": 0.0, "fetch_seconds": 0.0}
        for e in self.workers:
            s = scrape(e)
            out["fetched_bytes"] += s.total("curvine_worker_ufs_fetch_bytes_total")
            out["fetches"] += s.total("curvine_worker_ufs_fetch_duration_seconds_count")
            out["fetch_seconds"] += s.total("curvine_worker_ufs_fetch_duration_seconds_sum")
        for e in self.fuse:
            s = scrape(e)
            for src in self.SOURCES:
                out[f"mount_{src}_bytes"] = s.total("curvine_client_read_bytes_total", source=src)
        return out

    @staticmethod
    def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: b[k] - a[k] for k in a}


class Pass:
    """Times one pass and records, beside its figure, its CPU and (with counters) what
    the workers fetched and where the mount's bytes came from."""

    def __init__(self, fig: Figures, cpu: Cpu, counters: Counters | None = None) -> None:
        self.fig, self.cpu, self.counters = fig, cpu, counters

    def __call__(self, name: str, nbytes: int, fn: typing.Callable[[], float]) -> dict[str, float]:
        c0 = self.cpu.snapshot()
        k0 = self.counters.snapshot() if self.counters else {}
        value = fn()
        c = Cpu.delta(c0, self.cpu.snapshot())
        k = Counters.delta(k0, self.counters.snapshot()) if self.counters else {}
        self.fig["runs"].setdefault(name, []).append(value)
        self.fig.setdefault("passes", {}).setdefault(name, []).append(
            {"value": value, "cpu_s": c, "cpu_s_per_GB": cpu_per_gb(c, nbytes), **k})
        return k


def best_pass(fig: Figures, name: str) -> dict[str, typing.Any]:
    """The record of name's best pass."""
    passes = fig["passes"][name]
    pick = min if name.endswith("_s") else max
    return pick(passes, key=lambda p: p["value"])


# ---------------------------------------------------------------------- S3 side
class Objects:
    """Objects put in the bucket before anything is measured: key -> (size, xxh3)."""

    def __init__(self) -> None:
        self.digests: dict[str, tuple[int, int]] = {}

    def put(self, op: typing.Any, key: str, size: int) -> None:
        data = os.urandom(size)
        op.write(key, data)
        self.digests[key] = (size, xxhash.xxh3_64_intdigest(data))

    def total(self, prefix: str) -> int:
        return sum(s for k, (s, _) in self.digests.items() if k.startswith(prefix))


def operator(s3: typing.Any) -> typing.Any:
    """OpenDAL on SeaweedFS, configured as curvine_py/ufs/s3.py configures it."""
    import opendal
    return opendal.Operator("s3", bucket=BUCKET, endpoint=s3.endpoint, region=s3.region,
                            access_key_id=s3.access_key, secret_access_key=s3.secret_key,
                            root="/", enable_virtual_host_style="false")


def peer_pass(op: typing.Any, objects: dict[str, int], block: int, threads: int) -> float:
    """Every object as ranged GETs of one block into reused buffers; MB/s over the wall."""
    local = threading.local()

    def fetch(job: tuple[str, int, int]) -> int:
        key, offset, want = job
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = memoryview(bytearray(block))
            buf[:] = b"\0" * block   # touched: fresh pages must not count as reading
        into, n = buf[:want], 0
        with op.open(key, "rb", offset=offset, size=want) as f:
            while n < want:
                got = f.readinto(into[n:])
                if not got:
                    break
                n += got
        if n != want:
            raise SystemExit(f"OpenDAL read {n} bytes of {key} at {offset}, wanted {want}")
        return n

    jobs = [(k, o, min(block, size - o)) for k, size in objects.items() for o in range(0, size, block)]
    t = time.perf_counter()
    if threads == 1:
        total = sum(fetch(j) for j in jobs)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(fetch, jobs))
    return total / (time.perf_counter() - t) / 1e6


def check_objects(op: typing.Any, keys: list[str], content: bytes) -> None:
    want = xxhash.xxh3_64_intdigest(content)
    for key in keys:
        data = op.read(key)
        if len(data) != len(content) or xxhash.xxh3_64_intdigest(data) != want:
            raise SystemExit(f"S3 object {key}: {len(data)} bytes, not the chunk written")


# ---------------------------------------------------------------------- cluster side
def read_files(opener: typing.Callable[[str], typing.Any], names: list[str],
               digests: list[tuple[int, int]], request: int) -> float:
    """Each file read whole with reads of `request` bytes into one buffer and checked; MB/s
    (hashing time excluded)."""
    view = memoryview(bytearray(request))
    total, hashing = 0, 0.0
    t0 = time.perf_counter()
    for name, (size, digest) in zip(names, digests):
        h = xxhash.xxh3_64()
        got = 0
        with opener(name) as f:
            while True:
                n = f.readinto(view)
                if not n:
                    break
                t = time.perf_counter()
                h.update(view[:n])
                hashing += time.perf_counter() - t
                got += n
        if got != size or h.intdigest() != digest:
            raise SystemExit(f"read of {name} returned wrong bytes ({got} of {size})")
        total += got
    return total / (time.perf_counter() - t0 - hashing) / 1e6


def kv_write(d: Path, n: int, payload: memoryview, tag: bytes) -> tuple[float, list[str]]:
    """LMCache's put: header + payload in one write to <name>.tmp, close, rename <name>.data.
    GB/s and the names written."""
    d.mkdir(parents=True, exist_ok=True)
    header = tag.ljust(HEADER, b"K")
    names = []
    t = time.perf_counter()
    for i in range(n):
        p = d / f"model@1@0@{i:08x}@bfloat16"
        with open(f"{p}.tmp", "wb", buffering=0) as f:
            f.write(header)
            f.write(payload[:KV_CHUNK - HEADER])
        os.rename(f"{p}.tmp", f"{p}.data")
        names.append(f"{p.name}.data")
    return n * KV_CHUNK / (time.perf_counter() - t) / 1e9, names


def wait_persisted(client: typing.Any, paths: list[str], poll_s: float = 0.05) -> float:
    """Poll the master until every path is persisted in its UFS; when (perf_counter).
    Each round asks about the paths in order up to the first still pending (the uploads
    go roughly in order): a few calls a round, not one per file, so the polling does not
    load the master that runs the uploads."""
    left, deadline = list(paths), time.monotonic() + WAIT_S
    while left:
        while left and client.ufs.stat(left[0]).state == "persisted":
            left.pop(0)
        if left:
            if time.monotonic() > deadline:
                raise SystemExit(f"{len(left)} write-back chunks not persisted after {WAIT_S:.0f} s")
            time.sleep(poll_s)
    return time.perf_counter()


def daemon_warnings(logs: Path, keep: int = 20) -> dict[str, typing.Any]:
    """WARNING / ERROR lines and tracebacks the daemons logged during the run: how many
    per log, and the first few (a bench that hides product errors measures the wrong thing)."""
    out: dict[str, typing.Any] = {"count": {}, "first": []}
    for path in sorted(logs.glob("*.log")):
        n = 0
        for line in path.read_text(errors="replace").splitlines():
            if " WARNING " in line or " ERROR " in line or line.startswith("Traceback"):
                n += 1
                if len(out["first"]) < keep:
                    out["first"].append(f"{path.stem}: {line[:300]}")
        if n:
            out["count"][path.stem] = n
    return out


# ---------------------------------------------------------------------- the run
def run(args: argparse.Namespace, base: Path) -> Figures:
    from curvine_py.cluster.local import LocalCluster
    from curvine_py.sdk import Client
    from curvine_py.testing.s3servers import SeaweedServer

    defaults = cfgmod.Config()
    block, ahead = defaults.master.block_size, defaults.client.read_ahead_blocks
    obj_size = args.size // READ_OBJECTS
    load_size = max(1, args.size // 2 // LOAD_OBJECTS)
    read_bytes, load_bytes, kv_bytes = obj_size * READ_OBJECTS, load_size * LOAD_OBJECTS, KV_CHUNK * args.kv_chunks
    fig: Figures = {"date": datetime.datetime.now().isoformat(timespec="minutes"), "cpus": os.cpu_count(),
                    "load_avg_start": os.getloadavg(), "read_bytes": read_bytes, "objects": READ_OBJECTS,
                    "block_bytes": block, "read_ahead_blocks": ahead, "read_request_bytes": args.read_size,
                    "load_bytes": load_bytes, "kv_chunks": args.kv_chunks, "kv_chunk_bytes": KV_CHUNK,
                    "n_runs": args.runs, "runs": {}}
    cpu = Cpu()
    timed = Pass(fig, cpu)
    s3 = cluster = client = None
    try:
        log(f"SeaweedFS: {READ_OBJECTS} x {obj_size / MiB:g} MiB to read, {LOAD_OBJECTS} x "
            f"{load_size / MiB:g} MiB to load")
        s3 = SeaweedServer(base / "seaweed").start()
        cpu.pids["seaweedfs"] = s3._proc.pid
        s3.make_bucket(BUCKET)
        op = operator(s3)
        objs = Objects()
        for i in range(READ_OBJECTS):
            objs.put(op, f"read/obj-{i:02d}.bin", obj_size)
        for i in range(LOAD_OBJECTS):
            objs.put(op, f"tree/d{i % LOAD_DIRS}/obj-{i:02d}.bin", load_size)
        op.create_dir("kv/")
        read_keys = {k: s for k, (s, _) in objs.digests.items() if k.startswith("read/")}
        peer_pass(op, {next(iter(read_keys)): min(block, obj_size)}, block, 1)   # connection, credentials

        # ---- peer: OpenDAL's ranged GETs, serial and with the read-ahead's concurrency
        for threads in (1, ahead):
            for _ in range(args.runs):
                drop_caches()
                timed(f"peer_x{threads}_MBps", read_bytes, lambda: peer_pass(op, read_keys, block, threads))
            log(f"peer x{threads}: {max(fig['runs'][f'peer_x{threads}_MBps']):.0f} MB/s")

        # ---- the cluster and its S3 mounts
        mnt = base / "mnt"
        cluster = LocalCluster(base / "cluster", workers=2, master_port=None, mount=str(mnt),
                               die_with_parent=True).start()
        for p in cluster.processes:
            cpu.pids[p.name] = p.popen.pid if p.popen is not None else p.pid
        cfg = cfgmod.Config()
        cfg.cluster.secret = cluster.secret
        cfg.client.master = cluster.master_address
        cfg.client.host = cluster.worker_host(0)     # the mount's host identity (D/curvine.toml)
        client = Client(master=cluster.master_address, config=cfg)
        client.ufs.poll_s = 0.02
        opts = {"endpoint_url": s3.endpoint, "region": s3.region, "access_key_id": s3.access_key,
                "secret_access_key": s3.secret_key}
        client.ufs.mount(f"s3://{BUCKET}/read", "/s3read", opts, "through")
        client.ufs.mount(f"s3://{BUCKET}/tree", "/s3tree", opts, "through")
        client.ufs.mount(f"s3://{BUCKET}/kv", "/s3kv", opts, "back")
        counters = Counters(cluster)
        counted = Pass(fig, cpu, counters)

        # ---- cold and warm reads, through the mount and (reference) the SDK
        names = sorted(k.split("/", 1)[1] for k in read_keys)
        digests = [objs.digests[f"read/{n}"] for n in names]
        if sorted(os.listdir(mnt / "s3read")) != names:
            raise SystemExit(f"the mount lists {sorted(os.listdir(mnt / 's3read'))}, not {names}")
        for n in names:
            os.stat(mnt / "s3read" / n)   # metadata in place; the data never read

        def via_mount(name: str) -> typing.Any:
            return open(mnt / "s3read" / name, "rb", buffering=0)

        def via_sdk(name: str) -> typing.Any:
            return client.open(f"/s3read/{name}", "rb")

        def cold(label: str, opener: typing.Callable[[str], typing.Any]) -> None:
            drop_caches()
            k = counted(label, read_bytes, lambda: read_files(opener, names, digests, args.read_size))
            if k["fetched_bytes"] < read_bytes:
                raise SystemExit(f"{label}: fetched {k['fetched_bytes']:.0f} bytes from S3, not "
                                 f"{read_bytes}: not a cold read")
            time.sleep(SETTLE_S)

        def free() -> None:
            client.ufs.free("/s3read", recursive=True)
            time.sleep(SETTLE_S)

        paths = [mnt / "s3read" / n for n in names]
        for r in range(args.runs):
            if r:
                free()
            cold("cold_MBps", via_mount)
            for kind in ("disk", "page_cache"):
                drop_caches() if kind == "disk" else fadvise_dontneed(paths)
                k = counted(f"warm_{kind}_MBps", read_bytes,
                            lambda: read_files(via_mount, names, digests, args.read_size))
                if k["fetched_bytes"]:
                    log(f"warning: warm read ({kind}) fetched {k['fetched_bytes']:.0f} bytes from S3 again")
            free()
            cold("sdk_cold_MBps", via_sdk)
            log(f"run {r + 1}: cold {fig['runs']['cold_MBps'][-1]:.0f} MB/s (SDK "
                f"{fig['runs']['sdk_cold_MBps'][-1]:.0f}), warm {fig['runs']['warm_disk_MBps'][-1]:.0f} (pool on "
                f"disk) / {fig['runs']['warm_page_cache_MBps'][-1]:.0f} MB/s (pool in page cache)")

        # ---- reference: the same reads of files written into the pool by the SDK (no UFS)
        client.mkdir("/native")
        native_digests = []
        for n in names:
            data = os.urandom(obj_size)
            client.put_bytes(f"/native/{n}", data)
            native_digests.append((obj_size, xxhash.xxh3_64_intdigest(data)))
            del data

        def via_native(name: str) -> typing.Any:
            return open(mnt / "native" / name, "rb", buffering=0)

        native_paths = [mnt / "native" / n for n in names]
        read_files(via_native, names, native_digests, args.read_size)   # read once, as the UFS files were
        for _ in range(args.runs):
            for kind in ("disk", "page_cache"):
                drop_caches() if kind == "disk" else fadvise_dontneed(native_paths)
                counted(f"native_{kind}_MBps", read_bytes,
                        lambda: read_files(via_native, names, native_digests, args.read_size))
        log(f"pool files: {max(fig['runs']['native_disk_MBps']):.0f} MB/s (disk) / "
            f"{max(fig['runs']['native_page_cache_MBps']):.0f} MB/s (page cache)")

        # ---- cv load of a tree (never listed in run 1), SDK load + wait as `cv load -r --wait`
        def load() -> float:
            t = time.perf_counter()
            job = client.ufs.wait(client.ufs.load("/s3tree", recursive=True).job_id, timeout_s=WAIT_S)
            took = time.perf_counter() - t
            if job.state != "done" or job.loaded_bytes != load_bytes or job.files != LOAD_OBJECTS:
                raise SystemExit(f"cv load /s3tree: {job}")
            return load_bytes / took / 1e6

        for r in range(args.runs):
            if r:
                client.ufs.free("/s3tree", recursive=True)
                time.sleep(SETTLE_S)
            drop_caches()
            counted("load_MBps", load_bytes, load)
            time.sleep(SETTLE_S)
        log(f"load: {max(fig['runs']['load_MBps']):.0f} MB/s")

        # ---- KV writes: a plain pool directory and the write-back mount, in alternating order
        payload = memoryview(os.urandom(KV_CHUNK))
        for r in range(args.runs):
            for kind in (("pool", "back") if r % 2 == 0 else ("back", "pool")):
                d = mnt / ("kvpool" if kind == "pool" else "s3kv") / f"r{r}"
                written: list[str] = []
                os.sync()   # the last pass's dirty pages (SeaweedFS's volumes, received blocks) on disk first
                time.sleep(SETTLE_S)

                def write() -> float:
                    gbps, got = kv_write(d, args.kv_chunks, payload, kind.encode())
                    written.extend(got)
                    return gbps

                timed(f"kv_{kind}_GBps", kv_bytes, write)
                if kind == "back":
                    t_written = time.perf_counter()
                    timed("kv_back_persisted_s", kv_bytes, lambda: wait_persisted(
                        client, [f"/s3kv/r{r}/{n}" for n in written]) - t_written)
                    check_objects(op, [f"kv/r{r}/{n}" for n in written],
                                  b"back".ljust(HEADER, b"K") + payload[:KV_CHUNK - HEADER])
            log(f"kv run {r + 1}: pool {fig['runs']['kv_pool_GBps'][-1]:.2f} GB/s, back "
                f"{fig['runs']['kv_back_GBps'][-1]:.2f} GB/s, in S3 "
                f"{fig['runs']['kv_back_persisted_s'][-1]:.1f} s after the last rename")
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop()
            fig["daemon_warnings"] = daemon_warnings(base / "cluster" / "logs")
        if s3 is not None:
            s3.close()
            # SeaweedFS's filer puts this socket in /tmp whatever its flags say
            Path(f"/tmp/seaweedfs-filer-grpc-{s3.ports['filer.grpc']}.sock").unlink(missing_ok=True)
    for name, values in fig["runs"].items():
        fig[name] = best(name, values)
    peer = f"peer_x{ahead}_MBps"
    fig["cold_vs_peer"] = fig["cold_MBps"] / fig[peer]
    fig["cold_vs_peer_x1"] = fig["cold_MBps"] / fig["peer_x1_MBps"]
    fig["warm_disk_vs_cold"] = fig["warm_disk_MBps"] / fig["cold_MBps"]
    fig["warm_page_cache_vs_cold"] = fig["warm_page_cache_MBps"] / fig["cold_MBps"]
    fig["load_vs_peer"] = fig["load_MBps"] / fig[peer]
    fig["kv_back_vs_pool"] = fig["kv_back_GBps"] / fig["kv_pool_GBps"]
    c = best_pass(fig, "cold_MBps")
    fig["cold_fetch_mean_ms"] = c["fetch_seconds"] / max(1.0, c["fetches"]) * 1e3
    fig["cold_fetches_in_flight"] = c["fetch_seconds"] / c["cpu_s"]["wall"]
    fig["load_avg_end"] = os.getloadavg()
    return fig


# ---------------------------------------------------------------------- the table
def verdict(value: float, target: float) -> str:
    return f">= {target:g}x: {'met' if value >= target else 'MISSED'}"


def table(fig: Figures) -> str:
    ahead, mib = fig["read_ahead_blocks"], fig["block_bytes"] // MiB
    peer = f"peer_x{ahead}_MBps"

    def cpu(name: str) -> str:
        return f"{best_pass(fig, name)['cpu_s_per_GB']:.1f}"

    def mbps(name: str) -> str:
        return f"{fig[name]:.0f} MB/s"

    rows = [
        (f"OpenDAL {mib} MiB ranged GETs, serial", mbps("peer_x1_MBps"), cpu("peer_x1_MBps"), "", ""),
        (f"OpenDAL {mib} MiB ranged GETs, {ahead} at once", mbps(peer), cpu(peer), "", ""),
        (f"cold read, mount ({fig['read_request_bytes'] // MiB} MiB reads)", mbps("cold_MBps"), cpu("cold_MBps"),
         f"{fig['cold_vs_peer']:.2f}x OpenDAL x{ahead}, {fig['cold_vs_peer_x1']:.2f}x serial",
         verdict(fig["cold_vs_peer"], COLD_TARGET)),
        ("  same, through the SDK (no FUSE)", mbps("sdk_cold_MBps"), cpu("sdk_cold_MBps"),
         f"{fig['sdk_cold_MBps'] / fig[peer]:.2f}x OpenDAL x{ahead}", ""),
        ("warm read, pool on disk (drop_caches)", mbps("warm_disk_MBps"), cpu("warm_disk_MBps"),
         f"{fig['warm_disk_vs_cold']:.2f}x cold", verdict(fig["warm_disk_vs_cold"], WARM_TARGET)),
        ("warm read, pool in page cache (fadvise)", mbps("warm_page_cache_MBps"), cpu("warm_page_cache_MBps"),
         f"{fig['warm_page_cache_vs_cold']:.2f}x cold", verdict(fig["warm_page_cache_vs_cold"], WARM_TARGET)),
        ("  same reads of pool files (no UFS), disk", mbps("native_disk_MBps"), cpu("native_disk_MBps"),
         f"warm UFS is {fig['warm_disk_MBps'] / fig['native_disk_MBps']:.2f}x this", ""),
        ("  same reads of pool files (no UFS), page cache", mbps("native_page_cache_MBps"),
         cpu("native_page_cache_MBps"),
         f"warm UFS is {fig['warm_page_cache_MBps'] / fig['native_page_cache_MBps']:.2f}x this", ""),
        (f"cv load -r --wait, {fig['load_bytes'] // MiB} MiB in {LOAD_OBJECTS} objects", mbps("load_MBps"),
         cpu("load_MBps"), f"{fig['load_vs_peer']:.2f}x OpenDAL x{ahead}", ""),
        (f"KV write, pool directory ({fig['kv_chunks']} x 14 MiB)", f"{fig['kv_pool_GBps']:.3f} GB/s",
         cpu("kv_pool_GBps"), "", ""),
        ("KV write, write-back S3 mount", f"{fig['kv_back_GBps']:.3f} GB/s", cpu("kv_back_GBps"),
         f"{fig['kv_back_vs_pool']:.2f}x pool", verdict(fig["kv_back_vs_pool"], KV_TARGET)),
        ("  every chunk persisted, after the last rename", f"{fig['kv_back_persisted_s']:.1f} s",
         cpu("kv_back_persisted_s"), "", ""),
    ]
    la0, la1 = fig["load_avg_start"], fig["load_avg_end"]
    head = (f"UFS on SeaweedFS (loopback), {fig['date']}, {fig['cpus']} CPUs, load average "
            f"{la0[0]:.2f} {la0[1]:.2f} {la0[2]:.2f} at start, {la1[0]:.2f} {la1[1]:.2f} {la1[2]:.2f} at end; "
            f"{fig['read_bytes'] // MiB} MiB read in {fig['objects']} objects; best of {fig['n_runs']} run(s)")
    c = best_pass(fig, "cold_MBps")
    foot = [f"cold read: {c['fetches']:.0f} block fetches (curvine_worker_ufs_fetch_duration_seconds), mean "
            f"{fig['cold_fetch_mean_ms']:.1f} ms, {fig['cold_fetches_in_flight']:.1f} in flight on average",
            "mount reads by source (curvine_client_read_bytes_total), MB: " + "; ".join(
                f"{label}: " + ", ".join(f"{src} {best_pass(fig, name)[f'mount_{src}_bytes'] / 1e6:.0f}"
                                         for src in Counters.SOURCES)
                for label, name in (("cold", "cold_MBps"), ("warm", "warm_page_cache_MBps"),
                                    ("pool files", "native_page_cache_MBps"))),
            "CPU seconds by process (user+sys), best pass:"]
    for label, name in (("peer x%d" % ahead, peer), ("cold, mount", "cold_MBps"), ("cold, SDK", "sdk_cold_MBps"),
                        ("warm, page cache", "warm_page_cache_MBps"), ("cv load", "load_MBps"),
                        ("KV write, pool", "kv_pool_GBps"), ("KV write, back", "kv_back_GBps"),
                        ("back uploads", "kv_back_persisted_s")):
        cs = best_pass(fig, name)["cpu_s"]
        parts = ", ".join(f"{k} {v:.2f}" for k, v in cs.items() if k != "wall")
        foot.append(f"  {label} ({cs['wall']:.2f} s): {parts}")
    warned = fig.get("daemon_warnings", {})
    if warned.get("count"):
        foot.append("daemon log warnings/errors: " + ", ".join(f"{k} {v}" for k, v in warned["count"].items())
                    + " (the first in --json)")
        foot.extend(f"  {line}" for line in warned["first"][:3])
    return "\n".join([head, output.table(rows, headers=("workload", "figure", "CPU-s/GB", "ratio", "target"),
                                         right={1, 2}), *foot])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=cfgmod.parse_size, default=None,
                    help="bytes read cold and warm, in 8 objects (default 512MiB); the load tree is half")
    ap.add_argument("--runs", type=int, default=None, help="passes of each kind, best kept (default 2)")
    ap.add_argument("--read-size", type=cfgmod.parse_size, default=4 * MiB, help="bytes per read() (4MiB)")
    ap.add_argument("--kv-chunks", type=int, default=None, help="14 MiB chunks each way (default 32)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 64 MiB, 1 run, 4 chunks (< 60 s)")
    ap.add_argument("--dir", default=None, help="where SeaweedFS and the cluster live (default: a temp "
                                                "dir under the current dir, removed at the end)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = dict(size=64 * MiB, runs=1, kv_chunks=4) if args.quick else dict(size=512 * MiB, runs=2, kv_chunks=32)
    for k, v in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.size < READ_OBJECTS * MiB or args.runs < 1 or args.kv_chunks < 1 or args.read_size < 4096:
        ap.error("--size at least 8MiB, --runs and --kv-chunks at least 1, --read-size at least 4KiB")
    if os.geteuid() != 0:
        ap.error("needs root (the FUSE mount, cv ufs mount, /proc/sys/vm/drop_caches)")
    log(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    base = Path(tempfile.mkdtemp(prefix="ufs-bench-", dir=args.dir or ".")).absolute()
    try:
        fig = run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        output.print_json(fig)
    else:
        print(table(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
