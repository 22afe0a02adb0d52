"""The master's view of space: per worker and pool, and placement that respects it.

Workers report each data dir's capacity and used bytes in every heartbeat, so the
reported figures lag by up to a heartbeat or two.  Blocks freed by eviction still
count in them until the worker had time to receive the delete order (next heartbeat
reply) and report the lower usage (the one after): they are subtracted until the
worker's last heartbeat is 1.5 intervals past the free, so one eviction pass is not
repeated for the same bytes.  Blocks placed but not yet reported are not added: writers
allocate block ids in growing batches and leave the unused ones, so counting placements
overestimated usage by tens of MiB per file and evicted far below the low watermark;
new writes show in the next heartbeat (a worker that is really full refuses the block,
and the writer retries while eviction makes room).  Blocks *committed* since a worker's
last heartbeat are added for the allocation back-pressure (``on_disk``; the evictor's
look-ahead has the write rate for them, and placement leaves a really full worker to
refuse the block): they are on the disk already (a writer ships a block before it commits it), and
a mount writing a few hundred MB/s commits many files between two heartbeats (usage
reached 126 MiB of a 128 MiB pool, past the 90% watermark, once metadata calls got fast).

Because eviction takes effect a heartbeat or two after the decision, the evictor looks
ahead: each worker's write rate (bytes/s of new blocks in its heartbeats' block reports
over the last two heartbeats; the gross rate, since usage itself stays flat while
eviction keeps up) times that lag, at most ``max_ahead`` of its capacity, is added to
its usage when checking the watermarks, so a pool written fast starts evicting early
enough not to fill up.

Placement walks the hash ring skipping workers without room for a block, and prefers
workers whose data dirs of the requested tier have room (falling back to any tier).
"""
from __future__ import annotations

import threading
import time
from collections import deque

from curvine_py.master.placement import Placement
from curvine_py.master.workers import Registry, Worker

MAX_ADJUST_S = 10.0     # a correction older than this is dropped whatever the heartbeats say
MIN_RATE_WINDOW_S = 1.0  # write rates are averaged over two heartbeats, at least this long


