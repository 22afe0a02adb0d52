"""The stop side of fuse/notify.py's KernelNotifier: a notification the kernel holds up
never holds the daemon's stop longer than STOP_WAIT_S, and after close() (a stop signal)
nothing new is told.  The kernel's own side is
tests/posix/test_posix_daemon.py::test_a_kernel_invalidation_waiting_on_a_cut_off_lookup_never_holds_the_stop."""
from __future__ import annotations

import threading
import time

import pytest

from curvine_py.fuse import notify
from curvine_py.fuse.notify import KernelNotifier
from curvine_py.pb import curvine_pb2 as pb

pytestmark = pytest.mark.timeout(30)


def name_key(name: str) -> list[pb.CacheKey]:
    return [pb.CacheKey(ino=7, name=name, entry=True)]


class HeldKernel:
    """invalidate_entry as the kernel runs it while a request holds the directory's lock:
    it returns only once released (the request answered)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.entered = threading.Event()
        self.told: list[bytes] = []

    def entry(self, ino: int, name: bytes) -> None:
        self.entered.set()
        self.released.wait(20)
        self.told.append(name)


def test_a_held_notification_bounds_stop_and_the_thread_is_never_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "STOP_WAIT_S", 0.2)
    k = HeldKernel()
    n = KernelNotifier(1, entry=k.entry, inode=lambda ino, attr_only=False: None).start()
    n.refused(name_key("a"))
    assert k.entered.wait(5)
    start = time.monotonic()
    assert n.stop() is False            # still in the kernel: the caller aborts the connection
    assert time.monotonic() - start < 2.0
    assert n._thread.daemon             # nothing joins it: a stuck one cannot hold the exit
    k.released.set()                    # the request answered: the notification returns
    assert n.idle(5)
    assert k.told == [b"a"]


def test_nothing_new_is_told_after_close() -> None:
    k = HeldKernel()
    n = KernelNotifier(1, entry=k.entry, inode=lambda ino, attr_only=False: None).start()
    n.refused(name_key("a"))
    assert k.entered.wait(5)
    n.close()                           # the stop signal, while "a" waits in the kernel
    n.refused(name_key("b"))            # after it: never told
    n.pushed(pb.Invalidation(seq=1, keys=name_key("c")))
    k.released.set()
    assert n.idle(5)
    n._thread.join(5)
    assert not n._thread.is_alive() and k.told == [b"a"]
    assert n.stop() is True
