"""File writer: random writes over immutable blocks, streamed or shipped whole, committed on flush.

Blocks on the workers never change.  A write lands in a *dirty block*: a pooled
block-sized buffer plus the byte ranges written into it.  Once a dirty block holds a
whole 1 MiB piece written in order from its start (the sequential case), it is
*streamed*: its block is opened on the workers and every further piece is sent as it
arrives (client/blockstream.py), so a close waits only for the tail.  A dirty block
the writes cover completely is then finished (or, unstreamed, shipped whole by an I/O
thread) while the caller goes on; the others are completed from the slot's current
bytes (or zeros) and shipped on flush.  Shipping stores the bytes as a *new* block id
on two workers; ``flush`` tells the master the new blocks and size (``Commit``), which
is when other clients see them (close-to-open).  Whole aligned blocks handed over by
the caller are sent straight from the caller's memory with no copy.

Reads through a file that has a writer see the writer's bytes: dirty blocks first,
then shipped blocks, then the committed ones (``FileReader`` over ``self.current``).

Why one module of ~700 lines: every piece of state here (dirty blocks, their streams,
the blocks in flight, the lease and the phase) is read and moved under the writer's one
lock, and a split along that state would pass the lock around.  What needs none of it is
apart: the block ids (client/blockids.py), a whole block's store and retries
(client/blockship.py), a dirty block's ranges (client/dirtyblock.py), a stream
(client/blockstream.py).
"""
from __future__ import annotations

import enum
import errno
import logging
import mmap
import threading
import time
from concurrent.futures import Future
from typing import Sequence

from curvine_py.client import metrics
from curvine_py.client.blockids import BlockIds
from curvine_py.client.blockio import PIECE
from curvine_py.client.blockship import store_block
from curvine_py.client.blockstream import BlockStream
from curvine_py.client.core import ClientCore
from curvine_py.client.dirtyblock import SMALL, DirtyBlock, merge_ranges, ranges_cover, written_prefix
from curvine_py.client.metaclient import Identity
from curvine_py.client.reader import FileReader, slots
from curvine_py.common.buffers import IDLE_S
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master

log = logging.getLogger(__name__)
IN_FLIGHT = 2          # blocks being shipped at once per writer
MAX_DIRTY = 16         # partially written blocks kept before the oldest is shipped
MAX_STREAMS = 2        # blocks sent piece by piece while written, per writer (client/blockstream.py)
HARDEN_WAIT_S = 60.0   # a thread waits this long for the first block ids the mount's loop asked for
RESENDS = 2            # a block whose bytes went out wrong (its buffer right) is sent again this often


class WriterClosed(CurvineError):
    """A write or truncate reached a writer that a close committed and closed while it
    waited for the writer's lock: in the mount, the FLUSH of another copy of the
    descriptor (a child process closing what it inherited, at its exec or exit).  Nothing
    was done; the caller takes the file's writer again (client/vfs.py) and does it there.
    Taken in, the write would have been acknowledged to the kernel and never shipped."""

    def __init__(self, ino: int) -> None:
        super().__init__(errno.EBADF, f"inode {ino}: its writer was closed (another descriptor's close)")


class Lease(enum.Enum):
    """Where this writer's lease stands at the master."""
    SOFT = "soft"            # a new file's lease that binds nobody yet: nothing allocated
    HARDENING = "hardening"  # the mount's loop sent the AllocateBlocks that makes it binding
    HARD = "hard"            # binding: blocks allocated (or the master may have applied an allocation)


class Phase(enum.Enum):
    """Where this writer stands in its life."""
    OPEN = "open"
    CLOSING = "closing"      # the mount's loop sent the Commit that closes it (close_request_nowait)
    CLOSED = "closed"        # committed and released, or aborted: a later write takes a new lease


# Every move of the two states (FileWriter._move); staying put is always allowed.  A failed
# harden goes back to SOFT (its error fails the writer); a CLOSING whose Commit failed is
# OPEN again, its blocks kept for the next flush or close.
_LEASE_MOVES = {Lease.SOFT: {Lease.HARDENING, Lease.HARD}, Lease.HARDENING: {Lease.SOFT, Lease.HARD},
                Lease.HARD: set()}
_PHASE_MOVES = {Phase.OPEN: {Phase.CLOSING, Phase.CLOSED}, Phase.CLOSING: {Phase.OPEN, Phase.CLOSED},
                Phase.CLOSED: set()}


