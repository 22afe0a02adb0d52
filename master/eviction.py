"""The bounded cache: watermark LRU eviction, TTL sweeps, and room for new blocks.

A thread wakes every ``master.evict_interval_s`` (or when kicked by an allocation that
pushed usage past the high watermark).  When the pool, or any worker, is above
``evict_high`` of its capacity, it evicts whole files, least recently used first
(recency = the later of the last read open and the last modification), until the pool
and those workers are below ``evict_low``.  Files open for writing, incomplete files and
pinned files (``user.curvine.pin`` on the file or an ancestor, or a client's expiring pin
from ``Locate``, master/pinleases.py) are never evicted.  Every
``ttl_sweep_s`` it removes files whose TTL (``user.curvine.ttl``, nearest ancestor)
passed since their last modification.

Decisions are made here, off the journal thread, from a read connection; the removal
is one ``evict`` op record (re-checked at apply time, see cacheops.py), so it is durable
and replayable, and the freed blocks are deleted on the workers by the usual delete
orders in heartbeat replies.

Last reads are noted in memory on every read open (no journal write per open) and
written to the inodes' ``last_read_ms`` column by an op every ``master.reads_flush_s`` and before each
eviction decision, so LRU order survives a master restart to within that window.
"""
from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import time
from typing import Any, Callable

from curvine_py.common.config import MasterConfig
from curvine_py.common.errors import err
from curvine_py.master import metrics, schema
from curvine_py.master.cachepolicy import TTL, Policies
from curvine_py.master.capacity import Capacity
from curvine_py.master.pinleases import PinLeases
from curvine_py.master.records import Evict, LastRead, RecordReads, Submit, Victim
from curvine_py.master.workers import Registry

# a file's last read in ns, 0 if never read (schema.NEVER_READ_MS)
_LAST_READ_NS = f"coalesce(nullif(i.last_read_ms, {schema.NEVER_READ_MS}), 0) * 1000000"

log = logging.getLogger(__name__)
STOP_FLUSH_S = 2.0   # a stopping master waits this long at most for its last reads to commit
MAX_VICTIMS = 2000        # files per evict op (a pass repeats while still above the watermark)
_FMT, _REG = 0o170000, 0o100000   # S_IFMT, S_IFREG


