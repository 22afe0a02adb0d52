#!/usr/bin/env python3
"""SDK benchmark: KV-cache objects, 1 GiB sequential, and metadata ops, beside a raw socket.

Starts its own local cluster (1 master + 2 workers on loopback, data under a temp dir
on /work's disk) unless --master is given, then prints GB/s and ops/s with the ratio
to a raw Python TCP socket moving the same bytes between two processes in this run.

The cluster's secret: the started cluster's own, or (with --master) the one the usual
config says (./.curvine/curvine.toml, $CURVINE_CONF, $CURVINE_CLUSTER_SECRET).

    .venv/bin/python bench/sdk_bench.py [--master HOST:PORT] [--runs 5] [--json]
        [--kv-size 103000000] [--seq-size 1GiB] [--meta-files 2000] [--meta-clients 4]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

from curvine_py.cli import output
from curvine_py.common import config as cfgmod

KV_BYTES = 103_000_000          # KV cache of a 1,925-token Qwen2-7B prompt (BRIEF.md)
SEQ_BYTES = 1 << 30
PIECE = 4 << 20


# ---------------------------------------------------------------------- raw socket baseline
def _sink(port_q: Any, nbytes: int, rounds: int, send: bool) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(PIECE)
    view = memoryview(buf)
    data = memoryview(os.urandom(PIECE))
    for _ in range(rounds):
        left = nbytes
        while left:
            if send:
                n = conn.send(data[:min(PIECE, left)])
            else:
                n = conn.recv_into(view[:min(PIECE, left)])
            left -= n
        conn.sendall(b"k") if not send else conn.recv(1)
    conn.close()


def raw_socket(nbytes: int, rounds: int, send: bool) -> float:
    """GB/s of one TCP stream on loopback between two processes (best of rounds)."""
    q: Any = mp.Queue()
    p = mp.Process(target=_sink, args=(q, nbytes, rounds, not send))
    p.start()
    s = socket.create_connection(("127.0.0.1", q.get()))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = memoryview(os.urandom(nbytes)) if send else None
    buf = memoryview(bytearray(nbytes)) if not send else None
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        if send:
            s.sendall(payload)
            s.recv(1)
        else:
            got = 0
            while got < nbytes:
                got += s.recv_into(buf[got:], nbytes - got)
            s.sendall(b"k")
        best = max(best, nbytes / (time.perf_counter() - t) / 1e9)
    s.close()
    p.join()
    return best


# ---------------------------------------------------------------------- SDK data path
def client(master: str, secret: str | None, config_path: str | None = None) -> Any:
    """An SDK client of master; secret None: the one the usual config gives (or
    config_path's: a started cluster's, for its [tls])."""
    from curvine_py import Client
    cfg = cfgmod.load(path=config_path)
    if secret is not None:
        cfg.cluster.secret = secret
    return Client(master, config=cfg)


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def data_bench(master: str, secret: str | None, runs: int, kv_bytes: int = KV_BYTES,
               seq_bytes: int = SEQ_BYTES) -> dict[str, Any]:
    c = client(master, secret)
    c.mkdir("/bench", exist_ok=True)
    kv = os.urandom(kv_bytes)
    put = timed(lambda: c.put_bytes("/bench/kv.data", kv), runs)
    bad: list[int] = []
    get: list[float] = []   # each object is checked and dropped, as an application would
    for _ in range(runs):
        t = time.perf_counter()
        obj = c.get_bytes("/bench/kv.data")
        get.append(time.perf_counter() - t)
        if obj != kv:
            bad.append(1)
        del obj
    assert not bad, "get_bytes returned wrong bytes"
    buf = bytearray(kv_bytes)
    get_into = timed(lambda: c.get_into("/bench/kv.data", buf), runs)
    assert buf == kv

    chunk = memoryview(os.urandom(PIECE))

    def seq_write() -> None:
        with c.open("/bench/seq", "wb") as f:
            for _ in range(seq_bytes // PIECE):
                f.write(chunk)

    rbuf = bytearray(PIECE)

    def seq_read() -> None:
        with c.open("/bench/seq", "rb") as f:
            while f.readinto(rbuf):
                pass

    sw = timed(seq_write, max(1, runs // 2))
    sr = timed(seq_read, max(1, runs // 2))
    with c.open("/bench/seq", "rb") as f:
        f.readinto(rbuf)
        assert bytes(rbuf) == bytes(chunk), "sequential read returned wrong bytes"
    c.remove("/bench/seq")
    c.remove("/bench/kv.data")
    c.close()
    best = lambda ts, n: n / min(ts) / 1e9  # noqa: E731
    med = lambda ts, n: n / statistics.median(ts) / 1e9  # noqa: E731
    return {
        "kv_put_GBps": best(put, kv_bytes), "kv_put_median_GBps": med(put, kv_bytes),
        "kv_get_GBps": best(get, kv_bytes), "kv_get_median_GBps": med(get, kv_bytes),
        "kv_get_into_GBps": best(get_into, kv_bytes), "kv_get_into_ms": min(get_into) * 1e3,
        "seq_write_GBps": best(sw, seq_bytes), "seq_read_GBps": best(sr, seq_bytes),
    }


# ---------------------------------------------------------------------- metadata
def _meta_worker(master: str, secret: str | None, idx: int, n: int, q: Any, start: Any,
                 config_path: str | None) -> None:
    c = client(master, secret, config_path)
    base = f"/meta/c{idx}"
    c.mkdir(base, parents=True, exist_ok=True)
    start.wait()    # every client connected and ready: all start together
    res = {}
    t = time.perf_counter()
    for i in range(n):
        c.touch(f"{base}/f{i}")
    res["create"] = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        c.stat(f"{base}/f{i}")
    res["stat"] = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        c.rename(f"{base}/f{i}", f"{base}/g{i}")
    res["rename"] = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        c.remove(f"{base}/g{i}")
    res["unlink"] = time.perf_counter() - t
    c.rmdir(base)
    q.put(res)
    c.close()


def meta_bench(master: str, secret: str | None, clients: int, n: int,
               config_path: str | None = None) -> dict[str, float]:
    # spawned, not forked: this process has run a gRPC client, and a forked child creating
    # its own channel once hung for 10 minutes (gRPC is not fork-safe)
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    start = ctx.Barrier(clients + 1)
    procs = [ctx.Process(target=_meta_worker, args=(master, secret, i, n, q, start, config_path))
             for i in range(clients)]
    for p in procs:
        p.start()
    start.wait(timeout=120)
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return {f"{op}_per_s": clients * n / max(r[op] for r in results) for op in ("create", "stat", "rename", "unlink")}


# ---------------------------------------------------------------------- main
def size(text: str) -> int:
    try:
        return cfgmod.parse_size(text)
    except Exception:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--master")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--kv-size", type=size, default=KV_BYTES,
                    help="bytes of the KV-cache object (default 103 MB, BRIEF.md's prompt)")
    ap.add_argument("--seq-size", type=size, default=SEQ_BYTES,
                    help="bytes of the sequential file, a multiple of 4 MiB (default 1 GiB)")
    ap.add_argument("--meta-files", type=int, default=2000, help="files per metadata client")
    ap.add_argument("--meta-clients", type=int, default=4)
    ap.add_argument("--dir", help="cluster directory (default: a temp dir under the current dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.seq_size <= 0 or args.seq_size % PIECE or args.kv_size <= 0:
        ap.error("--kv-size must be positive, --seq-size a positive multiple of 4 MiB")
    cluster, tmp = None, None
    master, secret = args.master, None
    try:
        if master is None:
            from curvine_py.cluster.local import LocalCluster
            tmp = tempfile.mkdtemp(prefix="bench-", dir=args.dir or ".")
            cluster = LocalCluster(tmp, workers=2, master_port=None, die_with_parent=True).start()
            master, secret = cluster.master_address, cluster.secret
        out: dict[str, Any] = {"raw_socket_send_GBps": raw_socket(args.kv_size, 3, send=True),
                               "raw_socket_recv_GBps": raw_socket(args.kv_size, 3, send=False)}
        out.update(data_bench(master, secret, args.runs, args.kv_size, args.seq_size))
        out.update(meta_bench(master, secret, args.meta_clients, args.meta_files))
        out["kv_get_vs_raw"] = out["kv_get_into_GBps"] / out["raw_socket_recv_GBps"]
        out["kv_put_vs_raw"] = out["kv_put_GBps"] / out["raw_socket_send_GBps"]
    finally:
        if cluster is not None:
            cluster.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    output.print_figures(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
