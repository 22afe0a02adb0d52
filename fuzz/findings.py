"""A real server's swallowed crashes, made visible to a fuzz target.

The servers of common/listener.py catch whatever a connection's thread raises (a server
must outlive a bad peer) and log it through their FailureLog, at most one line per kind
per 10 s.  A target swaps that log for this one, which keeps every unexpected exception
(the ones logged with their traceback) for the target to raise as its finding."""
from __future__ import annotations

import threading

from curvine_py.common.listener import ConnectionServer, FailureLog


class Crashes(FailureLog):
    """A FailureLog that also keeps the exceptions noted with trace=True (the unexpected ones)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._crashes: list[tuple[str, BaseException]] = []
        self._mutex = threading.Lock()

    def note(self, what: str, e: BaseException, trace: bool = False) -> None:
        if trace:
            with self._mutex:
                self._crashes.append((what, e))
        super().note(what, e, trace)

    def take(self) -> list[tuple[str, BaseException]]:
        with self._mutex:
            out, self._crashes = self._crashes, []
        return out


def watch(server: ConnectionServer, name: str) -> Crashes:
    """Swap server's FailureLog for a Crashes, and return it."""
    crashes = Crashes(name)
    server._failures = crashes
    return crashes
