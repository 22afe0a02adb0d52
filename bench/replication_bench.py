#!/usr/bin/env python3
"""Two replicas, two ways: a chain (client -> A -> B) against the client writing A and B itself.

Runs both strategies alternately on the same two workers (a local cluster it starts, or
--master) with the same 4 MiB blocks, and prints GB/s of acknowledged two-copy data and
the client's CPU seconds per GB: the measurement behind the writer's choice of a chain.

The cluster's secret: the started cluster's own, or (with --master) the one the usual
config says (./.curvine/curvine.toml, $CURVINE_CONF, $CURVINE_CLUSTER_SECRET).

    .venv/bin/python bench/replication_bench.py [--blocks 64] [--rounds 3] [--dir DIR] [--master HOST:PORT]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

BLOCK = 4 << 20


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--master")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="where the local cluster lives (default: a temp dir under the current dir)")
    args = ap.parse_args()
    from curvine_py import Client
    from curvine_py.common import config as cfgmod
    from curvine_py.common.security import WRITE, BlockTokens
    cfg = cfgmod.load()
    cluster, tmp = None, None
    master = args.master
    try:
        if master is None:
            from curvine_py.cluster.local import LocalCluster
            tmp = tempfile.mkdtemp(prefix="repl-bench-", dir=args.dir or ".")
            cluster = LocalCluster(tmp, workers=2, die_with_parent=True).start()
            master, cfg.cluster.secret = cluster.master_address, cluster.secret
        c = Client(master, config=cfg)
        a, b = [w.address for w in c.report().workers][:2]
        io = c.core.io
        # The blocks go to the workers without the master: their write tokens are minted
        # here, with the secret, as the master mints them (an open cluster needs none).
        tokens = BlockTokens(cfg.cluster.secret)
        data = memoryview(os.urandom(BLOCK))
        pool = ThreadPoolExecutor(4)
        next_id = [1 << 40]

        def ids(n: int) -> list[int]:
            first = next_id[0]
            next_id[0] += n
            return list(range(first, first + n))

        def chain() -> None:   # two blocks in flight, each client -> A -> B (or B -> A)
            futs = [pool.submit(io.write_block, [a, b] if i % 2 else [b, a], bid, data, tokens.mint(bid, WRITE))
                    for i, bid in enumerate(ids(args.blocks))]
            for f in futs:
                assert len(f.result()[0]) == 2

        def fan_out() -> None:  # the client sends every block to A and to B itself
            futs = []
            for bid in ids(args.blocks):
                futs.append(pool.submit(io.write_block, [a], bid, data, tokens.mint(bid, WRITE)))
                futs.append(pool.submit(io.write_block, [b], bid + (1 << 39), data,
                                        tokens.mint(bid + (1 << 39), WRITE)))
            for f in futs:
                f.result()

        results: dict[str, list[tuple[float, float]]] = {"chain": [], "fan-out": []}
        for _ in range(args.rounds):
            for name, fn in (("chain", chain), ("fan-out", fan_out)):
                t, u = time.perf_counter(), cpu()
                fn()
                dt, du = time.perf_counter() - t, cpu() - u
                gb = args.blocks * BLOCK / 1e9
                results[name].append((gb / dt, du / gb))
        print(f"{'strategy':10} {'GB/s (2 copies acked)':>22} {'client CPU s/GB':>16}")
        for name, rs in results.items():
            best = max(r[0] for r in rs)
            print(f"{name:10} {best:22.2f} {min(r[1] for r in rs):16.2f}")
        c.close()
    finally:
        if cluster is not None:
            cluster.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
