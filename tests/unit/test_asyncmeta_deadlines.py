"""The mount loop's master calls are bounded by _Deadlines (client/asyncmeta.py), not by a
trio cancel scope per call: a connection past its deadline is closed, which ends the
exchange waiting on it; the watching task parks when idle and wakes for the next one."""
from __future__ import annotations

import socket

import pytest
import trio

from curvine_py.client.asyncmeta import _Conn, _Deadlines


def _pair() -> tuple[_Conn, socket.socket]:
    """A connection whose peer never answers (its other end, kept open by the test)."""
    a, b = socket.socketpair()
    a.setblocking(False)
    return _Conn(a, ("local", 0, "")), b


def test_an_exchange_past_its_deadline_ends_and_is_marked_expired() -> None:
    async def main() -> None:
        d = _Deadlines()
        conn, peer = _pair()
        with peer:
            start = trio.current_time()
            d.watch(conn, 0.3)
            with trio.fail_after(3):
                with pytest.raises((trio.ClosedResourceError, OSError)):
                    await conn.sock.recv(10)   # the peer never sends: only the deadline ends this
            took = trio.current_time() - start
            assert conn.expired and conn not in d.busy
            assert 0.3 <= took < 0.3 + d.TICK_S + 0.5, took
    trio.run(main)


def test_an_exchange_that_ends_in_time_is_left_alone() -> None:
    async def main() -> None:
        d = _Deadlines()
        conn, peer = _pair()
        with peer:
            d.watch(conn, 0.2)
            peer.send(b"x")
            assert await conn.sock.recv(10) == b"x"
            d.done(conn)
            await trio.sleep(0.2 + 2 * d.TICK_S)
            assert not conn.expired and conn.sock.fileno() != -1
            conn.sock.close()
    trio.run(main)


def test_the_watcher_parks_when_idle_and_the_next_exchange_wakes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Deadlines, "IDLE_TICKS", 2)

    async def main() -> None:
        d = _Deadlines()
        first, p1 = _pair()
        with p1:
            d.watch(first, 5)
            d.done(first)
            await trio.sleep(5 * d.TICK_S)
            assert d._parked is not None   # idle: no more ticks
            conn, p2 = _pair()
            with p2:
                d.watch(conn, 0.2)
                assert d._parked is None
                with trio.fail_after(3), pytest.raises((trio.ClosedResourceError, OSError)):
                    await conn.sock.recv(10)
                assert conn.expired
            first.sock.close()
    trio.run(main)


def test_each_trio_run_gets_its_own_watcher() -> None:
    """A client used by successive runs (tests do): the second run's exchanges are bounded too."""
    d = _Deadlines()

    async def one() -> None:
        conn, peer = _pair()
        with peer:
            d.watch(conn, 0.2)
            with trio.fail_after(3), pytest.raises((trio.ClosedResourceError, OSError)):
                await conn.sock.recv(10)
            assert conn.expired
    trio.run(one)
    trio.run(one)
