"""The journal: every mutation of the namespace is applied in order, in batched transactions.

Callers (the threads serving calls) queue an op record in ``submit``; whichever caller
holds the writer lock applies every record queued so far (flat combining), each in
its own savepoint (a failing op rolls back alone), and commits the batch once (group
commit); only then are the callers answered, so a reply always follows durability.  A
lone caller applies its own record in its own thread: no hand-off to a writer thread
and back (two thread wake-ups, ~30% of a mutation's time on two busy cores).

The ``oplog`` table is the retry cache: for a record with a request id it keeps the
request id and the result (``encode_result``: compact JSON, an error as its errno), and
a record whose request id was already applied gets that result instead of being applied
twice.  It keeps nothing else: not the record (a single master is its own log; in a Raft
group the Raft log is), no row for a record without a request id (the master's own
records, lease renewals).  Rows are forgotten by a record too (``PruneOplog``, from the
housekeeping), never by the clock, so that masters replaying the same log prune at the
same point; the pages they free go back to the file system in bounded steps
(``reclaim``, also from the housekeeping).  Records are checked when they are built
(``records.py``), so the only error an op raises is its own ``CurvineError``, which
fails that record alone.

In a Raft group (docs/ha.md, ``master/raft.py``) no caller applies anything: Raft's
thread applies each committed entry with ``apply_entry``, the same ``_apply_one`` in a
transaction of its own that also stores the entry's log index.
"""
from __future__ import annotations

import errno
import json
import logging
import operator
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Final, Mapping

from curvine_py.common.errors import CurvineError, Unavailable
from curvine_py.master import metrics, schema
from curvine_py.master.events import EventLog
from curvine_py.master.namespace import Namespace
from curvine_py.master.records import Record, decode, json_default
from curvine_py.master.store import INODE_FIELDS, InodeRow, Result

log = logging.getLogger(__name__)
Key = tuple[int, "str | None"]
CHANGES_KEY: Final = "_changes"   # a result's entry for on_change's answer (never stored in the oplog)
MAX_BATCH = 256
# The `request_id != ''` term lets SQLite use the partial index oplog_req: with
# `request_id=?` alone it cannot prove the bound value is not '' and scans the whole
# oplog instead, ~8 ms per mutation at 30k rows (10 minutes of a busy client), which
# made every create, rename and unlink through the mount cost 3 ms.
RETRY_LOOKUP = "SELECT result FROM oplog WHERE request_id=? AND request_id != ''"
APPLIED = "SELECT value FROM meta WHERE key='raft_applied'"
REMEMBER = "INSERT INTO oplog(request_id, ts_ms, result) VALUES (?,?,?)"
# A store of schema 1 installed as a Raft snapshot an older master of the group sent
# (schema.migrate runs at open only) still has the `op` column, NOT NULL.
REMEMBER_V1 = "INSERT INTO oplog(request_id, ts_ms, result, op) VALUES (?,?,?,'')"
# Reclaiming freed pages (``reclaim``): at most this many per step (~10-40 us a page when
# live pages must move, so a step holds the writer a few ms), and only while more than
# RECLAIM_SLACK of the file's pages (and at least RECLAIM_MIN_FREE) are free: the free
# pages the next inserts would reuse are left alone (the pruned oplog's, in a steady state).
RECLAIM_STEP_PAGES = 128
RECLAIM_SLACK = 1 / 16
RECLAIM_MIN_FREE = 16


