"""Persist: upload a file's bytes from the pool to its UFS object (WorkerService.Persist).

The master picks a worker holding (some of) the file's blocks and names every block
with its live replicas and read tokens.  The worker streams the blocks in file order
into one ``Ufs.writer(key)`` (a multipart upload on S3): a block held here is read from
the store (verified chunk by chunk) and written piece by piece; any other block is read
from a replica over the data channel (a READ, as a client does) into a pooled block
buffer, checked against its checksum, then written, so a replica that fails half-way
is replaced by the next one before a byte of it reaches the upload.  Any failure aborts
the upload (nothing partial is left visible) and is one CurvineError: EIO for the UFS
and for blocks no replica could give, ENOENT for an unknown mount, EINVAL for a request
whose blocks overlap or reach past its size.

A file's blocks need not cover it: a sparse write or a truncate that grows the file
leaves holes (slots with no block, or a block shorter than its slot), which read as
zeros and are uploaded as zeros.  A truncate that shrinks a file shortens its last
block in the namespace only: the stored block keeps its longer bytes and checksum, so
only the first ``length`` bytes are uploaded (verified chunk by chunk where they are
read, as every partial READ is).
"""
from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Callable, Mapping, TypeVar

import xxhash

from curvine_py.common import frames
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.errors import CurvineError
from curvine_py.common.security import READ, BlockTokens
from curvine_py.pb import curvine_pb2, data_pb2
from curvine_py.ufs.base import ObjectInfo, Ufs, UfsError, UfsWriter
from curvine_py.worker import metrics
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.ufsfetch import BlockBuffers
from curvine_py.worker.ufsmounts import UfsMounts

log = logging.getLogger(__name__)

Op = data_pb2.Op
_T = TypeVar("_T")


class Persister:
    """Uploads files to their UFS; one Persist call at a time per gRPC thread."""

    def __init__(self, store: BlockStore, mounts: UfsMounts, pool: ConnectionPool, buffers: BlockBuffers,
                 worker_id: Callable[[], int], timeout_s: float = 30.0, tokens: BlockTokens | None = None) -> None:
        """tokens: the cluster's (this worker holds the secret): each block read from another
        worker goes with a read token minted just then, not the one the master sent with
        the request, which an upload longer than the token life would outlast."""
        self.tokens = tokens
        self.store = store
        self.mounts = mounts
        self.pool = pool
        self.buffers = buffers
        self.worker_id = worker_id
        self.timeout_s = timeout_s

    def persist(self, req: curvine_pb2.PersistRequest) -> curvine_pb2.PersistReply:
        """Upload req's blocks to req.key of mount req.mount_id; the object's etag and mtime."""
        blocks = sorted(req.blocks, key=lambda b: b.offset)
        _check_layout(req.key, blocks, req.size)
        ufs = self._mount(req.mount_id)
        start = time.perf_counter()
        try:
            info = self._upload(ufs, req, blocks)
        except BaseException:
            metrics.UFS_PERSISTS.labels("failed").inc()
            raise
        metrics.UFS_PERSISTS.labels("ok").inc()
        metrics.UFS_PERSIST_BYTES.inc(req.size)
        log.info("persisted %s key %r: %d bytes in %d blocks, %.2fs", ufs.uri, req.key, req.size,
                 len(blocks), time.perf_counter() - start)
        return curvine_pb2.PersistReply(etag=info.etag, mtime_ns=info.mtime_ns)

    def _upload(self, ufs: Ufs, req: curvine_pb2.PersistRequest, blocks: list[curvine_pb2.BlockInfo]) -> ObjectInfo:
        """The object's bytes, streamed block by block into one upload (aborted on failure)."""
        if req.size == 0:
            info = _ufs_call(ufs, req.key, lambda: ufs.put(req.key, b""))
        else:
            writer = _ufs_call(ufs, req.key, lambda: ufs.writer(req.key))
            try:
                addresses = {w.worker_id: w for w in req.workers}
                end = 0
                for b in blocks:
                    _write_zeros(ufs, req.key, writer, b.offset - end)      # a hole before it
                    self._copy_block(ufs, req.key, b, addresses, writer)
                    end = b.offset + b.length
                _write_zeros(ufs, req.key, writer, req.size - end)          # a hole at the end
                info = _ufs_call(ufs, req.key, writer.close)
            except BaseException:
                writer.abort()
                raise
        return info

    def _mount(self, mount_id: int) -> Ufs:
        """The mount's provider; a provider that cannot be opened is EIO (ENOENT: unknown id)."""
        try:
            return self.mounts.get(mount_id)
        except UfsError as e:
            raise CurvineError(errno.EIO, f"persist: UFS mount {mount_id}: {e.strerror}") from None

    def _copy_block(self, ufs: Ufs, key: str, b: curvine_pb2.BlockInfo,
                    addresses: Mapping[int, curvine_pb2.WorkerAddress], writer: UfsWriter) -> None:
        if b.block_id not in self.store or not self._copy_local(ufs, key, b, writer):
            self._copy_remote(ufs, key, b, addresses, writer)

    def _copy_local(self, ufs: Ufs, key: str, b: curvine_pb2.BlockInfo, writer: UfsWriter) -> bool:
        """Verified pieces of the local block straight into the upload (no copy here).
        False when the local copy failed before any of it was uploaded (gone, corrupt in
        its first chunk, another length): a replica may still give it."""
        written = False
        try:
            with self.store.open_reader(b.block_id, 0, b.length) as reader:   # a truncated block: its head
                if reader.length != b.length:
                    raise CurvineError(errno.EIO, f"holds {reader.length} bytes, the file's block {b.length}")
                for piece in reader:
                    _ufs_call(ufs, key, lambda: writer.write(piece))
                    written = True
        except UfsError:
            raise
        except CurvineError as e:
            if written:
                raise CurvineError(errno.EIO, f"persist of {key!r}: block {b.block_id}: {e.strerror}") from None
            log.warning("persist of %r: local block %d unusable (%s); reading a replica", key, b.block_id, e)
            return False
        return True

    def _copy_remote(self, ufs: Ufs, key: str, b: curvine_pb2.BlockInfo,
                     addresses: Mapping[int, curvine_pb2.WorkerAddress], writer: UfsWriter) -> None:
        """Read the block whole from the first replica that gives it, then upload it."""
        buf = self.buffers.acquire(b.length, time.monotonic() + self.timeout_s)
        view = memoryview(buf)[:b.length]
        try:
            self._read_replica(b, addresses, view)
            _ufs_call(ufs, key, lambda: writer.write(view))
        finally:
            view.release()
            self.buffers.release(buf)

    def _read_replica(self, b: curvine_pb2.BlockInfo, addresses: Mapping[int, curvine_pb2.WorkerAddress],
                      into: memoryview) -> None:
        me = self.worker_id()
        errors: list[str] = []
        if self.tokens is not None and self.tokens.enabled:
            b.token = self.tokens.mint(b.block_id, READ)
        for wid in b.workers:
            addr = addresses.get(wid)
            if wid == me or addr is None:
                errors.append(f"worker {wid}: {'this worker lacks it' if wid == me else 'no address'}")
                continue
            try:
                read_block(self.pool, addr, b, into)
                return
            except (CurvineError, OSError) as e:
                errors.append(f"worker {wid}: {e.strerror or e}")
        raise CurvineError(errno.EIO, f"block {b.block_id}: no replica could be read "
                                      f"({'; '.join(errors) or 'none listed'})")


