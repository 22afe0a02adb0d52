"""The master's view of space: per worker and pool, and placement that respects it.

Workers report each data dir's capacity and used bytes in every heartbeat, so the
reported figures lag by up to a heartbeat or two.  Two corrections keep decisions
honest in between:

* blocks freed by eviction still count until the worker had time to receive the
  delete order (next heartbeat reply) and report the lower usage (the one after):
  they are subtracted until the worker's last heartbeat is 1.5 intervals past the free;
* blocks placed on a worker count as soon as they are placed, until the worker's
  next heartbeat (which reports them as reserved or written).

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
REPORT_MARGIN_S = 0.05  # a block placed this long before a heartbeat is in its report


class Capacity:
    """Projected usage (reported, corrected) and space-aware, tier-aware placement."""

    def __init__(self, registry: Registry, placement: Placement, heartbeat_s: float) -> None:
        self.registry = registry
        self.placement = placement
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._freed: deque[tuple[float, int, int]] = deque()      # (time, worker, bytes)
        self._placed: deque[tuple[float, int, int]] = deque()

    # ------------------------------------------------------------------ corrections
    def note_freed(self, per_worker: dict[int, int]) -> None:
        now = time.monotonic()
        with self._lock:
            self._freed.extend((now, w, n) for w, n in per_worker.items() if n)

    def note_placed(self, workers: list[int], nbytes: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._placed.extend((now, w, nbytes) for w in workers)

    def frees_pending(self) -> bool:
        """Are evicted bytes still on their way out of some worker?"""
        return any(self._corrections()[1].values())

    def _corrections(self) -> tuple[dict[int, int], dict[int, int]]:
        """(bytes placed but not reported, bytes freed but still reported) per worker.

        Entries the workers' heartbeats already reflect are dropped, so the queues hold
        about one heartbeat's worth of allocations."""
        now = time.monotonic()
        with self._lock:
            self._placed = self._pending(self._placed, now, REPORT_MARGIN_S)
            self._freed = self._pending(self._freed, now, 1.5 * self.heartbeat_s)
            return self._sum(self._placed), self._sum(self._freed)

    def _pending(self, q: deque[tuple[float, int, int]], now: float, lag: float) -> deque[tuple[float, int, int]]:
        beats = {w.worker_id: w.last_heartbeat for w in self.registry.live_workers()}
        return deque(e for e in q if now - e[0] < MAX_ADJUST_S and beats.get(e[1], now) < e[0] + lag)

    @staticmethod
    def _sum(q: deque[tuple[float, int, int]]) -> dict[int, int]:
        out: dict[int, int] = {}
        for _, wid, n in q:
            out[wid] = out.get(wid, 0) + n
        return out

    # ------------------------------------------------------------------ usage
    def usage(self) -> dict[int, tuple[int, int]]:
        """worker id -> (capacity, projected used) of every live worker."""
        placed, freed = self._corrections()
        out = {}
        for w in self.registry.live_workers():
            used = w.used + placed.get(w.worker_id, 0) - freed.get(w.worker_id, 0)
            out[w.worker_id] = (w.capacity, max(0, used))
        return out

    def pool(self) -> tuple[int, int]:
        u = self.usage().values()
        return sum(c for c, _ in u), sum(x for _, x in u)

    # ------------------------------------------------------------------ placement
    @staticmethod
    def tier_room(w: Worker, tier: str) -> int:
        return sum(max(0, d.capacity - d.used) for d in w.dirs if d.tier == tier)

    def place(self, block_id: int, replicas: int, block_size: int, exclude: frozenset[int] = frozenset(),
              tier: str = "") -> list[int]:
        """Workers for a new block ([] when none has room); the preferred tier first."""
        placed, freed = self._corrections()
        live = self.registry.live_workers()
        full = frozenset(w.worker_id for w in live
                         if w.capacity - w.used - placed.get(w.worker_id, 0) + freed.get(w.worker_id, 0) < block_size)
        ring = self.placement.ring()
        targets: list[int] = []
        if tier:
            no_tier = frozenset(w.worker_id for w in live if self.tier_room(w, tier) < block_size)
            targets = ring.place_block(block_id, replicas, exclude | full | no_tier)
        if len(targets) < replicas:
            targets = ring.place_block(block_id, replicas, exclude | full) or targets
        if not targets:
            targets = ring.place_block(block_id, replicas, full)   # excluded ones beat nothing
        return targets
