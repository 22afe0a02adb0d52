#!/usr/bin/env python3
"""Short-circuit read benchmark: a local directory vs a local replica's block files vs the network.

Starts a local cluster (1 master + 2 workers) in a temp dir under --dir, writes one
KV-cache-sized object (103 MB, two replicas) and the same bytes as a plain file in the
same directory, then reads each into one reused buffer (page cache warm, as a KV reader
sees it right after another replica wrote it):

* local dir: ``readinto`` of the plain file (the physical limit of this path);
* short-circuit: ``get_into`` by a client whose host identity is worker 0's host, so
  worker 0's replicas are read from their block files (verified with the .meta checksums);
* network: ``get_into`` with ``client.short_circuit = false`` (the framed TCP channel).

    .venv/bin/python bench/shortcircuit_bench.py [--runs 7] [--size 103000000] [--dir /dev/shm] [--json]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

from curvine_py.cli import output

KV_BYTES = 103_000_000


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def local_dir(path: str, data: bytes, buf: bytearray, runs: int) -> list[float]:
    with open(path, "wb") as f:
        f.write(data)
    view = memoryview(buf)

    def read() -> None:
        with open(path, "rb", buffering=0) as f:
            got = 0
            while got < len(data):
                got += f.readinto(view[got:])  # type: ignore[operator]
    read()
    ts = timed(read, runs)
    assert buf == data, "local read returned wrong bytes"
    os.unlink(path)
    return ts


def sdk_read(master: str, secret: str, host: str, short_circuit: bool, data: bytes, buf: bytearray,
             runs: int) -> tuple[list[float], dict[str, int]]:
    from curvine_py.common.config import Config
    from curvine_py.sdk import Client
    cfg = Config()
    cfg.cluster.secret = secret
    cfg.client.host = host
    cfg.client.short_circuit = short_circuit
    c = Client(master, config=cfg)
    try:
        c.get_into("/bench/kv.data", buf)   # warm: connections, block locations, file paths
        ts = timed(lambda: c.get_into("/bench/kv.data", buf), runs)
        assert buf == data, "get_into returned wrong bytes"
        stats = c.core.paths.shortcircuit.stats() if c.core.paths.shortcircuit else {}
        return ts, stats
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--size", type=int, default=KV_BYTES,
                    help="bytes of the object (default 103 MB, BRIEF.md's prompt)")
    ap.add_argument("--dir", help="where the cluster and the local file live (default: the current dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.size <= 0 or args.runs <= 0:
        ap.error("--size and --runs must be positive")
    from curvine_py import Client
    from curvine_py.cluster.local import LocalCluster
    tmp = tempfile.mkdtemp(prefix="bench-sc-", dir=args.dir or ".")
    cluster = LocalCluster(tmp, workers=2, master_port=None, die_with_parent=True).start()
    try:
        data = os.urandom(args.size)
        from curvine_py.common.config import Config
        cfg = Config()
        cfg.cluster.secret = cluster.secret
        w = Client(cluster.master_address, config=cfg)
        w.mkdir("/bench", exist_ok=True)
        w.put_bytes("/bench/kv.data", data)
        w.close()
        buf = bytearray(args.size)
        out: dict[str, Any] = {}
        series = {
            "local_dir": local_dir(os.path.join(tmp, "plain.data"), data, buf, args.runs),
            "short_circuit": None, "network": None,
        }
        args_ = (cluster.master_address, cluster.secret, cluster.worker_host(0))
        series["short_circuit"], sc_stats = sdk_read(*args_, True, data, buf, args.runs)
        series["network"], _ = sdk_read(*args_, False, data, buf, args.runs)
        assert sc_stats.get("reads", 0) > 0 and sc_stats.get("fallbacks", 1) == 0, sc_stats
        for name, ts in series.items():
            out[f"{name}_GBps"] = args.size / min(ts) / 1e9
            out[f"{name}_median_GBps"] = args.size / statistics.median(ts) / 1e9
            out[f"{name}_ms"] = min(ts) * 1e3
        out["short_circuit_vs_local"] = out["short_circuit_GBps"] / out["local_dir_GBps"]
        out["short_circuit_vs_network"] = out["short_circuit_GBps"] / out["network_GBps"]
        out["short_circuit_median_vs_local"] = out["short_circuit_median_GBps"] / out["local_dir_median_GBps"]
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)   # ~200 MB of blocks, maybe in RAM (/dev/shm)
    output.print_figures(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
