"""Sequential file writer: gathers bytes into whole blocks and ships them, two at a time.

Bytes are copied once into a pooled block-sized buffer (or, when the caller hands
over whole aligned blocks, sent straight from the caller's memory); a full buffer
is sent to its replicas by an I/O thread while the caller fills the next one.  The
master learns the new blocks at close (commit + release of the lease), which is
when the file becomes visible with its full contents (close-to-open).
"""
from __future__ import annotations

import errno
import logging
import threading
from concurrent.futures import Future
from typing import Callable

from curvine_py.client.core import ClientCore
from curvine_py.client.metaclient import Identity
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
IN_FLIGHT = 2
WRITE_ATTEMPTS = 3


class FileWriter:
    """Writes one file from its current end; not thread-safe (one writer per file)."""

    def __init__(self, core: ClientCore, reply: pb.OpenReply, ident: Identity | None = None,
                 append: bool = False) -> None:
        self.core = core
        self.ident = ident
        self.ino = reply.attr.ino
        self.lease_id = reply.lease_id
        self.bs = reply.attr.block_size
        self.orig_size = reply.attr.size
        self.size = reply.attr.size if append else 0
        self.pool = core.buffer_pool(self.bs)
        self._buf_raw = self.pool.acquire()
        self._buf = memoryview(self._buf_raw)
        self._buf_idx = self.size // self.bs
        self._buf_len = 0
        self._done: list[pb.BlockInfo] = []
        self._inflight: list[Future[pb.BlockInfo]] = []
        self._slots = threading.Semaphore(IN_FLIGHT)
        self._spare: list[pb.BlockInfo] = []
        self._error: BaseException | None = None
        self.closed = False
        core.workers.learn(list(reply.workers))
        core.leases.add(self.lease_id)
        if append and self.size % self.bs:
            self._load_tail(reply)

    # ------------------------------------------------------------------ public
    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._check()
        mv = memoryview(data).cast("B")
        total = len(mv)
        direct: list[Future[pb.BlockInfo]] = []
        while len(mv):
            if self._buf_len == 0 and len(mv) >= self.bs:
                direct.append(self._ship(self._buf_idx, mv[:self.bs], None))
                self._buf_idx += 1
                mv = mv[self.bs:]
                continue
            n = min(len(mv), self.bs - self._buf_len)
            self._buf[self._buf_len:self._buf_len + n] = mv[:n]
            self._buf_len += n
            mv = mv[n:]
            if self._buf_len == self.bs:
                self._ship_buffer()
        for f in direct:  # the caller's memory must not be used after we return
            f.result()
        self.size += total
        self._check()
        return total

    def close(self) -> pb.Attr:
        """Ship the last partial block, wait for every block, commit and release the lease."""
        if self.closed:
            raise CurvineError(errno.EBADF, "file already closed")
        self.closed = True
        try:
            if self._buf_len:
                self._ship_buffer(final=True)
            self._wait_all()
            if self._error is not None:
                raise self._error
            return self.core.meta.commit(self.ino, self.lease_id, self.size, self._done, release=True,
                                         ident=self.ident)
        finally:
            self._release_buffer()
            self.core.leases.remove(self.lease_id)

    def abort(self) -> None:
        """Give up: the lease is released with nothing new committed."""
        if self.closed:
            return
        self.closed = True
        self._wait_all()
        self._release_buffer()
        try:
            self.core.meta.commit(self.ino, self.lease_id, self.orig_size, [], release=True, ident=self.ident)
        except CurvineError as e:
            log.warning("abort of inode %d: %s", self.ino, e)
        finally:
            self.core.leases.remove(self.lease_id)

    # ------------------------------------------------------------------ internals
    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _release_buffer(self) -> None:
        if self._buf_raw is not None:
            self._buf.release()
            self.pool.release(self._buf_raw)
            self._buf_raw = None

    def _ship_buffer(self, final: bool = False) -> None:
        raw, view, n = self._buf_raw, self._buf, self._buf_len
        self._ship(self._buf_idx, view[:n], (raw, view))
        self._buf_idx += 1
        self._buf_len = 0
        if final:
            self._buf_raw = None
            return
        self._buf_raw = self.pool.acquire()
        self._buf = memoryview(self._buf_raw)

    def _ship(self, idx: int, data: memoryview, owned: tuple | None) -> Future[pb.BlockInfo]:
        self._slots.acquire()
        target = self._next_block()
        fut = self.core.executor.submit(self._send, idx, data, target, owned)
        self._inflight.append(fut)
        return fut

    def _send(self, idx: int, data: memoryview, target: pb.BlockInfo, owned: tuple | None) -> pb.BlockInfo:
        try:
            for attempt in range(WRITE_ATTEMPTS):
                addrs = [a for a in (self.core.workers.get(w) for w in target.workers) if a is not None]
                try:
                    acked, checksum = self.core.io.write_block(addrs, target.block_id, data)
                    info = pb.BlockInfo(block_id=target.block_id, offset=idx * self.bs, length=len(data),
                                        checksum=checksum, workers=acked)
                    self._done.append(info)
                    return info
                except CurvineError as e:
                    if attempt + 1 == WRITE_ATTEMPTS or e.errno == errno.ENOSPC and len(addrs) == 0:
                        raise
                    log.warning("block %d: %s; retrying on other workers", target.block_id, e)
                    target = self._allocate(1, exclude=list(target.workers))[0]
            raise CurvineError(errno.EIO, "unreachable")
        except BaseException as e:
            self._error = self._error or e
            raise
        finally:
            data.release()
            if owned is not None:
                owned[1].release()
                self.pool.release(owned[0])
            self._slots.release()

    def _next_block(self) -> pb.BlockInfo:
        if not self._spare:
            self._spare = self._allocate(4)
        return self._spare.pop(0)

    def _allocate(self, count: int, exclude: list[int] | None = None) -> list[pb.BlockInfo]:
        reply = self.core.meta.allocate(self.ino, self.lease_id, count, exclude, ident=self.ident)
        self.core.workers.learn(list(reply.workers))
        return list(reply.blocks)

    def _wait_all(self) -> None:
        for f in self._inflight:
            try:
                f.result()
            except BaseException as e:
                self._error = self._error or e
        self._inflight.clear()

    def _load_tail(self, reply: pb.OpenReply) -> None:
        """Appending inside a partial last block: start from its current bytes."""
        from curvine_py.client.reader import fetch_block
        idx = self.size // self.bs
        for b in reply.blocks:
            if b.offset // self.bs == idx:
                n = fetch_block(self.core, b, 0, self._buf[:b.length])
                self._buf[n:self.size - idx * self.bs] = bytes(self.size - idx * self.bs - n)
                break
        else:
            self._buf[:self.size - idx * self.bs] = bytes(self.size - idx * self.bs)
        self._buf_len = self.size - idx * self.bs
        self.size = idx * self.bs


def write_all(core: ClientCore, reply: pb.OpenReply, data: memoryview,
              progress: Callable[[int], None] | None = None, ident: Identity | None = None) -> pb.Attr:
    """Write a whole object from memory with no intermediate copy of full blocks."""
    w = FileWriter(core, reply, ident)
    try:
        step = w.bs * 4
        for off in range(0, len(data), step):
            w.write(data[off:off + step])
            if progress:
                progress(min(step, len(data) - off))
        return w.close()
    except BaseException:
        w.abort()
        raise
