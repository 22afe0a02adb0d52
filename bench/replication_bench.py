#!/usr/bin/env python3
"""Two replicas, two ways: a chain (client -> A -> B) against the client writing A and B itself.

Runs both strategies alternately on the same two workers (a local cluster it starts, or
--master) with the same 4 MiB blocks, and prints GB/s of acknowledged two-copy data and
the client's CPU seconds per GB: the measurement behind the writer's choice of a chain.

    .venv/bin/python bench/replication_bench.py [--blocks 64] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import resource
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
    args = ap.parse_args()
    from curvine_py import Client
    cluster = None
    master = args.master
    if master is None:
        from curvine_py.localcluster import LocalCluster
        cluster = LocalCluster(tempfile.mkdtemp(prefix="repl-bench-", dir="."), workers=2).start()
        master = cluster.master_address
    try:
        c = Client(master)
        a, b = [w.address for w in c.report().workers][:2]
        io = c.core.io
        data = memoryview(os.urandom(BLOCK))
        pool = ThreadPoolExecutor(4)
        next_id = [1 << 40]

        def ids(n: int) -> list[int]:
            first = next_id[0]
            next_id[0] += n
            return list(range(first, first + n))

        def chain() -> None:   # two blocks in flight, each client -> A -> B (or B -> A)
            futs = [pool.submit(io.write_block, [a, b] if i % 2 else [b, a], bid, data)
                    for i, bid in enumerate(ids(args.blocks))]
            for f in futs:
                assert len(f.result()[0]) == 2

        def fan_out() -> None:  # the client sends every block to A and to B itself
            futs = []
            for bid in ids(args.blocks):
                futs.append(pool.submit(io.write_block, [a], bid, data))
                futs.append(pool.submit(io.write_block, [b], bid + (1 << 39), data))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
