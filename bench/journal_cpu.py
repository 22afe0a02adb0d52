#!/usr/bin/env python3
"""The master's CPU per mutation, in process: Journal.submit on a real store in a temp dir.

What a mount's create, rename and unlink cost the master once the call reached it: the
same records the service submits (a request id each, so a retry-cache row each; the cache
sessions' change tracking on, as a serving master has it), applied one at a time by the
caller's thread as a lone client's are.  For each op it prints the CPU µs per call
(``time.process_time``), the SQL statements per call (sqlite3's trace callback; a
trigger's statements count too) and, in a second pass with the WAL's auto-checkpoint off,
the WAL pages each commit wrote (the WAL's growth / (page size + 24)).  With --process,
the same ops through the SDK's MasterClient (frames) on a real master process (a local
cluster of one master and one worker): the master's CPU per call from /proc (utime +
stime), and the calls' wall time.  Figures only.

    .venv/bin/python bench/journal_cpu.py [--files 2000] [--rounds 3] [--dir /tmp] [--process]
"""
from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import tempfile
import time
import uuid
from collections import Counter
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from curvine_py.master import schema  # noqa: E402
from curvine_py.master.journal import Journal  # noqa: E402
from curvine_py.master.namespace import Namespace  # noqa: E402
from curvine_py.master.posix import Cred  # noqa: E402
from curvine_py.master.records import (  # noqa: E402
    Allocate, Commit, CommitBlock, Create, Mknod, Record, Rename, Unlink,
)
from curvine_py.master.store import Result  # noqa: E402

USER = Cred(1000, 1000, frozenset())
OPS = ["create", "allocate", "commit", "rename", "unlink"]   # --empty: no allocate, commit (cv bench meta's files)
BLOCK = 4 << 20   # one block of the default size (a KV chunk is one block)


def envelope() -> dict:
    """A client's envelope: its cred, a fresh request id (metaclient's uuid4 hex)."""
    return {"cred": USER, "request_id": uuid.uuid4().hex, "client_id": "bench", "now_ns": 0}


def records(op: str, parent: int, n: int, made: list[Result]) -> list[Record]:
    """The n records of one op, as LMCache's writer makes them: create x.tmp, allocate its
    block, commit it at the close, rename it to x.data; then unlink.  made: the creates' results."""
    if op == "create":
        return [Create(**envelope(), parent=parent, name=f"f{i}.tmp", mode=0o644, lease_ms=60_000, umask=0o022)
                for i in range(n)]
    if op == "allocate":
        return [Allocate(**envelope(), ino=m["attr"].ino, lease_id=m["lease_id"], count=1) for m in made]
    if op == "commit":
        return [Commit(**envelope(), ino=m["attr"].ino, lease_id=m["lease_id"], size=BLOCK, release=True,
                       blocks=(CommitBlock(m["block_ids"][0], 0, BLOCK, 7),)) for m in made]
    if op == "rename":
        return [Rename(**envelope(), parent=parent, name=f"f{i}.tmp", new_parent=parent, new_name=f"f{i}.data")
                for i in range(n)]
    return [Unlink(**envelope(), parent=parent, name=f"f{i}.data") for i in range(n)]


def open_journal(path: str) -> Journal:
    """A store and journal as the master opens them (service.py), tracking changes."""
    conn = schema.open_db(os.path.join(path, "meta.db"))
    schema.init_db(conn, 4 << 20, 2)
    journal = Journal(Namespace(conn, 4 << 20, 2))
    journal.start()
    journal.track(lambda keys, rec: None)
    return journal


def run(journal: Journal, op: str, parent: int, n: int, on_sql: Callable[[str], None] | None,
        made: list[Result]) -> float:
    """Submit the op's n records; CPU seconds per record (made: the creates' results, filled by "create")."""
    recs = records(op, parent, n, made)
    journal.conn.set_trace_callback(on_sql)
    start = time.process_time()
    results = [journal.submit(rec) for rec in recs]
    spent = time.process_time() - start
    journal.conn.set_trace_callback(None)
    if op == "create":
        made[:] = results
    if op == "allocate":
        for m, r in zip(made, results):
            m["block_ids"] = r["block_ids"]
    return spent / n


