"""A master of a Raft group (docs/ha.md): PySyncObj replicates the op records, every
master applies them to its own SQLite, and only the leader serves.

Why PySyncObj (0.3.17, pinned): the maintained pure-Python Raft, with a journal file,
log compaction into a snapshot and snapshot transfer to a follower that fell behind.
What this module adds around it:

- **The state machine.** One replicated method, ``apply(text)``: the record's JSON
  (``Record.to_json``, the log's versioned encoding, never a pickle of our classes),
  applied by ``Journal.apply_entry`` with its log index (the leader applies the record it
  built, ``_Node._in_flight``, not a decode of its text: 38 us a create).  The index is stored in the same
  SQLite transaction, so an entry is applied once even when PySyncObj replays its journal
  after a restart.  The leader's handler thread waits for PySyncObj's callback, which
  comes once the entry is committed (in a majority's journals) and applied here.
- **Snapshots** are SQLite backups (``Snapshots``): taken in Raft's thread (60 ms for a
  41 MB store of 10^5 files here; a thread of their own would race a snapshot installed
  meanwhile), shipped by PySyncObj, installed with the backup API into the live store.
- **Leading** means more than PySyncObj's state: ``ready`` once the first record of the
  leader's term (``LeaderAnnounce``) is applied -- everything committed before it is then
  applied too -- and a leader that hears no majority for 0.65 x the election timeout
  steps down before any other master can be elected, so reads on the leader are never
  stale.
- **Three changes** of PySyncObj's behaviour, each measured (docs/ha.md):
  - a late success reply no longer moves the leader's next index for a follower back
    (it made followers truncate and re-append entries they had acknowledged: 7
    "truncating already-applied log entries" warnings in 2,000 ops, none after, and
    1.8x the ops/s);
  - records are sent in batches, not one message per record: every record queued when
    Raft's thread wakes is appended, then sent to each follower in one message (its
    "batch" mode instead waits up to 0.1 s for a timer, its other mode sends each record
    alone).  Measured with PySyncObj alone, 3 processes here: 1 caller 1,182 -> 1,543
    ops/s, 4 callers 2,010 -> 4,466, 16 callers 3,057 -> 8,463;
  - a journal or snapshot left unreadable by a crash is moved aside at start, so the
    master rejoins and catches up instead of refusing to start.
- The Raft port's messages are pickles: PySyncObj encrypts them with the cluster
  secret (``password``), so a group needs ``[cluster] secret``.  With tls.enabled the
  port also speaks mutual TLS, masters' certificates only (master/rafttls.py).  Either
  way a message under 64 KiB goes out uncompressed (a stored zlib block, which every
  PySyncObj reads): PySyncObj's zlib level 3 cost 50-125 us per message whatever its
  size, and a mutation sends three on its critical path (master/rafttls.py).

Where a serial mutation's time goes on three masters on one machine (docs/performance-log.md,
"Issue 39: where a mutation's time goes on three masters"): the leader's two sends, the
follower's receive and answer, the leader's receive, then the apply in SQLite (~0.3 ms,
as on one master) and the handler thread's wake-up.  Every master applies every record
(~0.45 ms of CPU on each follower), which on a shared 2-core machine competes with the
leader's critical path.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import sqlite3
import struct
import threading
import time
from typing import Any, Callable

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.syncobj import SyncObjException

from curvine_py.common.config import MasterConfig, addresses
from curvine_py.common.errors import ConfigError, CurvineError, NotLeader, Unavailable
from curvine_py.common.tls import Tls
from curvine_py.master import schema
from curvine_py.master.group import client_address
from curvine_py.master.journal import Journal
from curvine_py.master.rafttls import transport_class
from curvine_py.master.records import LeaderAnnounce, Record
from curvine_py.master.store import Result
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
ROLES = {0: "follower", 1: "candidate", 2: "leader"}
LEADER = 2
JOURNAL_FILE, SNAPSHOT_FILE = "raft.journal", "raft.snapshot"
COMMIT_WAIT_S = 10.0        # a record not committed by then: Unavailable, the client retries (same request id)
STEP_DOWN = 0.65            # x election timeout: a leader without a majority's replies steps down
TRANSFER_CHUNK = 1 << 20    # snapshot and append-entries pieces on the Raft port
IN_FLIGHT_MAX = 4096        # submitted records kept for their apply (_Node._in_flight), at most
_NOT_LEADING = {FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.DISCARDED,
                FAIL_REASON.MISSING_LEADER}


class _Node(SyncObj):
    """PySyncObj's node: one replicated method, batched sends and the next-index fix
    (module docstring).  Run with appendEntriesUseBatch: records are appended as Raft's
    thread finds them, and sent here, not by PySyncObj's timer."""

    def __init__(self, me: str, peers: list[str], conf: SyncObjConf,
                 apply_entry: Callable[[int, str, Record | None], Any], tls: Tls | None = None) -> None:
        self._apply_entry = apply_entry
        # The records this master submitted, by their text, until applied here or failed
        # (or leadership lost, or IN_FLIGHT_MAX of them): the leader applies the record it
        # built instead of decoding its text.  Only a shortcut: a text not found is decoded.
        self._in_flight: dict[str, Record] = {}
        super().__init__(me, peers, conf, transportClass=transport_class(tls))
        self._wake = PipeNotifier(self._poller)

    def submit(self, text: str, callback: Callable[[Any, int], None], rec: Record | None = None) -> None:
        """Queue one record for the log and wake Raft's thread to send it now.  rec: the
        record whose to_json() text is, applied here as it is when its entry comes."""
        if rec is not None:
            if len(self._in_flight) >= IN_FLIGHT_MAX:   # a backstop: entries are popped as they apply
                self._in_flight.clear()
            self._in_flight[text] = rec
            callback = self._forgetting(text, callback)
        self.apply(text, callback=callback)
        try:
            self._wake.notify()
        except BlockingIOError:
            pass   # the pipe is full of wake-ups already: the thread has plenty to wake it

    def _checkCommandsToApply(self) -> None:
        """PySyncObj appends the queued records; then one message per follower carries them."""
        last = self.last_log_index()
        SyncObj._checkCommandsToApply(self)
        if self._isLeader() and self.last_log_index() != last:
            self._SyncObj__sendAppendEntries()

    def _forgetting(self, text: str, callback: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """callback, which first forgets text's record when its entry failed (never applied here)."""
        def called(result: Any, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                self._in_flight.pop(text, None)
            callback(result, error)
        return called

    def forget_in_flight(self) -> None:
        """Forget every submitted record (leadership lost: their entries may never come)."""
        self._in_flight.clear()

    @replicated
    def apply(self, text: str) -> Any:
        """Apply one committed record on this master (Raft's thread, in log order); its
        index is the one after the last applied (PySyncObj counts it after this returns).
        The record this master submitted as text, if any, is applied without decoding."""
        rec = self._in_flight.pop(text, None) if self._in_flight else None
        return self._apply_entry(self.raftLastApplied + 1, text, rec)

    def _SyncObj__onMessageReceived(self, node: Any, message: dict[str, Any]) -> None:
        """PySyncObj's message handler, except that a follower's success reply older than
        what the leader has sent since never moves that follower's next index back."""
        keep = None
        if message.get("type") == "next_node_idx" and message.get("success") and not message.get("reset"):
            keep = self._SyncObj__raftNextIndex.get(node)
        SyncObj._SyncObj__onMessageReceived(self, node, message)
        if keep is not None:
            now = self._SyncObj__raftNextIndex.get(node)
            if now is not None and now < keep:
                self._SyncObj__raftNextIndex[node] = keep

    def last_log_index(self) -> int:
        return int(self._SyncObj__raftLog[-1][1])


class Snapshots:
    """PySyncObj's serializer and deserializer: the store as a SQLite file, with PySyncObj's
    own data (the last two log entries, the members) in a table of it."""

    def __init__(self, db_path: str, journal: Journal) -> None:
        self.db_path = db_path
        self.journal = journal

    def save(self, path: str, raft_data: Any) -> None:
        """A consistent copy of the store at path (PySyncObj then renames it into place)."""
        for stale in (path, path + "-wal", path + "-shm", path + "-journal"):
            if os.path.exists(stale):
                os.unlink(stale)
        start = time.perf_counter()
        src, dst = sqlite3.connect(self.db_path), sqlite3.connect(path)
        try:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")   # one self-contained file to ship
            dst.execute("CREATE TABLE IF NOT EXISTS raft_snapshot (data BLOB NOT NULL)")
            dst.execute("DELETE FROM raft_snapshot")
            dst.execute("INSERT INTO raft_snapshot(data) VALUES (?)", (pickle.dumps(raft_data),))
            dst.commit()
        finally:
            dst.close()
            src.close()
        log.info("raft snapshot at log index %d (%d bytes) in %.2f s", _applied_in(path), os.path.getsize(path),
                 time.perf_counter() - start)

    def load(self, path: str) -> Any:
        """PySyncObj's data from the snapshot at path; the store becomes the snapshot's when
        the snapshot is further along (a follower catching up, a wiped master), and stays
        as it is otherwise (a restart: the store has applied at least as much)."""
        snap = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            data = pickle.loads(snap.execute("SELECT data FROM raft_snapshot").fetchone()[0])
            index = _applied_in(path)
            if index > self.journal.raft_applied:
                start, was = time.perf_counter(), self.journal.raft_applied
                snap.backup(self.journal.conn)
                self.journal.conn.execute("PRAGMA journal_mode=WAL")
                self.journal.conn.execute("DROP TABLE IF EXISTS raft_snapshot")
                schema.upgrade(self.journal.conn)   # an older master's snapshot: this version's tables
                schema.keep_counts(self.journal.conn)
                self.journal.raft_applied = self.journal.stored_index()
                log.info("installed the raft snapshot at log index %d in %.2f s (the store was at %d)", index,
                         time.perf_counter() - start, was)
        finally:
            snap.close()
        return data


def _applied_in(path: str) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT value FROM meta WHERE key='raft_applied'").fetchone()[0])
    finally:
        conn.close()


class RaftGroup:
    """This master's place in its group: the Raft node, readiness, submit and status."""

    def __init__(self, cfg: MasterConfig, secret: str, journal: Journal, db_path: str,
                 frame_port: Callable[[], int], tls: Tls | None = None) -> None:
        """tls: the master's TLS (tls.enabled): the Raft port then takes only masters'
        certificates of the cluster's CA (master/rafttls.py)."""
        peers = list(addresses(cfg.raft_peers))
        self.me = f"{cfg.ip}:{cfg.raft_port}"
        _check_group(self.me, peers, secret)
        self.journal = journal
        self.address = client_address(cfg)
        self._frame_port = frame_port
        self._ready_term = -1          # the term whose LeaderAnnounce is applied here
        self._announcing = -1          # the term whose LeaderAnnounce is on its way
        self._lock = threading.Lock()
        self._reader = threading.local()
        self._db_path = db_path
        meta_dir = os.path.dirname(db_path)
        journal_path, snapshot_path = os.path.join(meta_dir, JOURNAL_FILE), os.path.join(meta_dir, SNAPSHOT_FILE)
        _keep_readable(journal_path, snapshot_path)
        snapshots = Snapshots(db_path, journal)
        t = cfg.election_timeout_s
        conf = SyncObjConf(
            password=secret, appendEntriesUseBatch=True, commandsWaitLeader=False,
            raftMinTimeout=t, raftMaxTimeout=2 * t, appendEntriesPeriod=min(0.1, t / 4),
            leaderFallbackTimeout=STEP_DOWN * t, connectionTimeout=max(3.5, 2 * t), connectionRetryTime=0.5,
            journalFile=journal_path, fullDumpFile=snapshot_path, serializer=snapshots.save,
            deserializer=snapshots.load, logCompactionMinEntries=max(2, cfg.snapshot_entries),
            logCompactionMinTime=24 * 3600, logCompactionBatchSize=TRANSFER_CHUNK,
            appendEntriesBatchSizeBytes=TRANSFER_CHUNK, sendBufferSize=4 * TRANSFER_CHUNK,
            recvBufferSize=4 * TRANSFER_CHUNK, bindAddress=f"{cfg.bind}:{cfg.raft_port}",
            bindRetryTime=0.5, maxBindRetries=20, onStateChanged=self._state_changed)
        self.node = _Node(self.me, [p for p in peers if p != self.me], conf, journal.apply_entry, tls)
        try:
            self.node.waitBinded()
        except SyncObjException:
            self.node.destroy()
            raise ConfigError(f"cannot listen on {cfg.bind}:{cfg.raft_port} (master.raft_port; port in use?)") from None
        log.info("raft: %s in a group of %d (%s)%s", self.me, len(peers), ", ".join(peers),
                 ", TLS on its port" if tls else "")

    # ------------------------------------------------------------------ leading
    @property
    def term(self) -> int:
        return int(self.node.raftCurrentTerm)

    def leading(self) -> bool:
        return bool(self.node._isLeader())

    def ready(self) -> bool:
        if not self.leading():
            return False
        term = self.term
        if self._ready_term == term:
            return True
        self._announce(term)   # a lost announcement is sent again on the next call
        return False

    def _state_changed(self, old: int, new: int) -> None:
        """PySyncObj's callback (its thread): a new leader announces itself at once (one
        elected before the node's constructor returned announces at its first call)."""
        if getattr(self, "node", None) is None:
            return
        log.info("raft: %s is now %s (term %d)", self.me, ROLES.get(new, new), self.term)
        if new == LEADER:
            self._announce(self.term)
        else:
            self.node.forget_in_flight()

    def _announce(self, term: int) -> None:
        with self._lock:
            if self._announcing == term:
                return
            self._announcing = term
        rec = LeaderAnnounce(term=term, raft_id=self.me, address=self.address, frame_port=self._frame_port(),
                             now_ns=time.time_ns())
        self.node.submit(rec.to_json(), lambda result, error: self._announced(term, error), rec)

    def _announced(self, term: int, error: int) -> None:
        with self._lock:
            if error == FAIL_REASON.SUCCESS:
                self._ready_term = term
                log.info("raft: %s leads term %d and serves", self.me, term)
            elif self._announcing == term:
                self._announcing = -1

    def leader_address(self) -> str:
        leader = self.node._getLeader()
        if leader is None:
            return ""
        if leader.id == self.me:
            return self.address
        return self._read().master_address(leader.id)

    def _read(self) -> Any:
        """This thread's read connection (the masters table, for leader_address)."""
        ns = getattr(self._reader, "ns", None)
        if ns is None:
            from curvine_py.master.groupops import GroupOps
            ns = self._reader.ns = GroupOps(schema.open_db(self._db_path, reader=True))
        return ns

    # ------------------------------------------------------------------ records
    def submit(self, rec: Record) -> Result:
        """Replicate rec and wait until it is committed and applied here; its result."""
        if not self.ready():
            raise NotLeader(self.leader_address())
        if not rec.now_ns:   # the leader's clock, so that every master applies the same time
            rec = dataclasses.replace(rec, now_ns=time.time_ns())
        done = threading.Event()
        box: list[Any] = [None, FAIL_REASON.SUCCESS]

        def finished(result: Any, error: int) -> None:
            box[0], box[1] = result, error
            done.set()

        self.node.submit(rec.to_json(), finished, rec)
        if not done.wait(COMMIT_WAIT_S):
            raise Unavailable(f"{rec.op} not committed within {COMMIT_WAIT_S:g} s (no majority?)")
        result, error = box
        if error in _NOT_LEADING:
            raise NotLeader(self.leader_address())
        if error != FAIL_REASON.SUCCESS:
            raise Unavailable(f"{rec.op} not replicated (raft error {error})")
        if isinstance(result, CurvineError):
            raise result
        return result if result is not None else Result()

    # ------------------------------------------------------------------ status
    def status(self) -> pb.MasterStatusReply:
        node = self.node
        st = node.getStatus()
        leader = st.get("leader")
        reply = pb.MasterStatusReply(
            address=self.address, raft_address=self.me, role=ROLES.get(st["state"], "?"), term=st["raft_term"],
            commit_index=st["commit_idx"], applied_index=st["last_applied"], last_log_index=node.last_log_index(),
            leader=self.leader_address(), leader_raft=leader.id if leader is not None else "", pid=os.getpid(),
            frame_port=self._frame_port(), ready=self.ready())
        if reply.role == "leader":
            for other in sorted(node.otherNodes, key=lambda n: n.id):
                reply.peers.append(pb.PeerStatus(raft_address=other.id, connected=node.isNodeConnected(other),
                                                 match_index=st.get(f"match_idx_server_{other.id}", 0)))
        return reply

    def stop(self) -> None:
        self.node.destroy()
        thread = getattr(self.node, "_SyncObj__thread", None)
        if thread is not None:
            thread.join(timeout=5)


def _check_group(me: str, peers: list[str], secret: str) -> None:
    if me not in peers:
        raise ConfigError(f"master.raft_peers ({', '.join(peers)}) does not name this master, {me} "
                          "(master.ip:master.raft_port)")
    if len(peers) % 2 == 0:
        raise ConfigError(f"master.raft_peers names {len(peers)} masters: use an odd number (3 or 5), "
                          "an even one tolerates no more failures than one fewer")
    if not secret:
        raise ConfigError("a group of masters needs [cluster] secret: their Raft messages are encrypted with it")


# ---------------------------------------------------------------------- start after a crash
HEADER = 40                 # PySyncObj's journal: name (24) + version (8) + format (4) + end offset (4)


def _keep_readable(journal_path: str, snapshot_path: str) -> None:
    """Move aside a journal or snapshot this master cannot read (a crash mid-write, a
    disk error), so that PySyncObj starts instead of failing or waiting: the master then
    rejoins with what is left and the leader sends it the rest.  A snapshot without its
    journal is useless and vice versa (the journal starts where the snapshot ends), so
    an unreadable snapshot takes the journal with it."""
    problem = _journal_problem(journal_path)
    if problem:
        _set_aside(journal_path, problem)
    problem = _snapshot_problem(snapshot_path)
    if problem:
        _set_aside(snapshot_path, problem)
        if os.path.exists(journal_path):
            _set_aside(journal_path, "its snapshot was unreadable")


def _set_aside(path: str, why: str) -> None:
    aside = f"{path}.unreadable-{int(time.time())}"
    os.replace(path, aside)
    log.warning("raft: %s is unreadable (%s): moved to %s; this master catches up from the leader", path, why, aside)


def _journal_problem(path: str) -> str:
    """Why PySyncObj could not read its journal file at path ("" if it can, or it is absent)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return ""
    if len(data) < HEADER or not data.startswith(b"PYSYNCOBJ"):
        return f"{len(data)} bytes, no journal header"
    end = struct.unpack_from("<I", data, HEADER - 4)[0]
    if not HEADER <= end <= len(data):
        return f"its end offset {end} lies outside the file ({len(data)} bytes)"
    at, last = HEADER, None
    while at < end:
        if at + 4 > end:
            return f"a record cut at byte {at}"
        size = struct.unpack_from("<I", data, at)[0]
        if size < 16 or at + 8 + size > end or struct.unpack_from("<I", data, at + 4 + size)[0] != size:
            return f"a broken record at byte {at}"
        index = struct.unpack_from("<Q", data, at + 4)[0]
        if last is not None and index != last + 1:
            return f"log index {index} follows {last}"
        last, at = index, at + 8 + size
    return ""


def _snapshot_problem(path: str) -> str:
    if not os.path.exists(path):
        return ""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            pickle.loads(conn.execute("SELECT data FROM raft_snapshot").fetchone()[0])
            conn.execute("SELECT value FROM meta WHERE key='raft_applied'").fetchone()[0]
        finally:
            conn.close()
    except Exception as e:   # noqa: BLE001 - whatever is wrong with it, the master must start
        return str(e) or type(e).__name__
    return ""
