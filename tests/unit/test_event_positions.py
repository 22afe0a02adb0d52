"""The event feed's positions (master/events.py next_position) are never reused: not after
the table was pruned empty and the master restarted, nor on a follower that installed a
Raft snapshot of such a store.  A watcher resumes from its last position; a position
handed out twice would give it a later event as one it has seen.  And they come from no
AUTOINCREMENT (no sqlite_sequence page written per commit with an event)."""
from __future__ import annotations

import stat
from pathlib import Path

from curvine_py.common.types import ROOT_INO
from curvine_py.master import events, schema
from curvine_py.master.journal import Journal
from curvine_py.master.namespace import Namespace
from curvine_py.master.raft import Snapshots
from curvine_py.master.records import Commit, Create, HostChange, Mknod, PruneEvents, ReplicaChanges
from tests.unit.test_namespace import NS
from tests.unit.test_schema_v3 import EVENT_ROWS, schema_2_events


def written(ns: NS, parent: int, name: str) -> int:
    """A file made as a writer makes it (create, close): one CREATED event."""
    made = ns.create(parent, name)
    ns.do(Commit, ino=made["attr"].ino, lease_id=made["lease_id"], size=0, release=True)
    return int(made["attr"].ino)


def positions(conn: object, parent: int) -> list[tuple[int, str, str]]:
    return [(e.position, e.name, e.host) for e in events.read_after(conn, parent, 0, 1 << 62, 100)]  # type: ignore[arg-type]


def test_positions_stay_monotonic_after_the_table_is_pruned_empty_and_the_master_restarts(tmp_path: Path) -> None:
    ns = NS(tmp_path)
    try:
        d = ns.mkdir(ROOT_INO, "d")
        for i in range(3):
            written(ns, d, f"f{i}")
        assert events.bounds(ns.ns.conn) == (0, 3)
        ns.do(PruneEvents, before_ms=1 << 62, keep=0)   # every event goes
        assert ns.ns.conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0
        assert events.bounds(ns.ns.conn) == (3, 3)
        # no AUTOINCREMENT: nothing but the rows and the floor keeps the positions
        assert ns.ns.conn.execute("SELECT count(*) FROM sqlite_master WHERE name='sqlite_sequence'").fetchone()[0] == 0
    finally:
        ns.journal.stop()
        ns.ns.conn.close()
    again = NS(tmp_path)   # the master restarted on the same store
    try:
        assert events.bounds(again.ns.conn) == (3, 3)
        d = again.lookup(ROOT_INO, "d").ino
        written(again, d, "after")
        assert events.bounds(again.ns.conn) == (3, 4)
        assert positions(again.ns.conn, d) == [(4, "after", "")]
    finally:
        again.journal.stop()


def store(path: Path) -> Journal:
    conn = schema.open_db(str(path))
    schema.init_db(conn, 4 << 20, 2, now_ns=0)
    return Journal(Namespace(conn, 4 << 20, 2))


def test_a_follower_given_a_snapshot_of_a_table_pruned_empty_goes_on_past_it(tmp_path: Path) -> None:
    """Leader and follower apply the same entries after the snapshot: the same positions,
    past the pruned ones, and the same host ids (the event's host reads back as its name)."""
    leader = store(tmp_path / "leader.db")
    index = 1

    def apply(j: Journal, rec: object) -> dict:
        out = j.apply_entry(index, rec.to_json())   # type: ignore[attr-defined]
        assert not isinstance(out, OSError), out
        return out  # type: ignore[no-any-return]

    def on_both(rec: object, *journals: Journal) -> list[dict]:
        nonlocal index
        index += 1
        return [apply(j, rec) for j in journals]

    d = on_both(Mknod(parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755, now_ns=1), leader)[0]["attr"].ino
    for i in range(3):
        made = on_both(Create(parent=d, name=f"f{i}", mode=0o644, lease_ms=60_000, client_id="c", now_ns=2), leader)[0]
        on_both(Commit(ino=made["attr"].ino, lease_id=made["lease_id"], size=0, release=True, client_id="c",
                       now_ns=3), leader)
    on_both(PruneEvents(before_ms=1 << 62, keep=0, now_ns=4), leader)
    assert events.bounds(leader.conn) == (3, 3)
    snap = str(tmp_path / "raft.snapshot")
    Snapshots(str(tmp_path / "leader.db"), leader).save(snap, ("entry", "entry", {"members"}))
    wiped = store(tmp_path / "wiped.db")   # a follower whose data directory was wiped
    Snapshots(str(tmp_path / "wiped.db"), wiped).load(snap)
    assert events.bounds(wiped.conn) == (3, 3)
    made = on_both(Create(parent=d, name="g", mode=0o644, lease_ms=60_000, client_id="c", now_ns=5), leader, wiped)
    ino = made[0]["attr"].ino
    on_both(Commit(ino=ino, lease_id=made[0]["lease_id"], size=0, release=True, client_id="c", now_ns=6),
            leader, wiped)
    on_both(ReplicaChanges(changes=(HostChange(ino, "h2", True), HostChange(ino, "h1", True)), now_ns=7),
            leader, wiped)
    for j in (leader, wiped):
        assert positions(j.conn, d) == [(4, "g", ""), (5, "g", "h2"), (6, "g", "h1")]
        assert events.hosts_of(j.conn, [ino]) == {ino: {"h1", "h2"}}
    assert [tuple(r) for r in leader.conn.execute("SELECT * FROM hosts")] == \
        [tuple(r) for r in wiped.conn.execute("SELECT * FROM hosts")]
    for j in (leader, wiped):
        j.stop()
        j.conn.close()


def test_an_older_masters_snapshot_of_its_feed_is_migrated_and_goes_on_past_it(tmp_path: Path) -> None:
    """A rolling upgrade: the leader still keeps schema 2's feed (AUTOINCREMENT, host
    names); a newer follower installs its snapshot: the same events at the same positions,
    the hosts by name, and its next event after the newest the old master gave."""
    old = str(tmp_path / "old.db")
    schema_2_events(old, EVENT_ROWS, seq=9, floor=3)   # (events 8 and 9 were the last ones, pruned by hand)
    conn = schema.open_db(old)
    conn.execute("UPDATE meta SET value = 10 WHERE key = 'raft_applied'")
    conn.close()
    snap = str(tmp_path / "raft.snapshot")
    Snapshots(old, None).save(snap, ("entry", "entry", {"members"}))  # type: ignore[arg-type]
    new = store(tmp_path / "new.db")
    try:
        Snapshots(str(tmp_path / "new.db"), new).load(snap)
        assert new.raft_applied == 10
        assert [(e.position, e.host) for e in events.read_after(new.conn, 9, 0, 100, 100)] == \
            [(4, ""), (5, "hostB"), (6, "hostA"), (7, "")]
        assert events.bounds(new.conn) == (9, 9) and events.hosts_of(new.conn, [20]) == {20: {"hostA", "hostB"}}
        d = new.apply_entry(11, Mknod(parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755, now_ns=11).to_json())
        made = new.apply_entry(12, Create(parent=d["attr"].ino, name="f", mode=0o644, lease_ms=60_000, client_id="c",
                                          now_ns=12).to_json())
        new.apply_entry(13, Commit(ino=made["attr"].ino, lease_id=made["lease_id"], size=0, release=True,
                                   client_id="c", now_ns=13).to_json())
        assert positions(new.conn, d["attr"].ino) == [(10, "f", "")]
    finally:
        new.stop()
        new.conn.close()
