"""One budget for a client's buffer pools (common/buffers.Budget): client.buffer_pool_bytes
is what a client's pools hold together, not what each block size's pool may hold (a mount
reading 16 MiB blocks with 4 MiB windows beside them held up to twice the key)."""
from __future__ import annotations

import mmap

from curvine_py.client.core import ClientCore
from curvine_py.common.buffers import Budget, BufferPool
from curvine_py.common.config import Config

KiB = 1 << 10


class Idle:
    """A holder keeping buffers of its pool, each given back when asked (it is idle)."""

    def __init__(self, pool: BufferPool, n: int) -> None:
        self.pool = pool
        self.kept = [pool.acquire_or_reclaim(self) for _ in range(n)]
        pool.hold(self, cheap=True)

    def reclaim(self) -> bool:
        if not self.kept:
            return False
        buf = self.kept.pop()
        assert buf is not None
        self.pool.release(buf)
        return True


def test_a_clients_pools_hold_buffer_pool_bytes_in_total() -> None:
    cfg = Config()
    cfg.client.master = "127.0.0.1:1"          # never asked: no file is opened
    cfg.master.block_size = 64 * KiB
    cfg.client.buffer_pool_bytes = 256 * KiB   # 4 blocks of the master's size, 16 of 16 KiB
    core = ClientCore(cfg)
    try:
        big, small = core.buffer_pool(64 * KiB), core.buffer_pool(16 * KiB)
        held = [big.acquire_nowait() for _ in range(4)]
        assert all(isinstance(b, mmap.mmap) for b in held)
        # the whole budget is in the big pool's buffers, in use: the small pool makes its floor
        # only (a quarter of its own 16)
        assert small.floor == 4
        extra = [small.acquire_nowait() for _ in range(small.floor + 1)]
        assert [b is not None for b in extra] == [True] * small.floor + [False]
        # a big buffer given back is dropped for four small ones
        for buf in held:
            big.release(buf)
        more = [small.acquire_nowait() for _ in range(4)]
        assert all(b is not None for b in more)
        assert big.stats().created == 2 and small.stats().created == 8
        assert core.budget.used == cfg.client.buffer_pool_bytes
    finally:
        core.close()


def test_a_pool_past_the_budget_takes_an_idle_holders_buffer_from_another_pool() -> None:
    budget = Budget(4 * 4096)
    big, small = BufferPool(4096, 4, budget), BufferPool(1024, 16, budget)
    keeper = Idle(big, 4)
    assert all(keeper.kept)
    floor = [small.acquire_or_reclaim() for _ in range(Budget.FLOOR)]
    assert all(floor)
    assert small.acquire_nowait() is None                 # speculative: no reclaim
    got = small.acquire_or_reclaim()                      # a read: the idle holder gives one back
    assert got is not None and len(keeper.kept) == 3
    assert big.stats().created == 3 and budget.used == 3 * 4096 + 3 * 1024


def test_a_pool_alone_keeps_its_own_size() -> None:
    budget = Budget(4 * 4096)
    pool = BufferPool(4096, 8, budget)
    got = [pool.acquire_nowait() for _ in range(5)]
    assert [b is not None for b in got] == [True] * 4 + [False]
