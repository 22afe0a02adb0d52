"""pyfuse3 operations: each kernel request handed to one VFS operation.

This module is an adapter and nothing more (as JuiceFS keeps ``pkg/fuse`` thin over
``pkg/vfs``): translate arguments (bytes names, RequestContext, SetattrFields) to
VFS calls, drive them on the trio loop (``_do``: master calls awaited there, only
work that may block in a worker thread), translate results to EntryAttributes and
errors to FUSEError errnos.  Semantics live in the VFS and the master.
"""
from __future__ import annotations

import contextvars
import errno
import fcntl
import functools
import inspect
import itertools
import logging
import os
import stat
import time
from typing import Any, Callable, Sequence, TypeVar

import pyfuse3
import trio

from curvine_py.client import metrics as cmetrics
from curvine_py.client.asyncmeta import AsyncMeta
from curvine_py.client.locks import LockAsk, acquire
from curvine_py.client.metaclient import Identity
from curvine_py.client.vfs import VFS, Op, Opened
from curvine_py.client.walgate import WalGates
from curvine_py.client.reader import LentView
from curvine_py.common.config import FuseConfig
from curvine_py.common.errors import CurvineError
from curvine_py.common.lockranges import RDLCK, UNLCK, WRLCK, Range
from curvine_py.common.types import (
    SETATTR_ATIME, SETATTR_ATIME_NOW, SETATTR_GID, SETATTR_MODE, SETATTR_MTIME, SETATTR_MTIME_NOW,
    SETATTR_SIZE, SETATTR_UID,
)
from curvine_py.fuse import metrics, passthrough
from curvine_py.fuse.passthrough import Passthrough
from curvine_py.fuse.watchdog import CURRENT, Abandoned, Request, Requests, hop, landed
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Method

log = logging.getLogger(__name__)
T = TypeVar("T")
_monotonic = time.monotonic
_perf = time.perf_counter
# The mount's own /metrics address, answered for this xattr of the mount's root (`cv stats
# MOUNTPOINT` reads it): never stored in the pool.
METRICS_XATTR = "user.curvine.metrics"
# Set on the mount's root (by root only), it drops the mount's own block copies that
# nothing uses (VFS.drop_caches): `cv bench --drop-caches` sets it beside the kernel's drop.
DROP_CACHES_XATTR = "user.curvine.drop_caches"
NOW_WINDOW_NS = 200_000_000   # pyfuse3 turns UTIME_NOW into the current time (see _times_are_now)
_ROOT = Identity(0, 0, ())
# FOPEN_NOFLUSH (Linux 5.14+) with the pyfuse3 that deploy/build-pyfuse3.sh builds; a stock
# pyfuse3 has no such field, and every close then sends a FLUSH as before.
_NOFLUSH = hasattr(pyfuse3.FileInfo(), "noflush")
# the kernel's lock types as the master's (POSIX's F_* for fcntl, LOCK_* for flock)
_FCNTL_TYPES = {fcntl.F_RDLCK: RDLCK, fcntl.F_WRLCK: WRLCK, fcntl.F_UNLCK: UNLCK}
_TO_FCNTL = {v: k for k, v in _FCNTL_TYPES.items()}
_FLOCK_TYPES = {fcntl.LOCK_SH: RDLCK, fcntl.LOCK_EX: WRLCK, fcntl.LOCK_UN: UNLCK}
# the kernel's interrupt of the lock request a task serves (a retried master call checks it)
_INTERRUPTED: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("interrupted", default=None)


