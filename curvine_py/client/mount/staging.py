"""Remote one-block files staged in memory for the kernel to read (``fuse.stage_remote``).

A read through the mount costs, per FUSE request, a round trip through the kernel,
pyfuse3 and the event loop, and a copy of the reply into the reader's pages one page at
a time (fs/fuse/dev.c takes the request's lock for each).  Measured for a remote 14 MiB
KV chunk: the mount spent 0.68 CPU-s/GB, of which receiving the block was ~0.15.  A file
with a replica on this host skips all of it by FUSE passthrough (fuse/passthrough.py).  A
file with none can too once its bytes are here: the mount fetches a complete one-block
file's block whole into a file of a memory filesystem of its own and answers the open
with that file as the backing file.  The kernel then serves every read and mmap from
those pages and the mount sees none of them (0.68 -> 0.43 CPU-s/GB for the mount, the
reader's own copy +0.13; docs/performance-log.md "Session 21").  The price: a read waits
for the whole block instead of its first bytes, so the open of a chunk not fetched ahead
(``fuse.fetch_ahead`` stages it from its lookup) returns after the fetch.

Where the files live: a tmpfs with huge pages, mounted detached (``fsopen``/``fsmount``,
Linux 5.2+, CAP_SYS_ADMIN as FUSE passthrough needs anyway): no path anywhere, gone with
the mount process.  Huge pages matter here: filling a fresh 4 KiB-page shmem file cost
0.8 CPU-s/GB more than a reused buffer (every page faulted, zeroed and later freed), a
huge-page one 0.04.  Where that tmpfs cannot be made, nothing is staged and one log line
says why (a memfd would be the 4 KiB-page case: slower than reading through the mount).

A file is never rewritten: each block version gets its own, so a reader's mmap of one
keeps seeing the bytes it mapped after the mount lets go of it (the kernel frees the
pages with the last reference).  Its bytes are the worker's verified ones
(worker/blockfile.BlockReader checks every chunk before sending it).

Memory is bounded by ``fuse.stage_bytes``.  A staged block stays after its last close,
least recently used first out, so a chunk read again on this host (a prefix reused by
another request) comes from memory; a block that does not fit is read through the
mount as before.  Lookups stage much as FetchAhead fetches (client/mount/fetchahead.py): in lookup
order, IN_FLIGHT at a time, at most AHEAD_LIMIT waiting for their opens, the oldest making room
after STALE_S.  Unlike FetchAhead, a lookup that finds no room is remembered (LATER_LIMIT,
for LATER_S): each open of a staged block lets the next one in, so a reader going through
32 chunks it looked up first (LMCache's retrieve) has the next ones fetched while it reads.
Two fetches at once, where FetchAhead runs one: a staged read costs the mount no CPU, so
the reader waits for the fetches alone (one 14 MiB fetch over the test hosts' veth took
9-12 ms while the reader read in ~2, and waited), and two from alternate workers were
faster in 3 alternated runs of bench/compare (docs/performance-log.md "Session 21").
As FetchAhead's, a lookup's fetch starts in a pause of the lookups only (lookups.Lookups):
the staging thread waits for it, and an open meanwhile takes the fetch over.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from curvine_py.client import metrics
from curvine_py.client.core import ClientCore
from curvine_py.client.mount.fetchahead import LIMIT as AHEAD_LIMIT, STALE_S
from curvine_py.client.mount.lookups import Lookups
from curvine_py.client.mount.localfiles import one_block
from curvine_py.client.reader import fetch_block
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)

IN_FLIGHT = 2      # lookups' fetches at once: from different workers (replica_order: the least busy)
LATER_LIMIT = 64   # lookups remembered for when staged ones are opened (a prompt of 64 chunks)
LATER_S = 10.0     # a lookup remembered longer than this is forgotten (no open followed it)

# The new mount API's system calls: one number on every architecture (they came after the
# tables were unified, Linux 5.2), so no per-architecture table is needed.
_SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 430, 431, 432
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6


def huge_tmpfs(size: int) -> int:
    """A detached tmpfs with huge pages, at most size bytes: the descriptor of its root.
    Raises OSError (EPERM without CAP_SYS_ADMIN, ENOSYS before Linux 5.2, ...)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def call(*args: object) -> int:
        r = int(libc.syscall(*args))
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return r

    fs = call(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC)
    try:
        for key, value in ((b"huge", b"always"), (b"size", str(size).encode()), (b"mode", b"0700")):
            call(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key, value, 0)
        call(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0)
        return call(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, 0)
    finally:
        os.close(fs)


