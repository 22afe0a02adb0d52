#!/usr/bin/env python3
"""Mount benchmark: the LMCache fs:// pattern and metadata ops, ours beside the local disk.

Starts a local cluster (1 master + 2 workers, data on this machine's disk), mounts it
twice (a writer mount and a fresh reader mount, as two inference nodes would), and
runs the same workloads against a local directory in the same run:

- kvcache: N files of 14 MiB written as `<name>.tmp` (28-byte header, then the payload
  in one write), renamed to `<name>.data`; then each is stat'ed and read whole (4 KiB,
  then the rest) through the *other* mount, every byte checked.
- meta: M files created, stat'ed, renamed, unlinked.
- dd: a 1 GiB sequential write and read with dd, as the disk's own reference.

    .venv/bin/python bench/mount_bench.py [--files 32] [--size 14680064] [--meta 10000] [--dd-mib 1024]
        [--direct-io-reads] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HEADER = 28


def drop_caches() -> None:
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def kv_write(d: Path, n: int, size: int, payload: bytes) -> float:
    d.mkdir(parents=True, exist_ok=True)
    header = b"K" * HEADER
    t = time.perf_counter()
    for i in range(n):
        p = d / f"model@1@0@{i:08x}@bfloat16"
        with open(f"{p}.tmp", "wb", buffering=0) as f:
            f.write(header)
            f.write(payload)
        os.rename(f"{p}.tmp", f"{p}.data")
    return n * size / (time.perf_counter() - t) / 1e9


def kv_read(d: Path, n: int, size: int, payload: bytes) -> tuple[float, list[float]]:
    buf = bytearray(size)
    view = memoryview(buf)
    per_file = []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        p = d / f"model@1@0@{i:08x}@bfloat16.data"
        os.stat(p)
        with open(p, "rb", buffering=0) as f:
            got = f.readinto(view[:4096])
            while got < size:
                k = f.readinto(view[got:])
                if not k:
                    break
                got += k
        per_file.append(time.perf_counter() - t)
        if got != size or view[HEADER:] != payload:
            raise SystemExit(f"kvcache read of {p} returned wrong bytes ({got} of {size})")
    return n * size / (time.perf_counter() - t0) / 1e9, per_file


def meta_ops(d: Path, m: int) -> dict[str, float]:
    d.mkdir(parents=True, exist_ok=True)
    out = {}

    def timed(name: str, fn: Callable[[int], Any]) -> None:
        t = time.perf_counter()
        for i in range(m):
            fn(i)
        out[f"{name}_per_s"] = m / (time.perf_counter() - t)

    timed("create", lambda i: os.close(os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644)))
    timed("stat", lambda i: os.stat(d / f"f{i}"))
    timed("rename", lambda i: os.rename(d / f"f{i}", d / f"g{i}"))
    timed("unlink", lambda i: os.unlink(d / f"g{i}"))
    return out


def dd(path: Path, mib: int) -> dict[str, float]:
    def run(args: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        return mib / 1024 / (time.perf_counter() - t)
    w = run(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={mib // 4}", "conv=fsync"])
    drop_caches()
    r = run(["dd", f"if={path}", "of=/dev/null", "bs=4M"])
    path.unlink()
    return {"dd_write_GiBps": w, "dd_read_cold_GiBps": r}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3


def run_kv(writer: Path, reader: Path, n: int, size: int, cold: bool) -> dict[str, float]:
    payload = os.urandom(size - HEADER)
    w = kv_write(writer, n, size, payload)
    if cold:
        drop_caches()
    r, per = kv_read(reader, n, size, payload)
    return {"write_GBps": w, "read_GBps": r, "read_p50_ms": pct(per, 0.5), "read_p99_ms": pct(per, 0.99)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--size", type=int, default=14 << 20)
    ap.add_argument("--meta", type=int, default=10000)
    ap.add_argument("--dd-mib", type=int, default=1024, help="MiB of the dd reference (a multiple of 4)")
    ap.add_argument("--dir", default=None, help="where the cluster and the local reference dir live")
    ap.add_argument("--direct-io-reads", action="store_true",
                    help="mount with fuse.direct_io_reads (read-only opens of complete files skip the page cache)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.dd_mib <= 0 or args.dd_mib % 4 or args.size <= HEADER:
        ap.error("--dd-mib must be a positive multiple of 4, --size larger than the 28-byte header")
    from curvine_py.cluster.local import LocalCluster

    base = Path(tempfile.mkdtemp(prefix="mount-bench-", dir=args.dir or "."))
    cluster = LocalCluster(base / "cluster", workers=2, master_port=None, die_with_parent=True).start()
    mounts = [base / "mnt-a", base / "mnt-b"]
    run_dir = base / "run"
    env = {**os.environ, "CURVINE_RUN_DIR": str(run_dir), "CURVINE_CLUSTER_SECRET": cluster.secret}
    if args.direct_io_reads:
        env["CURVINE_FUSE_DIRECT_IO_READS"] = "true"
    cv = str(Path(sys.executable).with_name("cv"))
    results: dict[str, Any] = {}
    try:
        for m in mounts:
            m.mkdir()
            subprocess.run([cv, "mount", str(m), "--master", cluster.master_address], check=True, env=env,
                           capture_output=True)
        local = base / "local"
        results["local"] = run_kv(local / "kv", local / "kv", args.files, args.size, cold=True)
        results["curvine"] = run_kv(mounts[0] / "kv", mounts[1] / "kv", args.files, args.size, cold=False)
        results["curvine_cold"] = run_kv(mounts[0] / "kv2", mounts[1] / "kv2", args.files, args.size, cold=True)
        results["local_meta"] = meta_ops(local / "meta", args.meta)
        results["curvine_meta"] = meta_ops(mounts[0] / "meta", args.meta)
        results["disk"] = dd(local / "dd.bin", args.dd_mib)
    finally:
        for m in mounts:
            subprocess.run([cv, "umount", str(m)], env=env, capture_output=True)
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"kvcache: {args.files} files x {args.size / (1 << 20):g} MiB (write through mount A, read through mount B)")
    print(f"{'':14} {'write GB/s':>11} {'read GB/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for k in ("local", "curvine", "curvine_cold"):
        r = results[k]
        print(f"{k:14} {r['write_GBps']:11.2f} {r['read_GBps']:10.2f} {r['read_p50_ms']:8.1f} {r['read_p99_ms']:8.1f}")
    print(f"\nmetadata: {args.meta} files, ops/s")
    print(f"{'':14} {'create':>9} {'stat':>9} {'rename':>9} {'unlink':>9}")
    for k in ("local_meta", "curvine_meta"):
        r = results[k]
        print(f"{k:14} " + " ".join(f"{r[o + '_per_s']:9.0f}" for o in ("create", "stat", "rename", "unlink")))
    d = results["disk"]
    print(f"\ndd {args.dd_mib} MiB on the local disk: write {d['dd_write_GiBps']:.2f} GiB/s, "
          f"cold read {d['dd_read_cold_GiBps']:.2f} GiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
