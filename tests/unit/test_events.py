"""The event feed's table (master/events.py) as the journal writes it: which records make
which events, and pruning.  The end-to-end stream is tests/integration/test_watch.py."""
from __future__ import annotations

import stat
import typing
from pathlib import Path

import pytest

from curvine_py.common.types import RENAME_EXCHANGE, ROOT_INO
from curvine_py.master import events
from curvine_py.master.records import (
    Commit, Evict, HostChange, Link, Mknod, PruneEvents, Rename, ReplicaChanges, Rmdir, Unlink, Victim,
)
from tests.unit.test_namespace import NS

Row = tuple[str, int, str, str]   # kind, parent, name, from_name
KIND = {events.CREATED: "created", events.REMOVED: "removed", events.EVICTED: "evicted",
        events.REPLICA_ADDED: "added", events.REPLICA_LOST: "lost"}


@pytest.fixture
def ns(tmp_path: Path) -> typing.Iterator[NS]:
    n = NS(tmp_path)
    yield n
    n.journal.stop()


def seen(ns: NS, after: int = 0) -> list[Row]:
    rows = ns.ns.conn.execute(f"SELECT kind, parent, name, {events.FROM_NAME} FROM events e WHERE pos > ? ORDER BY pos",
                              (after,))
    return [(KIND[r[0]], r[1], r[2], r[3]) for r in rows]


def head(ns: NS) -> int:
    return events.bounds(ns.ns.conn)[1]


def written(ns: NS, parent: int, name: str) -> int:
    """A file made as a writer makes it: Create (leased), then the close's Commit."""
    made = ns.create(parent, name)
    ino = made["attr"].ino
    ns.do(Commit, ino=ino, lease_id=made["lease_id"], size=0, release=True)
    return int(ino)


def test_a_file_is_announced_at_its_close_not_at_its_create(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "d")
    made = ns.create(d, "x.tmp")
    assert seen(ns) == []                                   # a writer holds it: nothing yet
    ns.do(Commit, ino=made["attr"].ino, lease_id=made["lease_id"], size=0, release=True)
    assert seen(ns) == [("created", d, "x.tmp", "")]
    ns.do(Mknod, parent=d, name="sub", mode=stat.S_IFDIR | 0o755)
    ns.do(Rmdir, parent=d, name="sub")
    assert len(seen(ns)) == 1                               # directories make none


def test_renames_within_across_over_and_exchanged(ns: NS) -> None:
    d, e = ns.mkdir(ROOT_INO, "d"), ns.mkdir(ROOT_INO, "e")
    written(ns, d, "a")
    written(ns, d, "b")
    at = head(ns)
    ns.do(Rename, parent=d, name="a", new_parent=d, new_name="b")          # over b
    assert seen(ns, at) == [("removed", d, "b", ""), ("created", d, "b", "a")]
    at = head(ns)
    ns.do(Rename, parent=d, name="b", new_parent=e, new_name="b")          # to another directory
    assert seen(ns, at) == [("removed", d, "b", ""), ("created", e, "b", "")]
    written(ns, e, "c")
    at = head(ns)
    ns.do(Rename, parent=e, name="b", new_parent=e, new_name="c", flags=RENAME_EXCHANGE)
    assert sorted(seen(ns, at)) == [("created", e, "b", "c"), ("created", e, "c", "b")]


def test_links_unlinks_and_evictions(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "d")
    ino = written(ns, d, "f")
    at = head(ns)
    ns.do(Link, ino=ino, new_parent=d, new_name="g")
    ns.do(Unlink, parent=d, name="f")
    assert seen(ns, at) == [("created", d, "g", ""), ("removed", d, "f", "")]
    at = head(ns)
    gen = ns.ns.inode(ino).generation
    ns.do(Evict, victims=[Victim(ino, gen)])
    assert seen(ns, at) == [("evicted", d, "g", "")]


