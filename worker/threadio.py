"""The thread-pool I/O engine: preadv/pwritev/fdatasync on a ThreadPoolExecutor.

The engine every machine can run (no binding, no kernel feature): each op is one
``os.preadv``/``os.pwritev``/``os.fdatasync`` call on a pool thread, which releases the
GIL for the copy, and returns the pool's ``Future[int]``, exactly as ``Uring`` does
(worker/ioengine.py has the contract).  O_DIRECT stays the callers' business: they open
the files and pass page-aligned pooled buffers, which preadv/pwritev take as they are.

Why a bounded number of ops in flight (a semaphore of ``entries``, like the io_uring's):
submitters then feel backpressure from a slow disk instead of queueing without limit.
Why ``threads`` defaults to a few, not ``entries``: on 2 vCPUs more threads than pieces
really in flight (4 per connection, a few connections) only add switching.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

from curvine_py.worker.ioengine import BlockingHelpers, Buffer, EngineClosed

DEFAULT_THREADS = 8


class ThreadIO(BlockingHelpers):
    """Positional disk I/O on a thread pool (an IoEngine)."""

    name = "threads"

    def __init__(self, entries: int = 128, threads: int = DEFAULT_THREADS) -> None:
        if entries < 2:
            raise ValueError("the I/O engine needs at least 2 entries")
        self.entries = entries
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(threads, entries)), thread_name_prefix="io")
        self._slots = threading.BoundedSemaphore(entries)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closing = False

    # ------------------------------------------------------------ async ops

    def readv_into(self, fd: int, views: Sequence[Buffer], offset: int, punt: bool = True) -> Future[int]:
        """Scatter-read into several buffers with one preadv."""
        mvs = [memoryview(v).cast("B") for v in views]
        if any(v.readonly for v in mvs):
            raise TypeError("readv_into needs writable buffers")
        return self._submit(os.preadv, fd, mvs, offset)

    def writev_from(self, fd: int, views: Sequence[Buffer], offset: int) -> Future[int]:
        """Gather-write several buffers with one pwritev."""
        mvs = [memoryview(v).cast("B") for v in views]
        return self._submit(os.pwritev, fd, mvs, offset)

    def fsync(self, fd: int, datasync: bool = False) -> Future[int]:
        """Flush fd to stable storage (fdatasync when datasync); the Future gives 0."""
        return self._submit(_sync, fd, datasync)

    # ------------------------------------------------------------ lifecycle

    def close(self, timeout: float = 10.0) -> None:
        """Wait for in-flight ops (up to timeout), then stop the pool's threads.  An op
        still running after the timeout (a hung device) keeps its thread and buffers."""
        if self._begin_close(timeout) is None:
            return
        self._pool.shutdown(wait=not self._in_flight)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    # ------------------------------------------------------------ internals

    def _submit(self, fn: Callable[..., int | None], *args: object) -> Future[int]:
        if self._closing:
            raise EngineClosed(self.name)
        self._slots.acquire()
        with self._lock:
            if self._closing:
                self._slots.release()
                raise EngineClosed(self.name)
            self._in_flight += 1
        try:
            return self._pool.submit(self._run, fn, args)
        except BaseException:
            self._finished()
            raise

    def _run(self, fn: Callable[..., int | None], args: tuple[object, ...]) -> int:
        """The op on a pool thread; it counts as finished before its Future is done, so
        a caller woken by the result sees in_flight without it."""
        try:
            return int(fn(*args) or 0)
        finally:
            self._finished()

    def _finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
        self._slots.release()


def _sync(fd: int, datasync: bool) -> int:
    if datasync:
        os.fdatasync(fd)
    else:
        os.fsync(fd)
    return 0
