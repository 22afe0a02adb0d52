#!/usr/bin/env python3
"""The master's cost of one Lookup that brings its directory's listing (issue 39).

A fresh reader mount's first stat in a directory sends one Lookup with listing_max and
one_block: the master lists the directory's names with their attributes, grants the
session every name and inode, and puts each one-block file's block (with a read token)
in its DirEntry.  This builds a real master service in process (its SQLite store, block
tokens with a cluster secret, two registered workers, one cache session), writes
--files one-block files into a directory through Create/AllocateBlocks/Commit, then
times Lookup handler calls plus the reply's serialization (what the framed server sends)
in four shapes: plain, one_block, with the listing, with the listing and its blocks.
Prints the median and 10th percentile per shape in µs; --profile prints the top of a
cProfile of the last shape.  Figures only; nothing is asserted.

    .venv/bin/python bench/listing_cost.py [--files 32] [--calls 3000] [--rounds 3] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
import typing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from curvine_py.common.config import Config  # noqa: E402
from curvine_py.master.service import MasterService  # noqa: E402
from curvine_py.master.sessions import LISTING_MAX  # noqa: E402
from curvine_py.pb import curvine_pb2 as pb  # noqa: E402

ROOT = 1
SHAPES: dict[str, dict[str, typing.Any]] = {
    "plain": {},
    "one_block": {"one_block": True},
    "listing": {"listing_max": LISTING_MAX},
    "listing+blocks": {"listing_max": LISTING_MAX, "one_block": True},
}


def start(tmp: str) -> MasterService:
    """A master service over tmp with block tokens on and two live workers."""
    cfg = Config()
    cfg.master.meta_dir = tmp
    cfg.cluster.secret = "listing-cost-secret"
    service = MasterService(cfg, os.path.join(tmp, "meta.db"))
    service.journal.start()
    for i in range(2):
        dirs = [pb.DataDir(path=f"/d{i}", tier="SSD", capacity=1 << 40, used=0)]
        service.RegisterWorker(pb.RegisterRequest(host=f"h{i}", ip="127.0.0.1", data_port=9000 + i,
                                                  storage_id=f"s{i}", dirs=dirs))
    return service


def populate(service: MasterService, caller: pb.Caller, files: int) -> int:
    """Directory /kv with `files` complete one-block files (1 MiB each): its inode."""
    d = service.Mknod(pb.MknodRequest(caller=caller, parent=ROOT, name="kv", mode=0o40755)).attr.ino
    for i in range(files):
        name = f"model@1@0@{i:016x}@bfloat16.data"
        f = service.Create(pb.MknodRequest(caller=caller, parent=d, name=name, mode=0o100644, open_flags=os.O_WRONLY))
        got = service.AllocateBlocks(pb.AllocateBlocksRequest(caller=caller, ino=f.attr.ino,
                                                              lease_id=f.lease_id, count=1))
        b = got.blocks[0]
        service.Commit(pb.CommitRequest(caller=caller, ino=f.attr.ino, lease_id=f.lease_id, size=1 << 20,
                                        release=True, blocks=[pb.BlockInfo(block_id=b.block_id, offset=0,
                                                                           length=1 << 20, checksum=12345 + i,
                                                                           workers=b.workers)]))
    return d


def timed(service: MasterService, request: pb.LookupRequest, calls: int) -> list[float]:
    """µs per Lookup + SerializeToString, one figure per call."""
    out = []
    clock = time.perf_counter
    sid = request.caller.session
    for i in range(calls):
        if i % 100 == 0 and not service.sessions.beat(sid, 0):   # (a lease runs out in seconds)
            raise SystemExit(f"cache session {sid} expired")
        t = clock()
        service.Lookup(request).SerializeToString()
        out.append((clock() - t) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="listing-cost-") as tmp:
        service = start(tmp)
        try:
            owner = pb.Caller(uid=0, gid=0, client_id="bench-writer")
            d = populate(service, owner, args.files)
            sid = service.open_session(pb.SessionRequest(caller=owner, lease_ms=60_000), lambda _: True).session
            caller = pb.Caller(uid=1000, gid=1000, client_id="bench-reader", session=sid)
            name = "model@1@0@0000000000000000@bfloat16.data"
            requests = {k: pb.LookupRequest(caller=caller, parent=d, name=name, **v) for k, v in SHAPES.items()}
            reply = service.Lookup(requests["listing+blocks"])
            assert reply.listed and len(reply.listing) == args.files and reply.lease_seq, reply
            assert all(e.blocks and e.blocks[0].token for e in reply.listing), "no read tokens in the listing"
            figures: dict[str, list[float]] = {k: [] for k in SHAPES}
            for _ in range(args.rounds):
                for k, r in requests.items():
                    figures[k] += timed(service, r, args.calls)
            reply = service.Lookup(requests["listing+blocks"])
            assert reply.listed and reply.lease_seq, "the listing was refused while timed"
            print(f"{args.files} files, {args.rounds} x {args.calls} calls per shape, load {os.getloadavg()}")
            for k, f in figures.items():
                q = statistics.quantiles(f, n=10)
                print(f"  {k:15s} median {statistics.median(f):7.1f} us   p10 {q[0]:7.1f}   p90 {q[-1]:7.1f}")
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                timed(service, requests["listing+blocks"], args.calls)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        finally:
            service.group.stop()


if __name__ == "__main__":
    main()