class Evictor:
    """One per master; its own thread plus synchronous calls from AllocateBlocks."""

    def __init__(self, cfg: MasterConfig, db_path: str, registry: Registry, capacity: Capacity,
                 submit: Submit, leading: Callable[[], bool] = lambda: True) -> None:
        self.cfg = cfg
        self.leading = leading   # a follower of a Raft group evicts nothing (docs/ha.md)
        self.db_path = db_path
        self.registry = registry
        self.capacity = capacity
        self.submit = submit
        self.high, self.low = cfg.evict_high, min(cfg.evict_low, cfg.evict_high)
        self._conn: sqlite3.Connection | None = None
        self._reads: dict[int, int] = {}
        self._reads_lock = threading.Lock()
        self._pass_lock = threading.Lock()
        self._kick = threading.Event()
        self.pins = PinLeases()   # clients' expiring pins (LMCache's locks: Locate pin_ms)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_flush = self._last_sweep = time.monotonic()
        self._last_warning = 0.0
        self.evicted_files = self.evicted_bytes = self.expired_files = 0

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="evictor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._last_flush_at_stop()

    def _last_flush_at_stop(self) -> None:
        """Record the reads not yet recorded, waiting STOP_FLUSH_S at most: when a whole
        group is stopped at once the other masters are gone, no majority commits the
        record, and the submit would hold the stop for its full COMMIT_WAIT_S (10 s per
        `cv cluster stop`).  The reads only order eviction: losing a few seconds' is harmless."""
        if not self.leading():
            return
        flusher = threading.Thread(target=self._flush_quietly, name="evictor-last-reads", daemon=True)
        flusher.start()
        flusher.join(STOP_FLUSH_S)
        if flusher.is_alive():
            log.warning("stopping: the last reads (eviction order) not recorded within %g s (no majority?)",
                        STOP_FLUSH_S)

    def _flush_quietly(self) -> None:
        try:
            self.flush_reads()
        except Exception:   # the journal may be gone already; no majority
            pass

    def kick(self) -> None:
        self._kick.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(self.cfg.evict_interval_s)
            self._kick.clear()
            if self._stop.is_set():
                return
            if not self.leading():
                continue
            try:
                self.tick()
            except Exception:
                log.exception("eviction pass failed")

    def tick(self) -> None:
        now = time.monotonic()
        if self.cfg.evict and self.over_high():
            self.evict()
        if now - self._last_sweep >= self.cfg.ttl_sweep_s:
            self._last_sweep = now
            self.sweep_ttl()
        if now - self._last_flush >= self.cfg.reads_flush_s:
            self.flush_reads()

    @property
    def conn(self) -> Any:
        """This evictor's read connection (used under _pass_lock only)."""
        if self._conn is None:
            self._conn = schema.open_db(self.db_path)
        return self._conn

    # ------------------------------------------------------------------ reads
    def note_read(self, ino: int) -> None:
        with self._reads_lock:
            self._reads[ino] = time.time_ns()

    def flush_reads(self) -> None:
        self._last_flush = time.monotonic()
        with self._reads_lock:
            reads, self._reads = self._reads, {}
        if reads:
            self.submit(RecordReads(reads=tuple(LastRead(ino, ns) for ino, ns in sorted(reads.items()))))

    # ------------------------------------------------------------------ watermarks
    @property
    def lag_s(self) -> float:
        """From an eviction decision to the lower usage in a heartbeat: look this far ahead."""
        return 2.5 * self.capacity.heartbeat_s + self.cfg.evict_interval_s

    def over_high(self) -> bool:
        return self._past_high(self.capacity.usage(self.lag_s, 1 - self.low))

    def _past_high(self, usage: dict[int, tuple[int, int]]) -> bool:
        """Is the pool, or one worker, past the high watermark?  usage: worker -> (capacity, used)."""
        cap = sum(c for c, _ in usage.values())
        used = sum(u for _, u in usage.values())
        return (cap > 0 and used > self.high * cap) or any(c and u > self.high * c for c, u in usage.values())

    def _need(self, extra: int = 0) -> tuple[int, dict[int, int]]:
        """Bytes to free in the pool and per worker: where usage looking ahead is past the high
        watermark, until it is below the low one (a lower floor for fast writers: measured
        shallower targets let a mount fill its pool between passes); with extra > 0 (an
        allocation found no room), at least extra free bytes on every worker that has less."""
        now = self.capacity.usage()
        ahead = self.capacity.usage(self.lag_s, 1 - self.low)
        cap = sum(c for c, _ in ahead.values())
        used = sum(u for _, u in ahead.values())
        pool = int(used - self.low * cap) if used > self.high * cap else 0
        workers: dict[int, int] = {}
        for w, (c, u) in ahead.items():
            n = int(u - self.low * c) if c and u > self.high * c else 0
            free = c - now[w][1]
            if extra and free < extra:
                n = max(n, extra - free)
            if n > 0:
                workers[w] = n
        return max(0, pool), workers

    # ------------------------------------------------------------------ eviction
    def evict(self, extra: int = 0) -> int:
        """One pass: evict LRU files until below the low watermark; returns files evicted.

        ``extra`` asks for that many more bytes than the watermark needs (an allocation
        that found no room)."""
        with self._pass_lock:
            return self._evict(extra)

    def on_heartbeat(self) -> None:
        """A heartbeat brought fresh usage: evict now if past the watermark, so that this
        worker's delete orders leave in this very reply (a heartbeat sooner than the thread
        would).  Skipped when a pass is already running (it sees the same figures)."""
        if self.cfg.evict and self.over_high() and self._pass_lock.acquire(blocking=False):
            try:
                self._evict(0)
            finally:
                self._pass_lock.release()

    def _evict(self, extra: int) -> int:
        """One eviction pass; the caller holds _pass_lock."""
        pool, workers = self._need(extra)
        if pool <= 0 and not any(n > 0 for n in workers.values()):
            return 0
        self.flush_reads()
        victims, per_worker, total = self._choose(pool, workers)
        if not victims:
            if time.monotonic() - self._last_warning > 30:   # every heartbeat would say it again
                self._last_warning = time.monotonic()
                log.warning("pool above its watermark but nothing is evictable (pinned or open files only)")
            metrics.EVICTIONS.labels("pin_blocked").inc()
            return 0
        result = self.submit(Evict(victims=tuple(victims), reason="lru"))
        done = set(result["evicted"])
        self.capacity.note_freed({w: n for w, n in per_worker.items()} if done else {})
        self.evicted_files += len(done)
        self.evicted_bytes += result["bytes"]
        metrics.EVICTIONS.labels("lru").inc(len(done))
        metrics.EVICTED_BYTES.labels("lru").inc(result["bytes"])
        log.info("evicted %d files (%d bytes logical, %d on workers) to stay under the watermark",
                 len(done), result["bytes"], total)
        return len(done)

    def _candidates(self) -> Any:
        """Complete, unleased regular files, least recently used first."""
        return self.conn.execute(
            f"SELECT i.ino, i.generation, max(i.mtime_ns, {_LAST_READ_NS}) AS recency"
            " FROM inodes i"
            " WHERE (i.mode & ?) = ? AND i.complete = 1 AND i.lease_id = 0 AND i.nlink > 0"
            " ORDER BY recency", (_FMT, _REG))

    def _choose(self, pool: int, workers: dict[int, int]) -> tuple[list[Victim], dict[int, int], int]:
        """Victims, bytes they free per worker, and the total."""
        policies = Policies(self.conn)
        victims: list[Victim] = []
        per_worker: dict[int, int] = {}
        total = 0
        need = dict(workers)
        for ino, generation, _ in self._candidates():
            if pool <= 0 and not any(n > 0 for n in need.values()):
                break
            if len(victims) >= MAX_VICTIMS or policies.pinned(ino) or self.pins.pinned(ino):
                continue
            frees = self._frees(ino)
            if not frees:
                continue
            if pool <= 0 and not any(need.get(w, 0) > 0 for w in frees):
                continue   # only workers that are fine hold it
            victims.append(Victim(ino, generation))
            for w, n in frees.items():
                per_worker[w] = per_worker.get(w, 0) + n
                need[w] = need.get(w, 0) - n
                total += n
            pool -= sum(frees.values())
        return victims, per_worker, total

    def _frees(self, ino: int) -> dict[int, int]:
        """Bytes each worker gets back when ino goes."""
        out: dict[int, int] = {}
        for bid, length in self.conn.execute("SELECT block_id, length FROM blocks WHERE ino=?", (ino,)):
            for w in self.registry.replicas(bid, live_only=False):
                out[w] = out.get(w, 0) + length
        return out

    # ------------------------------------------------------------------ room for a block
    @staticmethod
    def tier_of(conn: Any, ino: int) -> str:
        """The tier a file's new blocks should land on ('' = any)."""
        return Policies(conn).tier(ino)

    def place(self, block_id: int, replicas: int, block_size: int, exclude: frozenset[int] = frozenset(),
              tier: str = "", prefer_host: str = "") -> list[int]:
        """Room-aware placement for AllocateBlocks; a full pool evicts (and waits) first, else ENOSPC."""
        def again() -> list[int]:
            return self.capacity.place(block_id, replicas, block_size, exclude, tier, prefer_host)
        if self.cfg.evict:
            self.hold_back()
        return again() or self.make_room(block_size, self.wait_s, again)

    def hold_back(self) -> None:
        """Back-pressure: while the disks' usage (reported, plus files committed since the
        last heartbeats; evicted bytes count until reported gone) is past the high watermark,
        a new allocation waits (at most wait_s) for eviction to take effect on the disks,
        instead of piling more blocks on.  This bounds usage at the watermark plus what
        writers already hold, however far the heartbeats lag; with only pinned or open
        files left there is nothing to wait for and the allocation goes on."""
        deadline = time.monotonic() + self.wait_s
        while self._disks_over_high() and time.monotonic() < deadline:
            if not self.evict() and not self.capacity.frees_pending():
                return
            time.sleep(min(0.05, self.capacity.heartbeat_s / 4))

    def _disks_over_high(self) -> bool:
        return self._past_high(self.capacity.on_disk())

    @property
    def wait_s(self) -> float:
        """How long an allocation waits for evicted blocks to leave the workers."""
        return 4 * self.capacity.heartbeat_s + 2.0

    def after_allocate(self) -> None:
        """Wake the evictor at once when an allocation pushed usage past the high watermark."""
        if self.cfg.evict and self.over_high():
            self.kick()

    def make_room(self, block_size: int, wait_s: float, place: Callable[[], list[int]]) -> list[int]:
        """Targets for a block when placement found none: evict, wait for the space, or ENOSPC."""
        deadline = time.monotonic() + wait_s
        while True:
            evicted = self.evict(extra=block_size * 4) if self.cfg.evict else 0
            if not evicted and not self.capacity.frees_pending():
                raise err(errno.ENOSPC, self.no_room() if self.registry.live_workers() else "no live workers")
            time.sleep(min(0.05, self.cfg.evict_interval_s))
            targets = place()
            if targets:
                return targets
            if time.monotonic() > deadline:
                raise err(errno.ENOSPC, "no space left in the pool (eviction did not free space in time)")

    def no_room(self) -> str:
        """What an ENOSPC says when nothing can be evicted: what holds the space, so a user
        knows whether to unpin, wait for writers, or add disks.  (Right after a failed big
        write the space is held by its blocks on their way out, not by pinned files.)"""
        capacity, _ = self.capacity.pool()
        writing = pinned = 0
        policies = Policies(self.conn)
        for ino, nbytes, open_ in self.conn.execute(
                "SELECT i.ino, i.replicas * coalesce((SELECT sum(length) FROM blocks b WHERE b.ino = i.ino), 0),"
                " i.lease_id != 0 OR i.complete = 0 FROM inodes i WHERE (i.mode & ?) = ? AND i.nlink > 0"
                " AND (i.lease_id != 0 OR i.complete = 0 OR ?)", (_FMT, _REG, policies.any_pins)):
            if open_:
                writing += nbytes
            elif policies.pinned(ino):
                pinned += nbytes
        other = max(0, capacity - pinned - writing)
        return (f"no space left in the pool ({capacity >> 20} MiB on {len(self.registry.live_workers())} live "
                f"workers) and nothing evictable: {pinned >> 20} MiB in pinned files, {writing >> 20} MiB in "
                f"files open for writing, {other >> 20} MiB in blocks being written or being freed")

    # ------------------------------------------------------------------ ttl
    def sweep_ttl(self) -> int:
        """Remove files whose TTL passed since their last modification; returns how many."""
        with self._pass_lock:
            policies = Policies(self.conn)
            if not policies.values[TTL]:
                return 0
            self.flush_reads()   # last reads count for UFS files
            now = time.time_ns()
            victims = []
            # A UFS file's TTL counts from its last read too (its mtime is the object's, maybe
            # years old), and one with nothing cached has nothing to free.
            for ino, generation, mtime, in_ufs in self.conn.execute(
                    "SELECT i.ino, i.generation, CASE WHEN f.ino IS NULL THEN i.mtime_ns"
                    f" ELSE max(i.mtime_ns, {_LAST_READ_NS}) END, f.ino IS NOT NULL"
                    " FROM inodes i LEFT JOIN ufs_files f ON f.ino = i.ino"
                    " WHERE (i.mode & ?) = ? AND i.complete = 1 AND i.lease_id = 0", (_FMT, _REG)):
                ttl = policies.ttl_s(ino)
                if ttl is not None and mtime + ttl * 1_000_000_000 <= now and not policies.pinned(ino) \
                        and not self.pins.pinned(ino) \
                        and not (in_ufs and not self._frees(ino)):
                    victims.append(Victim(ino, generation))
            if not victims:
                return 0
            freed: dict[int, int] = {}
            for v in victims:
                for w, n in self._frees(v.ino).items():
                    freed[w] = freed.get(w, 0) + n
            result = self.submit(Evict(victims=tuple(victims), reason="ttl"))
            self.capacity.note_freed(freed)
            self.expired_files += len(result["evicted"])
            metrics.EVICTIONS.labels("ttl").inc(len(result["evicted"]))
            metrics.EVICTED_BYTES.labels("ttl").inc(result.get("bytes", 0))
            log.info("ttl sweep removed %d files", len(result["evicted"]))
            return len(result["evicted"])
