"""Schema 3 (master/schema.py): a schema-2 store opened by this code gets its dirents as a
WITHOUT ROWID table in listing order and its retry cache's request ids as bytes, keeping
every name, listing position and retry answer; a new store is made that way.  The retry
cache's results write an inode's times as differences (master/journal.py)."""
from __future__ import annotations

import contextlib
import errno
import sqlite3
import stat
import typing
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from curvine_py.common.types import ROOT_INO
from curvine_py.master import events, schema
from curvine_py.master.journal import Journal, decode_result, encode_result
from curvine_py.master.namespace import Namespace
from curvine_py.master.posix import Cred
from curvine_py.master.records import Mknod
from curvine_py.master.store import InodeRow
from tests.unit.test_namespace import errno_of

ROOT = Cred(0, 0, frozenset())
# PRAGMA index_list of the new dirents: its primary key (the table's own b-tree, WITHOUT
# ROWID) and two indexes; no (parent, seq) index of its own
DIRENTS_KEYS = {"sqlite_autoindex_dirents_1", "dirents_name", "dirents_ino"}
SCHEMA_2_DIRENTS = """
CREATE TABLE dirents (
  parent INTEGER NOT NULL, name TEXT NOT NULL, ino INTEGER NOT NULL, seq INTEGER NOT NULL,
  PRIMARY KEY (parent, name)
);
CREATE UNIQUE INDEX dirents_seq ON dirents(parent, seq);
CREATE INDEX dirents_ino ON dirents(ino);
"""


def mknod(j: Journal, parent: int, name: str, mode: int, rid: str = "") -> int:
    rec = Mknod(cred=ROOT, request_id=rid or uuid.uuid4().hex, parent=parent, name=name, mode=mode)
    return int(j.submit(rec)["attr"].ino)


def names(conn: sqlite3.Connection) -> list[tuple[int, int, str, int]]:
    return [tuple(r) for r in conn.execute("SELECT parent, seq, name, ino FROM dirents ORDER BY parent, seq")]


def opened(path: str | Path) -> sqlite3.Connection:
    """The store at path as a master opens it: made if new, migrated if older."""
    conn = schema.open_db(str(path))
    schema.init_db(conn, 4 << 20, 2)
    return conn


@contextlib.contextmanager
def rewound(conn: sqlite3.Connection, old: str, drop: tuple[str, ...] = (),
            version: int | None = None) -> typing.Iterator[sqlite3.Connection]:
    """Put conn's store back in an older form, in one transaction: drop the tables drop,
    run old's statements (that form's tables), let the block fill them, set
    meta.schema_version to version (if given); then close conn."""
    conn.execute("BEGIN")
    for table in drop:
        conn.execute(f"DROP TABLE {table}")
    for sql in old.split(";"):
        if sql.strip():
            conn.execute(sql)
    yield conn
    if version is not None:
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (version,))
    conn.execute("COMMIT")
    conn.close()


def schema_2_store(path: str) -> tuple[list[tuple[int, int, str, int]], str]:
    """A store as a schema-2 master left it: a directory of 50 files made through the
    journal (so the retry cache has rows), then dirents and the oplog's ids put back in
    version 2's form.  Returns its names and one retried request's id."""
    conn = opened(path)
    j = Journal(Namespace(conn, 4 << 20, 2))
    rid = uuid.uuid4().hex
    d = mknod(j, ROOT_INO, "d", stat.S_IFDIR | 0o755, rid)
    for i in range(50):
        mknod(j, d, f"f{i:03d}", stat.S_IFREG | 0o644)
    j.stop()
    made = names(conn)
    with rewound(conn, SCHEMA_2_DIRENTS, drop=("dirents",), version=2):
        conn.executemany("INSERT INTO dirents(parent, seq, name, ino) VALUES (?,?,?,?)", made)
        conn.execute("UPDATE oplog SET request_id = lower(hex(request_id)) WHERE typeof(request_id) = 'blob'")
    return made, rid


def test_a_new_store_is_schema_3(tmp_path: Path) -> None:
    conn = opened(tmp_path / "meta.db")
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name='dirents'").fetchone()[0]
    assert "WITHOUT ROWID" in sql
    assert {r[1] for r in conn.execute("PRAGMA index_list(dirents)")} == DIRENTS_KEYS
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == 3
    conn.close()