class Capacity:
    """Projected usage (reported, corrected) and space-aware, tier-aware placement."""

    def __init__(self, registry: Registry, placement: Placement, heartbeat_s: float) -> None:
        self.registry = registry
        self.placement = placement
        self.heartbeat_s = heartbeat_s
        self.rate_window_s = max(MIN_RATE_WINDOW_S, 2 * heartbeat_s)
        self._lock = threading.Lock()
        self._freed: deque[tuple[float, int, int]] = deque()      # (time, worker, bytes)
        self._committed: deque[tuple[float, int, int]] = deque()  # (time, worker, bytes)
        self._added: dict[int, deque[tuple[float, int]]] = {}       # worker -> (time, bytes reported new)

    # ------------------------------------------------------------------ corrections
    def note_freed(self, per_worker: dict[int, int]) -> None:
        now = time.monotonic()
        with self._lock:
            self._freed.extend((now, w, n) for w, n in per_worker.items() if n)

    def note_committed(self, per_worker: dict[int, int]) -> None:
        """Blocks of these sizes were committed on these workers (on disk, not yet reported)."""
        now = time.monotonic()
        with self._lock:
            self._committed.extend((now, w, n) for w, n in per_worker.items() if n)

    def _unreported(self) -> dict[int, int]:
        """Committed bytes per worker that no heartbeat has reported yet: kept until one
        arrives a whole interval after the commit (surely sent after the block was on
        disk, even on a loaded machine; counting a file twice for a heartbeat only makes
        the back-pressure wait a little longer)."""
        now = time.monotonic()
        with self._lock:
            self._committed = self._pending(self._committed, now, self.heartbeat_s)
            return self._sum(self._committed)

    def frees_pending(self) -> bool:
        """Are evicted or otherwise freed bytes (a failed write's blocks, a deleted file's)
        still on their way out of some worker?  An allocation waits for them rather than
        failing with ENOSPC while the room is coming."""
        return any(self._corrections().values()) or self.registry.deletes_in_flight()

    def _corrections(self) -> dict[int, int]:
        """Bytes freed but still reported, per worker (entries already reflected are dropped)."""
        now = time.monotonic()
        with self._lock:
            self._freed = self._pending(self._freed, now, 1.5 * self.heartbeat_s)
            return self._sum(self._freed)

    def _pending(self, q: deque[tuple[float, int, int]], now: float, lag: float) -> deque[tuple[float, int, int]]:
        beats = {w.worker_id: w.last_heartbeat for w in self.registry.live_workers()}
        return deque(e for e in q if now - e[0] < MAX_ADJUST_S and beats.get(e[1], now) < e[0] + lag)

    @staticmethod
    def _sum(q: deque[tuple[float, int, int]]) -> dict[int, int]:
        out: dict[int, int] = {}
        for _, wid, n in q:
            out[wid] = out.get(wid, 0) + n
        return out

    def note_added(self, wid: int, nbytes: int) -> None:
        """A heartbeat reported nbytes of new blocks on worker wid."""
        if nbytes:
            with self._lock:
                self._added.setdefault(wid, deque()).append((time.monotonic(), nbytes))

    def _rate(self, w: Worker) -> float:
        """Bytes/s of new blocks on w over the last rate window (quickly 0 once writes stop)."""
        now = time.monotonic()
        with self._lock:
            q = self._added.get(w.worker_id)
            if not q:
                return 0.0
            while q and now - q[0][0] > self.rate_window_s:
                q.popleft()
            return sum(n for _, n in q) / self.rate_window_s

    # ------------------------------------------------------------------ usage
    def usage(self, ahead_s: float = 0.0, max_ahead: float = 0.1) -> dict[int, tuple[int, int]]:
        """worker id -> (capacity, projected used) of every live worker, ahead_s seconds from now
        (the look-ahead adds at most max_ahead of a worker's capacity)."""
        freed = self._corrections()
        out = {}
        for w in self.registry.live_workers():
            ahead = min(self._rate(w) * ahead_s, max_ahead * w.capacity) if ahead_s else 0
            used = w.used - freed.get(w.worker_id, 0) + int(ahead)
            out[w.worker_id] = (w.capacity, max(0, used))
        return out

    def on_disk(self) -> dict[int, tuple[int, int]]:
        """worker id -> (capacity, used) as the disks hold it now: reported plus committed
        since, evicted bytes still counted until a heartbeat shows them gone."""
        fresh = self._unreported()
        return {w.worker_id: (w.capacity, w.used + fresh.get(w.worker_id, 0)) for w in self.registry.live_workers()}

    def pool(self) -> tuple[int, int]:
        u = self.usage().values()
        return sum(c for c, _ in u), sum(x for _, x in u)

    # ------------------------------------------------------------------ placement
    @staticmethod
    def tier_room(w: Worker, tier: str) -> int:
        return sum(max(0, d.capacity - d.used) for d in w.dirs if d.tier == tier)

    def place(self, block_id: int, replicas: int, block_size: int, exclude: frozenset[int] = frozenset(),
              tier: str = "", prefer_host: str = "") -> list[int]:
        """Workers for a new block ([] when none has room); the preferred tier first, and a
        worker on prefer_host (the writer's) first among them when it has room."""
        freed = self._corrections()
        live = self.registry.live_workers()
        full = frozenset(w.worker_id for w in live if w.capacity - w.used + freed.get(w.worker_id, 0) < block_size)
        ring = self.placement.ring()
        targets: list[int] = []
        if tier:
            no_tier = frozenset(w.worker_id for w in live if self.tier_room(w, tier) < block_size)
            targets = ring.place_block(block_id, replicas, exclude | full | no_tier, prefer_host)
        if len(targets) < replicas:
            targets = ring.place_block(block_id, replicas, exclude | full, prefer_host) or targets
        if not targets:
            targets = ring.place_block(block_id, replicas, full)   # excluded ones beat nothing
        return targets
