"""One io_uring per worker process: asynchronous pread/pwrite/fsync returning Futures.

The binding is ``liburing`` 2024.5.3 (Cython; ``io_uring()``, ``io_uring_cqe()``,
``iovec(buffers)``).  Why the shape below (measured on the target machines):

* ``io_uring_wait_cqe`` holds the GIL while it blocks, which would freeze every other
  thread.  Completions are therefore signalled through an eventfd registered on the
  ring; a reaper thread blocks in ``os.eventfd_read`` (which releases the GIL) and then
  drains the completion queue with the non-blocking ``io_uring_peek_cqe`` (it returns
  ``-EAGAIN`` when the queue is empty; it raises nothing).
* ``io_uring_prep_read/write`` take one contiguous buffer; ``iovec`` takes a list of
  buffers (it reads them through ``const unsigned char[:]``, so memoryviews of
  bytearrays, mmaps and read-only bytes all work, slices too), so every op is a
  readv/writev over an ``iovec``.  That lets callers read into and write from slices of
  pooled buffers with no copy.  The ``iovec`` (and the views) stay referenced until the
  op completes.  ``iovec`` refuses a zero-length buffer, so empty views are dropped (an
  op with nothing left completes at once with 0).
* Several threads submit, so get_sqe/prep/submit run under one lock; data ops carry
  ``IOSQE_ASYNC`` so ``io_uring_submit`` hands the copy to a kernel worker instead of
  doing it inline while this thread holds the GIL.
* At most ``entries`` ops are in flight (a semaphore), so the completion queue (twice
  the submission queue) can never overflow and an SQE is almost always available.
* ``cqe.res`` is the raw result (a negative errno on failure, no exception); the CQE is
  always marked seen (or the ring wedges), and an error is set on the op's Future.

Importing liburing is not safe for several processes at once: its ``__init__`` runs
``dynamic_import.importer()``, whose cache check (2024.5.2) always fails, so every import
deletes and rewrites ``liburing/__pycache__/__init__.importer-311.pyc``; two processes
importing together race and one dies with ``FileNotFoundError``.  ``load_liburing``
imports it under an exclusive ``flock`` of the package's ``__init__.py`` (readable by
everyone who can import it, one inode per installation) and resolves every name used
here at once, so no extension module is loaded lazily later.  Nothing imports liburing
at module import: only constructing a ``Uring`` does, after the worker's probe
(worker/uringprobe.py) passed in a child process.
"""
from __future__ import annotations

import errno
import fcntl
import importlib
import importlib.util
import logging
import os
import sys
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from curvine_py.worker.ioengine import BlockingHelpers, Buffer, EngineClosed, done_future

log = logging.getLogger(__name__)

_TRANSIENT_SUBMIT = (errno.EAGAIN, errno.EBUSY, errno.EINTR)
# Kernel ABI constants (linux/io_uring.h); the 2024 binding exposes them only inside
# its Cython enums, whose names differ between releases.
IOSQE_ASYNC = 1 << 4
IORING_FSYNC_DATASYNC = 1 << 0


class UringClosed(EngineClosed):
    """An op was submitted after close()."""

    def __init__(self) -> None:
        super().__init__("io_uring")


# ---------------------------------------------------------------- the binding

@dataclass(frozen=True)
class Liburing:
    """The binding's names this module uses, resolved once per process."""
    io_uring: Any
    io_uring_cqe: Any
    iovec: Any
    queue_init: Callable[..., int]
    queue_exit: Callable[..., Any]
    register_eventfd: Callable[..., int]
    get_sqe: Callable[..., Any]
    prep_readv: Callable[..., None]
    prep_writev: Callable[..., None]
    prep_fsync: Callable[..., None]
    sqe_set_data64: Callable[..., None]
    sqe_set_flags: Callable[..., None]
    submit: Callable[..., int]
    peek_cqe: Callable[..., int]
    cqe_get_data64: Callable[..., int]
    cqe_seen: Callable[..., None]


_liburing: Liburing | None = None
_liburing_lock = threading.Lock()


def load_liburing() -> Liburing:
    """Import liburing (once per process) under an exclusive lock shared with every
    other process importing the same installation; ImportError if unusable."""
    global _liburing
    with _liburing_lock:
        if _liburing is None:
            _liburing = _bind(_import_locked())
        return _liburing