class Journal:
    """Serializes every mutation of the namespace through one writer lock."""

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns
        self.conn: sqlite3.Connection = ns.conn
        self._q: queue.SimpleQueue[tuple[Record, Future[Result]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self.applied = 0
        self.raft_applied = self.stored_index()
        self._vacuum_conn: sqlite3.Connection | None = None
        self._checkpoint_due = False
        # Told, in commit order, the cache keys each committed record changed (schema.
        # track_changes; master/sessions.py); what it returns rides in the record's result
        # under CHANGES_KEY for the caller.  None: nobody caches, nothing is tracked.
        self.on_change: Callable[[list[Key], Record], Any] | None = None
        self._changes: list[Key] = []
        self._record_counters: dict[str, Any] = {}   # JOURNAL_RECORDS' child of each op name
        # the event feed's rows, written in each record's savepoint (master/events.py)
        self.events = EventLog(self.conn)

    def start(self) -> None:
        """Nothing to start: callers apply records themselves (kept for the master's
        start-up order, which opens the journal before serving)."""
        self._stopped = False

    def stop(self) -> None:
        """Refuse new records; one being applied finishes first (it holds the lock)."""
        with self._lock:
            self._stopped = True
            if self._vacuum_conn is not None:
                self._vacuum_conn.close()
                self._vacuum_conn = None

    def submit(self, rec: Record) -> Result:
        """Apply rec durably and return its result (raises the op's CurvineError).  A record
        not yet stamped (now_ns 0) gets the time of its submission."""
        if not rec.now_ns:
            rec = rec.at(time.time_ns())
        fut: Future[Result] = Future()
        self._q.put((rec, fut))
        with self._lock:
            while not fut.done():   # another caller's batch may have applied ours already
                if self._stopped:
                    self._fail_queued(Unavailable("the master is stopping"))
                    break
                batch = self._take_batch()
                if not batch:   # cannot happen: ours stays queued until applied under this lock
                    fut.set_exception(CurvineError(errno.EIO, "journal lost a record"))
                    break
                self._apply_batch(batch)
        return fut.result()

    def _take_batch(self) -> list[tuple[Record, Future[Result]]]:
        batch: list[tuple[Record, Future[Result]]] = []
        while len(batch) < MAX_BATCH:
            try:
                batch.append(self._q.get_nowait())
            except queue.Empty:
                break
        return batch

    def _fail_queued(self, error: BaseException) -> None:
        for _, fut in self._take_batch():
            fut.set_exception(error)

    def track(self, on_change: Callable[[list[Key], Record], Any]) -> None:
        """Start telling on_change what each committed record changed (the cache sessions)."""
        with self._lock:
            if self.on_change is None:
                schema.track_changes(self.conn)
                self.on_change = on_change

    def _apply_batch(self, batch: list[tuple[Record, Future[Result]]]) -> None:
        outcomes: list[tuple[Future[Result], Any, list[Key], Record]] = []
        start = time.perf_counter()
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            for rec, fut in batch:
                outcomes.append((fut, self._apply_one(rec), self._changes, rec))
            self.conn.execute("COMMIT")
            self.events.committed()
        except Exception as e:  # the store itself failed: nobody in the batch was applied
            log.exception("journal batch failed")
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            error = CurvineError(5, f"metadata store error: {e}")
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(error)
            return
        self._count([rec for rec, _ in batch], start)
        for fut, outcome, changes, rec in outcomes:
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(self._told(outcome, changes, rec))

    def _told(self, outcome: Any, changes: list[Key], rec: Record) -> Any:
        """After the commit, in commit order: on_change hears what a record changed, and
        its answer goes to the record's caller with the result."""
        if changes and self.on_change is not None:
            told = self.on_change(changes, rec)
            if isinstance(outcome, dict):
                return {**outcome, CHANGES_KEY: told}
        return outcome

    def _count(self, recs: list[Record], start: float) -> None:
        self.applied += len(recs)
        metrics.JOURNAL_COMMIT_SECONDS.observe(time.perf_counter() - start)
        metrics.JOURNAL_BATCH.observe(len(recs))
        for rec in recs:
            counter = self._record_counters.get(rec.op)
            if counter is None:   # (labels() looks its child up under a lock: once per op name here)
                counter = self._record_counters[rec.op] = metrics.JOURNAL_RECORDS.labels(rec.op)
            counter.inc()

    # ------------------------------------------------------------------ a Raft group's entries
    def stored_index(self) -> int:
        """The log index of the last Raft entry applied to this store (0: none)."""
        row = self.conn.execute(APPLIED).fetchone()
        return int(row[0]) if row else 0

    def apply_entry(self, index: int, text: str, rec: Record | None = None) -> Any:
        """Apply the committed Raft entry at index (its record's to_json()) in a transaction
        of its own, which also stores index; returns the result or the op's CurvineError.
        rec: the record text was made from, when this master built it (the leader): it is
        applied as it is, not decoded again (~38 us of a create's critical path); followers
        and replays decode text, which gives an equal record (tests/unit/test_raft_leader_record.py).
        An entry at or below the stored index is already in the tables (a journal replayed
        after a restart, a snapshot installed) and is skipped: None.  A record this master
        cannot decode (a newer op) raises: Raft's thread then stops applying, rather than
        skip an entry, until the master is upgraded."""
        if index <= self.raft_applied:
            return None
        if rec is None:
            rec = decode(text)
        start = time.perf_counter()
        with self._lock:   # uncontended but for a step of reclaim
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                outcome = self._apply_one(rec)
                self.conn.execute("UPDATE meta SET value=? WHERE key='raft_applied'", (index,))
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.events.committed()
            if not isinstance(outcome, BaseException):
                outcome = self._told(outcome, self._changes, rec)
        self.raft_applied = index
        self._count([rec], start)
        return outcome

    def _apply_one(self, rec: Record) -> Any:
        """Apply one record in a savepoint; returns its result or its CurvineError."""
        rid = rec.request_id
        self._changes = []
        if rid:
            row = self.conn.execute(RETRY_LOOKUP, (schema.request_key(rid),)).fetchone()
            if row is not None:
                return decode_result(row[0])
        self.conn.execute("SAVEPOINT op")
        try:
            result = self.ns.apply(rec)
            self.events.record(rec, result)
            if self.on_change is not None:
                self._changes = schema.take_changes(self.conn)
        except (CurvineError, ValueError, TypeError, OverflowError, KeyError) as e:
            self.conn.execute("ROLLBACK TO op")
            self.conn.execute("RELEASE op")
            if not isinstance(e, CurvineError):   # a bug in one op fails that record, not its batch
                log.exception("op %s failed", rec.op)
                e = CurvineError(errno.EIO, f"internal error applying {rec.op}: {e}")
            if rid:  # a failed op is remembered too, so its retry fails the same way
                self._remember(rid, rec.now_ns, {"__errno": e.errno, "__msg": e.strerror})
            return e
        self.conn.execute("RELEASE op")
        if rid:
            self._remember(rid, rec.now_ns, result)
        return result

    def _remember(self, rid: str, now_ns: int, result: Mapping[str, object]) -> None:
        """The retry cache's row of request rid: what its retry gets back."""
        args = (schema.request_key(rid), now_ns // 1_000_000, encode_result(result))
        try:
            self.conn.execute(REMEMBER, args)
        except sqlite3.IntegrityError:
            self.conn.execute(REMEMBER_V1, args)

    # ------------------------------------------------------------------ the file's free pages
    def reclaim(self, max_pages: int = RECLAIM_STEP_PAGES) -> int:
        """One bounded step of giving the store's free pages (a pruned oplog's, deleted
        files') back to the file system: an incremental vacuum of at most max_pages, when
        more than RECLAIM_SLACK of the file is free; then a passive checkpoint, which is
        what shortens meta.db in WAL mode (tried again each step until it got through).
        Called by the housekeeping of every master, off the mutation path: it runs on a
        connection of its own, holding the writer lock so that no mutation waits in
        SQLite's busy handler (sleeps of 1 ms and more) behind it.  Returns the pages freed."""
        if self._stopped:
            return 0
        conn = self._vacuum_connection()
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        n = min(free, max_pages) if free > max(RECLAIM_MIN_FREE, pages * RECLAIM_SLACK) else 0
        if n and conn.execute("PRAGMA auto_vacuum").fetchone()[0] != schema.INCREMENTAL:
            n = 0   # a store from before auto_vacuum (schema.incremental_vacuum_on said so at open)
        if n:
            with self._lock:
                if self._stopped:
                    return 0
                # executescript steps the pragma to its end (execute() frees a single page)
                conn.executescript(f"PRAGMA incremental_vacuum({n})")
            self._checkpoint_due = True
        if self._checkpoint_due:
            _, wal_frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self._checkpoint_due = copied < wal_frames   # readers held part of the WAL: again next step
        return n

    def _vacuum_connection(self) -> sqlite3.Connection:
        """The connection reclaim uses, opened on first use (the writer's own for a store
        with no file).  Not the writer's: in a Raft group, Raft's thread also installs
        snapshots into that one, without the writer lock."""
        if self._vacuum_conn is None:
            path = self.conn.execute("PRAGMA database_list").fetchone()[2]
            if not path:
                return self.conn
            sync = "full" if self.conn.execute("PRAGMA synchronous").fetchone()[0] >= 2 else "normal"
            self._vacuum_conn = schema.open_db(path, sync, reader=True)
        return self._vacuum_conn


PACKED_ATTR = "@a"
# An InodeRow as encode_result writes it since schema 3: "@a"'s values but for mtime and
# ctime, written as mtime - atime and ctime - mtime (a create's three times are one: 0, 0
# instead of two more 19-digit numbers; ~35% of a create's row).
PACKED_TIMES = "@t"
_values = operator.attrgetter(*INODE_FIELDS)   # an InodeRow's values, in INODE_FIELDS' order
_AT, _MT, _CT = (INODE_FIELDS.index(f) for f in ("atime_ns", "mtime_ns", "ctime_ns"))
# What an older master's retry cache lacks: its rows had fewer columns (kv, allocated), or
# were plain JSON objects (schema 1).
_DEFAULTS: dict[str, Any] = {"complete": 1, "lease_client": "", "acl": None, "default_acl": None,
                             "target": None}
_FIXED = INODE_FIELDS.index("default_acl") + 1   # the leading columns every packed row has, in this order


def _packed(o: Any) -> Any:
    """The encoder's default: an InodeRow as its values, the times as PACKED_TIMES says
    (encode_result), bytes as records do."""
    if isinstance(o, InodeRow):
        values = list(_values(o))
        values[_CT] -= values[_MT]
        values[_MT] -= values[_AT]
        return {PACKED_TIMES: values}
    return json_default(o)


# (json.dumps makes an encoder a call; the C encoder walks the result and calls _packed
# only for what JSON lacks: no Python pass over the result first)
_encode = json.JSONEncoder(separators=(",", ":"), default=_packed).encode


def encode_result(result: Any) -> str:
    """A result as the retry cache keeps it: compact JSON where each inode's attributes (an
    InodeRow: most results carry one or two) are the list of their values in INODE_FIELDS
    order, mtime and ctime as differences (PACKED_TIMES), as ``{"@t": [...]}``: ~25% of
    the plain JSON (a create's 800 bytes)."""
    return _encode(result)


def decode_result(text: str | None) -> Any:
    """The result encode_result stored (an InodeRow again where it held one; plain JSON, as
    schema 1 stored it, decodes too); a failed op's CurvineError."""
    if text is None:
        return {}
    data = json.loads(text, object_hook=_unpack)
    if isinstance(data, dict) and "__errno" in data:
        return CurvineError(data["__errno"], data["__msg"])
    return data


def _unpack(d: dict[str, Any]) -> Any:
    if len(d) == 1 and PACKED_TIMES in d:
        values = d[PACKED_TIMES]
        values[_MT] += values[_AT]
        values[_CT] += values[_MT]
        return InodeRow(*values)
    if len(d) == 1 and PACKED_ATTR in d:   # a row written before schema 3
        return _packed_row(d[PACKED_ATTR])
    if len(d) == 1 and "__bytes" in d:   # json_default's bytes (an inode's ACL)
        return bytes.fromhex(d["__bytes"])
    if "ino" in d and "nlink" in d and "ctime_ns" in d:   # schema 1's plain attributes
        return InodeRow(*(d.get(k, _DEFAULTS.get(k, 0)) for k in INODE_FIELDS))
    return d


def _packed_row(values: list[Any]) -> InodeRow:
    """An InodeRow from its packed values; an older master's (fewer columns: the same
    leading ones, target last) gets the defaults of those it lacked."""
    if len(values) == len(INODE_FIELDS):
        return InodeRow(*values)
    lacked = [_DEFAULTS.get(k, 0) for k in INODE_FIELDS[_FIXED:-1]]
    return InodeRow(*[*values[:_FIXED], *lacked, values[-1]])
