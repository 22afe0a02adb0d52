"""BufferPool's non-waiting paths for reads (issue 43): acquire_or_reclaim never waits, and
share() splits the buffers for speculative work evenly among the holders."""
from __future__ import annotations

import mmap
import threading
import time

from curvine_py.common.buffers import BufferPool


class Keeper:
    """A holder keeping buffers; gives one back when asked only if it is idle."""

    def __init__(self, pool: BufferPool, idle: bool) -> None:
        self.pool, self.idle, self.kept = pool, idle, [pool.acquire_or_reclaim(self) for _ in range(2)]
        pool.hold(self, cheap=True)

    def reclaim(self) -> bool:
        if not self.idle or not self.kept:
            return False
        buf = self.kept.pop()
        assert buf is not None
        self.pool.release(buf)
        return True


def test_acquire_or_reclaim_takes_from_an_idle_holder_and_otherwise_returns_none_at_once() -> None:
    pool = BufferPool(4096, max_buffers=4)
    busy = Keeper(pool, idle=False)
    idle = Keeper(pool, idle=True)
    t = time.monotonic()
    got = [pool.acquire_or_reclaim(busy) for _ in range(3)]
    assert time.monotonic() - t < BufferPool.RECHECK_S, "a dry pool was waited for"
    assert [isinstance(b, mmap.mmap) for b in got] == [True, True, False]
    assert idle.kept == [] and len(busy.kept) == 2
    assert pool.stats().reclaims == 2


def test_a_requester_is_not_asked_for_its_own_buffers() -> None:
    pool = BufferPool(4096, max_buffers=2)
    me = Keeper(pool, idle=True)
    assert pool.acquire_or_reclaim(me) is None and len(me.kept) == 2


def test_share_splits_the_buffers_among_the_holders_and_is_at_least_one() -> None:
    pool = BufferPool(4096, max_buffers=16)
    assert pool.share() == 16
    holders = [Keeper(BufferPool(4096, 2), idle=False) for _ in range(4)]
    for h in holders:
        pool.hold(h, cheap=True)
    assert pool.share() == 4
    many = [Keeper(BufferPool(4096, 2), idle=False) for _ in range(40)]
    for h in many:
        pool.hold(h, cheap=False)
    assert pool.share() == 1


def test_a_waiting_acquire_still_gets_a_released_buffer() -> None:
    """acquire (writers) keeps waiting; a buffer given back wakes it."""
    pool = BufferPool(4096, max_buffers=1)
    buf = pool.acquire()
    out: list[mmap.mmap] = []
    t = threading.Thread(target=lambda: out.append(pool.acquire()))
    t.start()
    time.sleep(0.1)
    assert not out
    pool.release(buf)
    t.join(timeout=5)
    assert out == [buf]


def test_plenty_while_more_than_half_the_buffers_are_unclaimed() -> None:
    pool = BufferPool(4096, max_buffers=4)
    assert pool.plenty()
    taken = [pool.acquire() for _ in range(2)]
    assert not pool.plenty()
    pool.release(taken.pop())
    assert pool.plenty()