def _fs_errors(fn: Callable[..., Any], op: str = "") -> Callable[..., Any]:
    """CurvineError -> FUSEError(errno); anything else is a bug -> EIO (logged), never a crash.

    And the request is registered with the mount's watchdog while it runs (fuse/watchdog.py:
    op, what it works on, since when); one the watchdog gave up (Abandoned) is answered EIO.
    So is one the loop's end cancels (a stop whose grace ran out, fuse/main.py): left
    unanswered, the kernel would hold its inode locks until the connection ends, and a
    kernel invalidation waiting for one (fuse/notify.py) keeps /dev/fuse open, so the
    connection never ends (pyfuse3 awaits the handler in its reader task and replies
    synchronously, so the answer goes out before the task sees the cancellation again).
    And timed into curvine_fuse_op_duration_seconds when the mount serves metrics, as op
    (default: the handler's name)."""
    params = list(inspect.signature(fn).parameters)
    name = params[1] if len(params) > 1 and params[1] != "ctx" else ""
    op = op or fn.__name__
    seconds = metrics.OP_SECONDS.labels(op)

    @functools.wraps(fn)
    async def wrapper(self: "CurvineOps", *args: Any, **kwargs: Any) -> Any:
        start = _perf() if self.timed else 0.0
        requests = self.requests
        req = None
        if requests is not None:   # Requests.begin, inlined (every request passes here)
            req = Request(op, name, args[0] if args else None, _monotonic())
            requests.active.add(req)
            req.token = CURRENT.set(req)
        try:
            return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Abandoned:   # logged by the watchdog, with the state that held it up
            raise pyfuse3.FUSEError(errno.EIO) from None
        except trio.Cancelled:   # the loop's end cut it off (a stop's grace ran out): answered, see above
            raise pyfuse3.FUSEError(errno.EIO) from None
        except OSError as e:   # CurvineError included
            code = e.errno if isinstance(e.errno, int) and e.errno > 0 else errno.EIO
            if code == errno.EBADF:   # the kernel sends only descriptors we opened: a bug of ours, say where
                log.warning("%s answered EBADF: %s", op, e, exc_info=not isinstance(e, CurvineError))
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            log.exception("%s failed", op)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if req is not None and requests is not None:   # (req is set only with requests)
                requests.active.discard(req)
                CURRENT.reset(req.token)
            if start:
                seconds.observe(_perf() - start)
    return wrapper


def _invalidate(ino: int) -> None:
    """Drop the kernel's cached pages and attributes of ino (one it has forgotten: nothing to do)."""
    try:
        pyfuse3.invalidate_inode(ino)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise


def _close_fd(fd: int | None) -> None:
    """An abandoned passthrough hop's block file descriptor: nobody will hand it to the kernel."""
    if fd is not None:
        os.close(fd)


