"""The event feed's table: what happened to the files of each directory, by position.

A router (docs/integrations.md) keeps an index of which host holds which KV chunk; it
needs every chunk's arrival and departure, in order, and a way to pick up where it left
off after it or the master restarted.  So the events are rows of the replicated store,
written by the journal in the same transaction (and savepoint) as the record that caused
them: a record that rolls back leaves none, and an acknowledged one cannot lose its
events.  Every master of a Raft group applies the same records in the same order and
derives the same rows, so an event's position (``next_position``: one past the newest
row and past ``meta.events_floor``, so a table pruned empty never reuses one, across a
restart, a Raft snapshot and a replay alike) is the same on every master: a watcher
resumes from its last position on whichever master leads next.  Not AUTOINCREMENT, which
wrote the ``sqlite_sequence`` table's page in every commit with an event (one WAL page in
~12 per create, rename, unlink).

What a record changed comes from temporary triggers on the journal's connection (like
the cache sessions' ``schema.track_changes``): every name added to or removed from a
directory is staged in ``temp.event_names``, and ``EventLog.record`` turns the stage into
events once the op has run:

- a name that appears for a regular file no writer holds open: ``CREATED`` (a rename within the
  directory: one ``CREATED`` with the old name in ``from_name``);
- a name that goes: ``REMOVED``, or ``EVICTED`` when an ``Evict`` record removed it;
- a ``Commit`` that releases the file (its close): ``CREATED`` for each of its names;
- an evicted UFS file keeps its name (only its cached blocks go): ``EVICTED`` too;
- a ``ReplicaChanges`` record (the leader's registry against the feed's last word, the
  ``event_hosts`` table: master/replicafeed.py): ``REPLICA_ADDED`` / ``REPLICA_LOST`` for
  each name of the file, with the host (stored as its id in ``hosts``, sent as its name).
  A file that goes takes its ``event_hosts`` rows with it (its ``removed`` or ``evicted``
  says every host lost it).

Directories and files never committed make no events.  Rows are pruned by a record
(``PruneEvents``, from the leader's housekeeping: ``master/watch.py``), never by a
master's own clock, so every master keeps the same window; ``meta.events_floor`` keeps
the newest position pruned, below which a watcher's position is too old.
"""
from __future__ import annotations

import os
import sqlite3
import stat
import threading
from dataclasses import dataclass
from typing import Any

from curvine_py.master.handlers import applies
from curvine_py.master.records import Commit, Evict, PruneEvents, Record, ReplicaChanges
from curvine_py.master.store import Result, Store
from curvine_py.pb import curvine_pb2 as pb

CREATED, REMOVED, EVICTED = pb.EVENT_CREATED, pb.EVENT_REMOVED, pb.EVENT_EVICTED
REPLICA_ADDED, REPLICA_LOST = pb.EVENT_REPLICA_ADDED, pb.EVENT_REPLICA_LOST
PRUNE_MAX_ROWS = 50_000   # rows one PruneEvents deletes at most (it holds the writer meanwhile)
STAGE = "temp.event_names"
# the next position (next_position) in the statement itself: no call of its own per record
_NEXT = ("max(ifnull((SELECT max(pos) FROM events), 0),"
         " ifnull((SELECT value FROM meta WHERE key='events_floor'), 0)) + 1")
_INSERT = ("INSERT INTO events(pos, ts_ms, kind, parent, name, from_name, from_prefix, ino, size, host_id)"
           f" VALUES ({_NEXT},?,?,?,?,?,?,?,?,?)")
# a row's old name whole (e: the events table; schema.EVENTS stores what follows the
# prefix it shares with the new name)
FROM_NAME = "CASE e.from_prefix WHEN 0 THEN e.from_name ELSE substr(e.name, 1, e.from_prefix) || e.from_name END"
_NAMES_SIZE = ("SELECT d.parent, d.name, i.size FROM dirents d JOIN inodes i ON i.ino = d.ino WHERE d.ino=?"
               " ORDER BY d.parent, d.name")
