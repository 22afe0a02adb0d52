"""Stop signals for the daemons, without locks in the signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly while
that same thread holds a ``threading`` lock (inside ``Event.wait`` or ``Event.set``);
a handler that calls ``Event.set`` can then deadlock the daemon on a second signal (seen:
a master killed by its parent's death signal hung forever).  Here the handler only
writes a byte to a pipe, and the main thread waits on the pipe.
"""
from __future__ import annotations

import os
import select
import signal
from types import FrameType


class StopSignals:
    """Install at the start of main(); ``wait()`` returns the first signal that arrived."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        for sig in signals:
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        try:
            os.write(self._w, bytes([signum]))
        except (BlockingIOError, OSError):
            pass   # a byte is already waiting: one is enough

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until a stop signal (its number) or the timeout (None)."""
        ready, _, _ = select.select([self._r], [], [], timeout)
        return os.read(self._r, 1)[0] if ready else None