class CurvineOps(pyfuse3.Operations):
    """The mount's request handlers."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, vfs: VFS, cfg: FuseConfig, meta: AsyncMeta) -> None:
        """meta: the master calls the handlers await on the trio loop (client/asyncmeta.py:
        lookups, getattrs, creates, renames, commits...), with the client's retry policy."""
        super().__init__()
        self.vfs = vfs
        self.cfg = cfg
        self.meta = meta
        meta.before_wait = self._unless_given_up
        vfs.blocks_wanted = self._blocks_wanted
        self._groups: dict[int, tuple[float, tuple[int, ...]]] = {}
        self._limiter = trio.CapacityLimiter(64)
        self._dirs: dict[int, tuple[int, Identity]] = {}
        self._dir_fhs = itertools.count(1)
        self.enable_passthrough = cfg.passthrough   # asked of the kernel at init (patched pyfuse3)
        self.passthrough: Passthrough | None = None
        # the requests in flight, for the watchdog (fuse/watchdog.py); None: it is off
        self.requests = Requests(cfg.request_timeout_s) if cfg.request_timeout_s > 0 else None
        # Per-request metrics (fuse/metrics.py) only when they are served: fuse.metrics_port 0
        # leaves the request path as it was.  metrics_address: what METRICS_XATTR answers.
        self.timed = cfg.metrics_port != 0
        self.metrics_address = ""
        self.top_dirs = metrics.TopDirs()
        self._renewing = False   # the lock lease's renewal task runs (while this mount holds a lock)
        # SQLite WAL indexes (``*-shm``): their locks are this mount's alone while it holds
        # any (client/walgate.py); one lock call at a time on each, so the gate is taken
        # before, and given up after, its processes' locks
        self.wal_gates = WalGates(vfs, _invalidate)
        self._gate_mu: dict[int, trio.Lock] = {}

    def init(self) -> None:
        """The kernel's INIT was answered: passthrough and locks are known to work or not now."""
        if self.enable_passthrough:
            self.passthrough = passthrough.start(self.vfs, self._run_backing_file)
            log.info("FUSE passthrough %s", "on" if self.passthrough is not None else "unavailable")
        locks_enabled = getattr(pyfuse3, "locks_enabled", None)
        if locks_enabled is None:
            log.warning("pyfuse3 without lock handlers (not deploy/build-pyfuse3.sh's): cross-mount locks are off, "
                        "flock and fcntl locks hold within this mount only")
        else:
            posix, flock = locks_enabled()
            log.info("cross-mount locks: POSIX %s, flock %s", "on" if posix else "off", "on" if flock else "off")

    # ------------------------------------------------------------------ helpers
    def _unless_given_up(self) -> None:
        """A master call retried on the loop stops once the watchdog gave its request up
        (as a thread hop is abandoned): the request is answered EIO, not after retry_s."""
        req = CURRENT.get() if self.requests is not None else None
        if req is not None and req.expired:
            raise Abandoned(f"{req.op}: given up while the master was unreachable")
        interrupted = _INTERRUPTED.get()
        if interrupted is not None and interrupted():   # a lock wait's signal: not after retry_s either
            raise CurvineError(errno.EINTR, "interrupted while the master was unreachable")

    async def _run(self, fn: Callable[..., T], *args: Any, discard: Callable[[T], None] | None = None) -> T:
        """fn(*args) in a worker thread.  Within a request the watchdog can give up: the
        thread is abandoned (it runs on; what it returns then goes to discard, if given)
        and Abandoned raised (fuse/watchdog.py hop).  Outside requests (system tasks) never."""
        req = CURRENT.get() if self.requests is not None else None
        if req is None:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        return await hop(req, self._limiter, fn, *args, discard=discard)

    async def _run_backing_file(self, fn: Callable[..., int | None], *args: Any) -> int | None:
        """The passthrough's hops (VFS.backing_file): an abandoned one's descriptor is closed."""
        return await self._run(fn, *args, discard=_close_fd)

    def _hop_limits(self) -> str:
        s = self._limiter.statistics()
        return f"  thread hops: {s.borrowed_tokens} of {s.total_tokens} busy, {s.tasks_waiting} waiting for one"

    def _ident(self, ctx: pyfuse3.RequestContext) -> Identity:
        """The caller, with its supplementary groups (cached per pid for a second)."""
        now = time.monotonic()
        cached = self._groups.get(ctx.pid)
        if cached is None or now - cached[0] > 1.0:
            try:
                groups = tuple(pyfuse3.get_sup_groups(ctx.pid))
            except (OSError, ValueError):
                groups = ()
            cached = (now, groups)
            if len(self._groups) > 4096:
                self._groups.clear()
            self._groups[ctx.pid] = cached
        return Identity(ctx.uid, ctx.gid, cached[1])

    def _entry(self, a: pb.Attr) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = a.ino
        e.generation = 0
        e.st_mode = a.mode
        e.st_nlink = a.nlink
        e.st_uid = a.uid
        e.st_gid = a.gid
        e.st_rdev = a.rdev
        e.st_size = a.size
        e.st_blksize = 1 << 20
        # a file's blocks that exist (holes count nothing: du, cp --sparse); others by their size
        e.st_blocks = ((a.allocated if stat.S_ISREG(a.mode) else a.size) + 511) // 512
        e.st_atime_ns = a.atime_ns
        e.st_mtime_ns = a.mtime_ns
        e.st_ctime_ns = a.ctime_ns
        e.attr_timeout = self.cfg.attr_timeout_s
        e.entry_timeout = self.cfg.entry_timeout_s
        return e

    # ------------------------------------------------------------------ metadata
    async def _master(self, method: Method[Any, Any], request: Any) -> Any:
        """One master call of a VFS operation: on the loop, over the framed channel
        (client/asyncmeta.py: no thread hop, the client's retries)."""
        return await self.meta.call(method, request)

    async def _do(self, op: Op[T]) -> T:
        """A VFS operation driven on the loop: its master calls awaited here, only its
        Blocking steps (a writer's flush, say) in a worker thread (_run)."""
        return await VFS.drive(op, self._master, self._run, self._landed)

    async def _landed(self, futures: list[Any]) -> None:
        """A Landed step: the blocks awaited on the loop (watchdog.landed), no thread hop."""
        await landed(CURRENT.get() if self.requests is not None else None, futures)

    @_fs_errors
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        text = os.fsdecode(name)
        try:
            attr = await self._do(self.vfs.lookup(parent_inode, text, self._ident(ctx)))
        except CurvineError as e:
            if e.errno != errno.ENOENT:
                raise
            if self.timed:
                self.top_dirs.count(self.top_dirs.label_of(parent_inode), "miss")
            if self.cfg.negative_timeout_s > 0 and self.vfs.kernel_may_keep_miss(parent_inode, text):
                neg = pyfuse3.EntryAttributes()
                neg.st_ino = 0
                neg.entry_timeout = self.cfg.negative_timeout_s
                return neg
            raise
        if self.timed:
            label = self.top_dirs.label_of(parent_inode)
            self.top_dirs.found(parent_inode, text, attr.ino, attr.mode)
            self.top_dirs.count(label, "hit")
        self.wal_gates.named(parent_inode, text, attr.ino)
        return self._entry(attr)

    @_fs_errors
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self._do(self.vfs.getattr(inode, self._ident(ctx))))

    @_fs_errors
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        req = pb.SetAttrRequest(ino=inode, mode=attr.st_mode, uid=attr.st_uid, gid=attr.st_gid, size=attr.st_size,
                                atime_ns=attr.st_atime_ns, mtime_ns=attr.st_mtime_ns)
        ident = self._ident(ctx)
        valid = 0
        valid |= SETATTR_MODE if fields.update_mode else 0
        valid |= SETATTR_UID if fields.update_uid else 0
        valid |= SETATTR_GID if fields.update_gid else 0
        valid |= SETATTR_SIZE if fields.update_size else 0
        if fields.update_atime or fields.update_mtime:
            now = await self._times_are_now(inode, attr, fields, ident)
            if fields.update_atime:
                valid |= SETATTR_ATIME_NOW if now else SETATTR_ATIME
            if fields.update_mtime:
                valid |= SETATTR_MTIME_NOW if now else SETATTR_MTIME
        req.valid = valid
        return self._entry(await self._do(self.vfs.setattr(inode, req, ident)))

    async def _times_are_now(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                             ident: Identity) -> bool:
        """Was this UTIME_NOW?  pyfuse3 hands over UTIME_NOW as the current time, so tell by who asks.

        With default_permissions the kernel refuses explicit times from anyone but the owner
        (EPERM) before the request reaches us, so a non-owner's time update is UTIME_NOW.  The
        owner and root may set any time, so theirs are sent as the exact values given (an
        explicit time a few ms from now, as ``cp -p`` of a fresh file makes, stays exact).
        """
        now = time.time_ns()
        recent = ((not fields.update_atime or abs(now - attr.st_atime_ns) < NOW_WINDOW_NS)
                  and (not fields.update_mtime or abs(now - attr.st_mtime_ns) < NOW_WINDOW_NS))
        if not recent or ident.uid == 0:
            return False
        owner = (await self._do(self.vfs.getattr(inode, ident))).uid
        return owner != ident.uid

    @_fs_errors
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return os.fsencode(await self._do(self.vfs.readlink(inode, self._ident(ctx))))

    @_fs_errors
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self._do(self.vfs.mknod(parent_inode, os.fsdecode(name), mode, rdev, ctx.umask,
                                                          self._ident(ctx))))

    @_fs_errors
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        dir_mode = stat.S_IFDIR | (mode & 0o7777)
        return self._entry(await self._do(self.vfs.mknod(parent_inode, os.fsdecode(name), dir_mode, 0, ctx.umask,
                                                         self._ident(ctx))))

    @_fs_errors
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._entry(await self._do(self.vfs.mknod(parent_inode, os.fsdecode(name), stat.S_IFLNK | 0o777, 0, 0,
                                                          self._ident(ctx), target=os.fsdecode(target))))

    @_fs_errors
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        op = self.vfs.link(inode, new_parent_inode, os.fsdecode(new_name), self._ident(ctx))
        return self._entry(await self._do(op))

    @_fs_errors
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._do(self.vfs.unlink(parent_inode, os.fsdecode(name), self._ident(ctx)))

    @_fs_errors
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self._do(self.vfs.rmdir(parent_inode, os.fsdecode(name), self._ident(ctx)))

    @_fs_errors
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        await self._do(self.vfs.rename(parent_inode_old, os.fsdecode(name_old), parent_inode_new,
                                       os.fsdecode(name_new), flags, self._ident(ctx)))

    # ------------------------------------------------------------------ directories
    @_fs_errors
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        ident = self._ident(ctx)
        attr = await self._do(self.vfs.getattr(inode, ident))
        if attr.mode & 0o170000 != 0o040000:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh = next(self._dir_fhs)
        self._dirs[fh] = (inode, ident)
        return fh

    @_fs_errors
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """'.' and '..' at offsets 1 and 2, then the master's entries (offsets >= 16, stable)."""
        ino, ident = self._dirs[fh]
        if start_id < 1:
            me = await self._do(self.vfs.getattr(ino, ident))
            if not pyfuse3.readdir_reply(token, b".", self._entry(me), 1):
                return
        if start_id < 2:
            # Listing needs only r on the directory (ext4 lists '..' without x), but a
            # lookup of '..' checks x: fetch the parent's attributes as root.
            up = await self._do(self.vfs.lookup(ino, "..", _ROOT))
            if not pyfuse3.readdir_reply(token, b"..", self._entry(up), 2):
                return
        offset = max(start_id, 2)
        while True:
            reply = await self._do(self.vfs.readdir(ino, offset, ident))
            for e in reply.entries:
                self.wal_gates.named(ino, e.name, e.attr.ino)
                if not pyfuse3.readdir_reply(token, os.fsencode(e.name), self._entry(e.attr), e.offset):
                    return
                offset = e.offset
            if reply.eof or not reply.entries:
                return

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

    # ------------------------------------------------------------------ files
    def _file_info(self, opened: Opened) -> pyfuse3.FileInfo:
        fi = pyfuse3.FileInfo(fh=opened.fh)
        fi.keep_cache = opened.keep_cache
        fi.direct_io = self.cfg.direct_io or opened.direct
        if not opened.writes and _NOFLUSH:
            fi.noflush = True   # its FLUSH would do nothing: close(2) is one round trip shorter
        return fi

    @_fs_errors
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        opened = await self._do(self.vfs.create(parent_inode, os.fsdecode(name), mode, flags, ctx.umask,
                                                 self._ident(ctx)))
        self.wal_gates.named(parent_inode, os.fsdecode(name), opened.attr.ino)
        return self._file_info(opened), self._entry(opened.attr)

    @_fs_errors
    async def tmpfile(self, parent_inode: int, mode: int, flags: int,
                      ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        """O_TMPFILE (the patched pyfuse3's handler): a file with no name until a linkat."""
        opened = await self._do(self.vfs.tmpfile(parent_inode, mode, flags, ctx.umask, self._ident(ctx)))
        return self._file_info(opened), self._entry(opened.attr)

    @_fs_errors
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        ident = self._ident(ctx)
        pt = self.passthrough
        if pt is None:
            return self._file_info(await self._open(inode, flags, ident))
        try:
            async with pt.lock(inode):
                pt.check_open(inode, flags)
                opened = await self._open(inode, flags, ident)
                fi = self._file_info(opened)
                try:
                    await pt.attach(inode, opened, fi)
                except BaseException:   # the kernel never hears of this handle: let it go here
                    self.vfs.core.executor.submit(self.vfs.run, self.vfs.release(opened.fh))
                    raise
                if self.timed and getattr(fi, "backing_id", None):   # None: a stock pyfuse3
                    cmetrics.PASSTHROUGH_READS.inc()   # its reads go to the block file, not to us
                return fi
        finally:
            pt.unlock(inode)

    async def _open(self, inode: int, flags: int, ident: Identity) -> Any:
        return await self._do(self.vfs.open(inode, flags, ident))

    @_fs_errors
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        lent = self.vfs.view_nowait(fh, off, size)   # already here: no thread hop, no copy
        if lent is None:   # waits for the bytes (an abandoned wait's late view: released)
            waited = await self._run(self.vfs.read_view, fh, off, size, discard=LentView.release)
            lent = waited
        elif self.timed:
            cmetrics.MEMORY_READS.inc()
            cmetrics.MEMORY_BYTES.inc(len(lent.view))
        if self.timed:
            metrics.READ_BYTES.inc(len(lent.view))
        # pyfuse3 copies the reply to the kernel right after this returns, within the same
        # trio step; a run_sync_soon callback runs only after that step: the view stays valid.
        trio.lowlevel.current_trio_token().run_sync_soon(lent.release)
        return lent.view

    @_fs_errors
    async def write(self, fh: int, off: int, buf: bytes | memoryview) -> int:
        """buf: with the patched pyfuse3 a view of the request where libfuse received it,
        valid until this returns (copied into a dirty block, or shipped and waited for)."""
        n = self.vfs.write_nowait(fh, off, buf)   # a copy into a dirty block: no thread hop
        begun = self.vfs.harden_begin(fh) if n is None else None
        if begun is not None:   # a new file's first write: its block ids come meanwhile
            await self.meta.harden(*begun)
            n = self.vfs.write_nowait(fh, off, buf)
        if n is None:
            n = await self._write_in_thread(fh, off, buf)
        if self.timed:
            metrics.WRITTEN_BYTES.inc(n)
        return n

    async def _write_in_thread(self, fh: int, off: int, buf: bytes | memoryview) -> int:
        """A write that may wait (a block to ship, a lease to take) in a worker thread.
        The watchdog may abandon that thread while it runs, so it gets a copy of a view of
        libfuse's receive buffer: the view is valid only until this returns, and libfuse
        reuses (or frees) that memory for the next request.  And a write given up fails its
        file's writer: the file must never be committed without that write's bytes."""
        data = bytes(buf) if isinstance(buf, memoryview) and self.requests is not None else buf
        try:
            return await self._run(self.vfs.write, fh, off, data, discard=lambda _n: self._fail_writer(fh))
        except (Abandoned, trio.Cancelled):
            self._fail_writer(fh)
            raise

    def _fail_writer(self, fh: int) -> None:
        """Fail the writer of fh's file (a write of it was given up); its later writes, its
        flush and its close fail with EIO and it commits nothing more."""
        try:
            w = self.vfs.handle(fh).state.writer
        except CurvineError:
            return
        if w is None or w.closed:
            return
        w.fail(CurvineError(errno.EIO, "a write was given up by the mount's watchdog (fuse.request_timeout_s)"))
        log.error("inode %d: a write request was given up; the file's writer fails from now on", w.ino)

    @_fs_errors
    async def flush(self, fh: int) -> None:
        await self._do(self.vfs.flush(fh))

    @_fs_errors
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self._do(self.vfs.fsync(fh))

    @_fs_errors
    async def release(self, fh: int) -> None:
        if self.passthrough is not None:
            self.passthrough.release(fh)
        await self._do(self.vfs.release(fh))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        return None  # the client keeps no per-inode lookup state

    # ------------------------------------------------------------------ space (client/vfsspace.py)
    @_fs_errors
    async def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2) (the patched pyfuse3's handler): its zeros written as a write's are,
        and one given up by the watchdog fails the file's writer as a write does (a range
        half zeroed must never be committed)."""
        try:
            await self._run(self.vfs.fallocate, fh, mode, offset, length, discard=lambda _n: self._fail_writer(fh))
        except (Abandoned, trio.Cancelled):
            self._fail_writer(fh)
            raise

    @_fs_errors
    async def lseek(self, fh: int, offset: int, whence: int) -> int:
        """SEEK_DATA and SEEK_HOLE (the kernel answers the other whences itself)."""
        return await self._run(self.vfs.seek_data, fh, offset, whence)

    # ------------------------------------------------------------------ locks (client/locks.py)
    @_fs_errors
    async def getlk(self, fh: int, owner: int, type: int, start: int, end: int,
                    pid: int) -> tuple[int, int, int, int]:
        a = LockAsk(0, owner, False, _FCNTL_TYPES.get(type, -1), start, end, pid)
        ino = self.vfs.handle(fh).ino
        found: Range | None
        if self.wal_gates.knows(ino):   # another mount's gate: a write lock over the range asked about
            async with self._gate_lock(ino):
                found = await self._do(self.wal_gates.getlk(fh, a))
        else:
            found = await self._do(self.vfs.getlk(fh, a))
        if found is None:
            return fcntl.F_UNLCK, start, end, pid
        return _TO_FCNTL[found.type], found.start, found.end, found.pid

    @_fs_errors
    async def setlk(self, fh: int, owner: int, type: int, start: int, end: int, pid: int, sleep: bool,
                    interrupted: Callable[[], bool]) -> None:
        await self._lock(fh, LockAsk(0, owner, False, _FCNTL_TYPES.get(type, -1), start, end, pid), sleep,
                         interrupted)

    @_fs_errors
    async def flock(self, fh: int, owner: int, op: int, interrupted: Callable[[], bool]) -> None:
        kind = _FLOCK_TYPES.get(op & ~fcntl.LOCK_NB, -1)
        await self._lock(fh, LockAsk(0, owner, True, kind), not op & fcntl.LOCK_NB, interrupted)

    async def forget_locks(self, fh: int, owner: int, flock: bool) -> None:
        """A close ends owner's locks (the patched pyfuse3 calls this first in every FLUSH,
        and in a flock holder's last RELEASE).  Nearly always the owner holds no lock of
        the file and it is no WAL index: answered here, with no request bookkeeping
        (_fs_errors: the watchdog's entry, the op's timing), as nothing can wait or fail."""
        try:
            ino = self.vfs.handle(fh).ino
        except CurvineError:   # (a handle already gone: nothing held through it)
            return
        if self.vfs.unlock_owner_nowait(fh, owner, flock) and not self.wal_gates.knows(ino):
            return
        await self._forget_locks(fh, owner, flock, ino)

    async def _forget_held_locks(self, fh: int, owner: int, flock: bool, ino: int) -> None:
        await self._do(self.vfs.unlock_owner(fh, owner, flock))
        if self.wal_gates.knows(ino):
            async with self._gate_lock(ino):
                await self._do(self.wal_gates.give_up(ino))
    _forget_locks = _fs_errors(_forget_held_locks, "forget_locks")   # (the op label as before)

    async def _lock(self, fh: int, a: LockAsk, block: bool, interrupted: Callable[[], bool]) -> None:
        req = CURRENT.get()
        ino = self.vfs.handle(fh).ino
        index = not a.flock and self.wal_gates.knows(ino)

        async def attempt(waiting: bool) -> bool:
            if req is not None:   # each try is bounded: the watchdog bounds the tries, not the wait
                req.start = _monotonic()
            if index:   # (client/walgate.py: the gate first, given up after the last lock)
                async with self._gate_lock(ino):
                    return await self._do(self.wal_gates.setlk(fh, a, waiting))
            return await self._do(self.vfs.setlk(fh, a, waiting))
        token = _INTERRUPTED.set(interrupted)   # (pyfuse3's worker tasks serve one request after another)
        try:
            await acquire(attempt, block and a.type != UNLCK, trio.sleep, interrupted)
        finally:
            _INTERRUPTED.reset(token)
        if a.type == UNLCK:
            return
        # what the kernel cached of the file is read again (NFS's rule; VFS.setlk)
        await self._run(_invalidate, self.vfs.handle(fh).ino)
        if not self._renewing:
            self._renewing = True
            trio.lowlevel.spawn_system_task(self._renew_locks)

    def _blocks_wanted(self, parent: int, name: str, ident: Identity) -> bool:
        """VFS.blocks_wanted: a lookup a listing answered, whose one-block file's block the
        mount checks or fetches ahead, asks for that block in a task of its own, so the
        lookup itself costs no master call.  False off the loop (the lookup asks now).
        Only where the listing brought no block for it (an older master's listing:
        MetaCache.first_from_listing); a listing with AttrReply.listing_blocks needs none."""
        try:
            trio.lowlevel.spawn_system_task(self._lookup_blocks, parent, name, ident)
        except RuntimeError:
            return False
        return True

    async def _lookup_blocks(self, parent: int, name: str, ident: Identity) -> None:
        try:
            await self._do(self.vfs.lookup_blocks(parent, name, ident))
        except Exception as e:   # (a hint only: the open asks for the block anyway)
            log.debug("block of %r in %d not learnt ahead: %s", name, parent, e)

    def _gate_lock(self, ino: int) -> trio.Lock:
        """One lock call at a time on WAL index ino (client/walgate.py)."""
        return self._gate_mu.setdefault(ino, trio.Lock())

    async def _renew_locks(self) -> None:
        """Renew the lock lease while this mount holds a lock (VFS.renew_locks)."""
        try:
            while True:
                try:
                    pause = await self._do(self.vfs.renew_locks())
                except Exception as e:   # the master unreachable past the retries: go on trying
                    log.warning("renewing the lock lease: %s", e)
                    pause = 1.0
                if not pause:
                    return
                await trio.sleep(pause)
        finally:
            self._renewing = False

    # ------------------------------------------------------------------ xattrs, statfs
    @_fs_errors
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if inode == pyfuse3.ROOT_INODE and name == METRICS_XATTR.encode() and self.metrics_address:
            return self.metrics_address.encode()
        try:
            return await self._do(self.vfs.getxattr(inode, os.fsdecode(name), self._ident(ctx)))
        except CurvineError as e:
            if e.errno == errno.ENODATA:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None
            raise

    @_fs_errors
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        if inode == pyfuse3.ROOT_INODE and name == DROP_CACHES_XATTR.encode():
            if ctx.uid != 0:
                raise pyfuse3.FUSEError(errno.EPERM)
            dropped = await self._run(self.vfs.drop_caches)   # closes files: off the loop
            log.info("client caches dropped (%s): %d bytes of staged blocks", DROP_CACHES_XATTR, dropped)
            return
        await self._do(self.vfs.setxattr(inode, os.fsdecode(name), value, 0, self._ident(ctx)))

    @_fs_errors
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return [os.fsencode(n) for n in await self._do(self.vfs.listxattr(inode, self._ident(ctx)))]

    @_fs_errors
    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        try:
            await self._do(self.vfs.removexattr(inode, os.fsdecode(name), self._ident(ctx)))
        except CurvineError as e:
            if e.errno == errno.ENODATA:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None
            raise

    @_fs_errors
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = await self._do(self.vfs.statfs())
        bsize = 4096
        out = pyfuse3.StatvfsData()
        out.f_bsize = 1 << 20
        out.f_frsize = bsize
        out.f_blocks = s.capacity // bsize
        out.f_bfree = s.available // bsize
        out.f_bavail = s.available // bsize
        out.f_files = s.files + 1_000_000
        out.f_ffree = 1_000_000
        out.f_favail = 1_000_000
        out.f_namemax = 255
        return out
