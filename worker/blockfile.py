"""One block file: the streaming writer and the verifying reader.

A block is written through a BlockWriter (pieces are checksummed as they stream by and
written by the store's I/O engine (worker/ioengine.py: io_uring or a thread pool) while
the next piece arrives; commit verifies and hands the file to the store) and read
through a BlockReader (1 MiB chunks read with the engine into
pooled buffers, each verified against the meta file's chunk checksum before the caller
sees it; the next chunk is read while the caller sends the current one).

The meta file format lives in curvine_py/common/blockmeta.py (docs/worker.md has the
bytes), shared with the short-circuit client that verifies local block files with it.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import shutil
import typing
from concurrent.futures import Future
from typing import Generator, Iterator

import xxhash

from curvine_py.common.blockmeta import BlockHasher, BlockMeta
from curvine_py.common.buffers import ALIGN, aligned
from curvine_py.common.errors import CurvineError
from curvine_py.worker import metrics

READ_STEP = 1 << 20   # what a block reader reads, verifies and sends at a time: whole chunks
SEND_STEP = 4 << 20   # ... or maps, verifies and sends from the page cache (fewer mappings)

if typing.TYPE_CHECKING:
    from curvine_py.common.buffers import BufferPool
    from curvine_py.worker.ioengine import IoEngine


class DataDir(typing.Protocol):
    """A data directory as block files see it: opaque, handed back to the store."""


class BlockEntry(typing.Protocol):
    """An installed block as its reader needs it (blockstore.BlockEntry)."""

    block_id: int
    length: int
    checksum: int
    chunk_size: int

    @property
    def chunk_sums(self) -> typing.Sequence[int]: ...


class BlockStore(typing.Protocol):
    """What block files ask of the store that made them (blockstore.BlockStore).  A
    protocol, so this module does not import the store, which builds on it."""

    io: "IoEngine"
    read_io: str
    read_pool: "BufferPool"

    def grow_reservation(self, ddir: typing.Any, extra: int) -> None: ...
    def discard_staging(self, ddir: typing.Any, path: str, reserved: int, size: int) -> None: ...
    def install(self, writer: "BlockWriter", meta: BlockMeta, meta_staging: str) -> typing.Any: ...
    def reader_done(self, entry: typing.Any) -> None: ...
    def acquire_read_buffers(self) -> tuple[mmap.mmap, mmap.mmap]: ...
    def mark_corrupt(self, entry: typing.Any, reason: str) -> None: ...
    def note_full(self) -> None: ...

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_BLOCK = 4 * MiB           # space reserved for a new block whose size is unknown

def supports_direct(directory: str) -> bool:
    """Does this directory's filesystem take O_DIRECT writes (tmpfs may not)?  Probed
    with a real aligned write, since some filesystems accept the flag at open only."""
    probe = os.path.join(directory, ".direct-probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT | os.O_CLOEXEC, 0o644)
    except OSError:
        return False
    buf = mmap.mmap(-1, ALIGN)
    try:
        return os.pwrite(fd, buf, 0) == ALIGN
    except OSError:
        return False
    finally:
        buf.close()
        os.close(fd)
        unlink(probe)


def io_error(e: OSError, what: str) -> CurvineError:
    """A disk error as the errno a client should see: ENOSPC stays ENOSPC, the rest is EIO."""
    if isinstance(e, CurvineError):
        return e
    code = errno.ENOSPC if e.errno in (errno.ENOSPC, errno.EDQUOT) else errno.EIO
    return CurvineError(code, f"{what}: {os.strerror(e.errno or errno.EIO)}")


# ---------------------------------------------------------------- writer

class PendingWrite:
    """One in-flight write; wait() settles short writes and maps errors to CurvineError."""
    __slots__ = ("future", "view", "offset", "writer", "fd", "close_fd", "_settled")

    def __init__(self, writer: "BlockWriter", future: Future[int], view: memoryview, offset: int,
                 fd: int | None = None, close_fd: bool = False) -> None:
        self.writer, self.future, self.view, self.offset = writer, future, view, offset
        self.fd = writer.fd if fd is None else fd
        self.close_fd = close_fd
        self._settled = False

    def done(self) -> bool:
        return self._settled or self.future.done()

    def wait(self) -> None:
        """Block until the piece is written; the caller may then reuse its buffer."""
        if self._settled:
            return
        self._settled = True
        try:
            n = self.future.result()
            if n < len(self.view):
                self.writer.store.io.pwrite_full(self.fd, self.view[n:], self.offset + n)
        except OSError as e:
            raise self.writer.disk_error(e, "write block") from None
        finally:
            self.view = memoryview(b"")
            if self.close_fd:
                os.close(self.fd)


class BlockWriter:
    """Appends the bytes of one block to a staging file, checksumming as they stream by.

    With ``direct`` the file was opened with O_DIRECT: pieces go from the caller's
    (pooled, page-aligned) buffer to the device without filling the page cache.  A
    fresh page-cache page is the costliest part of a buffered write here (on a VM whose
    free memory goes back to the host, each one faults), and the device takes direct
    writes faster than the page cache fills.  The unaligned end of the last piece is
    kept aside and written padded at commit, then the file is cut to its length.  A
    piece that cannot go direct (unaligned memory, or after an unaligned one) turns
    the file back to buffered writes for the rest of the block.
    """

    def __init__(self, store: BlockStore, block_id: int, ddir: DataDir, path: str, fd: int,
                 reserved: int, initial_size: int, direct: bool = False) -> None:
        self.store, self.block_id, self.dir, self.path, self.fd = store, block_id, ddir, path, fd
        self.reserved = reserved
        self.initial_size = initial_size      # > 0 for a recycled file
        self.direct = direct
        self._tail: mmap.mmap | None = None   # direct: the unaligned end of the last piece
        self._tail_len = 0
        self._tail_at = 0                     # its offset in the file
        self.length = 0
        self._hasher = BlockHasher()
        self._pending: list[PendingWrite] = []
        self._closed = False

    def append(self, data: bytes | bytearray | memoryview) -> PendingWrite:
        """Checksum data and start writing it at the block's end; the buffer must stay
        untouched until the returned PendingWrite is waited (or flush/commit)."""
        if self._closed:
            raise CurvineError(errno.EINVAL, f"block {self.block_id} writer is closed")
        view = memoryview(data).cast("B")
        n = len(view)
        if self.length + n > self.reserved:
            grow = max(self.length + n - self.reserved, DEFAULT_BLOCK)
            self.store.grow_reservation(self.dir, grow)
            self.reserved += grow
        self._hasher.update(view)
        offset = self.length
        self.length += n
        if self.direct and n and not (self._tail_len == 0 and aligned(view)):
            self._to_buffered()
        if self.direct and n % ALIGN:
            cut = n - n % ALIGN
            self._keep_tail(view[cut:], offset + cut)
            view = view[:cut]
        fut = self.store.io.write_from(self.fd, view, offset) if len(view) else _done(0)
        pending = PendingWrite(self, fut, view, offset)
        if len(self._pending) > 16:
            self._settle_done()
        self._pending.append(pending)
        return pending

    def disk_error(self, e: OSError, what: str) -> CurvineError:
        """A failed write of this block as the client's error; a full disk also tells the
        store, whose figures the master must see at once (or it keeps placing blocks here)."""
        error = io_error(e, f"{what} {self.block_id}")
        if error.errno == errno.ENOSPC:
            self.store.note_full()
        return error

    def _keep_tail(self, piece: memoryview, at: int) -> None:
        """Copy the unaligned end of a direct piece aside (zero-padded); written at commit."""
        if self._tail is None:
            self._tail = mmap.mmap(-1, ALIGN)
        self._tail[:len(piece)] = piece
        self._tail[len(piece):] = bytes(ALIGN - len(piece))
        self._tail_len, self._tail_at = len(piece), at

    def _to_buffered(self) -> None:
        """Stop writing direct: wait for the direct writes, clear O_DIRECT on the file,
        and write a kept tail through the page cache."""
        self.flush()
        self.direct = False
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            if self._tail_len:
                self._write_tail(self._tail_len)
        except OSError as e:
            raise self.disk_error(e, "write block") from None

    def _write_tail(self, length: int) -> None:
        """Write the kept tail at its offset: padded to ALIGN on a direct file (which
        _finish_data then cuts to the block's length), as it is on a buffered one."""
        assert self._tail is not None
        with memoryview(self._tail) as tail:
            self.store.io.pwrite_full(self.fd, tail[:length], self._tail_at)
        self._tail_len = 0

    def _settle_done(self) -> None:
        keep = []
        for p in self._pending:
            if p.done():
                p.wait()
            else:
                keep.append(p)
        self._pending = keep

    def flush(self) -> None:
        """Wait until every appended piece is written (raises the first write error)."""
        pending, self._pending = self._pending, []
        first: CurvineError | None = None
        for p in pending:
            try:
                p.wait()
            except CurvineError as e:
                first = first or e
        if first is not None:
            raise first

    @property
    def checksum(self) -> int:
        return self._hasher.checksum

    def verify(self, expected_length: int | None = None,
               expected_checksum: int | None = None) -> None:
        """Check length and xxh3 of what was appended (EBADMSG on a mismatch).  Needs no
        disk wait, so the data server can verify, then commit downstream replicas while
        this one's disk writes finish."""
        if expected_length is not None and expected_length != self.length:
            raise CurvineError(errno.EBADMSG, f"block {self.block_id}: got {self.length} "
                                              f"bytes, expected {expected_length}")
        if expected_checksum is not None and expected_checksum != self.checksum:
            metrics.CHECKSUM_FAILURES.labels("write").inc()
            raise CurvineError(errno.EBADMSG, f"block {self.block_id}: checksum mismatch")

    def commit(self, expected_length: int | None = None,
               expected_checksum: int | None = None, sync: bool = False) -> BlockEntry:
        """Verify (on failure the block is discarded), finish the disk writes and make
        the block visible; sync=True fdatasyncs the data first."""
        meta_staging = self.path + ".meta"
        try:
            self.verify(expected_length, expected_checksum)
            meta = self._meta()
            self._write_meta(meta_staging, meta)   # overlaps the last data writes
            self._finish_data(sync)
        except BaseException:
            self.abort()
            raise
        self._closed = True
        return self.store.install(self, meta, meta_staging)

    def commit_written(self, length: int, checksum: int, chunk_sums: list[int], chunk_size: int,
                       sync: bool = False) -> BlockEntry:
        """Commit bytes a short-circuit client wrote into this staging file through a
        passed descriptor (worker/localwrite.py).  Its checksums are taken as given: a
        client holding the block's write token could send any bytes over TCP as well, and
        every read verifies chunks against them (a wrong sum marks the copy bad, and the
        master replaces it from another replica).  The client may have padded the file to
        an O_DIRECT boundary; it is cut to `length`."""
        try:
            if self._closed or self.length:
                raise CurvineError(errno.EINVAL, f"block {self.block_id}: bytes were appended here as well")
            if not 0 < chunk_size <= self.store.read_pool.size or len(chunk_sums) != -(-length // chunk_size):
                raise CurvineError(errno.EBADMSG, f"block {self.block_id}: {len(chunk_sums)} chunk "
                                                  f"checksums of {chunk_size} bytes for {length} bytes")
            if length > self.reserved:
                self.store.grow_reservation(self.dir, length - self.reserved)
                self.reserved = length
            self.length = length
            meta = BlockMeta(length, checksum, tuple(chunk_sums), chunk_size)
            meta_staging = self.path + ".meta"
            self._write_meta(meta_staging, meta)
            self._finish_data(sync, cut=True)
        except BaseException:
            self.abort()
            raise
        self._closed = True
        return self.store.install(self, meta, meta_staging)

    def _meta(self) -> BlockMeta:
        return BlockMeta(self.length, self.checksum, tuple(self._hasher.chunk_sums()), self._hasher.chunk_size)

    def _finish_data(self, sync: bool, cut: bool = False) -> None:
        """Wait for the writes, write a kept tail, cut the file to the block's length
        (a padded tail, a longer recycled file, or `cut`), and close it."""
        self.flush()
        try:
            padded = self._tail_len > 0
            if padded:
                self._write_tail(ALIGN)
            if padded or cut or self.initial_size > self.length:
                os.ftruncate(self.fd, self.length)
            if sync:
                self.store.io.fsync(self.fd, datasync=True).result()
        except OSError as e:
            raise self.disk_error(e, "finish block") from None
        finally:
            self._close_tail()
            os.close(self.fd)
            self.fd = -1

    def _close_tail(self) -> None:
        # Not closed by hand: the I/O engine may still hold a view of it until the
        # completion is reaped; the mapping goes with its last reference.
        self._tail = None

    def _write_meta(self, path: str, meta: BlockMeta) -> None:
        """Start writing the meta file; flush() waits for it with the data writes."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self.disk_error(e, "write meta of block") from None
        view = memoryview(meta.encode())
        try:
            fut = self.store.io.write_from(fd, view, 0)
        except OSError as e:
            os.close(fd)
            raise self.disk_error(e, "write meta of block") from None
        self._pending.append(PendingWrite(self, fut, view, 0, fd=fd, close_fd=True))

    def abort(self) -> None:
        """Discard the block (idempotent); its staging file is recycled."""
        if self._closed:
            return
        self._closed = True
        for p in self._pending:
            try:
                p.wait()
            except CurvineError:
                pass
        self._pending = []
        self._close_tail()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        unlink(self.path + ".meta")
        self.store.discard_staging(self.dir, self.path, self.reserved, max(self.length, self.initial_size))


def _done(n: int) -> Future[int]:
    f: Future[int] = Future()
    f.set_result(n)
    return f


# ---------------------------------------------------------------- reader

MADV_POPULATE_READ = 22   # Linux 5.14+: fault a mapping in, an I/O error returned (not SIGBUS)


def can_populate() -> bool:
    """Does this kernel take MADV_POPULATE_READ (read_io "sendfile" needs it)?"""
    m = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        m.madvise(MADV_POPULATE_READ)
        return True
    except OSError:
        return False
    finally:
        m.close()


class FileRange(typing.NamedTuple):
    """Verified bytes of a block file, for the caller to send from the page cache
    (frames.send_file)."""
    fd: int
    offset: int
    length: int


class BlockReader:
    """Iterates verified pieces of a block range; each piece is a view into a pooled
    buffer, valid until the next iteration.  The next step is read while the caller
    consumes the current one.  A block in the page cache can instead be verified in place
    and sent from there (``sendable``, ``file_ranges``)."""

    def __init__(self, store: BlockStore, entry: BlockEntry, fd: int, offset: int, length: int,
                 dfd: int = -1) -> None:
        self.store, self.entry, self.fd = store, entry, fd
        self.dfd = dfd            # the same file opened O_DIRECT (a block written direct), or -1
        self.offset, self.length = offset, length
        self.checksum = entry.checksum
        self._closed = False
        self._gen: Generator[memoryview, None, None] | None = None

    def __enter__(self) -> "BlockReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop iterating (returns the buffers to the pool) and release the block."""
        if self._gen is not None:
            self._gen.close()
            self._gen = None
        if not self._closed:
            self._closed = True
            os.close(self.fd)
            if self.dfd >= 0:
                os.close(self.dfd)
            self.store.reader_done(self.entry)

    def __iter__(self) -> Iterator[memoryview]:
        if self._closed:
            raise CurvineError(errno.EBADF, "block reader is closed")
        if self._gen is None:
            self._gen = self._pieces()
        return self._gen

    @property
    def sendable(self) -> bool:
        """May the range go out as file_ranges?  With read_io "sendfile", for a range of at
        least READ_STEP of a block read through the page cache (not one written O_DIRECT,
        which is read O_DIRECT into a pooled buffer: no page cache to send from) whose
        chunks are whole pages (a mapping starts on a page).  A small range (a random
        read) is read with preadv: its copy costs little, and one not in the page cache
        faults in slower through a mapping (the fault's read-around; 128 KiB reads of
        uncached blocks here: p99 10.6-11.9 ms mapped, 1.4-2.8 by preadv)."""
        return (self.store.read_io == "sendfile" and self.dfd < 0 and self.length >= READ_STEP
                and self.entry.chunk_size % mmap.ALLOCATIONGRANULARITY == 0)

    def file_ranges(self) -> Generator[FileRange, None, None]:
        """The range as verified ranges of the block file, a step at a time: the step's
        whole chunks are mapped, faulted in (MADV_POPULATE_READ: a disk error is an
        error, not a SIGBUS), checked in place and unmapped; the caller then sends the
        step's part of the range from the page cache.  The bytes are copied once, into
        the socket (on a veth or NIC with scatter-gather not even that: the socket takes
        the page-cache pages), instead of into a pooled buffer and then into the socket."""
        if self._closed:
            raise CurvineError(errno.EBADF, "block reader is closed")
        if self.length == 0:
            return
        steps = self._steps(SEND_STEP)
        stop = steps[-1][0] + steps[-1][1]
        try:
            size = os.fstat(self.fd).st_size
        except OSError as e:
            raise io_error(e, f"stat block {self.entry.block_id}") from None
        if size < stop:   # a mapping past the file's end would fault
            self.store.mark_corrupt(self.entry, f"file short: {size} of {stop} bytes")
            raise CurvineError(errno.EBADMSG, f"block {self.entry.block_id} is truncated")
        end = self.offset + self.length
        for at, n in steps:
            self._verify_mapped(at, n)
            lo = max(self.offset, at)
            yield FileRange(self.fd, lo, min(end, at + n) - lo)

    def _verify_mapped(self, at: int, n: int) -> None:
        """_verify the file's bytes [at, at+n) through a mapping of them."""
        try:
            m = mmap.mmap(self.fd, n, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=at)
        except OSError as e:
            raise io_error(e, f"map block {self.entry.block_id}") from None
        try:
            try:
                m.madvise(MADV_POPULATE_READ)
            except OSError as e:
                raise io_error(e, f"read block {self.entry.block_id}") from None
            with memoryview(m) as view:
                self._verify(at, n, view)
        finally:
            m.close()

    def _pieces(self) -> Generator[memoryview, None, None]:
        if self.length == 0:
            return
        steps = self._steps()
        bufs = self.store.acquire_read_buffers()
        views = [memoryview(b) for b in bufs]
        inflight: _StepRead | None = None
        try:
            inflight = _StepRead(self, views[0], *steps[0])
            end = self.offset + self.length
            for k, (at, n) in enumerate(steps):
                cur = inflight
                assert cur is not None
                got = cur.finish()
                inflight = _StepRead(self, views[(k + 1) % 2], *steps[k + 1]) if k + 1 < len(steps) else None
                self._verify(at, n, cur.view[:got])
                yield cur.view[max(self.offset, at) - at:min(end, at + n) - at]
        finally:
            if inflight is not None:
                inflight.finish(quiet=True)
            for v in views:
                v.release()
            for b in bufs:
                self.store.read_pool.release(b)

    def _steps(self, most: int = 0) -> list[tuple[int, int]]:
        """(offset, length) of each read step: the whole chunks the range touches (a
        chunk is verified whole, so a read within one chunk, or across a boundary, reads
        one or two of them, never more), in steps of as many chunks as a pooled buffer
        holds (or `most` bytes hold)."""
        cs, length = self.entry.chunk_size, self.entry.length
        most = most or self.store.read_pool.size
        if cs > most:
            raise CurvineError(errno.EBADMSG, f"block {self.entry.block_id}: chunk size {cs} "
                                              f"exceeds the read buffer ({most})")
        span = most // cs * cs
        start = self.offset // cs * cs
        stop = min(length, -(-(self.offset + self.length) // cs) * cs)
        return [(at, min(span, stop - at)) for at in range(start, stop, span)]

    def _verify(self, at: int, want: int, data: memoryview) -> None:
        """Check every chunk of a step read at `at` (a multiple of the chunk size)."""
        cs = self.entry.chunk_size
        if len(data) != want:   # a short read of a regular file: it was truncated
            self.store.mark_corrupt(self.entry, f"bytes at {at} short: {len(data)} of {want}")
            raise CurvineError(errno.EBADMSG, f"block {self.entry.block_id} is truncated")
        for pos in range(0, want, cs):
            chunk = (at + pos) // cs
            if xxhash.xxh3_64_intdigest(data[pos:pos + cs]) != self.entry.chunk_sums[chunk]:
                metrics.CHECKSUM_FAILURES.labels("read").inc()
                self.store.mark_corrupt(self.entry, f"chunk {chunk} checksum mismatch")
                raise CurvineError(errno.EBADMSG, f"block {self.entry.block_id} chunk {chunk} is corrupt")


class _StepRead:
    """One read step (whole chunks) being read; finish() completes short reads synchronously.

    With ``read_io = "pread"`` (or "sendfile", the default, for blocks it does not send
    from the page cache) a step is read at once with ``preadv``
    in the serving thread (the GIL is released during the copy): measured on 2 cores a
    block fetch of cached chunks ran 15-20% faster than through the shared io_uring,
    whose submit and completion hand-offs cost more than the copy (docs/performance.md).
    A block written with O_DIRECT (not in the page cache) is read with O_DIRECT through
    the I/O engine instead, overlapping the send of the previous chunk, without filling
    the page cache.  "uring" reads every chunk through the I/O engine (io_uring or its
    thread pool, worker.io_engine)."""
    __slots__ = ("reader", "view", "offset", "future")

    def __init__(self, reader: BlockReader, buf: memoryview, offset: int, n: int) -> None:
        self.reader, self.view, self.offset = reader, buf[:n], offset
        io = reader.store.io
        if reader.store.read_io == "uring":
            self.future = io.read_into(reader.fd, self.view, offset)
            return
        want = -(-n // ALIGN) * ALIGN         # O_DIRECT reads whole sectors (past EOF: short)
        if reader.dfd >= 0 and offset % ALIGN == 0 and want <= len(buf):
            self.future = io.read_into(reader.dfd, buf[:want], offset, punt=False)
            return
        try:
            self.future = _done(os.preadv(reader.fd, [self.view], offset))
        except OSError as e:
            self.future = Future()
            self.future.set_exception(e)

    def finish(self, quiet: bool = False) -> int:
        """Bytes read (fewer only at end of file); raises EIO on a disk error."""
        try:
            got = min(self.future.result(), len(self.view))
            if 0 < got < len(self.view):   # a short read: the rest through the page cache
                got += self.reader.store.io.pread_full(self.reader.fd, self.view[got:], self.offset + got)
            return got
        except OSError as e:
            if quiet:
                return 0
            raise io_error(e, f"read block {self.reader.entry.block_id}") from None


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove %s: %s", path, e)


def remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        unlink(path)