_READ = (f"SELECT e.pos, e.kind, e.name, {FROM_NAME}, e.ino, e.size, e.ts_ms, ifnull(h.name, '') FROM events e"
         " LEFT JOIN hosts h ON h.id = e.host_id WHERE e.parent=? AND e.pos>? AND e.pos<=? ORDER BY e.pos LIMIT ?")
# the newest position pruned and the newest row's (each one b-tree's last key or a meta row)
_BOUNDS = ("SELECT ifnull((SELECT value FROM meta WHERE key='events_floor'), 0),"
           " ifnull((SELECT max(pos) FROM events), 0)")
# came = 1 for a name added, 0 for one removed; the inode's mode, and whether it was ever
# committed (no writer's lease, or a generation: blocks committed), as it was then
_STAGED = "(came, parent, name, ino, mode, committed) VALUES ({0}, {1}.parent, {1}.name, {1}.ino," \
          " (SELECT mode FROM inodes WHERE ino={1}.ino)," \
          " (SELECT lease_id = 0 OR generation > 0 FROM inodes WHERE ino={1}.ino))"


@dataclass(frozen=True)
class Event:
    """One row of the table, as a watcher is sent it (hosts are added when it is sent)."""
    position: int
    kind: int
    name: str
    from_name: str
    ino: int
    size: int
    time_ms: int
    host: str = ""   # replica events: the host


@dataclass(frozen=True)
class _Staged:
    came: bool
    parent: int
    name: str
    ino: int
    mode: int | None
    committed: int | None