def test_a_schema_2_store_is_migrated_at_open(tmp_path: Path) -> None:
    path = str(tmp_path / "meta.db")
    made, rid = schema_2_store(path)
    conn = schema.open_db(path)
    # the journal's connection carries temporary triggers on dirents (the event feed's,
    # the cache sessions'): they must survive the table's rebuild
    conn.execute("CREATE TEMP TABLE seen (name TEXT)")
    conn.execute("CREATE TEMP TRIGGER seen_in AFTER INSERT ON dirents BEGIN INSERT INTO seen VALUES (NEW.name); END")
    assert conn.execute("SELECT typeof(request_id) FROM oplog LIMIT 1").fetchone()[0] == "text"
    schema.init_db(conn, 4 << 20, 2)
    assert "WITHOUT ROWID" in conn.execute("SELECT sql FROM sqlite_master WHERE name='dirents'").fetchone()[0]
    assert {r[1] for r in conn.execute("PRAGMA index_list(dirents)")} == DIRENTS_KEYS
    assert names(conn) == made   # every name at its listing position
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == 3
    assert {r[0] for r in conn.execute("SELECT typeof(request_id) FROM oplog")} == {"blob"}
    j = Journal(Namespace(conn, 4 << 20, 2))
    try:
        d = next(ino for parent, _, name, ino in made if parent == ROOT_INO and name == "d")
        # a retry of a request answered before the upgrade gets its first answer, no second mkdir
        again = j.submit(Mknod(cred=ROOT, request_id=rid, parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755))
        assert again["attr"].ino == d
        mknod(j, d, "new", stat.S_IFREG | 0o644)
        assert [r[0] for r in conn.execute("SELECT name FROM seen")] == ["new"]   # the trigger is there
        listed = [r[0] for r in conn.execute("SELECT name FROM dirents WHERE parent=? AND seq>0 ORDER BY seq", (d,))]
        assert listed == [f"f{i:03d}" for i in range(50)] + ["new"]
        assert j.ns.child(d, "f007") is not None and j.ns.child(d, "nope") is None
    finally:
        j.stop()
        conn.close()
    # opened again: nothing left to migrate
    conn = opened(path)
    assert len(names(conn)) == len(made) + 1
    conn.close()


def test_request_keys_are_bytes_only_for_canonical_hex() -> None:
    rid = uuid.uuid4().hex
    assert schema.request_key(rid) == bytes.fromhex(rid)
    for other in (rid.upper(), rid[:-1], "mk-1", "", "g" * 32):
        assert schema.request_key(other) == other
    assert encode_result({"freed": []}) == '{"freed":[]}'


def test_the_retry_cache_writes_times_as_differences() -> None:
    """A create's three times are one: its row holds one 19-digit number, not three; times
    in any order (atime set after mtime, ctime before) come back as they were."""
    t = 1_796_640_249_952_646_740
    made = InodeRow(4, 0o100644, 0, 0, 0, 1, t, t, t, 0, 4 << 20, 2, 1, 0, 1, "c", 5, None, b"\x02", 0, 0, None)
    text = encode_result({"attr": made})
    assert text.count(str(t)) == 1 and '"@t"' in text
    assert decode_result(text) == {"attr": made}
    odd = replace(made, atime_ns=t + 5, mtime_ns=t - 7, ctime_ns=t, target="x")
    assert decode_result(encode_result({"dirs": [odd, made]})) == {"dirs": [odd, made]}


# The event feed as schema 2 kept it: AUTOINCREMENT positions, host names as text
SCHEMA_2_EVENTS = """
CREATE TABLE events (
  pos INTEGER PRIMARY KEY AUTOINCREMENT, ts_ms INTEGER NOT NULL, kind INTEGER NOT NULL,
  parent INTEGER NOT NULL, name TEXT NOT NULL, from_name TEXT NOT NULL, ino INTEGER NOT NULL,
  size INTEGER NOT NULL, host TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_parent ON events(parent, pos);
CREATE TABLE event_hosts (ino INTEGER NOT NULL, host TEXT NOT NULL, PRIMARY KEY (ino, host)) WITHOUT ROWID;
"""
EVENT_ROWS = [   # pos, ts_ms, kind, parent, name, from_name, ino, size, host
    (4, 100, 0, 9, "a", "", 20, 5, ""), (5, 101, 3, 9, "a", "", 20, 5, "hostB"),
    (6, 102, 3, 9, "a", "", 20, 5, "hostA"), (7, 103, 0, 9, "b", "a.tmp", 21, 0, "")]


def schema_2_events(path: str, rows: list[tuple], seq: int, floor: int) -> None:
    """A store whose event feed is schema 2's: rows, sqlite_sequence at seq (the newest
    position AUTOINCREMENT gave), meta.events_floor at floor; file 20 held by both hosts."""
    with rewound(opened(path), SCHEMA_2_EVENTS, drop=("events", "event_hosts", "hosts"), version=2) as conn:
        conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?)", rows)
        conn.execute("DELETE FROM sqlite_sequence WHERE name='events'")
        conn.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('events', ?)", (seq,))
        conn.executemany("INSERT INTO event_hosts VALUES (?,?)", [(20, "hostB"), (20, "hostA")])
        conn.execute("UPDATE meta SET value=? WHERE key='events_floor'", (floor,))


