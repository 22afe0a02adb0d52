"""Block files on the worker's data dirs: staging, atomic commit, checksums, capacity.

Layout of one data dir (docs/worker.md has the byte format of the meta file)::

    <dir>/blocks/<xx>/<block_id>        block bytes (xx = low byte of xxh3(block_id), hex)
    <dir>/blocks/<xx>/<block_id>.meta   length, whole-block xxh3, one xxh3 per 1 MiB chunk
    <dir>/staging/                      blocks being written (emptied at start)
    <dir>/free/                         files of deleted blocks, overwritten by new blocks

Commit order: the data file is renamed into ``blocks/`` first and the meta file last, so
the meta file is the commit record: a data file without a meta file is a leftover and
is removed at start; a meta file whose data file is missing or has the wrong size is
removed too.  After a power loss without fsync a data file could hold stale bytes
under a valid meta file; the per-chunk checksums catch that on the first read, which
drops the block and reports it removed so the master re-replicates it.

Freed block files are recycled (renamed into ``free/`` and overwritten in place by the
next block) because their page-cache pages are already allocated: touching fresh
memory is the slowest thing on these machines (docs/worker.md has the measurements).
Writers and readers of one block file live in blockfile.py.
"""
from __future__ import annotations

from array import array
import errno
import fcntl
import itertools
import logging
import mmap
import os
import re
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, cast

from curvine_py.common.blockmeta import CHUNK, block_file
from curvine_py.common.buffers import BufferPool
from curvine_py.common.config import parse_size
from curvine_py.common.errors import ConfigError, CurvineError
from curvine_py.worker.blockfile import (DEFAULT_BLOCK, READ_STEP, BlockMeta, BlockReader, BlockWriter, can_populate,
                                         PendingWrite, io_error, remove_tree, supports_direct,
                                         unlink)
from curvine_py.worker.memtier import MemoryReader, MemoryTier
from curvine_py.worker.ioengine import IoEngine

__all__ = ["CHUNK", "DEFAULT_BLOCK", "READ_STEP", "MAX_FREE_FILES", "TIERS", "TIER_INDEX", "BlockEntry", "BlockMeta",
           "BlockReader", "BlockStore", "BlockWriter", "DataDir", "PendingWrite", "parse_dir_spec"]

log = logging.getLogger(__name__)

TIERS = ("MEM", "SSD", "HDD", "DISK")
TIER_INDEX = {name: i + 1 for i, name in enumerate(TIERS)}   # DataHeader.tier; 0 = any
MAX_FREE_FILES = 256              # recycled files kept per data dir (1 GiB of 4 MiB blocks)
PRIVATE_DIR_MODE = 0o700          # staging/, free/, blocks/: the worker's uid and root alone
_DIR_SPEC = re.compile(r"^\s*\[(?P<tier>[A-Za-z]+)(?::(?P<cap>[^\]]*))?\]\s*(?P<path>.+?)\s*$")


# ---------------------------------------------------------------- dir specs

def parse_dir_spec(spec: str) -> tuple[str, int | None, str]:
    """'[SSD:100GB]/data1' -> ('SSD', 107374182400, '/data1'); a bare path is tier DISK."""
    m = _DIR_SPEC.match(spec)
    if not m:
        if not spec.strip() or spec.strip().startswith("["):
            raise ConfigError(f"bad worker.dirs entry {spec!r} (use e.g. [SSD:100GB]/data1)")
        return "DISK", None, spec.strip()
    tier = m.group("tier").upper()
    if tier not in TIERS:
        raise ConfigError(f"unknown tier {tier!r} in worker.dirs entry {spec!r} (one of {TIERS})")
    cap = m.group("cap")
    capacity = parse_size(cap) if cap else None
    if capacity is not None and capacity <= 0:
        raise ConfigError(f"capacity must be positive in worker.dirs entry {spec!r}")
    return tier, capacity, m.group("path")