def install(conn: sqlite3.Connection) -> None:
    """The staging table and its triggers on conn (temporary: the journal's connection
    only, never in the file or a Raft snapshot)."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS event_names (came INTEGER NOT NULL, parent INTEGER NOT NULL,"
                 " name TEXT NOT NULL, ino INTEGER NOT NULL, mode INTEGER, committed INTEGER)")
    for name, when, rows in (
            ("in", "INSERT", [_STAGED.format(1, "NEW")]),
            ("out", "DELETE", [_STAGED.format(0, "OLD")]),
            ("moved", "UPDATE", [_STAGED.format(0, "OLD"), _STAGED.format(1, "NEW")])):
        body = " ".join(f"INSERT INTO event_names{r};" for r in rows)
        conn.execute(f"CREATE TEMP TRIGGER IF NOT EXISTS event_names_{name} AFTER {when} ON dirents"
                     f" BEGIN {body} END")


class EventLog:
    """The journal's side: events written with each record, watchers woken after commits."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        install(conn)
        self.changed = threading.Condition()
        self.generation = 0   # commits that wrote events, counted (a watcher waits only if none came since it looked)
        self._written = False

    def record(self, rec: Record, result: Any) -> None:
        """Turn what rec's op staged into rows (inside its savepoint, after the op)."""
        staged = self._take()
        if isinstance(rec, ReplicaChanges):   # its op wrote its events itself
            self._written = True
            return
        if not staged and not isinstance(rec, (Commit, Evict)):
            return
        rows = _events_of(self.conn, rec, result, staged)
        if rows:
            ts_ms = rec.now_ns // 1_000_000
            self.conn.executemany(_INSERT, [(ts_ms, kind, parent, name, *_shared(name, old), ino, size, 0)
                                            for kind, parent, name, old, ino, size in rows])
            self._written = True
        for ino in {r[4] for r in rows if r[0] == EVICTED or (r[0] == REMOVED and not _exists(self.conn, r[4]))}:
            # the file is gone, or its cached blocks are: no host holds it any more
            self.conn.execute("DELETE FROM event_hosts WHERE ino=?", (ino,))

    def _take(self) -> list[_Staged]:
        rows = self.conn.execute(f"SELECT came, parent, name, ino, mode, committed FROM {STAGE} ORDER BY rowid"
                                 ).fetchall()
        if rows:
            self.conn.execute(f"DELETE FROM {STAGE}")
        return [_Staged(bool(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def committed(self) -> None:
        """After a commit: wake the watchers if it wrote events."""
        if self._written:
            self._written = False
            with self.changed:
                self.generation += 1
                self.changed.notify_all()

    def wait(self, seen: int, timeout: float) -> None:
        """Until a commit that writes events follows generation seen, or timeout."""
        with self.changed:
            if self.generation == seen:
                self.changed.wait(timeout)


EventRow = tuple[int, int, str, str, int, int]   # kind, parent, name, from_name, ino, size


def _events_of(conn: sqlite3.Connection, rec: Record, result: Any, staged: list[_Staged]) -> list[EventRow]:
    gone = [s for s in staged if not s.came and _announced(s)]
    came = [s for s in staged if s.came]
    out: list[EventRow] = []
    renamed: dict[tuple[int, int], str] = {}
    for s in came:   # a name moved within its directory: one event, with its old name
        for g in gone:
            if g.ino == s.ino and g.parent == s.parent and (g.parent, g.ino) not in renamed:
                renamed[(g.parent, g.ino)] = g.name
                gone.remove(g)
                break
    kind = EVICTED if isinstance(rec, Evict) else REMOVED
    out += [(kind, g.parent, g.name, "", g.ino, 0) for g in gone]
    for s in came:
        attrs = _file(conn, s.ino)
        if attrs is not None:
            out.append((CREATED, s.parent, s.name, renamed.get((s.parent, s.ino), ""), s.ino, attrs[1]))
    if isinstance(rec, Commit) and rec.release and not came:
        out += _names_of(conn, CREATED, rec.ino)
    if isinstance(rec, Evict) and isinstance(result, dict):
        gone_inos = {g.ino for g in gone}
        for ino in result.get("evicted", ()):
            if ino not in gone_inos:   # a UFS file: its name stays, its cached blocks went
                out += _names_of(conn, EVICTED, ino)
    return out


def _shared(name: str, from_name: str) -> tuple[str, int]:
    """(what follows the prefix, its length): how a row stores from_name beside name.  A
    rename's names share most of their characters (x.tmp -> x.data: 60 of LMCache's 62),
    which the row would otherwise hold twice."""
    k = len(os.path.commonprefix((name, from_name)))
    return from_name[k:], k


def _announced(s: _Staged) -> bool:
    """A removed name worth an event: a file's (not a directory's), committed at least once."""
    if s.mode is None:
        return True
    return not stat.S_ISDIR(s.mode) and bool(s.committed)


def _file(conn: sqlite3.Connection, ino: int) -> tuple[int, int] | None:
    """(mode, size) of a complete regular file no writer holds open, else None (a new
    file is complete and empty while its writer has it: its close announces it)."""
    r = conn.execute("SELECT mode, size, complete, lease_id FROM inodes WHERE ino=?", (ino,)).fetchone()
    if r is None or not stat.S_ISREG(r[0]) or not r[2] or r[3]:
        return None
    return int(r[0]), int(r[1])


def _exists(conn: sqlite3.Connection, ino: int) -> bool:
    return conn.execute("SELECT 1 FROM inodes WHERE ino=?", (ino,)).fetchone() is not None


def _names_of(conn: sqlite3.Connection, kind: int, ino: int) -> list[EventRow]:
    attrs = _file(conn, ino)
    if attrs is None:
        return []
    return [(kind, int(p), str(n), "", ino, attrs[1])
            for p, n in conn.execute("SELECT parent, name FROM dirents WHERE ino=? ORDER BY parent, name", (ino,))]


# ---------------------------------------------------------------------- reading
def bounds(conn: sqlite3.Connection) -> tuple[int, int]:
    """(floor, head): the newest position pruned (0: none) and the newest written (the
    floor when every event was pruned: the rows are the only other record of it)."""
    floor, newest = conn.execute(_BOUNDS).fetchone()
    return int(floor), max(int(floor), int(newest))


def next_position(conn: sqlite3.Connection) -> int:
    """The next event's position: past every row and the pruned floor, never one used
    before (what _INSERT gives each row it writes, by _NEXT).  Read from the store in the
    record's transaction, so every master of a group (and a replay, and a master
    restarted or given a Raft snapshot) derives the same."""
    return bounds(conn)[1] + 1


def host_id(conn: sqlite3.Connection, host: str, add: bool) -> int | None:
    """Host's id in the hosts table (added when add, in the record's transaction: ids are
    given in record order, the same on every master); None if it has none."""
    if add:
        conn.execute("INSERT INTO hosts(name) VALUES (?) ON CONFLICT(name) DO NOTHING", (host,))
    row = conn.execute("SELECT id FROM hosts WHERE name=?", (host,)).fetchone()
    return int(row[0]) if row is not None else None


def hosts_of(conn: sqlite3.Connection, inos: list[int]) -> dict[int, set[str]]:
    """The feed's last word on which hosts hold each of these files whole."""
    out: dict[int, set[str]] = {}
    for k in range(0, len(inos), 500):
        part = inos[k:k + 500]
        for ino, host in conn.execute("SELECT e.ino, h.name FROM event_hosts e JOIN hosts h ON h.id = e.host_id"
                                      f" WHERE e.ino IN ({','.join('?' * len(part))})", part):
            out.setdefault(int(ino), set()).add(str(host))
    return out


def read_after(conn: sqlite3.Connection, parent: int, after: int, upto: int, limit: int) -> list[Event]:
    """Directory parent's events with after < position <= upto, oldest first, at most limit."""
    return [Event(*r) for r in conn.execute(_READ, (parent, after, upto, limit))]


# ---------------------------------------------------------------------- pruning
class EventOps(Store):
    """op_replica_changes, op_prune_events (a mixin of Namespace)."""

    @applies(ReplicaChanges)
    def op_replica_changes(self, rec: ReplicaChanges) -> Result:
        """Record each change the feed has not said yet, and its event for each of the
        file's names (a file gone meanwhile: nothing)."""
        ts_ms, n = rec.now_ns // 1_000_000, 0
        for c in rec.changes:
            if not _exists(self.conn, c.ino) or (hid := host_id(self.conn, c.host, c.held)) is None:
                continue   # (a host the feed never named held nothing)
            if c.held:
                done = self.conn.execute("INSERT OR IGNORE INTO event_hosts(ino, host_id) VALUES (?,?)", (c.ino, hid))
            else:
                done = self.conn.execute("DELETE FROM event_hosts WHERE ino=? AND host_id=?", (c.ino, hid))
            if done.rowcount:
                kind = REPLICA_ADDED if c.held else REPLICA_LOST
                rows = [(ts_ms, kind, p, name, "", 0, c.ino, size, hid)
                        for p, name, size in self.conn.execute(_NAMES_SIZE, (c.ino,)).fetchall()]
                self.conn.executemany(_INSERT, rows)
                n += len(rows)
        return {"events": n}

    @applies(PruneEvents)
    def op_prune_events(self, rec: PruneEvents) -> Result:
        """Delete the events before the first one at or after rec.before_ms, and all but
        the newest rec.keep, at most PRUNE_MAX_ROWS of them (the next record takes the
        rest); the floor moves up.  The old ones are the oldest positions' prefix, found
        by reading from the floor up to the first young event: not every event's time
        (a scan of the whole window, ~60 ms per 10^6 events holding the writer, every
        10 s), and never one newer than the window (a leader whose clock is behind the
        previous one's wrote older times after newer)."""
        floor, head = bounds(self.conn)
        last = min(head, floor + PRUNE_MAX_ROWS)
        young = self.conn.execute("SELECT pos FROM events WHERE pos > ? AND pos <= ? AND ts_ms >= ? ORDER BY pos"
                                  " LIMIT 1", (floor, last, rec.before_ms)).fetchone()
        old = last if young is None else int(young[0]) - 1
        cut = min(max(old, head - rec.keep), floor + PRUNE_MAX_ROWS)
        if cut <= floor:
            return {"pruned": 0}
        n = self.conn.execute("DELETE FROM events WHERE pos <= ?", (cut,)).rowcount
        self.conn.execute("INSERT INTO meta(key, value) VALUES ('events_floor', ?)"
                          " ON CONFLICT(key) DO UPDATE SET value=excluded.value", (cut,))
        return {"pruned": n}