def a_round(base: str, n: int, k: int, trace: bool) -> dict[str, tuple[float, float, Counter[str]]]:
    """One store: mkdir, then n creates, renames, unlinks; per op (CPU s, statements, kinds)."""
    d = tempfile.mkdtemp(prefix="journal-cpu-", dir=base)
    try:
        journal = open_journal(d)
        parent = journal.submit(Mknod(**{**envelope(), "cred": Cred(0, 0, frozenset())}, parent=1, name=f"d{k}",
                                      mode=stat.S_IFDIR | 0o777))["attr"].ino
        out: dict[str, tuple[float, float, Counter[str]]] = {}
        made: list[Result] = []
        for op in OPS:
            seen: Counter[str] = Counter()
            cpu = run(journal, op, parent, n, (lambda s: seen.update([s.split(None, 1)[0].upper()])) if trace
                      else None, made)
            out[op] = (cpu, sum(seen.values()) / n, seen)
        journal.stop()
        journal.conn.close()
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def wal_pages(base: str, n: int) -> dict[str, float]:
    """WAL pages per commit of each op, the auto-checkpoint off meanwhile."""
    d = tempfile.mkdtemp(prefix="journal-wal-", dir=base)
    try:
        journal = open_journal(d)
        conn = journal.conn
        conn.execute("PRAGMA wal_autocheckpoint=0")
        frame = conn.execute("PRAGMA page_size").fetchone()[0] + 24
        wal = os.path.join(d, "meta.db-wal")
        parent = journal.submit(Mknod(**{**envelope(), "cred": Cred(0, 0, frozenset())}, parent=1, name="d",
                                      mode=stat.S_IFDIR | 0o777))["attr"].ino
        out = {}
        made: list[Result] = []
        for op in OPS:
            before = os.path.getsize(wal)
            run(journal, op, parent, n, None, made)
            out[op] = (os.path.getsize(wal) - before) / frame / n
        journal.stop()
        conn.close()
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process pid so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def through_a_master(base: str, n: int, rounds: int) -> None:
    """The three ops through a master process: its CPU µs per call, and µs per call of wall time."""
    from curvine_py.client.metaclient import MasterClient
    from curvine_py.cluster.local import LocalCluster
    from curvine_py.common.config import Config
    d = tempfile.mkdtemp(prefix="journal-cpu-cluster-", dir=base)
    cluster = LocalCluster(d, workers=1, die_with_parent=True).start()
    client = MasterClient(cluster.master_address, Config().client, cluster.secret)
    try:
        best: dict[str, tuple[float, float]] = {}
        for k in range(rounds):
            parent = client.mknod(1, f"d{k}", stat.S_IFDIR | 0o777).ino
            calls: dict[str, Callable[[int], object]] = {
                "create": lambda i: client.create(parent, f"f{i}.tmp", 0o100644, os.O_WRONLY | os.O_CREAT,
                                                  exclusive=True),
                "rename": lambda i: client.rename(parent, f"f{i}.tmp", parent, f"f{i}.data"),
                "unlink": lambda i: client.unlink(parent, f"f{i}.data")}
            for op, call in calls.items():
                cpu0, t0 = proc_cpu(cluster.master.pid), time.perf_counter()
                for i in range(n):
                    call(i)
                wall, cpu = (time.perf_counter() - t0) / n, (proc_cpu(cluster.master.pid) - cpu0) / n
                if op not in best or cpu < best[op][0]:
                    best[op] = (cpu, wall)
        print(f"{'op':8} {'master CPU us/call (best)':>26} {'wall us/call':>13}")
        for op, (cpu, wall) in best.items():
            print(f"{op:8} {cpu * 1e6:>26.0f} {wall * 1e6:>13.0f}")
    finally:
        client.close()
        cluster.stop()
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary stores go")
    ap.add_argument("--kinds", action="store_true", help="also print the statements' kinds per op")
    ap.add_argument("--process", action="store_true", help="through a master process instead (see above)")
    ap.add_argument("--empty", action="store_true", help="files never written: create, rename, unlink only")
    a = ap.parse_args()
    if a.empty:
        OPS[:] = [op for op in OPS if op not in ("allocate", "commit")]
    print(f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}; {a.files} files a round")
    if a.process:
        through_a_master(a.dir, a.files, a.rounds)
        return
    cpu: dict[str, list[float]] = {op: [] for op in OPS}
    stmts: dict[str, tuple[float, Counter[str]]] = {}
    for k in range(a.rounds):
        for op, (c, _, _) in a_round(a.dir, a.files, k, trace=False).items():
            cpu[op].append(c)
    for op, (_, s, kinds) in a_round(a.dir, min(a.files, 500), 0, trace=True).items():
        stmts[op] = (s, kinds)
    pages = wal_pages(a.dir, min(a.files, 500))
    print(f"{'op':8} {'CPU us/call (min / median)':>28} {'SQL statements':>15} {'WAL pages/commit':>17}")
    for op in OPS:
        xs = sorted(cpu[op])
        print(f"{op:8} {xs[0] * 1e6:>13.0f} / {xs[len(xs) // 2] * 1e6:<12.0f} {stmts[op][0]:>15.1f}"
              f" {pages[op]:>17.1f}")
        if a.kinds:
            print("         " + ", ".join(f"{k} {v / min(a.files, 500):.1f}" for k, v in stmts[op][1].most_common()))


if __name__ == "__main__":
    main()
