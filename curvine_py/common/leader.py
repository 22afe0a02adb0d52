"""Which master of a group to call next: the leader as this process last found it.

With three masters (docs/ha.md) only the leader answers; a follower answers NotLeader,
naming the leader when it knows one.  A client or a worker holds the masters' gRPC
addresses (``client.master`` / ``worker.master``, comma-separated) and calls the one it
last found to be the leader.  When a call fails it tells this object why, and calls
whichever master ``current()`` names next:

- ``not_leader(at, hint)``: a follower named the leader: go there at once, even if that
  address is not in the list (the configured list may be stale);
- ``not_leader(at, "")`` or ``unreachable(at)``: try the next master of the list at once;
- after a whole round of failures without an answer (as many failed attempts in a row
  as there are masters) the caller waits, with the backoff given here, before the next
  round: ``wait(failures)`` is 0 within a round and the backoff at its end.  Counting
  a round in failed attempts, hints included, bounds the calls a client makes while two
  masters point at each other during an election.

A report about a master that is no longer the current one (another thread already moved
on) changes nothing: many threads failing on the same dead leader move the group's
choice once, not once each.  One master (the embedded default) stays that master, and
``wait`` is then the backoff after every failure: a single master is retried exactly as
before there were groups.

Shared by the client core and the worker (which may import only ``curvine_py.common``
and ``curvine_py.pb``), so it knows neither transport: callers map their errors.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

from curvine_py.common.config import addresses as parse_addresses

Backoff = Callable[[int], float]   # seconds to wait after failed round n (1 = the first)


class Leader:
    """The master to call next, among a group's addresses; thread-safe.

    ``current()`` is a plain attribute read (no lock): it is on every call's path."""

    def __init__(self, masters: str | Sequence[str], backoff: Backoff) -> None:
        listed = parse_addresses(masters) if isinstance(masters, str) else tuple(dict.fromkeys(masters))
        if not listed:
            raise ValueError("no master address given")
        self.addresses: tuple[str, ...] = listed
        self._backoff = backoff
        self._lock = threading.Lock()
        self._index = 0              # the listed master we are at, or came from to a hint
        self._current = listed[0]    # listed[_index], or a hinted address not in the list

    def __str__(self) -> str:
        return ", ".join(self.addresses)

    def current(self) -> str:
        """The master to call now: the last one found to be the leader, or the next to try."""
        return self._current

    def not_leader(self, at: str, hint: str) -> str:
        """Master `at` answered NotLeader naming `hint` ("" = it knows no leader): the
        next call goes to hint, else to the next master of the list.  Returns the master
        to call now."""
        with self._lock:
            if at != self._current:
                return self._current   # another caller moved on already
            if not hint or hint == at:   # no leader known (or a confused answer): the next one
                return self._advance()
            if hint in self.addresses:
                self._index = self.addresses.index(hint)
            self._current = hint
            return hint

    def unreachable(self, at: str) -> str:
        """A call to master `at` got no answer (refused, timed out, UNAVAILABLE): the next
        call goes to the next master of the list.  Returns the master to call now."""
        with self._lock:
            if at != self._current:
                return self._current
            return self._advance()

    def round_over(self, failures: int) -> bool:
        """After `failures` failed attempts in a row of one caller (1 = the first), has a
        whole round of the list failed without an answer?"""
        return failures % len(self.addresses) == 0

    def wait(self, failures: int, error: BaseException | None = None) -> float:
        """Seconds to wait after `failures` failed attempts in a row: none within a round
        (the next master is tried at once), the backoff of the round at its end.  Has the
        shape of ``common/retry.py``'s ``Wait``."""
        if not self.round_over(failures):
            return 0.0
        return self._backoff(failures // len(self.addresses))

    def _advance(self) -> str:
        """Under the lock: the master after the listed one we are at, or after the one
        that named a hint outside the list (which may still name the same dead hint)."""
        self._index = (self._index + 1) % len(self.addresses)
        self._current = self.addresses[self._index]
        return self._current