@contextmanager
def unshared(path: str) -> Iterator[bool]:
    """Whether no other open file description of path exists (True), held while the body runs.

    A write lease (F_SETLEASE F_WRLCK) is granted only when nobody else has the file open,
    and while it is held another open of the file waits for it to be let go; so a file
    found unshared stays so until the body (a rename out of its place) is done.  The
    lease's break signal is pointed at nobody (F_SETOWN 0): an opener that waits for it
    must not send SIGIO, whose default action would end the worker.  A file system
    without leases counts as shared (the caller takes the safe branch)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError:
            yield False
            return
        try:
            fcntl.fcntl(fd, fcntl.F_SETOWN, 0)
            yield True
        finally:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- dirs and index entries

@dataclass(eq=False)
class DataDir:
    """One configured data dir and its space accounting (guarded by the store's lock)."""
    index: int
    path: str
    tier: str
    configured_capacity: int | None
    reserve: int
    used: int = 0                 # bytes of committed blocks
    reserved: int = 0             # bytes promised to blocks being written
    free_files: list[tuple[str, int]] = field(default_factory=list)   # (path, size)
    direct: bool = False          # block files are written with O_DIRECT (worker.direct_io, probed)

    @property
    def blocks_dir(self) -> str:
        return os.path.join(self.path, "blocks")

    @property
    def staging_dir(self) -> str:
        return os.path.join(self.path, "staging")

    @property
    def free_dir(self) -> str:
        return os.path.join(self.path, "free")

    def block_path(self, block_id: int) -> str:
        return block_file(self.path, block_id)

    def _disk_room(self) -> int:
        st = os.statvfs(self.path)
        recycled = sum(size for _, size in self.free_files)
        return st.f_bavail * st.f_frsize + recycled - self.reserve

    @property
    def capacity(self) -> int:
        """The smaller of the configured capacity and what this dir's disk can hold (its
        blocks plus the disk's free room): a dir configured at 400 MiB on a 160 MiB disk
        holds 160 MiB, and the master's eviction must work from that, or writes fail on
        a pool it thinks a third used.  Reported with used + reserved as the dir's use, it
        leaves the master the same room as available(): bytes of blocks being written are
        off the disk's free room already, and promised to them in reserved."""
        disk = max(0, self.used + self._disk_room())
        return disk if self.configured_capacity is None else min(self.configured_capacity, disk)

    def available(self) -> int:
        """Room for another block: the disk's free room less what blocks being written
        were promised (their bytes written so far count twice, so this errs low by at most
        the bytes in flight: two blocks created at once must not both take the last room
        and fail mid-write), and within the configured capacity."""
        room = self._disk_room() - self.reserved
        if self.configured_capacity is not None:
            room = min(room, self.configured_capacity - self.used - self.reserved)
        return max(0, room)


class BlockEntry:
    """A committed block in the index."""
    __slots__ = ("block_id", "dir", "length", "checksum", "chunk_sums", "chunk_size", "readers", "cached")

    def __init__(self, block_id: int, ddir: DataDir, meta: BlockMeta) -> None:
        self.block_id = block_id
        self.dir = ddir
        self.length = meta.length
        self.checksum = meta.checksum
        # 8 bytes a sum: ~64 MB of RAM per TB held at 128 KiB chunks (a tuple of ints: ~340 MB)
        self.chunk_sums = array("Q", meta.chunk_sums)
        self.chunk_size = meta.chunk_size
        self.readers = 0          # open BlockReaders: their file must not be recycled
        # Written through the page cache (reads try it first); a block written with
        # O_DIRECT is read with O_DIRECT, which neither fills the cache nor reads ahead.
        self.cached = not ddir.direct

    @property
    def path(self) -> str:
        return self.dir.block_path(self.block_id)

    def __repr__(self) -> str:
        return f"BlockEntry({self.block_id}, len={self.length}, dir={self.dir.path})"

# ---------------------------------------------------------------- the store

class BlockStore:
    """The index of committed blocks over all data dirs, plus writers and readers."""

    def __init__(self, dir_specs: Iterable[str], io: IoEngine, reserve: int = 256 << 20,
                 reuse_files: bool = True, max_free_files: int = MAX_FREE_FILES,
                 read_buffers: int = 256, read_io: str = "pread", direct_io: bool = False,
                 memory_cache: int = 0) -> None:
        self.io = io             # the disk I/O engine (io_uring or threads) of every block file
        self.memory = MemoryTier(memory_cache)   # recently written blocks in RAM (worker/memtier.py)
        self.read_io = read_io   # "sendfile", "pread" or "uring": how BlockReader reads chunks
        if read_io == "sendfile" and not can_populate():
            log.warning("worker.read_io \"sendfile\" needs MADV_POPULATE_READ (Linux 5.14+), "
                        "not in this kernel: block reads are copied through buffers (\"pread\")")
            self.read_io = "pread"
        self.reuse_files = reuse_files
        # Called when a block is refused for want of space (the worker's heartbeat, sent at
        # once: the master's figures lag otherwise, and it keeps placing blocks here).
        self.on_full: Callable[[], None] = lambda: None
        self.max_free_files = max_free_files
        self.read_pool = BufferPool(READ_STEP, max_buffers=read_buffers)
        self._read_pool_lock = threading.Lock()   # readers take both buffers at once
        self._lock = threading.RLock()
        self._index: dict[int, BlockEntry] = {}
        self._added: dict[int, BlockEntry] = {}
        self._removed: set[int] = set()
        self._seq = itertools.count(1)
        # Free files outlive the process (a restart adopts them), so their names carry
        # this process's start token: a counter alone restarts at 1 and would rename a
        # newly freed file over an adopted one still on the free list.
        self._boot = uuid.uuid4().hex[:8]
        specs = list(dir_specs)
        if not specs:
            raise ConfigError("worker.dirs is empty")
        self.dirs = [DataDir(i, os.path.abspath(p), tier, cap, reserve)
                     for i, (tier, cap, p) in enumerate(map(parse_dir_spec, specs))]
        for d in self.dirs:
            self._scan(d, direct_io)
            capacity = d.capacity
            if d.configured_capacity is not None and capacity < d.configured_capacity:
                log.warning("data dir %s: its disk holds %d MiB beside worker.reserve (%d MiB), less than the "
                            "%d MiB configured: its capacity is %d MiB", d.path, capacity >> 20, reserve >> 20,
                            d.configured_capacity >> 20, capacity >> 20)
        log.info("block store: %d blocks in %d dirs", len(self._index), len(self.dirs))

    # ------------------------------------------------------------ queries

    def get(self, block_id: int) -> BlockEntry | None:
        return self._index.get(block_id)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._index

    def __len__(self) -> int:
        return len(self._index)

    def dir_usage(self) -> list[tuple[str, str, int, int]]:
        """(path, tier, capacity, used) of every data dir."""
        with self._lock:
            return [(d.path, d.tier, d.capacity, d.used + d.reserved) for d in self.dirs]

    # ------------------------------------------------------------ block reports

    def snapshot(self) -> list[BlockEntry]:
        """Every block, for a full report; the incremental log restarts from here."""
        with self._lock:
            self._added.clear()
            self._removed.clear()
            return list(self._index.values())

    def drain_changes(self) -> tuple[list[BlockEntry], list[int]]:
        """Blocks added and removed since the last drain (or snapshot)."""
        with self._lock:
            added, removed = list(self._added.values()), sorted(self._removed)
            self._added.clear()
            self._removed.clear()
            return added, removed

    def requeue_changes(self, added: list[BlockEntry], removed: list[int]) -> None:
        """Put back changes a failed heartbeat could not deliver (newer changes win)."""
        with self._lock:
            for e in added:
                bid = e.block_id
                if bid not in self._added and bid not in self._removed and self._index.get(bid) is e:
                    self._added[bid] = e
            for bid in removed:
                if bid not in self._added and bid not in self._index:
                    self._removed.add(bid)

    # ------------------------------------------------------------ writing

    def create(self, block_id: int, tier: int = 0, size_hint: int = DEFAULT_BLOCK,
               cached: bool = False) -> BlockWriter:
        """Start writing block_id in a dir with room for size_hint bytes (ENOSPC if none);
        cached: through the page cache even in an O_DIRECT dir (readers find it in memory)."""
        size_hint = max(size_hint, 1)
        with self._lock:
            ddir = self._choose_dir(tier, size_hint)
            ddir.reserved += size_hint
            recycled = self._take_free_file(ddir)
        staging = os.path.join(ddir.staging_dir, f"{block_id}.{next(self._seq)}")
        direct = ddir.direct and not cached
        try:
            if recycled is not None:
                os.rename(recycled[0], staging)
            fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_DIRECT if direct else 0),
                         0o644)
        except OSError as e:
            with self._lock:
                ddir.reserved -= size_hint
            raise io_error(e, f"create block {block_id}") from None
        return BlockWriter(self, block_id, ddir, staging, fd, size_hint,
                           recycled[1] if recycled else 0, direct=direct)

    def _choose_dir(self, tier: int, size: int) -> DataDir:
        """Preferred tier if it has room, else the dir with the most room."""
        rooms = [(d.available(), d) for d in self.dirs]
        fitting = [(room, d) for room, d in rooms if room >= size]
        if not fitting:
            self.note_full()
            raise CurvineError(errno.ENOSPC, f"no data dir has room for {size} bytes")
        preferred = [(room, d) for room, d in fitting if TIER_INDEX.get(d.tier) == tier]
        return max(preferred or fitting, key=lambda rd: rd[0])[1]

    def note_full(self) -> None:
        """A block was refused for want of space: tell whoever reports this store's figures."""
        self.on_full()

    def grow_reservation(self, ddir: DataDir, extra: int) -> None:
        """A block outgrew its reservation (its size was unknown at create): ENOSPC if no room."""
        with self._lock:
            if ddir.available() < extra:
                self.note_full()
                raise CurvineError(errno.ENOSPC, f"data dir {ddir.path} is full")
            ddir.reserved += extra

    def discard_staging(self, ddir: DataDir, path: str, reserved: int, size: int) -> None:
        """An aborted write: release its reservation and recycle its staging file."""
        with self._lock:
            ddir.reserved -= reserved
            self._recycle_or_unlink(ddir, path, size)

    def _take_free_file(self, ddir: DataDir) -> tuple[str, int] | None:
        if self.reuse_files and ddir.free_files:
            return ddir.free_files.pop()
        return None

    def _recycle_or_unlink(self, ddir: DataDir, path: str, size: int) -> None:
        """Keep a no-longer-needed block file for reuse, or delete it.  A file another
        process has open -- a mount reading it through FUSE passthrough, a short-circuit
        reader -- is only unlinked: overwriting it in place would change bytes under them."""
        if self.reuse_files and len(ddir.free_files) < self.max_free_files and size > 0:
            dest = os.path.join(ddir.free_dir, f"f{self._boot}-{next(self._seq)}")
            try:
                with unshared(path) as alone:
                    if alone:
                        os.rename(path, dest)
                        ddir.free_files.append((dest, size))
                        return
            except OSError as e:
                log.warning("cannot recycle %s: %s", path, e)
        unlink(path)

    def install(self, writer: BlockWriter, meta: BlockMeta, meta_staging: str) -> BlockEntry:
        """Move a finished block into place and index it (the commit point is the meta rename)."""
        ddir, bid = cast(DataDir, writer.dir), writer.block_id   # opaque to the writer: one of self.dirs
        entry = BlockEntry(bid, ddir, meta)
        entry.cached = not writer.direct
        final = ddir.block_path(bid)
        with self._lock:
            old = self._index.pop(bid, None)
            if old is not None:   # a rewrite: the old file is recycled like a deleted one
                self.memory.drop(bid)
                self._release_entry(old, recycle=True)
            try:
                os.rename(writer.path, final)
                os.rename(meta_staging, final + ".meta")
            except OSError as e:
                unlink(final)
                unlink(meta_staging)
                ddir.reserved -= writer.reserved
                if old is not None:
                    self._note_removed(bid)
                raise io_error(e, f"commit block {bid}") from None
            ddir.reserved -= writer.reserved
            ddir.used += meta.length
            self._index[bid] = entry
            self._removed.discard(bid)
            self._added[bid] = entry
        return entry

    # ------------------------------------------------------------ reading

    def open_reader(self, block_id: int, offset: int = 0,
                    length: int | None = None) -> BlockReader | MemoryReader:
        """A reader of [offset, offset+length) clamped to the block end (ENOENT, EINVAL):
        from the memory tier when the block is kept there, else from its file."""
        with self._lock:
            entry = self._index.get(block_id)
            if entry is None:
                raise CurvineError(errno.ENOENT, f"block {block_id} not found")
            if offset > entry.length:
                raise CurvineError(errno.EINVAL, f"offset {offset} beyond block {block_id} "
                                                 f"of length {entry.length}")
            avail = entry.length - offset
            n = avail if length is None else min(length, avail)
            kept = self.memory.open(block_id)
            if kept is None:
                entry.readers += 1
        if kept is not None:
            return MemoryReader(self.memory, kept, offset, n, entry.checksum, READ_STEP)
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            self.reader_done(entry)
            if e.errno == errno.ENOENT:
                self.mark_corrupt(entry, "block file missing")
                raise CurvineError(errno.ENOENT, f"block {block_id} not found") from None
            raise io_error(e, f"open block {block_id}") from None
        return BlockReader(self, entry, fd, offset, n, self._open_direct(entry))

    def _open_direct(self, entry: BlockEntry) -> int:
        """The block file opened O_DIRECT when the block was written past the page cache;
        -1 when not (reads stay buffered)."""
        if entry.cached or self.read_io == "uring":
            return -1
        try:
            return os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
        except OSError:
            return -1

    def read_range(self, block_id: int, offset: int = 0, length: int | None = None) -> bytes:
        """The verified bytes of a range (a convenience for small reads and tests)."""
        with self.open_reader(block_id, offset, length) as r:
            return b"".join(bytes(piece) for piece in r)

    def reader_done(self, entry: BlockEntry) -> None:
        """A BlockReader closed: the block's file may be recycled again."""
        with self._lock:
            entry.readers -= 1

    def acquire_read_buffers(self) -> tuple[mmap.mmap, mmap.mmap]:
        """Two chunk buffers for a reader's double buffering."""
        with self._read_pool_lock:   # all-or-nothing: no two readers deadlock holding one each
            return self.read_pool.acquire(), self.read_pool.acquire()

    # ------------------------------------------------------------ removal

    def delete(self, block_id: int) -> bool:
        """Delete a block; True if it existed."""
        with self._lock:
            entry = self._index.pop(block_id, None)
            if entry is None:
                return False
            self.memory.drop(block_id)
            self._release_entry(entry, recycle=True)
            self._note_removed(block_id)
        return True

    def mark_corrupt(self, entry: BlockEntry, reason: str) -> None:
        """Drop a block that failed verification; it is reported removed (re-replicated)."""
        with self._lock:
            if self._index.get(entry.block_id) is not entry:
                return
            del self._index[entry.block_id]
            self.memory.drop(entry.block_id)
            self._release_entry(entry, recycle=False)
            self._note_removed(entry.block_id)
        log.error("block %d in %s is corrupt (%s); dropped", entry.block_id, entry.dir.path, reason)

    def _note_removed(self, block_id: int) -> None:
        self._added.pop(block_id, None)
        self._removed.add(block_id)

    def _release_entry(self, entry: BlockEntry, recycle: bool) -> None:
        """Uncommit (meta first) and free the data file; caller holds the lock."""
        ddir = entry.dir
        ddir.used -= entry.length
        path = entry.path
        unlink(path + ".meta")
        if recycle and entry.readers == 0:
            self._recycle_or_unlink(ddir, path, entry.length)
        else:
            unlink(path)

    # ------------------------------------------------------------ start-up scan

    def _scan(self, ddir: DataDir, direct_io: bool) -> None:
        """Create the layout, empty staging, probe O_DIRECT, adopt recycled files, load
        committed blocks (after the probe: a block in a direct dir is read direct)."""
        for sub in (ddir.staging_dir, ddir.free_dir, ddir.blocks_dir):
            os.makedirs(sub, exist_ok=True)
            # Only this uid (and root) may reach block files: they are read without a block
            # token by short-circuit readers on this host (docs/security.md, "Local paths").
            os.chmod(sub, PRIVATE_DIR_MODE)
        for i in range(256):
            os.makedirs(os.path.join(ddir.blocks_dir, f"{i:02x}"), exist_ok=True)
        for name in os.listdir(ddir.staging_dir):
            remove_tree(os.path.join(ddir.staging_dir, name))
        ddir.direct = direct_io and supports_direct(ddir.staging_dir)
        if direct_io and not ddir.direct:
            log.info("data dir %s: its filesystem takes no O_DIRECT writes; writing through "
                     "the page cache", ddir.path)
        self._scan_free(ddir)
        for i in range(256):
            self._scan_subdir(ddir, os.path.join(ddir.blocks_dir, f"{i:02x}"))

    def _scan_free(self, ddir: DataDir) -> None:
        for entry in os.scandir(ddir.free_dir):
            if entry.is_file(follow_symlinks=False) and len(ddir.free_files) < self.max_free_files \
                    and self.reuse_files:
                ddir.free_files.append((entry.path, entry.stat().st_size))
            else:
                remove_tree(entry.path)

    def _scan_subdir(self, ddir: DataDir, subdir: str) -> None:
        sizes: dict[str, int] = {}
        metas: list[str] = []
        for entry in os.scandir(subdir):
            if entry.name.endswith(".meta"):
                metas.append(entry.name)
            elif entry.name.isdigit() and entry.is_file(follow_symlinks=False):
                sizes[entry.name] = entry.stat().st_size
            else:
                remove_tree(entry.path)
        for name in metas:
            self._adopt(ddir, subdir, name[:-5], sizes)
        for name, size in sizes.items():  # data files without a meta file: never committed
            log.warning("removing uncommitted block file %s", os.path.join(subdir, name))
            self._recycle_or_unlink(ddir, os.path.join(subdir, name), size)

    def _adopt(self, ddir: DataDir, subdir: str, name: str, sizes: dict[str, int]) -> None:
        path = os.path.join(subdir, name)
        size = sizes.pop(name, None)
        try:
            with open(path + ".meta", "rb") as f:
                meta = BlockMeta.decode(f.read())
            block_id = int(name)
            if size != meta.length or ddir.block_path(block_id) != path:
                raise ValueError(f"data file size {size} != {meta.length} or misplaced")
        except (OSError, ValueError) as e:
            log.warning("removing broken block %s: %s", path, e)
            unlink(path + ".meta")
            unlink(path)
            return
        if block_id in self._index:
            log.warning("block %d is in two dirs; keeping %s", block_id, self._index[block_id].path)
            unlink(path + ".meta")
            unlink(path)
            return
        self._index[block_id] = BlockEntry(block_id, ddir, meta)
        ddir.used += meta.length