def test_a_schema_2_event_feed_keeps_its_positions_and_hosts(tmp_path: Path) -> None:
    path = str(tmp_path / "meta.db")
    schema_2_events(path, EVENT_ROWS, seq=7, floor=3)
    conn = opened(path)
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name='events'").fetchone()[0]
    assert "AUTOINCREMENT" not in sql.upper() and "host_id" in sql
    assert conn.execute("SELECT count(*) FROM sqlite_sequence WHERE name='events'").fetchone()[0] == 0
    assert [tuple(r) for r in conn.execute("SELECT id, name FROM hosts")] == [(1, "hostA"), (2, "hostB")]
    # the feed answers as before: every event at its position, with its host's name
    got = [(e.position, e.kind, e.name, e.from_name, e.ino, e.size, e.time_ms, e.host)
           for e in events.read_after(conn, 9, 0, 100, 100)]
    assert got == [(p, k, n, f, i, s, t, h) for p, t, k, _, n, f, i, s, h in EVENT_ROWS]
    assert events.bounds(conn) == (3, 7) and events.next_position(conn) == 8
    assert events.hosts_of(conn, [20]) == {20: {"hostA", "hostB"}}
    assert {r[1] for r in conn.execute("PRAGMA index_list(events)")} == {"events_parent"}
    conn.close()
    conn = opened(path)   # opened again: nothing left to migrate
    assert events.bounds(conn) == (3, 7)
    conn.close()


def test_a_schema_2_event_feed_pruned_empty_keeps_its_newest_position(tmp_path: Path) -> None:
    """No rows: the floor is the newest position (what a prune leaves); a sequence past
    the floor (rows deleted by hand) becomes the floor: positions go on past it."""
    for seq, floor in ((7, 7), (9, 7)):
        path = str(tmp_path / f"meta-{seq}.db")
        schema_2_events(path, [], seq=seq, floor=floor)
        conn = opened(path)
        assert events.next_position(conn) == seq + 1
        assert events.bounds(conn) == (seq, seq)
        conn.close()


def test_a_reads_table_moves_into_the_inodes_last_read(tmp_path: Path) -> None:
    """A store (or an older master's Raft snapshot) with the reads table of last reads (ns)
    gets them as the inodes' last_read_ms, and the table goes; a read recorded for a file
    gone since moves nowhere."""
    path = str(tmp_path / "meta.db")
    conn = opened(path)
    j = Journal(Namespace(conn, 4 << 20, 2))
    a, b = (mknod(j, ROOT_INO, n, stat.S_IFREG | 0o644) for n in ("a", "b"))
    j.stop()
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name='reads'").fetchone() is None
    # back to the old form: no column, a row per read file
    with rewound(conn, "ALTER TABLE inodes DROP COLUMN last_read_ms;"
                 " CREATE TABLE reads (ino INTEGER PRIMARY KEY, last_read_ns INTEGER NOT NULL)"):
        conn.executemany("INSERT INTO reads VALUES (?, ?)", [(a, 1_700_000_000_123_456_789), (999_999, 5)])
    conn = opened(path)
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name='reads'").fetchone() is None
    got = dict(conn.execute("SELECT ino, last_read_ms FROM inodes WHERE ino IN (?, ?)", (a, b)).fetchall())
    assert got == {a: 1_700_000_000_123, b: schema.NEVER_READ_MS}
    schema.init_db(conn, 4 << 20, 2)   # once: a second open changes nothing
    assert conn.execute("SELECT last_read_ms FROM inodes WHERE ino=?", (a,)).fetchone()[0] == 1_700_000_000_123
    conn.close()


