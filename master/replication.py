"""Re-replication: bring blocks that lost a replica back to their file's replica count.

A block becomes *suspect* when something may have cost it a copy: its worker was
declared lost, a worker reported it removed (deleted or found corrupt), a client
reported a bad replica.  A periodic full scan catches whatever no event announced
(for example blocks whose only other holder was lost while the master was down).  The
first full scan waits for the worker timeout after the master starts, so that workers
re-registering after a master restart are not mistaken for lost ones.  A scan walks
the blocks in id order, SCAN_SLICE of them per tick, so that a pool of millions of
blocks never holds the housekeeping thread (and the GIL the master's requests need)
for seconds at a time.

For each suspect with fewer live replicas than wanted, one live holder (the *source*)
is told, in its next heartbeat reply, to push the block to a target on a host that
holds no copy yet; the target's block report then counts the new replica.  An order
not confirmed within ``order_timeout_s`` is given again, possibly to another pair.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass

from curvine_py.common.security import WRITE, BlockTokens
from curvine_py.master.placement import Placement
from curvine_py.master.store import to_u64
from curvine_py.master.workers import Registry
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
BATCH = 2000              # suspects examined per tick
PER_SOURCE = 8            # orders a worker may have outstanding as a source
PER_TARGET = 8            # ... and as a target
SCAN_SLICE = 50_000       # blocks the periodic scan looks at per tick


@dataclass
class _Order:
    source: int
    target: int
    deadline: float


class Replicator:
    """Thread-safe; driven by the master's housekeeping tick and heartbeats."""

    def __init__(self, registry: Registry, placement: Placement, tokens: BlockTokens,
                 grace_s: float, scan_interval_s: float, order_timeout_s: float = 15.0,
                 scan_slice: int = SCAN_SLICE) -> None:
        self.registry = registry
        self.placement = placement
        self.tokens = tokens
        self.scan_interval_s = scan_interval_s
        self.scan_slice_blocks = scan_slice
        self.order_timeout_s = order_timeout_s
        self._lock = threading.Lock()
        self._suspects: set[int] = set()
        self._orders: dict[int, _Order] = {}              # block id -> outstanding order
        self._outbox: dict[int, list[pb.ReplicateCommand]] = {}  # source worker -> orders to send
        self._next_scan = time.monotonic() + grace_s
        self._scan_after: int | None = None   # the scan under way resumes after this block id
        self.ordered = 0                                  # orders given since start (for the report)

    def restart(self, grace_s: float) -> None:
        """Drop every order and suspicion and judge no block for grace_s: a new leader first
        hears from its workers (docs/ha.md)."""
        with self._lock:
            self._suspects.clear()
            self._orders.clear()
            self._outbox.clear()
            self._next_scan = time.monotonic() + grace_s
            self._scan_after = None

    # ------------------------------------------------------------------ events
    def suspect(self, block_ids: "list[int] | set[int]") -> None:
        with self._lock:
            self._suspects.update(block_ids)

    def worker_lost(self, wid: int) -> None:
        """wid's blocks need copies; orders to or from it will never be carried out."""
        w = self.registry.get(wid)
        with self._lock:
            self._drop_orders_of(wid)
            self._outbox.pop(wid, None)
            if w is not None:
                self._suspects.update(w.blocks)

    def worker_restarted(self, wid: int) -> None:
        """wid registered (again): a copy ordered to or from its old process will never be
        made (its source's push to a dead port failed, silently); order those blocks again
        now, instead of when the orders expire (order_timeout_s, 15 s)."""
        with self._lock:
            self._drop_orders_of(wid)

    def _drop_orders_of(self, wid: int) -> None:
        """Forget the orders to or from wid and judge their blocks again (caller holds _lock)."""
        dead = [b for b, o in self._orders.items() if wid in (o.source, o.target)]
        for b in dead:
            del self._orders[b]
        self._suspects.update(dead)

    def take(self, wid: int) -> list[pb.ReplicateCommand]:
        """Orders for worker wid to carry out (sent in its heartbeat reply)."""
        with self._lock:
            return self._outbox.pop(wid, [])

    # ------------------------------------------------------------------ the tick
    def tick(self, conn: sqlite3.Connection) -> None:
        now = time.monotonic()
        if self._scan_after is None and now >= self._next_scan:
            self._next_scan = now + self.scan_interval_s
            self._scan_after = -1
        if self._scan_after is not None:
            found, self._scan_after = self.scan_slice(conn, self._scan_after)
            self.suspect(found)
        with self._lock:
            expired = [b for b, o in self._orders.items() if o.deadline < now]
            for b in expired:
                del self._orders[b]
            self._suspects.update(expired)
            batch = [self._suspects.pop() for _ in range(min(BATCH, len(self._suspects)))]
            busy = self._busy()   # counted once per tick; _examine keeps it current
        keep = [b for b in batch if not self._examine_safely(conn, b, busy)]
        if keep:
            with self._lock:
                self._suspects.update(keep)

    def scan(self, conn: sqlite3.Connection) -> list[int]:
        """Every committed block with fewer live replicas than its file wants."""
        out: list[int] = []
        after: int | None = -1
        while after is not None:
            found, after = self.scan_slice(conn, after)
            out += found
        return out

    def scan_slice(self, conn: sqlite3.Connection, after: int) -> tuple[list[int], int | None]:
        """The under-replicated blocks among the next scan_slice_blocks committed blocks
        whose id is above `after` (ids are positive), and the id the next slice starts
        after (None: that was the last slice)."""
        limit = self.scan_slice_blocks
        # A block of a UFS file with no replica is not lost but uncached (a read fetches it).
        rows = conn.execute("SELECT b.block_id, i.replicas, f.state = 'persisted' FROM blocks b"
                            " JOIN inodes i ON i.ino = b.ino LEFT JOIN ufs_files f ON f.ino = b.ino"
                            " WHERE b.block_id > ? ORDER BY b.block_id LIMIT ?", (after, limit)).fetchall()
        found = [bid for bid, want, in_ufs in rows
                 if 0 < len(self.registry.replicas(bid)) < want or (not in_ufs and not self.registry.replicas(bid))]
        return found, (rows[-1][0] if len(rows) == limit else None)

    def _examine_safely(self, conn: sqlite3.Connection, bid: int, busy: dict[tuple[str, int], int]) -> bool:
        try:
            return self._examine(conn, bid, busy)
        except Exception:   # one bad row must not stop the others; it is looked at again later
            log.exception("re-replication of block %d failed", bid)
            return False

    def _examine(self, conn: sqlite3.Connection, bid: int, busy: dict[tuple[str, int], int]) -> bool:
        """Order a copy of bid if it needs one; False = look again later.  busy: outstanding
        orders per ("s", source) and ("t", target) worker."""
        row = conn.execute("SELECT b.length, b.checksum, i.replicas FROM blocks b JOIN inodes i ON i.ino = b.ino "
                           "WHERE b.block_id = ?", (bid,)).fetchone()
        if row is None:
            return True                      # deleted meanwhile
        length, checksum, want = row[0], to_u64(row[1]), row[2]
        holders = self.registry.replicas(bid)
        if len(holders) > want:
            self._trim(bid, holders, want)
            return True
        if len(holders) == want:
            return True
        if not holders:
            return False                     # every copy is on lost workers: wait for one to return
        with self._lock:
            if bid in self._orders:
                return True                  # an order is outstanding (its expiry re-suspects)
        source = min((h for h in holders if busy.get(("s", h), 0) < PER_SOURCE),
                     key=lambda h: busy.get(("s", h), 0), default=None)
        target = self._target(bid, holders, length, busy)
        if source is None or target is None:
            return False
        self._order(bid, length, checksum, source, target)
        busy[("s", source)] = busy.get(("s", source), 0) + 1
        busy[("t", target)] = busy.get(("t", target), 0) + 1
        return True

    def _trim(self, bid: int, holders: list[int], want: int) -> None:
        """Delete the copies beyond want, keeping the holders the ring prefers for bid."""
        with self._lock:
            if bid in self._orders:
                return                       # a copy is being made: wait for it to settle
        preferred = self.placement.ring().place_block(bid, len(holders))
        ranked = sorted(holders, key=lambda h: preferred.index(h) if h in preferred else len(preferred))
        extra = ranked[want:]
        for wid in extra:
            self.registry.delete_on(wid, [bid])
        log.info("block %d: %d copies for %d wanted; deleting those on workers %s", bid, len(holders), want, extra)

    def _busy(self) -> dict[tuple[str, int], int]:
        busy: dict[tuple[str, int], int] = {}
        for o in self._orders.values():
            busy[("s", o.source)] = busy.get(("s", o.source), 0) + 1
            busy[("t", o.target)] = busy.get(("t", o.target), 0) + 1
        return busy

    def _target(self, bid: int, holders: list[int], length: int, busy: dict[tuple[str, int], int]) -> int | None:
        """A live worker with room on a host holding no copy, by the ring's order for bid."""
        live = self.registry.live_workers()
        hosts = {w.host for w in live if w.worker_id in holders}
        refused = self.registry.unreachable()   # a client could not reach it since its last heartbeat
        exclude = frozenset(w.worker_id for w in live
                            if w.host in hosts or w.available < length or bid in w.pending_deletes
                            or busy.get(("t", w.worker_id), 0) >= PER_TARGET or w.worker_id in refused)
        picked = self.placement.ring().place_block(bid, 1, exclude)
        return picked[0] if picked else None

    def _order(self, bid: int, length: int, checksum: int, source: int, target: int) -> None:
        addr = self.registry.get(target)
        if addr is None:
            return
        cmd = pb.ReplicateCommand(block_id=bid, length=length, checksum=checksum, targets=[addr.address()],
                                  token=self.tokens.mint(bid, WRITE))
        with self._lock:
            self._orders[bid] = _Order(source, target, time.monotonic() + self.order_timeout_s)
            self._outbox.setdefault(source, []).append(cmd)
            self.ordered += 1
        log.info("block %d: copy from worker %d to worker %d", bid, source, target)

    def confirmed(self, bid: int) -> None:
        """A worker reported holding bid: an order for it is done."""
        with self._lock:
            self._orders.pop(bid, None)

    def pending(self) -> int:
        with self._lock:
            return len(self._orders)
