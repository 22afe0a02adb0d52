#!/usr/bin/env python3
"""What the mount's Prometheus metrics cost: the same pool through two mounts, metrics on and off.

Starts a local cluster (1 master + 2 workers, data under --dir) and mounts it twice on
this host: one mount serving /metrics (``fuse.metrics_port`` set: every FUSE request
timed, bytes and lookups counted), one with ``fuse.metrics_port = 0`` (the request path
without them).  Each round runs ``cv bench``'s kvcache write and read (LMCache's
pattern, every byte verified) and its metadata ops through both mounts, in alternating
order, and the script prints the median of each figure per mount and the ratio on/off
(1.00 = no cost; below 1 for GB/s and ops/s = metrics cost that much).

    .venv/bin/python bench/metrics_cost.py [--files 16] [--size 14MiB] [--meta 2000] [--rounds 5] [--json]
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
from pathlib import Path
from typing import Any

from curvine_py.cli.bench.workloads import Plan, drop_caches, kv_read, kv_write, meta_ops
from curvine_py.common.config import parse_size
from curvine_py.cluster.local import LocalCluster
from curvine_py.cluster.processes import free_ports

MODES = ("on", "off")
FIGURES = ("write_GBps", "read_GBps", "stat_per_s", "create_per_s")


def mount(cv: str, mnt: Path, cluster: LocalCluster, env: dict[str, str], metrics_port: int) -> None:
    mnt.mkdir()
    subprocess.run([cv, "mount", str(mnt), "--master", cluster.master_address], check=True, capture_output=True,
                   env={**env, "CURVINE_FUSE_METRICS_PORT": str(metrics_port)})


def one_round(mnt: Path, plan: Plan, meta: int, r: int) -> dict[str, float]:
    d = mnt / f"r{r}"
    d.mkdir()
    out = {"write_GBps": kv_write(d, plan)["write_GBps"]}
    drop_caches()
    out["read_GBps"] = kv_read(d, plan)["read_GBps"]
    ops = meta_ops(d, Plan(workloads=["meta"], meta_files=meta, seed=r))
    out["stat_per_s"], out["create_per_s"] = ops["stat_per_s"], ops["create_per_s"]
    shutil.rmtree(d)
    return out


def run(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    cluster = LocalCluster(base / "cluster", workers=2, extra_master_flags=("--master-heartbeat-ms", "200"),
                           die_with_parent=True).start()
    env = {**os.environ, "CURVINE_RUN_DIR": str(base / "run"), "CURVINE_CLUSTER_SECRET": cluster.secret}
    cv = str(Path(sys.executable).with_name("cv"))
    mnts = {m: base / f"mnt-{m}" for m in MODES}
    plan = Plan(workloads=["kvcache"], files=args.files, file_size=parse_size(args.size),
                writers=args.writers, readers=args.readers)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        mount(cv, mnts["on"], cluster, env, free_ports(1, "127.0.0.1")[0])
        mount(cv, mnts["off"], cluster, env, 0)
        for m in MODES:
            one_round(mnts[m], plan, args.meta, -1)     # warm-up: first-touch costs out of the way
        for r in range(args.rounds):
            for m in (MODES if r % 2 == 0 else MODES[::-1]):
                results[m].append(one_round(mnts[m], plan, args.meta, r))
    finally:
        for mnt in mnts.values():
            if mnt.exists():
                subprocess.run([cv, "umount", str(mnt)], env=env, capture_output=True)
        cluster.stop()
    medians = {m: {f: statistics.median(x[f] for x in results[m]) for f in FIGURES} for m in MODES}
    ratio = {f: medians["on"][f] / medians["off"][f] for f in FIGURES}
    return {"rounds": results, "median": medians, "on_over_off": ratio}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=16, help="KV chunks per round")
    ap.add_argument("--size", default="14MiB", help="chunk size (Qwen2.5-7B: 14 MiB)")
    ap.add_argument("--writers", type=int, default=1, help="threads writing chunks (LMCache's put pool)")
    ap.add_argument("--readers", type=int, default=1, help="threads reading chunks (its retrieve)")
    ap.add_argument("--meta", type=int, default=2000, help="files of the metadata ops per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the cluster lives (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="metrics-cost-", dir=args.dir))
    try:
        res = run(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{'figure':<14}{'metrics on':>12}{'metrics off':>13}{'on/off':>8}")
    for f in FIGURES:
        print(f"{f:<14}{res['median']['on'][f]:>12.3f}{res['median']['off'][f]:>13.3f}{res['on_over_off'][f]:>8.3f}")
    print(f"medians of {args.rounds} rounds; {args.files} x {args.size} chunks, {args.meta} metadata files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
