"""The mount's lookups in flight and when the last one ended (Lookups): the work a
lookup starts ahead of an open -- a block fetched ahead (client/mount/fetchahead.py), a
remote block staged (staging.py), a local block's whole-file check (localfiles.py) --
waits for a pause of the lookups, never runs beside them, so a run of stats (LMCache's
lookup of a prompt's chunks) keeps both cores.  Its own module because all three use it
and localfiles is imported by fetchahead."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

QUIET_S = 0.002   # work ahead starts once no lookup has run for this long (and none runs)


class Lookups:
    """The mount's lookups in flight and when the last one ended, so that fetches ahead
    start in a pause of them only (wait_quiet), never beside them.  The VFS's lookup runs
    its call to the master inside ``with lookups:`` (MountOpens.looking_up); an open
    (MountOpens.opened) says the reads have begun, which ends the pause's wait early."""

    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self.quiet_s = quiet_s
        self._cond = threading.Condition(threading.Lock())
        self._running = 0
        self._ended = 0.0      # time.monotonic() when the last lookup ended
        self._opened = False   # an open came since the last lookup ended

    def __enter__(self) -> None:
        with self._cond:
            self._running += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._running -= 1
            self._ended = time.monotonic()
            self._opened = False

    def opened(self) -> None:
        """A file was opened: once no lookup runs, fetches need not wait out quiet_s."""
        with self._cond:
            if not self._opened:
                self._opened = True
                self._cond.notify_all()

    def wait_quiet(self, stop: Callable[[], bool]) -> None:
        """Return once no lookup runs and either none ended in the last quiet_s or a file
        was opened since, or once stop() (asked at least every quiet_s).  A background
        thread's wait: a lookup never wakes it, it looks again when the pause would be long
        enough."""
        with self._cond:
            while not stop():
                if self._running:
                    left = self.quiet_s
                elif self._opened:
                    return
                else:
                    left = self._ended + self.quiet_s - time.monotonic()
                    if left <= 0:
                        return
                self._cond.wait(left)
