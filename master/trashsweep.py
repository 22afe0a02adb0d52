"""Which names in the trash directory belong to clients that are gone (common/trash.py).

A client that keeps a file in the trash (unlinked while open, or an O_TMPFILE not linked
yet) renews its lock lease while it does (``RenewLocks``, even holding no lock); each
renewal is ``heard`` here.  A name whose owner was not heard for ``grace_s`` is stale:
the leader removes it (``MasterService._sweep_trash``) and so frees its blocks.

In memory only, as the lock table: a master that starts, or becomes the leader, has
heard nobody yet, so it calls nothing stale for one grace from then (``new_term``): every
live client renews well within it (every third of the lock lease).  What it forgets is
only when it last heard each client.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

from curvine_py.common.trash import owner_of, tag_of


class TrashOwners:
    """When each client that keeps trash was last heard (thread-safe)."""

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self._clock = clock
        self._mu = threading.Lock()
        self._heard: dict[str, float] = {}   # owner tag -> last heard
        self._since = clock()

    def heard(self, client_id: str) -> None:
        if client_id:
            with self._mu:
                self._heard[tag_of(client_id)] = self._clock()

    def new_term(self) -> None:
        """This master starts leading: nobody heard yet, nothing stale for one grace."""
        with self._mu:
            self._heard.clear()
            self._since = self._clock()

    def stale(self, names: Iterable[str]) -> list[str]:
        """Of names in the trash, those whose owner was not heard for a grace (none
        within a grace of this master's start as leader; untagged names never)."""
        now = self._clock()
        with self._mu:
            if now < self._since + self.grace_s:
                return []
            for gone in [t for t, at in self._heard.items() if now > at + self.grace_s]:
                del self._heard[gone]
            live = set(self._heard)
        return [n for n in names if (tag := owner_of(n)) is not None and tag not in live]
