"""Forwarding block writes to the next replica of a chain, and pushing local blocks.

A write reaches the first replica, which forwards every frame to the next one as soon
as it has it (before writing it to its own disk), so the second copy costs one more
network hop, not another client upload.  A downstream that cannot be reached or fails
mid-way is dropped: the write goes on locally and the downstream is simply absent from
the ``acked`` list of the reply, which tells the client (and the master) which replicas
exist.

Connections to peers are pooled (a long-lived cluster keeps a handful of sockets per
peer instead of a connect per 4 MiB block); an idle socket is health-checked before
reuse because a peer closes connections that stay idle too long.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from curvine_py.common import frames
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.errors import CurvineError
from curvine_py.pb import data_pb2
from curvine_py.worker import metrics
from curvine_py.worker.blockstore import BlockStore

log = logging.getLogger(__name__)

Op = data_pb2.Op


class Downstream:
    """The next replica of one block write; every failure just drops it."""

    def __init__(self, pool: ConnectionPool, target: data_pb2.ChainTarget, sock: socket.socket) -> None:
        self.pool = pool
        self.target = target
        self.sock: socket.socket | None = sock

    @classmethod
    def open(cls, pool: ConnectionPool, chain: Sequence[data_pb2.ChainTarget], block_id: int,
             size_hint: int = 0, tier: int = 0, token: str = "") -> "Downstream | None":
        """Connect to chain[0] and send WRITE_OPEN with the rest of the chain; None if unreachable."""
        target = chain[0]
        header = data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=block_id, length=size_hint,
                                     tier=tier, token=token)
        header.chain.extend(chain[1:])
        try:
            sock = pool.get(target.ip, target.port)
        except OSError as e:
            log.warning("block %d: replica %d at %s:%d unreachable: %s", block_id,
                        target.worker_id, target.ip, target.port, e)
            return None
        down = cls(pool, target, sock)
        down._send([frames.header_bytes(header)], block_id)
        return down if down.ok else None

    @property
    def ok(self) -> bool:
        return self.sock is not None

    def forward(self, piece: memoryview, block_id: int) -> None:
        """Forward one piece as a WRITE_DATA frame."""
        if self.sock is not None:
            hdr = frames.header_bytes(data_pb2.DataHeader(op=Op.WRITE_DATA, payload_len=len(piece)))
            self._send([hdr, piece], block_id)

    def forward_raw(self, piece: memoryview, block_id: int, payload_len: int | None = None) -> None:
        """Forward received bytes cut-through; payload_len starts a new WRITE_DATA frame of
        that size (its header goes out with this first piece in one sendmsg)."""
        if self.sock is None:
            return
        if payload_len is None:
            self._send([piece], block_id)
        else:
            hdr = frames.header_bytes(data_pb2.DataHeader(op=Op.WRITE_DATA, payload_len=payload_len))
            self._send([hdr, piece], block_id)

    def commit(self, length: int, checksum: int, block_id: int) -> list[int]:
        """Send WRITE_COMMIT and wait for the reply: the worker ids the downstream acked
        ([] on any failure)."""
        self.send_commit(length, checksum, block_id)
        return self.wait_commit(block_id)

    def send_commit(self, length: int, checksum: int, block_id: int) -> None:
        """Send WRITE_COMMIT without waiting, so the local commit can overlap it."""
        if self.sock is not None:
            self._send([frames.header_bytes(data_pb2.DataHeader(op=Op.WRITE_COMMIT, length=length,
                                                          checksum=checksum))], block_id)

    def wait_commit(self, block_id: int) -> list[int]:
        """The downstream's reply to WRITE_COMMIT: the worker ids it acked ([] on failure)."""
        if self.sock is None:
            return []
        try:
            h = frames.check_reply(frames.recv_header(self.sock), f"replica {self.target.worker_id}")
        except frames.ChannelClosed as e:
            self._drop(block_id, e)
            return []
        except CurvineError as e:   # an error reply: the stream is still in sync
            self._drop(block_id, e, close=False)
            return []
        except OSError as e:
            self._drop(block_id, e)
            return []
        self.pool.put(self.target.ip, self.target.port, self.sock)
        self.sock = None
        return list(h.acked)

    def abort(self) -> None:
        """Give up on this replica: closing the connection makes it discard the block."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _send(self, buffers: list[bytes | bytearray | memoryview], block_id: int) -> None:
        assert self.sock is not None
        try:
            frames.send_all(self.sock, buffers)
        except OSError as e:
            self._drop(block_id, e)

    def _drop(self, block_id: int, e: BaseException, close: bool = True) -> None:
        log.warning("block %d: replica %d at %s:%d dropped: %s", block_id, self.target.worker_id,
                    self.target.ip, self.target.port, e)
        if self.sock is not None:
            if close:
                self.sock.close()
            else:  # an error reply leaves the stream in sync: keep the connection
                self.pool.put(self.target.ip, self.target.port, self.sock)
            self.sock = None


def push_block(store: BlockStore, pool: ConnectionPool, block_id: int,
               chain: Sequence[data_pb2.ChainTarget], token: str = "") -> list[int]:
    """Copy a local block to the replicas in chain (re-replication); returns who acked.

    Raises CurvineError(ENOENT) if the block is not here, EBADMSG if it is corrupt, and
    EHOSTDOWN if chain[0] cannot be reached.
    """
    if not chain:
        return []
    with store.open_reader(block_id) as reader:
        down = Downstream.open(pool, chain, block_id, size_hint=reader.length, token=token)
        if down is None:
            raise CurvineError(errno.EHOSTDOWN, f"replica {chain[0].worker_id} unreachable")
        try:
            for piece in reader:
                down.forward(piece, block_id)
                if not down.ok:
                    break
        except BaseException:
            down.abort()
            raise
        return down.commit(reader.length, reader.checksum, block_id)


class CopyQueue:
    """Carries out the master's re-replication orders (HeartbeatReply.replicate) in the
    background, a few at a time, so heartbeats never wait for a copy.  An order for a
    block already being copied is ignored; a failed copy is only logged: the master
    gives the order again (maybe to another pair) when it is not confirmed in time."""

    def __init__(self, store: BlockStore, pool: ConnectionPool, threads: int = 2) -> None:
        self.store = store
        self.pool = pool
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="copy")
        self._active: set[int] = set()
        self._lock = threading.Lock()
        self.copied = 0

    def submit(self, block_id: int, targets: Sequence[data_pb2.ChainTarget], token: str) -> None:
        with self._lock:
            if block_id in self._active:
                return
            self._active.add(block_id)
        self._executor.submit(self._copy, block_id, list(targets), token)

    def _copy(self, block_id: int, targets: list[data_pb2.ChainTarget], token: str) -> None:
        try:
            acked = push_block(self.store, self.pool, block_id, targets, token)
            wanted = {t.worker_id for t in targets}
            if wanted - set(acked):
                metrics.COPIES.labels("failed").inc()
                log.warning("copy of block %d: only %s of %s acked", block_id, acked, sorted(wanted))
            else:
                self.copied += 1
                metrics.COPIES.labels("ok").inc()
                log.info("copied block %d to worker(s) %s", block_id, acked)
        except (CurvineError, OSError) as e:
            metrics.COPIES.labels("failed").inc()
            log.warning("copy of block %d to %s failed: %s", block_id, [t.worker_id for t in targets], e)
        except Exception:
            metrics.COPIES.labels("failed").inc()
            log.exception("copy of block %d failed", block_id)
        finally:
            with self._lock:
                self._active.discard(block_id)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
