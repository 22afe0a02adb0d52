#!/usr/bin/env python3
"""What eviction costs the kvcache write throughput: an empty pool versus a full one.

Starts a local cluster (1 master + 2 workers, --capacity per worker, two replicas, data
under --dir) and mounts it.  Each run writes --files LMCache chunks (``cv bench``'s
kvcache writer: ``.tmp``, 28-byte header, payload in one write, close, rename) into
the empty pool, then fills the pool past its high watermark, then writes --files more
chunks while the master evicts least recently used chunks to make room.  Prints the
write GB/s of both phases (median of --runs; a fresh cluster per run) and their ratio.

    .venv/bin/python bench/eviction_bench.py [--capacity 1GiB] [--files 16] [--runs 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from curvine_py.cli.bench.workloads import Plan, kv_write
from curvine_py.common.config import parse_size
from curvine_py.cluster.local import LocalCluster

MiB = 1 << 20


def phase(directory: Path, files: int, size: int, seed: int) -> float:
    """Write files chunks into directory; returns GB/s (open to rename, as cv bench measures)."""
    plan = Plan(workloads=["kvcache"], files=files, file_size=size, seed=seed)
    return kv_write(directory, plan)["write_GBps"]


def one_run(base: Path, capacity: int, files: int, size: int) -> dict[str, Any]:
    cluster = LocalCluster(base / "cluster", workers=2, capacity=capacity,
                           extra_master_flags=("--master-heartbeat-ms", "200"), die_with_parent=True).start()
    mnt = base / "mnt"
    mnt.mkdir()
    env = {**os.environ, "CURVINE_RUN_DIR": str(base / "run"), "CURVINE_CLUSTER_SECRET": cluster.secret}
    cv = str(Path(sys.executable).with_name("cv"))
    try:
        subprocess.run([cv, "mount", str(mnt), "--master", cluster.master_address], check=True, env=env,
                       capture_output=True)
        phase(mnt / "warmup", files, size, 0)     # first-touch costs (fresh block files, buffers) out of the way
        shutil.rmtree(mnt / "warmup")
        time.sleep(1)                             # deletes reach the workers: the pool is empty again
        empty = phase(mnt / "empty", files, size, 1)
        filled = 0
        while (rep := cluster.report()) is not None and rep.evicted_files == 0:   # fill past the watermark
            filled += 1
            phase(mnt / f"fill{filled}", files, size, 100 + filled)
        time.sleep(1)
        full = phase(mnt / "full", files, size, 2)
        rep = cluster.report()
        assert rep is not None
        return {"empty_GBps": empty, "full_GBps": full, "evicted_files": rep.evicted_files,
                "evicted_bytes": rep.evicted_bytes, "pool_used": rep.used, "pool_capacity": rep.capacity}
    finally:
        subprocess.run([cv, "umount", str(mnt)], env=env, capture_output=True)
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", default="1GiB", help="capacity of each worker (two workers, two replicas)")
    ap.add_argument("--files", type=int, default=16, help="chunks per timed phase")
    ap.add_argument("--size", default="14MiB", help="chunk size (Qwen2.5-7B: 14 MiB)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where clusters live (default: a temp dir here)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    capacity, size = parse_size(args.capacity), parse_size(args.size)
    runs = []
    for _ in range(args.runs):
        base = Path(tempfile.mkdtemp(prefix="evict-bench-", dir=args.dir or "."))
        try:
            runs.append(one_run(base, capacity, args.files, size))
        finally:
            shutil.rmtree(base, ignore_errors=True)
    empty = statistics.median(r["empty_GBps"] for r in runs)
    full = statistics.median(r["full_GBps"] for r in runs)
    summary = {"capacity_per_worker": capacity, "chunk": size, "files": args.files, "runs": runs,
               "empty_GBps": empty, "full_GBps": full, "full_over_empty": full / empty if empty else 0.0}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"kvcache write through the mount: {args.files} x {size // MiB} MiB chunks, "
          f"2 workers x {capacity // MiB} MiB, 2 replicas, median of {args.runs}")
    print(f"  empty pool        {empty:6.3f} GB/s   runs {[round(r['empty_GBps'], 3) for r in runs]}")
    print(f"  full (evicting)   {full:6.3f} GB/s   runs {[round(r['full_GBps'], 3) for r in runs]}")
    print(f"  full / empty      {full / empty if empty else 0:6.2f}")
    print(f"  evicted per run   {[r['evicted_files'] for r in runs]} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