def _import_locked() -> Any:
    if "liburing" in sys.modules:
        return sys.modules["liburing"]
    spec = importlib.util.find_spec("liburing")
    if spec is None or not spec.origin:
        raise ModuleNotFoundError("No module named 'liburing'", name="liburing")
    fd = os.open(spec.origin, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return importlib.import_module("liburing")
    finally:
        os.close(fd)   # drops the lock


def _bind(L: Any) -> Liburing:
    """Every name at once (each first access loads an extension module)."""
    try:
        return Liburing(
            io_uring=L.io_uring, io_uring_cqe=L.io_uring_cqe, iovec=L.iovec,
            queue_init=L.io_uring_queue_init, queue_exit=L.io_uring_queue_exit,
            register_eventfd=L.io_uring_register_eventfd, get_sqe=L.io_uring_get_sqe,
            prep_readv=L.io_uring_prep_readv, prep_writev=L.io_uring_prep_writev,
            prep_fsync=L.io_uring_prep_fsync, sqe_set_data64=L.io_uring_sqe_set_data64,
            sqe_set_flags=L.io_uring_sqe_set_flags, submit=L.io_uring_submit,
            peek_cqe=L.io_uring_peek_cqe, cqe_get_data64=L.io_uring_cqe_get_data64,
            cqe_seen=L.io_uring_cqe_seen)
    except AttributeError as e:
        version = getattr(L, "__version__", "?")
        raise ImportError(f"liburing {version} lacks the 2024.5 API ({e})".strip()) from None


# ---------------------------------------------------------------- the ring

class _Op:
    """What the reaper needs when an op completes; holds the buffers alive until then."""

    __slots__ = ("future", "keep")

    def __init__(self, future: Future[int], keep: tuple[Any, ...]) -> None:
        self.future = future
        self.keep = keep


class Uring(BlockingHelpers):
    """A shared io_uring with a reaper thread; thread-safe submission (an IoEngine)."""

    name = "uring"

    def __init__(self, entries: int = 128) -> None:
        if entries < 2:
            raise ValueError("io_uring needs at least 2 entries")
        self.entries = entries
        self._L = L = load_liburing()
        self._ring = L.io_uring()
        L.queue_init(entries, self._ring, 0)
        self._efd = os.eventfd(0, os.EFD_CLOEXEC)
        try:
            L.register_eventfd(self._ring, self._efd)
        except OSError:
            L.queue_exit(self._ring)
            os.close(self._efd)
            raise
        self._cqe = L.io_uring_cqe()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(entries)
        self._pending: dict[int, _Op] = {}
        self._next_id = 1
        self._closing = False
        self._closed = False
        self._reaper = threading.Thread(target=self._reap_loop, name="uring-reaper", daemon=True)
        self._reaper.start()

    # ------------------------------------------------------------ async ops

    def readv_into(self, fd: int, views: Sequence[Buffer], offset: int, punt: bool = True) -> Future[int]:
        """Scatter-read into several buffers with one op."""
        mvs = _views(views)
        if any(v.readonly for v in mvs):
            raise TypeError("readv_into needs writable buffers")
        if not mvs:
            return self._nothing()
        L, iov = self._L, self._L.iovec(mvs)
        return self._submit(lambda sqe: L.prep_readv(sqe, fd, iov, offset),
                            (iov, mvs), IOSQE_ASYNC if punt else 0)

    def writev_from(self, fd: int, views: Sequence[Buffer], offset: int) -> Future[int]:
        """Gather-write several buffers with one op."""
        mvs = _views(views)
        if not mvs:
            return self._nothing()
        L, iov = self._L, self._L.iovec(mvs)
        return self._submit(lambda sqe: L.prep_writev(sqe, fd, iov, len(mvs), offset),
                            (iov, mvs), IOSQE_ASYNC)

    def fsync(self, fd: int, datasync: bool = False) -> Future[int]:
        """Flush fd to stable storage (fdatasync when datasync)."""
        L, flags = self._L, IORING_FSYNC_DATASYNC if datasync else 0
        return self._submit(lambda sqe: L.prep_fsync(sqe, fd, flags), (), 0)

    # ------------------------------------------------------------ lifecycle

    def close(self, timeout: float = 10.0) -> None:
        """Wait for in-flight ops (up to timeout), stop the reaper and free the ring."""
        deadline = self._begin_close(timeout)
        if deadline is None:
            return
        os.eventfd_write(self._efd, 1)  # wake the reaper so it sees _closing
        self._reaper.join(timeout=max(0.1, deadline - time.monotonic()))
        if self._pending:
            # The kernel may still write into these buffers: leak the ring rather than
            # free memory it references.  Only happens when a device hangs.
            log.error("io_uring closed with %d ops still in flight; ring leaked", len(self._pending))
            return
        self._closed = True
        self._L.queue_exit(self._ring)
        os.close(self._efd)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------ internals

    def _nothing(self) -> Future[int]:
        if self._closing:
            raise UringClosed()
        return done_future(0)

    def _submit(self, prep: Callable[[Any], None], keep: tuple[Any, ...], flags: int) -> Future[int]:
        if self._closing:
            raise UringClosed()
        self._slots.acquire()
        fut: Future[int] = Future()
        L = self._L
        try:
            with self._lock:
                if self._closing:
                    raise UringClosed()
                op_id = self._next_id
                self._next_id += 1
                sqe = self._get_sqe()
                prep(sqe)
                L.sqe_set_data64(sqe, op_id)
                if flags:
                    L.sqe_set_flags(sqe, flags)
                # Registered before submit: the completion may arrive at once.
                self._pending[op_id] = _Op(fut, keep)
                self._submit_locked()
        except BaseException as e:
            if not self._was_queued(fut):
                self._slots.release()
                raise
            # The SQE is queued and will complete later; the op entry keeps the buffers
            # alive until then, and the caller sees the submission error.
            fut.set_exception(e if isinstance(e, OSError) else OSError(errno.EIO, str(e)))
        return fut

    def _was_queued(self, fut: Future[int]) -> bool:
        return any(op.future is fut for op in self._pending.values())

    def _get_sqe(self) -> Any:
        """An SQE (the binding returns an empty one, false, when the queue is full);
        when the submission queue is full, submit what is queued and retry."""
        for _ in range(1000):
            sqe = self._L.get_sqe(self._ring)
            if sqe:
                return sqe
            self._submit_locked()
            time.sleep(0.0001)
        raise OSError(errno.EBUSY, "io_uring submission queue stays full")

    def _submit_locked(self) -> None:
        for attempt in range(100):
            try:
                self._L.submit(self._ring)
                return
            except OSError as e:
                if e.errno not in _TRANSIENT_SUBMIT:
                    raise
                time.sleep(0.0005 * (attempt + 1))
        raise OSError(errno.EAGAIN, "io_uring_submit keeps failing")

    def _reap_loop(self) -> None:
        while True:
            try:
                os.eventfd_read(self._efd)
            except InterruptedError:
                continue
            try:
                self._drain()
            except Exception:   # never let the reaper die: every later op would hang
                log.exception("io_uring reaper error")
            if self._closing and not self._pending:
                return

    def _drain(self) -> None:
        """Complete every CQE that is ready."""
        L, ring, cqe = self._L, self._ring, self._cqe
        while L.peek_cqe(ring, cqe) == 0:
            try:
                op_id, res = L.cqe_get_data64(cqe), cqe.res
            finally:
                L.cqe_seen(ring, cqe)
            self._complete(op_id, res)

    def _complete(self, op_id: int, res: int) -> None:
        op = self._pending.pop(op_id, None)
        if op is None:
            log.warning("io_uring completion for unknown op %s", op_id)
            return
        self._slots.release()
        if op.future.done():  # failed at submission, or cancelled by its caller
            return
        try:
            if res < 0:
                op.future.set_exception(OSError(-res, os.strerror(-res)))
            else:
                op.future.set_result(res)
        except InvalidStateError:   # cancelled meanwhile
            pass


def _views(views: Sequence[Buffer]) -> list[memoryview]:
    """Byte views of the non-empty buffers (the binding's iovec refuses empty ones)."""
    mvs = [memoryview(v).cast("B") for v in views]
    return [v for v in mvs if len(v)]