def read_block(pool: ConnectionPool, addr: curvine_pb2.WorkerAddress, b: curvine_pb2.BlockInfo,
               into: memoryview) -> None:
    """READ the whole block b from the worker at addr into `into` (len = b.length) and
    check it against the reply's checksum (and b.checksum when the master knows it),
    unless the worker's copy is longer (a block cut by a truncate: _holds_more).
    The connection goes back to the pool only after a clean exchange."""
    sock = pool.get(addr.ip, addr.data_port)
    clean = False
    try:
        frames.send_frame(sock, data_pb2.DataHeader(op=Op.READ, block_id=b.block_id, offset=0,
                                                    length=b.length, token=b.token))
        h = frames.recv_header(sock)
        if h.op == Op.REPLY and h.errno:
            clean = True              # an error reply leaves the stream in sync
        h = frames.check_reply(h, f"worker {addr.worker_id}")
        if h.length != b.length:
            raise CurvineError(errno.EIO, f"sent {h.length} bytes of a {b.length}-byte block")
        frames.recv_exact_into(sock, into)
        got = xxhash.xxh3_64_intdigest(into)
        if (got != h.checksum or (b.checksum and got != b.checksum)) and not _holds_more(sock, b):
            clean = True
            raise CurvineError(errno.EBADMSG, "checksum mismatch")
        clean = True
    finally:
        _return(pool, addr, sock, clean)


def _holds_more(sock: socket.socket, b: curvine_pb2.BlockInfo) -> bool:
    """Does the worker's copy of b run past b.length?  Then b was cut by a truncate, and
    both checksums (the reply's, the master's) cover bytes the file no longer has; the
    head we read was verified chunk by chunk by the sending worker."""
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.READ, block_id=b.block_id, offset=b.length,
                                                length=1, token=b.token))
    h = frames.check_reply(frames.recv_header(sock), f"block {b.block_id}")
    if h.length > 1:   # a length is a claim: never allocated before it is checked
        raise frames.ChannelClosed(f"block {b.block_id}: a reply of {h.length} bytes to a read of 1")
    if h.length:
        frames.recv_exact_into(sock, memoryview(bytearray(1)))
    return h.length == 1


def _check_layout(key: str, blocks: list[curvine_pb2.BlockInfo], size: int) -> None:
    """EINVAL unless the blocks (sorted by offset) lie inside the file without overlapping."""
    end = 0
    for b in blocks:
        if b.offset < end or b.offset + b.length > size:
            raise CurvineError(errno.EINVAL, f"persist of {key!r}: block {b.block_id} at [{b.offset}, "
                                             f"+{b.length}) overlaps another or lies past the file's {size} bytes")
        end = b.offset + b.length


ZERO_PIECE = 4 << 20
ZEROS = memoryview(bytes(ZERO_PIECE))


def _write_zeros(ufs: Ufs, key: str, writer: UfsWriter, n: int) -> None:
    """n zero bytes into the upload (a hole of a sparse file), a piece at a time."""
    while n > 0:
        piece = ZEROS[:min(n, ZERO_PIECE)]
        _ufs_call(ufs, key, lambda: writer.write(piece))
        n -= len(piece)


def _return(pool: ConnectionPool, addr: curvine_pb2.WorkerAddress, sock: socket.socket, clean: bool) -> None:
    if clean:
        pool.put(addr.ip, addr.data_port, sock)
    else:
        sock.close()


def _ufs_call(ufs: Ufs, key: str, call: Callable[[], _T]) -> _T:
    """Run one UFS call; any failure of it is EIO naming the URI and key, one line."""
    try:
        return call()
    except Exception as e:
        cause = " ".join(((e.strerror if isinstance(e, OSError) and e.strerror else str(e))
                          or type(e).__name__).split())
        raise UfsError(errno.EIO, f"persist to {ufs.uri} key {key!r} failed: {cause}") from None