class Staged:
    """One block version's file: fetched once, then read by the kernel for every open of
    it while it stays (its `users` are the open handles using it)."""

    __slots__ = ("ino", "block", "fd", "done", "started", "users", "dropped", "looked_up")

    def __init__(self, ino: int, block: pb.BlockInfo) -> None:
        self.ino, self.block = ino, block
        self.fd = -1                  # the file (O_RDWR, unlinked); -1 until fetched, and once dropped
        self.done: Future[None] = Future()   # set when whole (an exception: the fetch failed)
        self.started = False          # its fetch has begun (a queued one is taken over by an open)
        self.users = 0
        self.dropped = False          # out of the table: its fd is closed once the fetch is over
        self.looked_up = 0.0          # time.monotonic() of the lookup that queued it; 0 once opened

    def same_version(self, block: pb.BlockInfo) -> bool:
        return self.block.length == block.length and self.block.checksum == block.checksum


def _failed(s: Staged) -> bool:
    return s.done.done() and s.done.exception() is not None


class StagedBlocks:
    """The staged blocks of one mount, by block id, least recently used first."""

    def __init__(self, core: ClientCore, dirfd: int, budget: int, ahead: bool,
                 lookups: Lookups | None = None) -> None:
        self.core = core
        self.dirfd = dirfd
        self.budget = budget
        self.ahead = ahead            # fuse.fetch_ahead: lookups stage their block
        self.lookups = lookups if lookups is not None else Lookups()   # their fetches wait for a pause
        self._lock = threading.Lock()
        self._table: OrderedDict[int, Staged] = OrderedDict()
        self._later: OrderedDict[int, tuple[int, pb.BlockInfo, float]] = OrderedDict()   # lookups with no room yet
        self._bytes = 0
        self._queue = ThreadPoolExecutor(max_workers=IN_FLIGHT, thread_name_prefix="stage-ahead")
        self._closed = False

    @property
    def staged_bytes(self) -> int:
        """Bytes of the blocks in the table (fetched, being fetched or queued)."""
        return self._bytes

    def block_of(self, attr: pb.Attr, blocks: Sequence[pb.BlockInfo], flags: int = 0) -> pb.BlockInfo | None:
        """The file's only block (one_block) if an open of it is staged for the kernel:
        one with no replica here (a local one is read from its block file:
        client/mount/localfiles.py) that fits the budget."""
        block = one_block(attr, blocks, flags)
        if block is None or block.length > self.budget or self.core.paths.local_replica(block) is not None:
            return None
        return block

    def stage_ahead(self, attr: pb.Attr, block: pb.BlockInfo) -> None:
        """Stage a looked-up one-block file's block, which has no replica here and may be
        read (MountOpens.after_lookup tells once), in the background, or remember it for
        when an open takes one of the AHEAD_LIMIT staged before it (never waits: this runs
        on the mount's event loop)."""
        if block.length > self.budget:
            return
        with self._lock:
            if block.block_id in self._table:
                return
            self._later[block.block_id] = (attr.ino, block, time.monotonic())
            while len(self._later) > LATER_LIMIT:
                self._later.popitem(last=False)
        self._stage_looked_up()

    def _stage_looked_up(self) -> None:
        """Queue the fetches of remembered lookups, oldest first, while there is room for them."""
        while True:
            now = time.monotonic()
            with self._lock:
                if not self._later or not self._ahead_room(now):
                    return
                _bid, (ino, block, at) = self._later.popitem(last=False)
                if now - at > LATER_S or block.block_id in self._table:
                    continue
                s = self._add(ino, block)
                if s is None:
                    return
                s.looked_up = at
            self._queue.submit(self._fetch_queued, s)

    def _ahead_room(self, now: float) -> bool:
        """(lock held) Fewer than AHEAD_LIMIT looked-up blocks wait for their opens, or the
        oldest has waited STALE_S (it then counts no more: it stays as any unused block)."""
        waiting = [s for s in self._table.values() if s.looked_up]
        if len(waiting) < AHEAD_LIMIT:
            return True
        oldest = min(waiting, key=lambda s: s.looked_up)
        if now - oldest.looked_up < STALE_S:
            return False
        oldest.looked_up = 0.0
        return True

    def acquire(self, ino: int, block: pb.BlockInfo) -> Staged | None:
        """An open's use of the block's staged file (started or found; the fetch runs in
        file_of or already runs); None when it does not fit.  Never waits."""
        with self._lock:
            s = self._table.get(block.block_id)
            if s is not None and (not s.same_version(block) or _failed(s)):
                self._drop(s)
                s = None
            if s is None:
                s = self._add(ino, block)
                if s is None:
                    return None
            elif metrics.on:
                metrics.STAGE_HITS.inc()
            self._table.move_to_end(block.block_id)
            s.users += 1
            opened_ahead, s.looked_up = bool(s.looked_up), 0.0
            self._later.pop(block.block_id, None)
        if opened_ahead:
            self._stage_looked_up()   # its place goes to the next file looked up
        return s

    def _add(self, ino: int, block: pb.BlockInfo) -> Staged | None:
        """(lock held) A new entry, after making room; None when it cannot fit."""
        if self._closed or not self._make_room(block.length):
            return None
        s = self._table[block.block_id] = Staged(ino, block)
        self._bytes += block.length
        return s

    def drop_unused(self) -> int:
        """Drop every staged block no handle uses and no fetch fills, and forget the
        lookups not yet staged (a "cold" read after drop_caches: the mount's copies go
        with the kernel's page cache; fuse/ops.py DROP_CACHES_XATTR); bytes dropped."""
        with self._lock:
            before = self._bytes
            for s in list(self._table.values()):
                if s.users == 0 and (s.done.done() or not s.started):
                    self._drop(s)
            self._later.clear()
            return before - self._bytes

    def _make_room(self, need: int) -> bool:
        """(lock held) Drop unused blocks, least recently used first, until need fits.
        A fetch running is not dropped (its bytes are on their way to somebody)."""
        for s in list(self._table.values()):
            if self._bytes + need <= self.budget:
                break
            if s.users == 0 and (s.done.done() or not s.started):
                self._drop(s)
        return self._bytes + need <= self.budget

    def _drop(self, s: Staged) -> None:
        """(lock held) Out of the table; its file goes once its fetch is over."""
        if s.dropped:
            return
        s.dropped = True
        self._bytes -= s.block.length
        if self._table.get(s.block.block_id) is s:
            del self._table[s.block.block_id]
        if s.done.done() or not s.started:
            self._close_file(s)

    @staticmethod
    def _close_file(s: Staged) -> None:
        if s.fd >= 0:
            os.close(s.fd)
            s.fd = -1

    def file_of(self, s: Staged) -> int | None:
        """A descriptor of s's file, whole (the caller closes it), fetched here if its
        fetch has not begun; None when the fetch failed (the caller reads normally)."""
        self._fetch(s)
        try:
            s.done.result()
        except (CurvineError, OSError) as e:
            log.info("block %d of inode %d not staged (%s): read through the mount", s.block.block_id, s.ino, e)
            return None
        with self._lock:
            return os.dup(s.fd) if s.fd >= 0 else None

    def release(self, s: Staged) -> None:
        """An open of s was closed (or reads normally after all)."""
        with self._lock:
            s.users -= 1
            if not s.dropped:
                self._table.move_to_end(s.block.block_id)
            if _failed(s):
                self._drop(s)

    def _fetch_queued(self, s: Staged) -> None:
        """A lookup's fetch, in the queue's turn and the next pause of the lookups
        (skipped when dropped meanwhile; taken over by an open meanwhile)."""
        try:
            self.lookups.wait_quiet(lambda: self._closed or s.started or s.dropped)
            self._fetch(s)
        except Exception:   # a background hint: never let it die silently
            log.exception("staging block %d", s.block.block_id)

    def _fetch(self, s: Staged) -> None:
        """Fetch s's block into a new file unless somebody has begun to (then return at once)."""
        with self._lock:
            if s.started:
                return
            s.started = True
            if s.dropped:
                s.done.set_exception(CurvineError(errno.ECANCELED, "dropped before its fetch"))
                return
        try:
            fd = self._new_file(s)
        except (CurvineError, OSError) as e:
            with self._lock:
                self._drop(s)
            s.done.set_exception(e)
            return
        with self._lock:
            s.fd = fd
            if s.dropped:
                self._close_file(s)
        if metrics.on:
            metrics.STAGED_BLOCKS.inc()
        s.done.set_result(None)

    def _new_file(self, s: Staged) -> int:
        """An unlinked file of the staging tmpfs holding the block (its space reserved
        first: a write through the mapping to a full tmpfs would be a SIGBUS)."""
        n = s.block.length
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=self.dirfd)
        try:
            os.posix_fallocate(fd, 0, n)
            with mmap.mmap(fd, n) as m:
                view = memoryview(m)
                try:
                    fetch_block(self.core, s.ino, s.block, 0, view)
                finally:
                    view.release()
        except BaseException:
            os.close(fd)
            raise
        return fd

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for s in list(self._table.values()):
                self._drop(s)
        self._queue.shutdown(wait=False, cancel_futures=True)
        os.close(self.dirfd)


def start(core: ClientCore, lookups: Lookups | None = None) -> StagedBlocks | None:
    """The mount's staging (fuse.stage_remote), once passthrough works, its lookups'
    fetches started in pauses of lookups; None, said in one log line, where its memory
    filesystem cannot be made."""
    budget = core.cfg.fuse.stage_bytes
    try:
        dirfd = huge_tmpfs(2 * budget)   # room for files a reader's mmap keeps after they were dropped
    except OSError as e:
        log.warning("remote blocks are not staged for the kernel (fuse.stage_remote): no huge-page tmpfs (%s); "
                    "they are read through the mount", e.strerror)
        return None
    log.info("remote one-block files are staged in memory for the kernel to read (up to %d MiB)", budget >> 20)
    return StagedBlocks(core, dirfd, budget, core.cfg.fuse.fetch_ahead, lookups)
