"""Data-channel throughput of two real worker processes (no master, no FUSE).

Starts workers A and B (``curvine-worker`` in standalone mode, data dirs under --dir),
then over one connection writes --total bytes in --block blocks of --piece pieces to A
with chain [B], and reads them back from A (and from B).  Prints GB/s per phase.  Round 0
writes new files; later rounds rewrite the same block ids, so they overwrite recycled
block files (the steady state of a cache that evicts).  docs/worker.md has results.

    .venv/bin/python bench/worker_bench.py --dir /work/bench-tmp --total 256MiB [--depth 2]
"""
from __future__ import annotations

import argparse
import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import xxhash

from curvine_py.common import frames
from curvine_py.common.config import parse_size
from curvine_py.pb import data_pb2

Op = data_pb2.Op


def start_worker(base: str, name: str, worker_id: int, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    d = os.path.join(base, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "worker_id"), "w") as f:   # standalone mode: id from the cache file
        f.write(f"{worker_id}\n")
    cmd = [sys.executable, "-m", "curvine_py.worker.main", "--worker-master", "",
           "--worker-dirs", d, "--worker-reserve", "0", "--worker-data-port", "0",
           "--worker-rpc-port", "0", "--worker-metrics-port", "0", "--log-level", "WARNING"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline().split()   # worker <id> data <ip>:<port> rpc <ip>:<port>
    if len(line) != 6:
        raise SystemExit(f"worker {name} did not start")
    return p, int(line[3].rsplit(":", 1)[1])


def write_blocks(sock: socket.socket, data: memoryview, block: int, piece: int,
                 chain: list[data_pb2.ChainTarget], first_id: int, depth: int = 1) -> list[list[int]]:
    """Write every block; up to `depth` blocks are sent before their replies are read."""
    acks: list[list[int]] = []
    offsets = list(range(0, len(data), block))
    sums = [xxhash.xxh3_64_intdigest(data[off:off + block]) for off in offsets]
    for n, off in enumerate(offsets):
        blk = data[off:off + block]
        frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=first_id + n,
                                                    chain=chain, length=len(blk)))
        for p in range(0, len(blk), piece):
            frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_DATA), blk[p:p + piece])
        frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_COMMIT, length=len(blk), checksum=sums[n]))
        if n + 1 - len(acks) >= depth:
            acks.append(list(frames.check_reply(frames.recv_header(sock), "write").acked))
    while len(acks) < len(offsets):
        acks.append(list(frames.check_reply(frames.recv_header(sock), "write").acked))
    return acks


def read_blocks(sock: socket.socket, out: memoryview, block: int, first_id: int) -> None:
    for n, off in enumerate(range(0, len(out), block)):
        frames.send_frame(sock, data_pb2.DataHeader(op=Op.READ, block_id=first_id + n, offset=0,
                                                    length=block))
        h = frames.check_reply(frames.recv_header(sock), "read")
        frames.recv_exact_into(sock, out[off:off + h.length])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/work/worker-bench")
    ap.add_argument("--total", default="256MiB")
    ap.add_argument("--block", default="4MiB")
    ap.add_argument("--piece", default="1MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--depth", type=int, default=1,
                    help="blocks sent ahead of their commit replies (1 = wait for each reply)")
    ap.add_argument("--new-ids", action="store_true",
                    help="new block ids every round (default: rewrite the same ids, so rounds after "
                         "the first overwrite recycled block files, the steady state)")
    args = ap.parse_args()
    total, block, piece = parse_size(args.total), parse_size(args.block), parse_size(args.piece)
    os.makedirs(args.dir, exist_ok=True)
    base = tempfile.mkdtemp(dir=args.dir)
    env = dict(os.environ)
    procs = []
    try:
        a, port_a = start_worker(base, "a", 1, env)
        procs.append(a)
        b, port_b = start_worker(base, "b", 2, env)
        procs.append(b)
        src = mmap.mmap(-1, total)
        src.write(os.urandom(1 << 20) * (total >> 20))
        data = memoryview(src)
        dst = memoryview(mmap.mmap(-1, total))
        dst[:] = data   # touch it: first-touch of guest memory is slow here and not what we measure
        chain = [data_pb2.ChainTarget(ip="127.0.0.1", port=port_b, worker_id=2)]
        sock_a = frames.tune(socket.create_connection(("127.0.0.1", port_a)))
        sock_b = frames.tune(socket.create_connection(("127.0.0.1", port_b)))
        for r in range(args.rounds):
            first = 1 + r * (total // block + 1) if args.new_ids else 1
            t = time.perf_counter()
            acks = write_blocks(sock_a, data, block, piece, chain, first, args.depth)
            tw = time.perf_counter() - t
            assert all(ack == [1, 2] for ack in acks), acks[:3]
            t = time.perf_counter()
            read_blocks(sock_a, dst, block, first)
            tr = time.perf_counter() - t
            assert dst == data
            t = time.perf_counter()
            read_blocks(sock_b, dst, block, first)
            tb = time.perf_counter() - t
            kind = 'fresh files' if r == 0 or args.new_ids else 'recycled files'
            print(f"round {r} ({kind}): write A->B {total / tw / 1e9:.2f} GB/s, read A {total / tr / 1e9:.2f} GB/s, "
                  f"read B {total / tb / 1e9:.2f} GB/s", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
