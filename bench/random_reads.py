#!/usr/bin/env python3
"""Small random reads through the mount: 128 KiB ``pread`` at random offsets of a cold file.

Starts a local cluster (1 master + 2 workers) with its mount, writes one --size file
through the SDK, and reads --reads random, aligned --io ranges through the mount after
dropping the page cache, every byte checked: once with the client's short-circuit reads
(the replica on this host read from its block file) and once over the data channel
(``client.short_circuit = false``: what a host without a replica does), FUSE passthrough
off.  The peer is the same reads of the same bytes in a file of the local disk under
--dir.  Prints IOPS, MiB/s, p50 and p99 per case and the ratio to the local disk.

    .venv/bin/python bench/random_reads.py [--size 1GiB] [--reads 300] [--io 128KiB] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from curvine_py.cli.bench.workloads import drop_caches
from curvine_py.common.config import Config, parse_size
from curvine_py.cluster.local import LocalCluster
from curvine_py.sdk import Client

PATTERN = 64 << 20   # the file repeats one random 64 MiB pattern (it is written once, fast)


def random_reads(path: Path, size: int, io: int, reads: int, pattern: bytes, seed: int) -> dict[str, float]:
    """reads preads of io bytes at random io-aligned offsets of path (cold), verified."""
    drop_caches()
    rng = random.Random(seed)
    lat = []
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for _ in range(reads):
            off = rng.randrange(0, size // io) * io
            t = time.perf_counter()
            got = os.pread(fd, io, off)
            lat.append(time.perf_counter() - t)
            p = off % len(pattern)
            if got != (pattern[p:p + io] if p + io <= len(pattern) else (pattern * 2)[p:p + io]):
                raise SystemExit(f"{path}: wrong bytes at {off}")
        wall = time.perf_counter() - t0
    finally:
        os.close(fd)
    lat.sort()
    return {"iops": reads / wall, "MiBps": reads * io / wall / (1 << 20),
            "p50_ms": statistics.median(lat) * 1e3, "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3}


def through_mount(base: Path, short_circuit: bool, args: argparse.Namespace, pattern: bytes) -> dict[str, float]:
    size, io = parse_size(args.size), parse_size(args.io)
    c = LocalCluster(base / "cluster", workers=2, mount=str(base / "mnt"), die_with_parent=True,
                     extra_master_flags=("--master-heartbeat-ms", "200"),
                     env={"CURVINE_CLIENT_SHORT_CIRCUIT": str(short_circuit).lower(),
                          "CURVINE_FUSE_PASSTHROUGH": "false"}).start()
    try:
        cfg = Config()
        cfg.cluster.secret, cfg.client.master = c.secret, c.master_address
        with Client(master=c.master_address, config=cfg) as client:
            with client.open("/random.bin", "wb") as f:
                for _ in range(size // len(pattern)):
                    f.write(pattern)
        return random_reads(base / "mnt" / "random.bin", size, io, args.reads, pattern, 1)
    finally:
        c.stop()
        shutil.rmtree(base / "cluster", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB", help="file size (a multiple of 64 MiB)")
    ap.add_argument("--io", default="128KiB", help="bytes per read")
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--dir", default=None, help="where the cluster and the local file live (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    size = parse_size(args.size)
    if size % PATTERN:
        ap.error("--size must be a multiple of 64MiB")
    pattern = random.Random(0).randbytes(PATTERN)
    base = Path(tempfile.mkdtemp(prefix="random-reads-", dir=args.dir))
    res: dict[str, Any] = {}
    try:
        local = base / "local.bin"
        with open(local, "wb") as f:
            for _ in range(size // PATTERN):
                f.write(pattern)
        os.sync()
        res["local disk"] = random_reads(local, size, parse_size(args.io), args.reads, pattern, 1)
        local.unlink()
        res["curvine, replica here"] = through_mount(base, True, args, pattern)
        res["curvine, over the network"] = through_mount(base, False, args, pattern)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{args.reads} random {args.io} reads of a cold {args.size} file")
    print(f"{'':<28}{'IOPS':>8}{'MiB/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'vs disk':>9}")
    for name, r in res.items():
        print(f"{name:<28}{r['iops']:>8.0f}{r['MiBps']:>8.1f}{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}"
              f"{r['iops'] / res['local disk']['iops']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
