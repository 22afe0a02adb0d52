"""What a master of a Raft group keeps on disk (master/raft.py, docs/ha.md): entries applied
once whatever PySyncObj replays, snapshots that install only when ahead, and a journal or
snapshot left unreadable by a crash set aside so that the master starts.

The journals here are written by PySyncObj's own FileJournal, the class the masters run."""
from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal

from curvine_py.common.types import ROOT_INO
from curvine_py.master import schema
from curvine_py.master.journal import Journal
from curvine_py.master.namespace import Namespace
from curvine_py.master.raft import Snapshots, _journal_problem, _keep_readable
from curvine_py.master.records import Mknod, PruneOplog, Rename


def store(path: Path) -> Journal:
    conn = schema.open_db(str(path))
    schema.init_db(conn, 4 << 20, 2, now_ns=0)
    return Journal(Namespace(conn, 4 << 20, 2))


def mkdir(j: Journal, index: int, name: str) -> object:
    rec = Mknod(parent=ROOT_INO, name=name, mode=stat.S_IFDIR | 0o755, request_id=f"r-{name}", now_ns=index)
    return j.apply_entry(index, rec.to_json())


def names(j: Journal) -> list[str]:
    return sorted(r[0] for r in j.conn.execute("SELECT name FROM dirents WHERE parent=?", (ROOT_INO,)))


def test_an_entry_is_applied_once_whatever_is_replayed(tmp_path: Path) -> None:
    j = store(tmp_path / "meta.db")
    assert mkdir(j, 5, "a")["attr"].ino > ROOT_INO
    assert mkdir(j, 5, "a") is None           # PySyncObj replaying its journal after a restart
    assert mkdir(j, 4, "older") is None       # anything at or below the stored index
    assert mkdir(j, 6, "b") is not None
    assert names(j) == ["a", "b"] and j.stored_index() == 6
    again = Journal(j.ns)                     # a restarted master reads the index back
    assert again.raft_applied == 6


def test_a_failing_op_still_advances_the_index(tmp_path: Path) -> None:
    """An op's own error (EEXIST) is its result, applied like any: the entry counts."""
    j = store(tmp_path / "meta.db")
    mkdir(j, 2, "a")
    failed = j.apply_entry(3, Mknod(parent=ROOT_INO, name="a", mode=stat.S_IFDIR | 0o755).to_json())
    assert isinstance(failed, OSError) and j.stored_index() == 3


def test_a_snapshot_installs_only_when_it_is_ahead(tmp_path: Path) -> None:
    leader = store(tmp_path / "leader.db")
    for i, name in enumerate(("a", "b", "c"), start=2):
        mkdir(leader, i, name)
    leader.apply_entry(5, PruneOplog(before_ms=0, now_ns=5).to_json())
    snap = str(tmp_path / "raft.snapshot")
    Snapshots(str(tmp_path / "leader.db"), leader).save(snap, ("entry", "entry", {"members"}))

    wiped = store(tmp_path / "wiped.db")       # a follower whose data directory was wiped
    assert Snapshots(str(tmp_path / "wiped.db"), wiped).load(snap) == ("entry", "entry", {"members"})
    assert names(wiped) == ["a", "b", "c"] and wiped.raft_applied == 5
    assert wiped.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert mkdir(wiped, 6, "d") is not None    # and it goes on applying the log after it

    ahead = store(tmp_path / "ahead.db")       # a restart: its store applied more than the snapshot
    for i, name in enumerate(("a", "b", "c", "x", "y"), start=2):
        mkdir(ahead, i, name)
    Snapshots(str(tmp_path / "ahead.db"), ahead).load(snap)
    assert names(ahead) == ["a", "b", "c", "x", "y"] and ahead.raft_applied == 6


def test_an_older_masters_snapshot_gets_this_versions_tables(tmp_path: Path) -> None:
    """A rolling upgrade: the leader still runs a version without the event feed's tables
    (and counter); a newer follower installs its snapshot and goes on applying records
    that write them."""
    old = store(tmp_path / "old.db")
    mkdir(old, 2, "a")
    old.conn.execute("DROP TABLE events")
    old.conn.execute("DROP TABLE event_hosts")
    old.conn.execute("DELETE FROM meta WHERE key='events_floor'")
    snap = str(tmp_path / "raft.snapshot")
    Snapshots(str(tmp_path / "old.db"), old).save(snap, ("entry", "entry", {"members"}))
    new = store(tmp_path / "new.db")
    Snapshots(str(tmp_path / "new.db"), new).load(snap)
    assert names(new) == ["a"]
    tables = {r[0] for r in new.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"events", "event_hosts"} <= tables
    assert new.conn.execute("SELECT value FROM meta WHERE key='events_floor'").fetchone() is not None
    made = new.apply_entry(3, Mknod(parent=ROOT_INO, name="f.tmp", mode=stat.S_IFREG | 0o644, now_ns=3).to_json())
    assert not isinstance(made, OSError), made
    moved = new.apply_entry(4, Rename(parent=ROOT_INO, name="f.tmp", new_parent=ROOT_INO, new_name="f",
                                      now_ns=4).to_json())
    assert not isinstance(moved, OSError), moved                     # a rename into place: an event
    assert names(new) == ["a", "f"] and new.conn.execute("SELECT count(*) FROM events").fetchone()[0] >= 1


def _journal(path: Path, entries: int) -> None:
    j = FileJournal(str(path))
    for i in range(1, entries + 1):
        j.add(b"\x00command-%d" % i, i, 1)
    j._destroy()


def test_a_journal_pysyncobj_wrote_is_readable(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    assert _journal_problem(str(path)) == ""          # none yet: PySyncObj makes one
    _journal(path, 50)
    assert _journal_problem(str(path)) == ""


@pytest.mark.parametrize("damage, why", [
    (lambda d: b"", "no journal header"),                          # created, never written (a crash)
    (lambda d: d[:30], "no journal header"),
    (lambda d: d[:36] + struct.pack("<I", len(d) + 100) + d[40:], "outside the file"),
    (lambda d: d[:44] + b"\xff" * 4 + d[48:], "follows"),          # an index torn
    (lambda d: d[:40] + struct.pack("<I", 3) + d[44:], "broken record"),
])
def test_a_damaged_journal_is_named(tmp_path: Path, damage: object, why: str) -> None:
    path = tmp_path / "raft.journal"
    _journal(path, 5)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    assert why in _journal_problem(str(path))


def test_unreadable_files_are_set_aside_and_a_bad_snapshot_takes_its_journal(tmp_path: Path) -> None:
    journal, snapshot = tmp_path / "raft.journal", tmp_path / "raft.snapshot"
    _journal(journal, 5)
    journal.write_bytes(journal.read_bytes()[:30])
    _keep_readable(str(journal), str(snapshot))
    assert not journal.exists() and len(list(tmp_path.glob("raft.journal.unreadable-*"))) == 1

    _journal(journal, 5)                               # a good journal, but its snapshot is empty
    snapshot.write_bytes(b"")
    _keep_readable(str(journal), str(snapshot))
    assert not journal.exists() and not snapshot.exists()
    assert len(list(tmp_path.glob("raft.snapshot.unreadable-*"))) == 1

    _journal(journal, 5)                               # nothing wrong: nothing moves
    before = sorted(os.listdir(tmp_path))
    _keep_readable(str(journal), str(snapshot))
    assert sorted(os.listdir(tmp_path)) == before