class FileWriter:
    """The write state of one open file; methods are serialized by an internal lock.

    Its state is two small machines, `lease` and `phase` (moved only by _move, along
    _LEASE_MOVES and _PHASE_MOVES), plus a sticky error: a writer that failed (a block
    that could not be stored, a harden refused) raises it from every later write and
    from its close, so no commit presents the file with bytes missing."""

    def __init__(self, core: ClientCore, reply: pb.OpenReply, ident: Identity | None = None) -> None:
        self.core = core
        self.ident = ident
        self.ino = reply.attr.ino
        self.label = f"inode {self.ino}"   # what logs call the file (the SDK and the mount name it when they can)
        self.lease_id = reply.lease_id
        self.reader = FileReader(core, reply)
        self.reader.lease_id = self.lease_id   # its shipped blocks' tokens are renewed under the lease
        self.bs = self.reader.bs
        self.committed_size = reply.attr.size
        self.pool = core.buffer_pool(self.bs)
        self.current = self.reader.blocks      # slot -> newest block (committed or shipped)
        self.dirty: dict[int, DirtyBlock] = {}
        self.inflight: dict[int, Future[pb.BlockInfo]] = {}   # slot -> its newest block being shipped
        self.streams: dict[int, BlockStream] = {}   # dirty slot -> its block already on the way
        self._streaming = True
        self.shipped: list[Future[pb.BlockInfo]] = []         # every ship since the last commit, in order
        self.uncommitted: list[pb.BlockInfo] = []  # shipped blocks of a commit that failed: sent again
        self.holes: set[int] = set()   # slots punched since the last commit, not written since (punch)
        self._slots = threading.Semaphore(IN_FLIGHT)
        self._lock = threading.RLock()
        self._error: BaseException | None = None
        self.changed = False         # written or truncated since the last commit
        # The smallest size this writer cut the file to since its last commit (None: no
        # cut): its commit carries it, the master cuts there first and ends every other
        # writer's lease (a new generation, docs/posix.md "Several writers").
        self.cut: int | None = None
        self.mtime_ns = 0            # time of the last change, the file's mtime at commit
        self._state_lock = threading.Lock()
        self._phase_moved = threading.Condition(self._state_lock)   # wait_closing's wake-up
        self.phase = Phase.OPEN
        # A new file's soft lease (OpenReply.soft_lease) binds nobody until this writer's
        # first AllocateBlocks, sent before the first byte or size change (_harden): soft
        # implies nothing allocated, and a close with nothing changed commits nothing.
        self.lease = Lease.SOFT if reply.soft_lease else Lease.HARD
        self._hardened = threading.Event()   # a HARDENING's AllocateBlocks came back (or failed)
        self.ids = BlockIds(core, self.ino, self.lease_id, ident, lambda: self._move(lease=Lease.HARD))
        core.leases.add(self.lease_id)
        self._used = time.monotonic()   # the last write (the pool takes from idle writers only)
        self.pool.hold(self, cheap=False)

    @property
    def closed(self) -> bool:
        """Closing or closed: no more writes through this writer."""
        return self.phase is not Phase.OPEN

    def _move(self, lease: Lease | None = None, phase: Phase | None = None, when: Lease | None = None) -> None:
        """The one place the states change (AssertionError on a move the tables forbid).
        when: move the lease only if it is in that state now.  Under a lock of its own,
        which the mount's loop may take (hardened): it guards two assignments, no I/O."""
        with self._state_lock:
            if lease is not None and lease is not self.lease and (when is None or when is self.lease):
                assert lease in _LEASE_MOVES[self.lease], f"inode {self.ino}: lease {self.lease.name} -> {lease.name}"
                self.lease = lease
            if phase is not None and phase is not self.phase:
                assert phase in _PHASE_MOVES[self.phase], f"inode {self.ino}: {self.phase.name} -> {phase.name}"
                self.phase = phase
                self._phase_moved.notify_all()

    def wait_closing(self) -> None:
        """Wait until a close the mount's loop is committing (CLOSING) has its answer.  The
        kernel sends a FLUSH for every close of every copy of a descriptor: a forked child
        closing what it inherited can close the writer while the parent's own close is
        on its way, and the second close must return only once the first one's commit is
        done (close-to-open), never fail.  Bounded by the commit's own retries."""
        limit = self.core.cfg.client.retry_s + 30
        with self._phase_moved:
            if not self._phase_moved.wait_for(lambda: self.phase is not Phase.CLOSING, limit):
                raise CurvineError(errno.ETIMEDOUT, f"inode {self.ino}: another close's commit did not end")

    @property
    def size(self) -> int:
        """The file's size as this writer sees it; its reader reads up to the same size."""
        return self.reader.size

    @size.setter
    def size(self, value: int) -> None:
        self.reader.size = value

    # ------------------------------------------------------------------ writes
    def pwrite(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        if offset < 0:
            raise CurvineError(errno.EINVAL, "negative offset")
        mv = memoryview(data).cast("B")
        direct: list[Future[pb.BlockInfo]] = []
        with self._lock:
            self._check_open()
            if self.lease is not Lease.HARD:
                self._harden()
            self._touch()
            for idx, within, done, n in slots(offset, len(mv), self.bs):
                piece = mv[done:done + n]
                self.holes.discard(idx)
                self.size = max(self.size, offset + done + n)
                if n == self.bs and idx not in self.dirty:
                    direct.append(self._ship(idx, piece, None))
                else:
                    self._write_dirty(idx, within, piece)
        for f in direct:   # the caller's memory must not be read after we return
            f.result()
        self._check()
        return len(mv)

    def try_pwrite(self, offset: int, data: bytes | bytearray | memoryview, append: bool = False) -> int | None:
        """pwrite if it cannot block, else None (nothing done).

        It cannot block when every byte lands in a dirty block that exists or can be made
        from a free pooled buffer, and no block gets complete (shipping one may wait for a
        free slot or a master call).  The mount calls this on its event loop thread first.
        """
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._error is not None or self.closed or self.lease is Lease.SOFT:
                return None
            if append:
                offset = self.size
            mv = memoryview(data).cast("B")
            if offset < 0 or not len(mv):
                return None
            plan = self._plan_nowait(offset, len(mv))
            if plan is None:
                return None
            self._touch()
            done = 0
            for idx, within, n, raw in plan:
                db = self.dirty.get(idx)
                if db is None:
                    db = self.dirty[idx] = DirtyBlock(self.pool)
                db.room(within + n, raw)   # a planned buffer, or none needed: no wait
                self.holes.discard(idx)
                self.size = max(self.size, offset + done + n)   # before a ship: it takes the size
                self._guard(idx, within)
                db.write(within, mv[done:done + n])
                if db.covers(self.bs):
                    self._ship_dirty(idx)   # a stream's last piece (the plan checked): no wait
                else:
                    self._feed(idx, nowait=True)
                done += n
            return len(mv)
        finally:
            self._lock.release()

    def _plan_nowait(self, offset: int, length: int) -> list[tuple[int, int, int, mmap.mmap | None]] | None:
        """Per touched block: (idx, within, n, pooled buffer it needs or None); None if any
        step could block."""
        plan: list[tuple[int, int, int, mmap.mmap | None]] = []
        new = 0
        for idx, within, _, n in slots(offset, length, self.bs):
            db = self.dirty.get(idx)
            ranges = merge_ranges((db.ranges if db is not None else []) + [[within, within + n]])
            stream = self.streams.get(idx)
            completes_stream = stream is not None and within >= stream.ready
            if ((ranges_cover(ranges, self.bs) and not completes_stream) or idx in self.inflight
                    or (self._wants_stream(idx, ranges) and not self.ids.at_hand
                        and self.lease is not Lease.HARDENING)):
                self._undo(plan)   # a block to ship whole, or a stream to open: may wait
                return None
            if db is None:
                new += 1
                if len(self.dirty) + new > MAX_DIRTY:
                    self._undo(plan)
                    return None
            raw = None
            if within + n > (len(db.view) if db is not None else SMALL):
                raw = self.pool.try_acquire()
                if raw is None:
                    self._undo(plan)
                    return None
            plan.append((idx, within, n, raw))
        return plan

    def _undo(self, plan: list[tuple[int, int, int, mmap.mmap | None]]) -> None:
        """Give back the buffers a plan took; the plan is abandoned."""
        for _, _, _, raw in plan:
            if raw is not None:
                self.pool.release(raw)

    def _write_dirty(self, idx: int, within: int, piece: memoryview) -> None:
        db = self.dirty.get(idx)
        if db is None:
            if len(self.dirty) >= MAX_DIRTY:
                self._ship_dirty(next(iter(self.dirty)))
            db = self.dirty[idx] = DirtyBlock(self.pool)
        self._room(idx, db, within + len(piece))
        self._guard(idx, within)
        db.write(within, piece)
        if db.covers(self.bs):
            self._ship_dirty(idx)
        else:
            self._feed(idx, nowait=False)

    def _room(self, idx: int, db: DirtyBlock, end: int) -> None:
        """db.room(end) for slot idx.  When that has to wait for the pool, this writer's
        other pooled dirty blocks are shipped first: a writer never waits for a buffer while
        holding ones that only it could give back (its lock is held here, so the pool cannot
        take them): 8 writers each holding one and waiting for one more hung a flush."""
        if end <= len(db.view):
            return
        raw = self.pool.acquire_nowait()
        if raw is None:
            for other in [i for i, d in self.dirty.items() if i != idx and d.pooled]:
                self._ship_dirty(other)
            raw = self.pool.acquire(requester=self)
        db.room(end, raw)

    def truncate(self, size: int) -> None:
        """Change the size; bytes past it are gone, a later growth reads zeros."""
        with self._lock:
            self._check_open()
            if self.lease is not Lease.HARD and size != self.size:   # truncate(0) of a new file (put_bytes): no change
                self._harden()
            self._touch()
            if size < self.size or size == 0:   # (an extension only grows the file, as a write does)
                self.cut = size if self.cut is None else min(self.cut, size)
            keep = (size + self.bs - 1) // self.bs
            for idx in [i for i in self.dirty if i >= keep]:
                self._drop_dirty(idx)
            for idx in [i for i in self.inflight if i >= keep]:
                self._apply(idx)
            for idx in [i for i in self.current if i >= keep]:
                del self.current[idx]
                self.reader.invalidate(idx)
            rem = size % self.bs
            last = keep - 1
            if rem and size < self.size and (last in self.current or last in self.dirty or last in self.inflight):
                db = self._materialize(last, min(self.bs, self.size - last * self.bs))
                self._room(last, db, self.bs)
                self._guard(last, rem)
                db.clip(rem)
                db.view[rem:] = bytearray(self.bs - rem)
            self.size = size

    def punch(self, holes: range) -> None:
        """Make whole slots holes (fallocate's punch or zero range over whole blocks): their
        bytes dropped here, and the next commit names them (CommitRequest.holes), so the
        master empties them after installing the commit's blocks and frees their blocks
        on the workers.  A slot written after this leaves the set again."""
        with self._lock:
            self._check_open()
            if self.lease is not Lease.HARD:
                self._harden()
            self._touch()
            for idx in sorted(i for i in self._present() if i in holes):   # (a hole already stays one)
                if idx in self.dirty:
                    self._drop_dirty(idx)
                if idx in self.inflight:
                    self._apply(idx)
                if self.current.pop(idx, None) is not None:
                    self.reader.invalidate(idx)
                self.holes.add(idx)

    def present_blocks(self) -> set[int]:
        """The slots that hold bytes as this writer sees them (committed, shipped, dirty);
        the others are holes (SEEK_DATA/SEEK_HOLE, client/vfsspace.py)."""
        with self._lock:
            return self._present()

    def _present(self) -> set[int]:
        return set(self.current) | set(self.inflight) | set(self.dirty)

    # ------------------------------------------------------------------ reads (overlay)
    def pread(self, offset: int, into: memoryview) -> int:
        with self._lock:
            if offset >= self.size:
                return 0
            total = min(len(into), self.size - offset)
            for idx, within, done, n in slots(offset, total, self.bs):
                if idx in self.dirty:
                    db = self._materialize(idx, min(self.bs, self.size - idx * self.bs))
                    into[done:done + n] = db.view[within:within + n]
                else:
                    if idx in self.inflight:
                        self._apply(idx)
                    self.reader.pread(offset + done, into[done:done + n])
            return total

    # ------------------------------------------------------------------ flush / close
    def flush(self, release: bool = False, closed_ok: bool = False) -> pb.Attr | None:
        """Ship every dirty block, wait for all, and commit size and blocks to the master.

        Nothing changed since the last commit: no commit (mtime stays), unless the
        lease is to be released.  A close of another descriptor under way (CLOSING) is
        waited for first; a writer closed already is EBADF, or nothing to do (None) with
        closed_ok: the mount's flushes, where another descriptor's close did the work.
        """
        while True:
            self.wait_closing()
            with self._lock:   # (close_request_nowait needs this lock to begin a CLOSING)
                if self.phase is Phase.CLOSING:
                    continue
                if self.closed:
                    if closed_ok:
                        return None
                    raise CurvineError(errno.EBADF, "file already closed")
                return self._flush_locked(release)

    def _flush_locked(self, release: bool) -> pb.Attr | None:
        """flush's work, under self._lock, on an open writer."""
        self._settle_harden()
        if not self.changed and not release:
            return None
        if release and self._quiet():
            self._finish()
            return None
        while self.dirty:   # (making room for one may ship others first: _room)
            self._ship_dirty(next(iter(self.dirty)))
        infos = self.uncommitted + self._wait_all()
        self._check()
        try:
            attr = self.core.meta.call(Master.Commit, self._commit_request(infos, release)).attr
        except CurvineError as e:
            if release and self.lost_nothing(e, infos):
                self._committed(release)
                return None
            self.uncommitted = infos   # a later flush or close commits them (e.g. the master is back)
            raise
        except BaseException:
            self.uncommitted = infos
            raise
        self._committed(release)
        return attr

    def _commit_request(self, infos: list[pb.BlockInfo], release: bool) -> pb.CommitRequest:
        """The size and new blocks written since the last commit (mtime only if changed)."""
        req = self.core.meta.commit_request(self.ino, self.lease_id, self.size, infos, release=release,
                                            mtime_ns=self.mtime_ns if self.changed else 0, ident=self.ident)
        req.holes.extend(sorted(self.holes))
        if self.cut is not None:
            req.truncated, req.truncate_to = True, self.cut
        return req

    def _committed(self, release: bool) -> None:
        self.uncommitted = []
        self.holes.clear()
        self.cut = None
        self.committed_size = self.size
        self.changed = False
        if release:
            self._finish()

    def land_nowait(self) -> list[Future[pb.BlockInfo]] | None:
        """Before a close from the mount's loop: hand each dirty block to its stream when
        its bytes all came in order (finishing a stream does not block: its pump runs in the
        block I/O pool), and return the blocks still on their way, for the loop to await;
        close_request_nowait then gives the Commit.  None: nothing done, as a dirty block
        needs more (bytes to read first, no stream, a block id still to come) or a thread is
        inside the writer."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self.closed or self._error is not None or self.lease is Lease.HARDENING:
                return None
            for idx, db in self.dirty.items():
                length = max(0, min(self.bs, self.size - idx * self.bs))
                stream = self.streams.get(idx)
                if stream is None or length < stream.ready or length > len(db.view) or db.gaps(length):
                    return None
            while self.dirty:
                self._ship_dirty(next(iter(self.dirty)))
            return [f for f in self.shipped if not f.done()]
        finally:
            self._lock.release()

    def close_request_nowait(self) -> pb.CommitRequest | None:
        """The Commit that closes this writer, when nothing is left to ship or wait for (a
        file created and closed unwritten, or whose blocks have all landed) and no thread
        is inside the writer; the caller sends it (the mount, from its event loop) and
        then calls close_sent.  None: nothing done, close() instead.  The writer counts as
        closed from here on: a later write takes a new lease, as after close()."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if (self.closed or self._error is not None or self.dirty or self.uncommitted
                    or not all(f.done() for f in self.shipped)):
                return None
            self.uncommitted = self._wait_all()   # every block is done: this does not wait
            if self._error is not None:
                return None   # close() reports it
            self._move(phase=Phase.CLOSING)
            return self._commit_request(self.uncommitted, release=True)
        finally:
            self._lock.release()

    def close_soft_nowait(self) -> bool:
        """Close here and now a writer that never used its soft lease: there is nothing to
        commit, and the master lets the lease lapse (lease_s), so no call at all; False:
        not such a writer (or a thread is inside it), nothing done."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.closed or not self._quiet():
                return False
            self._finish()
            return True
        finally:
            self._lock.release()

    def _quiet(self) -> bool:
        """Nothing for the master to hear at close: the lease is still soft (so nothing was
        allocated: no dirty, shipped or failed block), no harden is on its way, and the size
        did not change either."""
        return self.lease is Lease.SOFT and not self.changed

    def harden_request_nowait(self) -> pb.AllocateBlocksRequest | None:
        """The AllocateBlocks that hardens a soft lease, for the mount to send from its event
        loop at the first write without waiting for it (then hardened()); None: not soft,
        or already sent.  Until its answer, writes fill dirty blocks (try_pwrite) and the
        blocks' streams wait for their ids; a thread that needs them waits for it."""
        if self.lease is not Lease.SOFT or self.closed:
            return None
        self._hardened = threading.Event()
        self._move(lease=Lease.HARDENING)
        return self.ids.request()

    def hardened(self, reply: pb.AllocateBlocksReply | None, error: BaseException | None = None) -> None:
        """That AllocateBlocks came back (on the mount's loop: takes no lock).  A failure
        (the file taken over by another writer: ESTALE) fails this writer: the writes
        accepted meanwhile cannot be committed, so its next write and its close report it.
        No answer because the loop stopped (error not an Exception: trio's Cancelled at
        unmount) fails nothing: the lease is soft again and the flush at unmount, in a
        thread, sends the same request again (BlockIds.allocate)."""
        if reply is not None:
            self.ids.received(reply)
        elif not isinstance(error, Exception):
            self._move(lease=Lease.SOFT, when=Lease.HARDENING)
        else:
            self.ids.refused()
            if self._error is None:
                self._error = error if isinstance(error, CurvineError) else CurvineError(
                    errno.EIO, f"the first block ids of inode {self.ino} did not come: {error!r}")
            self._move(lease=Lease.SOFT, when=Lease.HARDENING)   # a thread's allocation may have made it HARD
        self._hardened.set()

    def _settle_harden(self) -> None:
        """Wait for a harden the mount's loop has on its way (never called on that loop),
        then raise its failure, if any."""
        if self.lease is Lease.HARDENING and not self._hardened.wait(HARDEN_WAIT_S):
            raise CurvineError(errno.ETIMEDOUT, f"the first block ids of inode {self.ino} did not come")
        self._check()

    def lost_nothing(self, e: CurvineError, infos: Sequence[pb.BlockInfo]) -> bool:
        """Is e, the failure of a closing commit carrying infos, one that loses nothing?  The
        lease ended (another client's truncation, docs/posix.md "Several writers") after
        everything this writer wrote was committed: then the close does not fail."""
        return e.errno == errno.ESTALE and not infos and not self.changed

    def close_sent(self, ok: bool) -> None:
        """The Commit from close_request_nowait succeeded (the writer is done), or failed
        (the writer is open again, its blocks kept for the next flush or close)."""
        with self._lock:
            self._move(phase=Phase.OPEN)
            if ok:
                self._committed(release=True)

    def close(self) -> pb.Attr | None:
        """flush(release=True); a writer closed already (by another descriptor's close) is
        closed: nothing to do."""
        try:
            return self.flush(release=True, closed_ok=True)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Give up: release the lease without committing what was not committed yet."""
        with self._lock:
            if self.closed:
                return
            for idx in list(self.dirty):
                self._drop_dirty(idx)
            try:
                self._wait_all()
            except BaseException:
                pass
            try:
                self.core.meta.commit(self.ino, self.lease_id, self.committed_size, [], release=True,
                                      ident=self.ident)
            except CurvineError as e:
                log.warning("abort of inode %d: %s", self.ino, e)
            self._finish()

    def _finish(self) -> None:
        if self.dirty and self._error is None:   # (abort drops them first; a flush ships them all)
            metrics.WRITE_VERIFY_FAILURES.labels("lost").inc()
            log.error("%s: closed with %d blocks of acknowledged writes never shipped", self.label, len(self.dirty))
        self._move(phase=Phase.CLOSED)
        self.pool.unhold(self)
        self.reader.close()
        self.core.leases.remove(self.lease_id)

    def fail(self, error: BaseException) -> None:
        """Make this writer fail from now on (a write of it was given up: the mount's
        watchdog): no later commit may present the file with that write's bytes missing."""
        if self._error is None:
            self._error = error

    def reclaim(self) -> bool:
        """The block pool ran dry (common/buffers.py): ship this writer's oldest part-filled
        pooled block now, if no thread is inside the writer, rather than hold its buffer
        until the writer's next request, which may be queued behind the very wait that
        asks.  Later writes to that block rewrite it whole (read back, completed, shipped
        again): slower, never stuck.  Called from a thread waiting in the pool."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if (self.closed or self._error is not None or self.lease is not Lease.HARD
                    or time.monotonic() - self._used < IDLE_S):
                return False
            idx = next((i for i, db in self.dirty.items() if db.pooled), None)
            if idx is None:
                return False
            try:
                self._ship_dirty(idx)
            except CurvineError as e:   # recorded: the writer's next write or close reports it
                log.warning("inode %d: shipping a block early for the pool failed: %s", self.ino, e)
                return False
            return True
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ shipping
    def _touch(self) -> None:
        self.changed = True
        self.mtime_ns = time.time_ns()
        self._used = time.monotonic()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _check_open(self) -> None:
        """Before a change: the writer's error, or WriterClosed once a close took it (a
        CLOSING one's commit is on its way without this change: it must not join it)."""
        self._check()
        if self.phase is not Phase.OPEN:
            raise WriterClosed(self.ino)

    def _drop_dirty(self, idx: int) -> None:
        db = self.dirty.pop(idx)
        stream = self.streams.pop(idx, None)
        if stream is not None:
            stream.abort()
        self._free(None, db)

    def _materialize(self, idx: int, length: int) -> DirtyBlock:
        """Make slot idx a dirty block holding its full current bytes up to length."""
        db = self.dirty.get(idx)
        if db is None:
            db = self.dirty[idx] = DirtyBlock(self.pool)
        self._room(idx, db, length)
        gaps = db.gaps(length)
        if gaps:
            if idx in self.inflight:
                self._apply(idx)
            base = bytearray(length)
            if idx in self.current:
                self.reader.pread(idx * self.bs, memoryview(base))
            for a, b in gaps:   # (no record: nothing acknowledged lands in a gap)
                db.view[a:b] = base[a:b]
            db.ranges = [[0, length]]
        return db

    def _apply(self, idx: int) -> None:
        """A shipped block of slot idx is done: it becomes the slot's current block."""
        info = self.inflight.pop(idx).result()
        self.current[idx] = info
        self.reader.invalidate(idx)

    def _ship_dirty(self, idx: int) -> None:
        length = max(0, min(self.bs, self.size - idx * self.bs))
        db = self._materialize(idx, length)
        del self.dirty[idx]
        stream = self.streams.pop(idx, None)
        if stream is not None and length >= stream.ready:
            fut = stream.finish(length)
            self.shipped.append(fut)
            self.inflight[idx] = fut
            return
        if stream is not None:
            stream.abort()
        self._ship(idx, db.view[:length], db)

    def _ship(self, idx: int, data: memoryview, owned: DirtyBlock | None) -> Future[pb.BlockInfo]:
        self._slots.acquire()
        try:
            target = self.ids.take()
        except BaseException as e:
            self._slots.release()
            # No block for these bytes (the master's ENOSPC, say): they are gone, so this
            # writer may no longer commit -- a commit would present the file, at its new
            # size, with a hole of zeros where they were.  Its close fails and the file
            # keeps its last committed contents (abort).
            self._error = self._error or e
            self._free(data, owned)
            raise
        fut = self.core.executor.submit(self._send_in_slot, idx, data, target, owned)
        self.shipped.append(fut)
        self.inflight[idx] = fut
        return fut

    def _send_in_slot(self, idx: int, data: memoryview, target: pb.BlockInfo,
                      owned: DirtyBlock | None) -> pb.BlockInfo:
        try:
            return self._send(idx, data, target, owned)
        finally:
            self._slots.release()

    def _send(self, idx: int, data: memoryview, target: pb.BlockInfo, owned: DirtyBlock | None) -> pb.BlockInfo:
        """Store data as slot idx's block (client/blockship.py: retried on other workers),
        checked against owned's records with the checksum the workers confirmed (sent
        again from the buffer if what went out was not it); frees data and owned; a
        failure is this writer's sticky error.  Data with no owner is the caller's own
        memory, waited for before its write returns: what it hashes to is what was written."""
        try:
            for _ in range(RESENDS + 1):
                info = store_block(self.core, idx * self.bs, data, target, owned.view if owned is not None else None,
                                   self.ids.replace)
                if owned is None or self._verified(idx, owned, data, info.block_id, info.checksum):
                    return info
                target = self.ids.allocate(1)[0]   # the wrong block is never committed (freed at release)
            raise CurvineError(errno.EIO, f"{self.label}: block {idx} went out wrong {RESENDS + 1} times")
        except BaseException as e:
            self._error = self._error or e
            raise
        finally:
            self._free(data, owned)

    def _verified(self, idx: int, db: DirtyBlock, data: memoryview, block_id: int, sent: int) -> bool:
        """Are the bytes the workers confirmed for block_id (their xxh3, sent) the bytes the
        writes into db handed over (DirtyBlock.verify)?  False: db holds them but something
        else went out (send again).  Raises EIO (this writer's sticky error, logged,
        counted) when db no longer holds them: nothing can send them again."""
        verdict = db.verify(data, sent)
        if verdict.ok:
            return True
        if not verdict.lost:
            metrics.WRITE_VERIFY_FAILURES.labels("resent").inc()
            log.error("%s: block %d (slot %d) went out with bytes other than those written; sent again",
                      self.label, block_id, idx)
            return False
        metrics.WRITE_VERIFY_FAILURES.labels("lost").inc()
        spans = ", ".join(f"[{idx * self.bs + a}, {idx * self.bs + b})" for a, b in verdict.lost)
        error = CurvineError(errno.EIO, f"{self.label}: acknowledged writes at file bytes {spans} are not in "
                                        f"block {block_id} (slot {idx}): the file is not committed")
        log.error("%s", error)
        self._error = self._error or error
        raise error

    def _free(self, data: memoryview | None, owned: DirtyBlock | None) -> None:
        """Give a shipped (or dropped) block's memory back to the pool."""
        if data is not None:
            data.release()
        if owned is not None:
            owned.release()

    # ------------------------------------------------------------------ streams
    def _wants_stream(self, idx: int, ranges: list[list[int]]) -> bool:
        """Would these ranges of slot idx open a stream (client/blockstream.py)?  Not for a
        slot rewritten under its stream: such a slot is written at random, shipped whole."""
        db = self.dirty.get(idx)
        return (self._streaming and idx not in self.streams and len(self.streams) < MAX_STREAMS
                and self._error is None and (db is None or db.streamable) and written_prefix(ranges) >= PIECE)

    def _feed(self, idx: int, nowait: bool) -> None:
        """Send the whole pieces written in order at the start of dirty slot idx; the
        first such piece opens the slot's stream (nowait: only with a block id at hand)."""
        db = self.dirty[idx]
        ready = min(written_prefix(db.ranges), self.bs) // PIECE * PIECE
        stream = self.streams.get(idx)
        if stream is None:
            if not self._wants_stream(idx, db.ranges) or (nowait and not self.ids.at_hand):
                return
            stream = self._open_stream(idx, db)
            if stream is None:
                return
        stream.feed(ready)

    def _open_stream(self, idx: int, db: DirtyBlock) -> BlockStream | None:
        try:
            target = self.ids.take()
        except CurvineError:
            self._streaming = False   # no block now: slots are shipped whole later, which reports it
            return None
        addrs = self.core.workers.of(target)
        if not addrs:
            self.ids.put_back(target)
            return None

        def fallback(length: int) -> pb.BlockInfo:
            return self._send(idx, db.view[:length], self.ids.allocate(1)[0], db)

        def check(length: int, sent: int) -> bool:
            return self._verified(idx, db, db.view[:length], target.block_id, sent)

        stream = BlockStream(self.core.io, self.core.executor, target, addrs, idx * self.bs, db.view, self.bs,
                             fallback, check, lambda length: self._free(None, db), self.core.paths.writer)
        self.streams[idx] = stream
        return stream

    def _guard(self, idx: int, within: int) -> None:
        """A write at `within` of slot idx: a stream that already took those bytes is dropped
        (they may be on the wire), and the slot is shipped whole when it is done."""
        stream = self.streams.get(idx)
        if stream is not None and within < stream.ready:
            del self.streams[idx]
            stream.abort()
            self.dirty[idx].streamable = False

    def _harden(self) -> None:
        """Make a soft lease binding before the first change: the first batch of block ids
        (needed anyway) is asked for now; from then on the file is being written (not
        complete) as under any lease.  The mount's loop may have asked already."""
        self._settle_harden()
        if self.lease is Lease.SOFT:
            self.ids.fill()

    def _wait_all(self) -> list[pb.BlockInfo]:
        for idx in list(self.inflight):
            try:
                self._apply(idx)
            except BaseException as e:
                self._error = self._error or e
        infos = []
        for f in self.shipped:
            try:
                infos.append(f.result())
            except BaseException as e:
                self._error = self._error or e
        self.shipped = []
        return infos