def test_names_are_found_by_their_key_and_compared_in_the_row(tmp_path: Path) -> None:
    """dirents_name holds (parent, name_key(name)), not the name; every statement that finds
    a name compares the name too, so names that share a key (here all of them: name_key
    made constant on a new store) are never lost or confused."""
    from curvine_py.master import locate
    from curvine_py.master.records import Create, Link, Rename, Unlink
    conn = opened(tmp_path / "meta.db")
    assert "name_key(name)" in conn.execute("SELECT sql FROM sqlite_master WHERE name='dirents_name'").fetchone()[0]
    conn.create_function("name_key", 1, lambda name: 7, deterministic=True)   # before any name is stored
    ns = Namespace(conn, 4 << 20, 2)
    j = Journal(ns)
    try:
        d = mknod(j, ROOT_INO, "d", stat.S_IFDIR | 0o755)
        inos = {n: mknod(j, d, n, stat.S_IFREG | 0o644) for n in ("a", "b", "c", "e.tmp")}
        assert {n: ns.lookup(ROOT, d, n).ino for n in inos} == inos
        made = j.submit(Create(cred=ROOT, parent=d, name="a", mode=0o644, lease_ms=1000, client_id="c",
                               exclusive=False))
        assert made["attr"].ino == inos["a"]   # an existing name, not a second one
        j.submit(Rename(cred=ROOT, parent=d, name="e.tmp", new_parent=d, new_name="e.data"))
        j.submit(Rename(cred=ROOT, parent=d, name="b", new_parent=d, new_name="c"))   # replaces c
        j.submit(Link(cred=ROOT, ino=inos["a"], new_parent=d, new_name="a2"))
        j.submit(Unlink(cred=ROOT, parent=d, name="a"))
        assert {r[0]: r[1] for r in conn.execute("SELECT name, ino FROM dirents WHERE parent=?", (d,))} == \
            {"c": inos["b"], "e.data": inos["e.tmp"], "a2": inos["a"]}
        assert ns.lookup(ROOT, d, "c").ino == inos["b"] and ns.lookup(ROOT, d, "a2").ino == inos["a"]
        assert [errno_of(lambda: ns.lookup(ROOT, d, gone)) for gone in ("a", "b", "e.tmp")] == [errno.ENOENT] * 3
        # Locate's two statements: the names it asks for, in a directory of colliding keys
        rows = conn.execute(locate._NAMES[locate._BRIEF].format(**locate._in_names(3)), (d, "c", "x", "a2")).fetchall()
        assert sorted((r[0], r[1]) for r in rows) == [("a2", inos["a"]), ("c", inos["b"])]
        link = int(j.submit(Mknod(cred=ROOT, parent=d, name="s", mode=stat.S_IFLNK | 0o777, target="c"))["attr"].ino)
        found = conn.execute(locate._whole_sql(4), ("x", "e.data", "s", None, d)).fetchall()
        assert [tuple(r) for r in found] == [(2, -link)]   # a symlink answers; empty files are no whole chunks
    finally:
        j.stop()


def names_indexed_whole(path: str, files: int) -> dict[str, int]:
    """A store of files files in its root whose dirents_name is the unique (parent, name)
    index (schema 3 as first made); returns their inodes by name."""
    conn = opened(path)
    j = Journal(Namespace(conn, 4 << 20, 2))
    made = {f"f{i:03d}": mknod(j, ROOT_INO, f"f{i:03d}", stat.S_IFREG | 0o644) for i in range(files)}
    j.stop()
    with rewound(conn, "DROP INDEX dirents_name; CREATE UNIQUE INDEX dirents_name ON dirents(parent, name)"):
        pass
    return made


def test_a_name_index_of_the_names_themselves_is_rebuilt_on_keys(tmp_path: Path) -> None:
    """A store whose dirents_name is the unique (parent, name) index (schema 3 as first made)
    gets the key index at open, every name still found."""
    path = str(tmp_path / "meta.db")
    made = names_indexed_whole(path, 30)
    conn = opened(path)
    assert "name_key(name)" in conn.execute("SELECT sql FROM sqlite_master WHERE name='dirents_name'").fetchone()[0]
    ns = Namespace(conn, 4 << 20, 2)
    assert {n: ns.lookup(ROOT, ROOT_INO, n).ino for n in made} == made
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_a_migration_that_fails_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    """Each migration is one transaction (schema._immediate): one that fails halfway (here
    names_by_key's new index: name_key raises on the rows it indexes, after the old index
    was dropped) leaves the old index, and the connection out of any transaction; the
    next open migrates."""
    path = str(tmp_path / "meta.db")
    made = names_indexed_whole(path, 3)

    def no_key(name: str | None) -> int:
        raise RuntimeError(f"no key for {name!r}")

    conn = schema.open_db(path)
    conn.create_function("name_key", 1, no_key, deterministic=True)
    with pytest.raises(sqlite3.OperationalError):
        schema.init_db(conn, 4 << 20, 2)
    assert not conn.in_transaction
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name='dirents_name'").fetchone()[0]
    assert "UNIQUE" in sql and "name_key" not in sql
    conn.close()
    conn = opened(path)
    assert "name_key(name)" in conn.execute("SELECT sql FROM sqlite_master WHERE name='dirents_name'").fetchone()[0]
    ns = Namespace(conn, 4 << 20, 2)
    assert {n: ns.lookup(ROOT, ROOT_INO, n).ino for n in made} == made
    conn.close()
