"""One io_uring per worker process: asynchronous pread/pwrite/fsync returning Futures.

Why the shape below (measured on the target machines with the ``liburing`` binding):

* ``io_uring_wait_cqe`` holds the GIL while it blocks, which would freeze every other
  thread.  Completions are therefore signalled through an eventfd registered on the
  ring; a reaper thread blocks in ``os.eventfd_read`` (which releases the GIL) and then
  drains the completion queue with the non-blocking ``io_uring_peek_cqe``.
* ``io_uring_prep_read/write`` only take ``bytes``/``bytearray``; ``Iovec`` accepts
  memoryviews (also slices and views of mmaps), so every op is a readv/writev over an
  ``Iovec``.  That lets callers read into and write from slices of pooled buffers with
  no copy.  The ``Iovec`` (and the views) stay referenced until the op completes.
* Several threads submit, so get_sqe/prep/submit run under one lock; data ops carry
  ``IOSQE_ASYNC`` so ``io_uring_submit`` hands the copy to a kernel worker instead of
  doing it inline while this thread holds the GIL.
* At most ``entries`` ops are in flight (a semaphore), so the completion queue (twice
  the submission queue) can never overflow and an SQE is almost always available.
* Reading ``cqe.res`` of a failed op raises ``OSError(errno)``; it is caught, the CQE is
  still marked seen (or the ring wedges), and the error is set on the op's Future.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable, Sequence

import liburing as L

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
_TRANSIENT_SUBMIT = (errno.EAGAIN, errno.EBUSY, errno.EINTR)


class UringClosed(OSError):
    """An op was submitted after close()."""

    def __init__(self) -> None:
        super().__init__(errno.EBADF, "io_uring executor is closed")


class _Op:
    """What the reaper needs when an op completes; holds the buffers alive until then."""

    __slots__ = ("future", "keep")

    def __init__(self, future: Future[int], keep: tuple[Any, ...]) -> None:
        self.future = future
        self.keep = keep


class Uring:
    """A shared io_uring with a reaper thread; thread-safe submission."""

    def __init__(self, entries: int = 128) -> None:
        if entries < 2:
            raise ValueError("io_uring needs at least 2 entries")
        self.entries = entries
        self._ring = L.Ring()
        L.io_uring_queue_init(entries, self._ring)
        self._efd = os.eventfd(0, os.EFD_CLOEXEC)
        try:
            L.io_uring_register_eventfd(self._ring, self._efd)
        except OSError:
            L.io_uring_queue_exit(self._ring)
            os.close(self._efd)
            raise
        self._cqe = L.Cqe()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(entries)
        self._pending: dict[int, _Op] = {}
        self._next_id = 1
        self._closing = False
        self._closed = False
        self._reaper = threading.Thread(target=self._reap_loop, name="uring-reaper", daemon=True)
        self._reaper.start()

    # ------------------------------------------------------------ async ops

    def read_into(self, fd: int, view: Buffer, offset: int, punt: bool = True) -> Future[int]:
        """Read up to len(view) bytes at offset into view; the Future gives the count.
        punt=False lets the kernel issue the read at submit (O_DIRECT reads do not block
        there), instead of handing it to an io-wq thread."""
        mv = memoryview(view)
        if mv.readonly:
            raise TypeError("read_into needs a writable buffer")
        return self.readv_into(fd, [mv], offset, punt)

    def write_from(self, fd: int, view: Buffer, offset: int) -> Future[int]:
        """Write view at offset; the Future gives the count (may be short)."""
        return self.writev_from(fd, [view], offset)

    def readv_into(self, fd: int, views: Sequence[Buffer], offset: int, punt: bool = True) -> Future[int]:
        """Scatter-read into several buffers with one op."""
        mvs = [memoryview(v).cast("B") for v in views]
        if any(v.readonly for v in mvs):
            raise TypeError("readv_into needs writable buffers")
        iov = L.Iovec(mvs)
        return self._submit(lambda sqe: L.io_uring_prep_readv(sqe, fd, iov, offset),
                            (iov, mvs), L.IOSQE_ASYNC if punt else 0)

    def writev_from(self, fd: int, views: Sequence[Buffer], offset: int) -> Future[int]:
        """Gather-write several buffers with one op."""
        mvs = [memoryview(v).cast("B") for v in views]
        iov = L.Iovec(mvs)
        return self._submit(lambda sqe: L.io_uring_prep_writev(sqe, fd, iov, offset),
                            (iov, mvs), L.IOSQE_ASYNC)

    def fsync(self, fd: int, datasync: bool = False) -> Future[int]:
        """Flush fd to stable storage (fdatasync when datasync)."""
        flags = L.IORING_FSYNC_DATASYNC if datasync else 0
        return self._submit(lambda sqe: L.io_uring_prep_fsync(sqe, fd, flags), (), 0)

    # ------------------------------------------------------------ blocking helpers

    def pread_full(self, fd: int, view: Buffer, offset: int) -> int:
        """Fill view from offset, looping on short reads; returns bytes read (< len at EOF)."""
        mv = memoryview(view).cast("B")
        got = 0
        while got < len(mv):
            n = self.read_into(fd, mv[got:], offset + got).result()
            if n == 0:
                break
            got += n
        return got

    def pwrite_full(self, fd: int, view: Buffer, offset: int) -> int:
        """Write all of view at offset, looping on short writes; returns len(view)."""
        mv = memoryview(view).cast("B")
        done = 0
        while done < len(mv):
            n = self.write_from(fd, mv[done:], offset + done).result()
            if n <= 0:
                raise OSError(errno.EIO, f"write made no progress at offset {offset + done}")
            done += n
        return done

    # ------------------------------------------------------------ lifecycle

    def close(self, timeout: float = 10.0) -> None:
        """Wait for in-flight ops (up to timeout), stop the reaper and free the ring."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.005)
        os.eventfd_write(self._efd, 1)  # wake the reaper so it sees _closing
        self._reaper.join(timeout=max(0.1, deadline - time.monotonic()))
        if self._pending:
            # The kernel may still write into these buffers: leak the ring rather than
            # free memory it references.  Only happens when a device hangs.
            log.error("io_uring closed with %d ops still in flight; ring leaked", len(self._pending))
            return
        self._closed = True
        L.io_uring_queue_exit(self._ring)
        os.close(self._efd)

    def __enter__(self) -> "Uring":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------ internals

    def _submit(self, prep: Callable[[Any], None], keep: tuple[Any, ...], flags: int) -> Future[int]:
        if self._closing:
            raise UringClosed()
        self._slots.acquire()
        fut: Future[int] = Future()
        try:
            with self._lock:
                if self._closing:
                    raise UringClosed()
                op_id = self._next_id
                self._next_id += 1
                sqe = self._get_sqe()
                prep(sqe)
                L.io_uring_sqe_set_data64(sqe, op_id)
                if flags:
                    L.io_uring_sqe_set_flags(sqe, flags)
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
        """An SQE; when the submission queue is full, submit what is queued and retry."""
        for _ in range(1000):
            sqe = L.io_uring_get_sqe(self._ring)
            if sqe is not None:
                return sqe
            self._submit_locked()
            time.sleep(0.0001)
        raise OSError(errno.EBUSY, "io_uring submission queue stays full")

    def _submit_locked(self) -> None:
        for attempt in range(100):
            try:
                L.io_uring_submit(self._ring)
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
        while True:
            try:
                L.io_uring_peek_cqe(self._ring, self._cqe)
            except BlockingIOError:
                return
            cqe = self._cqe[0]
            op_id = L.io_uring_cqe_get_data64(cqe)
            res: int | None = None
            error: OSError | None = None
            try:
                res = cqe.res
            except OSError as e:
                error = e
            finally:
                L.io_uring_cqe_seen(self._ring, cqe)
            self._complete(op_id, res, error)

    def _complete(self, op_id: int | None, res: int | None, error: OSError | None) -> None:
        op = self._pending.pop(op_id, None) if op_id is not None else None
        if op is None:
            log.warning("io_uring completion for unknown op %s", op_id)
            return
        self._slots.release()
        if op.future.done():  # failed at submission, or cancelled by its caller
            return
        try:
            if error is not None:
                code = error.errno or errno.EIO
                op.future.set_exception(OSError(code, os.strerror(code)))
            elif res is not None and res < 0:
                op.future.set_exception(OSError(-res, os.strerror(-res)))
            else:
                op.future.set_result(int(res or 0))
        except InvalidStateError:   # cancelled meanwhile
            pass
