#!/usr/bin/env python3
"""Metadata calls through gRPC and through the framed channel, side by side.

Starts a local cluster (1 master + 1 worker as processes; or uses --master) and makes
the same calls in this process through the master's gRPC service (``GrpcMaster`` below:
the same requests on a stub; clients no longer use gRPC) and through a MasterClient
(frames, the clients' transport): GetAttr, Lookup, and a Create + Unlink pair (a pair counts as two calls), with
1 and 4 threads, the two transports alternating.  Prints µs per call (a thread's wall
time per call), calls/s (all threads), this process's and the master's CPU µs per call,
and the frames/gRPC ratio.  Figures only; nothing is asserted.

    .venv/bin/python bench/meta_rpc_bench.py [--calls 3000] [--rounds 2] [--master HOST:PORT]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
import typing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from curvine_py.client.metaclient import MasterClient  # noqa: E402
from curvine_py.common.config import ClientConfig, Config  # noqa: E402
from curvine_py.common.rpc import channel  # noqa: E402
from curvine_py.pb import curvine_pb2 as pb  # noqa: E402
from curvine_py.pb import curvine_pb2_grpc as pb_grpc  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int | None) -> float:
    """CPU seconds of another process (the master), 0 when unknown."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class GrpcMaster:
    """The four calls below over gRPC: MasterClient's requests, sent on a gRPC stub."""

    def __init__(self, address: str, cfg: ClientConfig, secret: str) -> None:
        self._requests = MasterClient(address, cfg, secret)   # request builders only: never called
        self._channel = channel(address, secret)
        self._stub = pb_grpc.MasterServiceStub(self._channel)
        self._timeout = cfg.rpc_timeout_s

    def getattr(self, ino: int) -> pb.Attr:
        return self._stub.GetAttr(self._requests.getattr_request(ino), timeout=self._timeout).attr

    def lookup(self, parent: int, name: str) -> pb.Attr:
        return self._stub.Lookup(self._requests.lookup_request(parent, name), timeout=self._timeout).attr

    def create(self, parent: int, name: str, mode: int, flags: int) -> pb.OpenReply:
        return self._stub.Create(self._requests.create_request(parent, name, mode, flags), timeout=self._timeout)

    def unlink(self, parent: int, name: str) -> None:
        self._stub.Unlink(self._requests.unlink_request(parent, name), timeout=self._timeout)

    def close(self) -> None:
        self._requests.close()
        self._channel.close()


Master = typing.Union[MasterClient, GrpcMaster]


def op_getattr(m: Master, ino: int, name: str, i: int) -> int:
    m.getattr(ino)
    return 1


def op_lookup(m: Master, ino: int, name: str, i: int) -> int:
    m.lookup(1, name)
    return 1


def op_create_unlink(m: Master, ino: int, name: str, i: int) -> int:
    tmp = f"{name}.{threading.get_ident()}.{i}"
    m.create(1, tmp, 0o100644, os.O_WRONLY | os.O_CREAT)
    m.unlink(1, tmp)
    return 2


OPS: dict[str, typing.Callable[[Master, int, str, int], int]] = {
    "GetAttr": op_getattr, "Lookup": op_lookup, "Create+Unlink": op_create_unlink}


def run(m: Master, op: typing.Callable[[Master, int, str, int], int], ino: int, name: str,
        calls: int, threads: int, master_pid: int | None) -> dict[str, float]:
    """calls in total, spread over threads; returns per-call figures."""
    per_thread = max(1, calls // threads)
    done = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        op(m, ino, name, -1 - t)   # this thread's connection, outside the timing
        barrier.wait()
        n = 0
        i = 0
        while n < per_thread:
            n += op(m, ino, name, i)
            i += 1
        done[t] = n

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    c0, m0, t0 = own_cpu(), proc_cpu(master_pid), time.perf_counter()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    c1, m1 = own_cpu(), proc_cpu(master_pid)
    total = sum(done)
    return {"us": wall / (total / threads) * 1e6, "rate": total / wall,
            "cpu": (c1 - c0) / total * 1e6, "mcpu": (m1 - m0) / total * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--master", help="an existing master (else a local cluster is started)")
    ap.add_argument("--secret", default=os.environ.get("CURVINE_CLUSTER_SECRET", ""))
    ap.add_argument("--calls", type=int, default=3000, help="calls per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="measurements per cell (best is shown)")
    ap.add_argument("--threads", default="1,4")
    args = ap.parse_args()
    cluster, tmp, master_pid = None, None, None
    address, secret = args.master, args.secret
    if address is None:
        from curvine_py.cluster.local import LocalCluster
        tmp = tempfile.mkdtemp(prefix="meta-rpc-bench-")
        cluster = LocalCluster(tmp, workers=1, die_with_parent=True).start()
        address, secret, master_pid = cluster.master_address, cluster.secret, cluster.master.pid
    cfg = Config().client
    try:
        clients: dict[str, Master] = {"gRPC": GrpcMaster(address, cfg, secret),
                                      "frames": MasterClient(address, cfg, secret)}
        name = f"meta-rpc-bench-{os.getpid()}"
        frames = typing.cast(MasterClient, clients["frames"])
        ino = frames.mknod(1, name, 0o100644).ino
        clients["gRPC"].getattr(ino)
        print(f"master {address}; {args.calls} calls per cell, best of {args.rounds}; load {os.getloadavg()[0]:.1f}")
        print(f"{'op':<14}{'thr':>4} | {'gRPC µs':>8} {'calls/s':>8} {'cpu µs':>7} {'mcpu µs':>8} | "
              f"{'frames µs':>9} {'calls/s':>8} {'cpu µs':>7} {'mcpu µs':>8} | {'speed-up':>8}")
        for label, op in OPS.items():
            for threads in (int(t) for t in args.threads.split(",")):
                best: dict[str, dict[str, float]] = {}
                for _ in range(args.rounds):
                    for kind, m in clients.items():
                        r = run(m, op, ino, name, args.calls, threads, master_pid)
                        if kind not in best or r["rate"] > best[kind]["rate"]:
                            best[kind] = r
                g, f = best["gRPC"], best["frames"]
                print(f"{label:<14}{threads:>4} | "
                      f"{g['us']:>8.0f} {g['rate']:>8.0f} {g['cpu']:>7.0f} {g['mcpu']:>8.0f} | "
                      f"{f['us']:>9.0f} {f['rate']:>8.0f} {f['cpu']:>7.0f} {f['mcpu']:>8.0f} | "
                      f"{f['rate'] / g['rate']:>7.1f}x", flush=True)
        frames.unlink(1, name)
        for m in clients.values():
            m.close()
    finally:
        if cluster is not None:
            cluster.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
