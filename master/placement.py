"""Block placement: the hash ring over live workers, rebuilt (new epoch) on membership change.

A block's replicas are the first ``replicas`` workers on distinct hosts clockwise
from xxh3(block_id); workers without room for a block, or that the client could not
reach, are skipped, so the next ones on the ring take their place.
"""
from __future__ import annotations

import errno
import threading
import time

from curvine_py.common.errors import err
from curvine_py.common.hashring import HashRing, RingNode
from curvine_py.master.workers import Registry


class Placement:
    """The current ring; cheap to read, rebuilt lazily when the registry's membership changes."""

    def __init__(self, registry: Registry, vnodes: int) -> None:
        self.registry = registry
        self.vnodes = vnodes
        self._lock = threading.Lock()
        self._version = -1
        self._epoch = int(time.time() * 1000)  # monotonic across master restarts
        self._ring = HashRing([], vnodes, self._epoch)

    def ring(self) -> HashRing:
        with self._lock:
            if self._version != self.registry.membership_version:
                self._version = self.registry.membership_version
                nodes = sorted((RingNode(w.worker_id, w.host) for w in self.registry.live_workers()),
                               key=lambda n: n.worker_id)
                if sorted(self._ring.nodes.values(), key=lambda n: n.worker_id) != nodes:
                    self._epoch += 1
                    self._ring = HashRing(nodes, self.vnodes, self._epoch)
            return self._ring

    def place(self, block_id: int, replicas: int, block_size: int, exclude: frozenset[int] = frozenset()) -> list[int]:
        """Workers for a new block; raises ENOSPC when no live worker has room."""
        full = frozenset(w.worker_id for w in self.registry.live_workers() if w.available < block_size)
        targets = self.ring().place_block(block_id, replicas, exclude | full)
        if not targets:
            targets = self.ring().place_block(block_id, replicas, full)  # excluded ones beat nothing
        if not targets:
            live = self.registry.live_workers()
            raise err(errno.ENOSPC, "no space left in the pool" if live else "no live workers")
        return targets