def test_prune_keeps_the_newest_and_moves_the_floor(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "d")
    for i in range(5):
        written(ns, d, f"f{i}")
    assert events.bounds(ns.ns.conn) == (0, 5)
    ns.do(PruneEvents, before_ms=0, keep=2)                  # by count
    assert events.bounds(ns.ns.conn) == (3, 5)
    assert [e.name for e in events.read_after(ns.ns.conn, d, 0, 5, 10)] == ["f3", "f4"]
    ns.do(PruneEvents, before_ms=1 << 62, keep=100)          # by age: all of them
    written(ns, d, "next")
    assert events.bounds(ns.ns.conn) == (5, 6)               # positions are never reused
    assert [(e.position, e.name) for e in events.read_after(ns.ns.conn, d, 5, 6, 10)] == [(6, "next")]


def test_replica_changes_say_only_what_the_feed_has_not_said(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "d")
    ino = written(ns, d, "f")
    ns.do(Link, ino=ino, new_parent=d, new_name="g")
    at = head(ns)
    ns.do(ReplicaChanges, changes=[HostChange(ino, "h1", True), HostChange(ino, "h2", True)])
    ns.do(ReplicaChanges, changes=[HostChange(ino, "h1", True), HostChange(ino, "h3", False)])   # said / never held
    ns.do(ReplicaChanges, changes=[HostChange(ino, "h1", False)])
    got = [(k, n) for k, _, n, _ in seen(ns, at)]
    assert got == [("added", "f"), ("added", "g"), ("added", "f"), ("added", "g"), ("lost", "f"), ("lost", "g")]
    hosts = [e.host for e in events.read_after(ns.ns.conn, d, at, head(ns), 100)]   # (stored as ids)
    assert hosts == ["h1", "h1", "h2", "h2", "h1", "h1"]
    assert events.hosts_of(ns.ns.conn, [ino]) == {ino: {"h2"}}
    ns.do(Unlink, parent=d, name="f")
    assert events.hosts_of(ns.ns.conn, [ino]) == {ino: {"h2"}}     # g still names it
    ns.do(Unlink, parent=d, name="g")
    assert events.hosts_of(ns.ns.conn, [ino]) == {}                 # gone: its removal says every host lost it


def test_a_renames_old_name_is_stored_as_what_it_does_not_share(ns: NS) -> None:
    """LMCache's x.tmp -> x.data: the row holds "tmp" beside the new name, not the 62
    characters again; the feed reads the old name back whole (and any other pair too)."""
    d = ns.mkdir(ROOT_INO, "d")
    chunk = "Qwen2.5-7B@1@0@9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822c@bfloat16"
    pairs = [(f"{chunk}.tmp", f"{chunk}.data"), ("ab", "abc"), ("pqr", "pq"), ("x", "y"), ("é.tmp", "é.data")]
    for old, _ in pairs:
        written(ns, d, old)
    at = head(ns)
    for old, new in pairs:
        ns.do(Rename, parent=d, name=old, new_parent=d, new_name=new)
    got = [(e.from_name, e.name) for e in events.read_after(ns.ns.conn, d, at, head(ns), 100)]
    assert got == pairs
    stored = [tuple(r) for r in ns.ns.conn.execute("SELECT from_name, from_prefix FROM events WHERE pos > ?", (at,))]
    assert stored == [("tmp", len(chunk) + 1), ("", 2), ("r", 2), ("x", 0), ("tmp", 2)]


def test_prune_by_age_takes_the_oldest_positions_up_to_the_first_young_event(ns: NS) -> None:
    """A new leader whose clock is behind wrote an older time after a newer one: the
    window's prefix goes, never an event younger than the window (the first young one
    stops it); the later old one goes with the next prune past it."""
    d = ns.mkdir(ROOT_INO, "d")
    for name, ms in (("a", 10), ("b", 20), ("c", 5), ("e", 30)):
        made = ns.create(d, name)
        ns.do(Commit, ino=made["attr"].ino, lease_id=made["lease_id"], size=0, release=True, now_ns=ms * 1_000_000)
    start = events.bounds(ns.ns.conn)[1] - 4
    ns.do(PruneEvents, before_ms=15, keep=100)
    assert [e.name for e in events.read_after(ns.ns.conn, d, 0, 100, 10)] == ["b", "c", "e"]
    assert events.bounds(ns.ns.conn) == (start + 1, start + 4)
    ns.do(PruneEvents, before_ms=25, keep=100)
    assert [e.name for e in events.read_after(ns.ns.conn, d, 0, 100, 10)] == ["e"]
