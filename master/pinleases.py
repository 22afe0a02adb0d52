"""Pins that expire: a client's short-lived exemption of files from eviction.

LMCache's lookup-and-lock must keep the chunks it found until it has loaded them
(``submit_unlock``).  A pin here is keyed by (the client's id, the inode) and lasts until
its expiry unless the same client asks again (``Locate`` with ``pin_ms``), so a client
that dies, or an unlock that never arrives, leaks nothing: the pin runs out.  The
``user.curvine.pin`` xattr would be journaled (a write per lookup) and never expire.

Pins are the leader's memory only: a new leader knows none, and a load racing an
eviction then is a miss, which LMCache handles (docs/kvcache.md "Locks").
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

Holder = str


class PinLeases:
    """(holder, ino) -> monotonic expiry; thread-safe; expired pins are dropped lazily."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[tuple[Holder, int], float] = {}
        self._by_ino: dict[int, set[Holder]] = {}

    def hold(self, holder: Holder, inos: Iterable[int], ttl_s: float) -> None:
        """Pin (or renew the pins of) inos for holder until ttl_s from now."""
        until = self._clock() + ttl_s
        with self._lock:
            for ino in inos:
                self._until[(holder, ino)] = until
                self._by_ino.setdefault(ino, set()).add(holder)

    def release(self, holder: Holder, inos: Iterable[int]) -> None:
        with self._lock:
            for ino in inos:
                self._drop(holder, ino)

    def pinned(self, ino: int) -> bool:
        """Does any holder's unexpired pin hold ino?"""
        now = self._clock()
        with self._lock:
            holders = self._by_ino.get(ino)
            if not holders:
                return False
            for h in list(holders):
                if self._until.get((h, ino), 0.0) > now:
                    return True
                self._drop(h, ino)
            return False

    def __len__(self) -> int:
        """Pins held now (expired ones are forgotten first)."""
        now = self._clock()
        with self._lock:
            for key in [k for k, until in self._until.items() if until <= now]:
                self._drop(*key)
            return len(self._until)

    def _drop(self, holder: Holder, ino: int) -> None:
        self._until.pop((holder, ino), None)
        holders = self._by_ino.get(ino)
        if holders is not None:
            holders.discard(holder)
            if not holders:
                del self._by_ino[ino]

