"""A block sent to its workers piece by piece while the writer is still filling it.

Why: a 14 MiB KV chunk written through the mount used to wait in close(2) for its last
blocks to travel whole to both replicas (6-11 ms of a ~40 ms file), because a block was
shipped only once complete.  A stream opens the block on its workers as soon as the
writer has its first 1 MiB piece and sends every further piece as it arrives, so at
close only the tail and the commit are left.

Rules that keep it safe:
* The writer owns the block's buffer until ``finish``; ``feed(ready)`` says the bytes
  below ``ready`` were written in order.  A later write below ``ready`` calls ``abort``
  (those bytes may already be on the wire): the workers drop the uncommitted block when
  its connection closes, and the writer ships the block whole, as before streams.
* Pieces are sent by *pumps* on the client's shared executor, one at a time per
  stream.  A pump sends what is ready and returns; it never waits for the writer, so
  streams cannot hold threads that the writer's other blocks need.
* A stream whose connection fails is not an error: at ``finish`` the block is sent
  again by the writer's ordinary path (``fallback``), which retries on other workers.
* Nothing is committed unchecked: at ``finish`` the xxh3 of the bytes that went out is
  checked against the records of the writes (``check``, DirtyBlock.verify); bytes sent
  wrong go again whole from the buffer, bytes the buffer lost fail the block (EIO).
* A replica on this host is written into its block file by the stream itself
  (short-circuit, ``BlockWriter.open_local``) when its worker allows it; the other replicas
  get the pieces over the network, as a chain among themselves.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
from concurrent.futures import Executor, Future
from typing import Callable

import xxhash

from curvine_py.client.blockio import BlockIO, RemoteWriter
from curvine_py.client.blockpaths import BlockWriter
from curvine_py.client.localwrite import LocalFile
from curvine_py.common.blockmeta import BlockHasher
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)


class BlockStream:
    """One block of a file, on its way to its workers while it is written."""

    def __init__(self, io: BlockIO, executor: Executor, target: pb.BlockInfo, addrs: list[pb.WorkerAddress],
                 offset: int, view: memoryview, block_size: int,
                 fallback: Callable[[int], pb.BlockInfo], check: Callable[[int, int], bool],
                 done: Callable[[int], None], writer: BlockWriter | None = None) -> None:
        """fallback(length) ships view[:length] the ordinary way (and frees the buffer);
        check(length, xxh3 of the bytes sent): are they the bytes written (False: send
        again; raises when the buffer lost them); done(length) frees the buffer after a
        committed stream, or a failed one; writer: how the replicas are written
        (BlockPaths.writer; None: all over the network)."""
        self.io = io
        self.executor = executor
        self.target = target
        self.addrs = addrs
        self.offset = offset
        self.view = view
        self.block_size = block_size
        self.fallback = fallback
        self.check = check
        self.done = done
        self.future: Future[pb.BlockInfo] = Future()
        self._lock = threading.Lock()
        self._ready = 0                  # bytes the writer has handed over, in order
        self._sent = 0                   # bytes on the wire (or given up after a failure)
        self._length: int | None = None  # set by finish: the block's final length
        self._aborted = False
        self._pumping = False
        self.writer = writer or RemoteWriter(io)
        self._opened = False
        self._head: pb.WorkerAddress | None = None
        self._sock: socket.socket | None = None
        self._file: LocalFile | None = None     # the replica on this host, written directly
        self._failed: BaseException | None = None
        self._hash = xxhash.xxh3_64()
        self._sums: BlockHasher | None = None   # chunk checksums, for the local replica's meta

    @property
    def ready(self) -> int:
        return self._ready

    # ------------------------------------------------------------------ the writer's side
    def feed(self, ready: int) -> None:
        """The first `ready` bytes are written; send what was not sent yet."""
        with self._lock:
            if ready > self._ready and self._length is None:
                self._ready = ready
                self._kick()

    def finish(self, length: int) -> Future[pb.BlockInfo]:
        """The block is complete at length bytes; the buffer now belongs to the stream.
        The future gives the block's BlockInfo once it is on its workers, checked."""
        with self._lock:
            self._length = self._ready = length
            self._kick()
        return self.future

    def abort(self) -> None:
        """Drop the stream (bytes already sent changed): the block is never committed."""
        with self._lock:
            self._aborted = True
            self._kick()

    def _kick(self) -> None:
        """Start a pump unless one runs (called with the lock held)."""
        if not self._pumping:
            self._pumping = True
            self.executor.submit(self._pump)

    # ------------------------------------------------------------------ pumps
    def _pump(self) -> None:
        while True:
            with self._lock:
                start, end, length = self._sent, self._ready, self._length
                if self._aborted or (start >= end and length is None):
                    self._pumping = False
                    aborted = self._aborted
                    break
            if start < end:
                self._send(start, end)
            if length is not None and self._sent >= length:
                self._complete(length)
                return
        if aborted:
            self._close(ok=False)

    def _send(self, start: int, end: int) -> None:
        if self._failed is None:
            try:
                if not self._opened:
                    self._open()
                data = self.view[start:end]
                if self._file is not None:   # started first: the disk writes while the network sends
                    self._file.write(self.view, start, end)
                if self._sock is not None:
                    self.io.send_pieces(self._sock, self.target.block_id, data)
                (self._sums or self._hash).update(data)
            except (CurvineError, OSError) as e:
                self._fail(e)
            except Exception as e:   # a bug, or the view released under an aborted stream
                if not self._aborted:
                    log.exception("streaming block %d", self.target.block_id)
                self._fail(e)
        self._sent = end

    def _open(self) -> None:
        """Open the block on its workers: a replica on this host by short-circuit if its
        worker takes it, the others (all, else) over the network as one chain."""
        self._opened = True
        self._file, remote = self.writer.open_local(self.addrs, self.target, self.block_size, self.view)
        if self._file is not None:
            self._sums = BlockHasher()
        if remote:
            self._head, self._sock = self.io.open_stream(remote, self.target.block_id, self.block_size,
                                                         self.target.token, self.target.tier)

    def _checksum(self) -> int:
        return self._sums.checksum if self._sums is not None else self._hash.intdigest()

    def _commit(self, length: int) -> list[int]:
        """Commit every replica: the network chain's commit is sent first, so its workers
        finish while the local one installs; returns the worker ids that hold the block."""
        bid = self.target.block_id
        checksum = self._checksum()
        if self._sock is not None:
            self.io.start_commit(self._sock, bid, length, checksum)
        acked: list[int] = []
        if self._file is not None and self._sums is not None:
            f, self._file = self._file, None
            acked += f.commit(bid, length, checksum, self._sums)
        if self._sock is not None and self._head is not None:
            acked += self.io.commit_reply(self._sock, self._head, bid, checksum)
        return acked

    def _complete(self, length: int) -> None:
        """Commit the streamed block once its bytes are checked; ship it again the ordinary
        way if the stream broke or sent other bytes; fail it if the bytes are lost."""
        try:
            if self._failed is None and (self._sock is not None or self._file is not None) \
                    and not self.check(length, self._checksum()):
                self._fail(CurvineError(errno.EIO, "streamed bytes differ from the bytes written"))
            if self._failed is None and (self._sock is not None or self._file is not None):
                try:
                    acked = self._commit(length)
                except (CurvineError, OSError) as e:
                    self._fail(e)
                else:
                    self._close(ok=True)
                    self.done(length)
                    self.future.set_result(pb.BlockInfo(block_id=self.target.block_id, offset=self.offset,
                                                        length=length, checksum=self._checksum(), workers=acked,
                                                        token=self.target.token))
                    return
            self.future.set_result(self.fallback(length))   # empty, broken, or sent wrong
        except BaseException as e:   # lost bytes (check), or the fallback failed: never committed
            self._close(ok=False)
            self.done(length)
            self.future.set_exception(e)

    def _fail(self, e: BaseException) -> None:
        log.info("streaming block %d failed (%s); it is sent whole at its end", self.target.block_id, e)
        self._failed = e
        self._close(ok=False)

    def _close(self, ok: bool) -> None:
        f, self._file = self._file, None
        if f is not None:   # not committed: the worker recycles its staging file
            f.abort()
        sock, self._sock = self._sock, None
        if sock is not None and self._head is not None:
            self.io.done_with(self._head, sock, ok)
