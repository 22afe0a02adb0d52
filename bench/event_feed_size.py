#!/usr/bin/env python3
"""The event feed's bytes in meta.db for LMCache's write pattern, in process.

Each chunk is written as LMCache's fs:// connector writes it (create ``<name>.tmp``, its
close, rename to ``<name>.data``) through Journal.submit on a real store, then the
leader's replica look announces two hosts holding it (ReplicaChanges).  That is four
events per chunk (created .tmp, created .data from .tmp, two replica_added) and two
``event_hosts`` rows, which stay for the file's life.  Printed: dbstat's payload and
pages per event (``events`` + ``events_parent``) and per file (``event_hosts`` +
``hosts``).  meta_scale.py measures the rest of meta.db (its files have no blocks, so no
replica events).  Figures only.

    .venv/bin/python bench/event_feed_size.py [--chunks 5000] [--host-len 20] [--dir /tmp]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import stat
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from curvine_py.master import schema  # noqa: E402
from curvine_py.master.journal import Journal  # noqa: E402
from curvine_py.master.namespace import Namespace  # noqa: E402
from curvine_py.master.posix import Cred  # noqa: E402
from curvine_py.master.records import Commit, Create, HostChange, Mknod, Rename, ReplicaChanges  # noqa: E402

ROOT = Cred(0, 0, frozenset())
CHUNK = 14 << 20   # a Qwen2.5-7B chunk's size


def chunk_name(i: int) -> str:
    """LMCache's <model>@<world>@<rank>@<hash>@<dtype> (62 characters with .data)."""
    return f"Qwen2.5-7B@1@0@{i:032x}{'0' * 8}@bfloat16"


def write_chunks(j: Journal, parent: int, n: int, hosts: tuple[str, str]) -> None:
    """n chunks written and renamed into place, then announced on both hosts."""
    inos = []
    for i in range(n):
        name = chunk_name(i)
        made = j.submit(Create(cred=ROOT, parent=parent, name=f"{name}.tmp", mode=0o644, lease_ms=60_000,
                               client_id="bench"))
        j.submit(Commit(cred=ROOT, ino=made["attr"].ino, lease_id=made["lease_id"], size=CHUNK, release=True,
                        client_id="bench"))
        j.submit(Rename(cred=ROOT, parent=parent, name=f"{name}.tmp", new_parent=parent, new_name=f"{name}.data"))
        inos.append(int(made["attr"].ino))
    for k in range(0, n, 500):   # (the replica look submits at most 1,000 changes a record)
        j.submit(ReplicaChanges(cred=ROOT, changes=tuple(HostChange(ino, h, True) for ino in inos[k:k + 500]
                                                         for h in hosts)))


def stored(conn: sqlite3.Connection, names: list[str]) -> tuple[int, int]:
    """(payload, pages' bytes) dbstat gives these tables and indexes (0, 0 for none)."""
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    names = [n for n in names if n in have]
    if not names:
        return 0, 0
    row = conn.execute(f"SELECT sum(payload), sum(pgsize) FROM dbstat WHERE name IN ({','.join('?' * len(names))})",
                       names).fetchone()
    return int(row[0] or 0), int(row[1] or 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=5000)
    ap.add_argument("--host-len", type=int, default=20, help="characters of each host's name (default 20)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary store goes")
    a = ap.parse_args()
    hosts = ("a" * (a.host_len - 1) + "1", "a" * (a.host_len - 1) + "2")
    d = tempfile.mkdtemp(prefix="event-feed-size-", dir=a.dir)
    try:
        conn = schema.open_db(os.path.join(d, "meta.db"))
        schema.init_db(conn, 4 << 20, 2)
        j = Journal(Namespace(conn, 4 << 20, 2))
        j.start()
        parent = j.submit(Mknod(cred=ROOT, parent=1, name="kv", mode=stat.S_IFDIR | 0o777))["attr"].ino
        write_chunks(j, parent, a.chunks, hosts)
        j.stop()
        n_events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        ev_table, _ = stored(conn, ["events"])
        ev_index, _ = stored(conn, ["events_parent"])
        ev_pages = stored(conn, ["events", "events_parent"])[1]
        eh_payload, eh_pages = stored(conn, ["event_hosts", "hosts", "sqlite_autoindex_hosts_1"])
        print(f"{a.chunks} chunks, {n_events} events, hosts of {a.host_len} characters")
        print(f"per event: payload {(ev_table + ev_index) / n_events:.1f} B (table {ev_table / n_events:.1f},"
              f" index {ev_index / n_events:.1f}), pages {ev_pages / n_events:.1f} B")
        print(f"per file (event_hosts, hosts): payload {eh_payload / a.chunks:.1f} B,"
              f" pages {eh_pages / a.chunks:.1f} B")
        conn.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
