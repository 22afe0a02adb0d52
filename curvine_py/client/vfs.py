"""The VFS: the POSIX file API of the client core, in inodes and file handles.

The mount (``curvine_py.fuse``) hands every kernel request to one method here, and the
SDK (``curvine_py/sdk/client.py``) every call on a path.  Policy lives here, not in the
adapter: one write state per inode shared by every handle of this client (so reads see
this client's writes), commits
on flush (close-to-open), the lease released with the last writer, kernel page-cache
reuse when a file did not change since it was last opened here.

One form per operation: each metadata operation (and flush, fsync, release) is written
once, as a generator of the steps it needs -- a master call ``(method, request)``, or
``Blocking(fn, *args)`` for work that may wait (a writer's flush) -- which a driver
runs: ``VFS.run`` blocking (the SDK, tools, threads), ``VFS.drive`` awaited on the
mount's trio loop, with master calls over its loop-side client and only the Blocking
steps in a worker thread.  The step's result (or its error, thrown in) is what the
``yield`` returns.  The data path (read, write and their non-blocking tries) stays
plain methods: it is called per FUSE request, and each of its waits is of its own kind.

Why one module of ~730 lines: it is one class over one table (the per-inode write states
and the handles, under one lock) with ~50 short operations, none over 45 lines; the
mount, the SDK and the tests all reach the client through it.  Reads and writes are in
client/reader.py and client/writer.py.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import itertools
import logging
import os
import stat
import threading
import time
import typing
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Generator, TypeVar

from curvine_py.client import vfsspace
from curvine_py.client.core import ClientCore
from curvine_py.client.locks import LockAsk, MountLocks
from curvine_py.client.metaclient import Identity
from curvine_py.client.reader import FileReader, LentView
from curvine_py.client.writer import FileWriter, Phase, WriterClosed
from curvine_py.common.errors import CurvineError, err
from curvine_py.common import trash as trash_names
from curvine_py.common.lockranges import UNLCK, WRLCK, Range
from curvine_py.common.trash import TRASH_NAME
from curvine_py.common.types import CAPABILITY_XATTR, HIDDEN_PREFIX, ROOT_INO, SETATTR_SIZE
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master, Method, Rep, Req

MasterCall = Callable[[Method[Any, Any], Any], Awaitable[Any]]   # (method, request) -> reply
T = TypeVar("T")


class Blocking:
    """A step that may block (a writer's flush, a reader's close waiting for its fetches):
    VFS.run calls it, VFS.drive runs it in a worker thread."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args


class Landed(Blocking):
    """A step that waits for blocks on their way to their workers (futures of the block
    I/O pool): VFS.run waits in this thread; the mount's loop awaits them with no thread
    hop (VFS.drive's landed)."""

    __slots__ = ("futures",)

    def __init__(self, futures: list[Future[Any]]) -> None:
        super().__init__(concurrent.futures.wait, futures)
        self.futures = futures


Step = tuple[Method[Any, Any], Any] | Blocking
Op = Generator[Step, Any, T]   # an operation: its steps, then its result


def ask(method: Method[Req, Rep], request: Req) -> Generator[Step, Any, Rep]:
    """One master call as a step of an operation (``reply = yield from ask(Master.Lookup,
    req)``): the driver makes the call, this gives its reply back typed."""
    reply: Rep = yield method, request
    return reply

log = logging.getLogger(__name__)
ROOT = Identity(0, 0)
DOTS = (".", "..")
NAME_MAX = 255
KEEP_MAX = 1024   # open inodes an unlink or rename carries for the master to keep (~10 KB)
_ZEROS = memoryview(bytes(1 << 20))   # what fallocate's zeroing modes write, a MiB at a time
ACL_ACCESS = "system.posix_acl_access"   # an inode's access ACL (master/acl.py), flagged in pb.Attr.acl


def lease_at_first_write(flags: int) -> bool:
    """Does an open for writing leave the write lease for its first write?  An O_RDWR open
    without O_TRUNC: a program that reads and writes a file in place, as databases do
    under their locks (docs/posix.md "Several writers").  Its writer, taken at the first
    write, starts from the file as committed then (the previous lock holder's writes
    included), not as it was at the open.  A write-only open, a truncation, takes it at once."""
    return flags & os.O_ACCMODE == os.O_RDWR and not flags & os.O_TRUNC


def shares_writes(e: CurvineError, flags: int) -> bool:
    """Does a create refused EBUSY open anyway, its lease taken at its first write
    (lease_at_first_write)?  (A master before several writers per file refused an open
    for writing of a file another client wrote with EBUSY; today's never does.)"""
    return e.errno == errno.EBUSY and lease_at_first_write(flags)


def replace_attr(attr: pb.Attr, **fields: Any) -> pb.Attr:
    """A copy of attr with fields changed."""
    a = pb.Attr()
    a.CopyFrom(attr)
    for k, v in fields.items():
        setattr(a, k, v)
    return a


def one_block(attr: pb.Attr) -> bool:
    """A complete regular file of one block (the master's rule for LookupRequest.one_block)."""
    return attr.complete and stat.S_ISREG(attr.mode) and 0 < attr.size <= attr.block_size


def opens_for_writing(flags: int) -> bool:
    """An open that may change the file: write access, or O_TRUNC (O_RDONLY|O_TRUNC truncates)."""
    return (flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & os.O_TRUNC)


@dataclass
class InodeState:
    """What this client has open of one inode."""
    ino: int
    writer: FileWriter | None = None
    writers: int = 0          # handles open for writing
    handles: int = 0
    hidden: tuple[int, str, Identity] | None = None   # unlinked while open: remove at last release
    version: int = 0          # bumped when a writer here commits: readers reload their block lists
    # the master said it has no security.capability: asked once while it is open here, not
    # before every write(2) (a capability set elsewhere meanwhile shows at the next open)
    no_capability: bool = False


@dataclass
class Handle:
    fh: int
    ino: int
    flags: int
    state: InodeState
    writes: bool = False      # this handle counts as a writer (holds the inode's write state)
    ident: Identity | None = None   # who opened it (a retaken lease is asked for as them)
    reader: FileReader | None = None
    version: int = 0          # InodeState.version the reader was loaded at
    local_block: pb.BlockInfo | None = None   # the file's one block, with a replica here (backing_file)
    staged: Any = None   # the file's one block, staged in memory for the kernel (client/mount/staging.py)
    lock_owners: set[tuple[int, bool]] = field(default_factory=set)   # (owner, flock?) that locked through it


@dataclass(frozen=True)
class Opened:
    fh: int
    attr: pb.Attr
    keep_cache: bool
    direct: bool = False      # this handle's reads and writes bypass the kernel page cache
    backed: bool = False      # the kernel may read the file from a backing file: see backing_file
    writes: bool = False      # a writing handle: its close(2) commits (FLUSH); no other needs one


class OpenPolicy(typing.Protocol):
    """What a mount adds at lookups and opens (client/mount/policy.py ``MountOpens``):
    files the kernel reads by itself, blocks fetched ahead, the kernel's cache modes."""

    dir_attr_ttl: float      # how long a directory's attributes from this client's own change stand
    direct_reads: bool       # FOPEN_DIRECT_IO for complete files read here
    direct_creates: bool     # ... and for files made here and opened write-only

    @property
    def one_block(self) -> bool: ...
    @property
    def staged_bytes(self) -> int: ...
    def looking_up(self) -> typing.ContextManager[object]: ...
    def after_lookup(self, attr: pb.Attr, blocks: typing.Sequence[pb.BlockInfo]) -> None: ...
    def opened(self, ino: int, reader: FileReader, reply: pb.OpenReply, flags: int,
               prefetch: bool) -> tuple[pb.BlockInfo | None, Any]: ...
    def staged_file(self, staged: Any) -> int | None: ...
    def release(self, staged: Any) -> None: ...
    def drop_unused(self) -> int: ...
    def stop_staging(self) -> None: ...
    def close(self) -> None: ...


class SdkOpens:
    """The SDK's opens: nothing read by a kernel, nothing fetched ahead of an open."""

    dir_attr_ttl = 0.0
    direct_reads = direct_creates = one_block = False
    staged_bytes = 0

    def looking_up(self) -> typing.ContextManager[object]:
        return contextlib.nullcontext()

    def after_lookup(self, attr: pb.Attr, blocks: typing.Sequence[pb.BlockInfo]) -> None:
        pass

    def opened(self, ino: int, reader: FileReader, reply: pb.OpenReply, flags: int,
               prefetch: bool) -> tuple[pb.BlockInfo | None, Any]:
        return None, None

    def staged_file(self, staged: Any) -> int | None:
        return None

    def release(self, staged: Any) -> None:
        pass

    def drop_unused(self) -> int:
        return 0

    def stop_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


class VFS:
    """Stateless metadata calls go to the master; open files keep their state here."""

    def __init__(self, core: ClientCore, root: str = "/", opens: OpenPolicy | None = None) -> None:
        """root: the pool directory the kernel's root inode stands for (`cv mount --subdir`);
        opens: the mount's policy at lookups and opens (client/mount/policy.py), none for the SDK."""
        self.core = core
        self.meta = core.meta
        self.root_ino = self._root_of(root)
        self._lock = threading.Lock()
        self._fhs = itertools.count(1)
        self._handles: dict[int, Handle] = {}
        self._inodes: dict[int, InodeState] = {}
        self._seen_generation: dict[int, int] = {}   # ino -> generation when last opened here
        # Directories as the master returned them after this client's own changes: the
        # kernel asks for a directory's attributes again after every create/unlink in it
        # (it invalidates them), and this answers without another call.
        self._dir_attrs: dict[int, tuple[float, pb.Attr]] = {}
        self.opens: OpenPolicy = opens or SdkOpens()
        core.meta.dirs_listener = self._learn_dirs
        self.cache = core.meta.cache   # the mount's names and attributes under leases (client/metacache.py)
        # The mount's (fuse/ops.py): starts lookup_blocks(parent, name, ident) beside the
        # lookup a listing answered; False: it could not (the lookup then asks the master)
        self.blocks_wanted: Callable[[int, str, Identity], bool] | None = None
        self.locks = MountLocks()   # the flock and POSIX locks this client holds (client/locks.py)

    def _root_of(self, path: str) -> int:
        """The inode of the mount's root directory: resolved once, so a subdir mount costs
        nothing per request but the mapping of one inode number (_in)."""
        if path.strip("/") == "":
            return ROOT_INO
        try:
            attr = self.meta.resolve(path)
        except CurvineError as e:
            raise e.with_path(path) from None
        if not stat.S_ISDIR(attr.mode):
            raise err(errno.ENOTDIR).with_path(path)
        return int(attr.ino)

    def _in(self, ino: int) -> int:
        """A kernel inode number as the master knows it: the kernel's root is the subdir."""
        return self.root_ino if ino == ROOT_INO else ino

    # ------------------------------------------------------------------ attributes
    def overlay(self, attr: pb.Attr) -> pb.Attr:
        """Attributes as this client sees them: with its own unflushed writes (size, mtime)."""
        st = self._inodes.get(attr.ino)
        if st is None:
            return attr
        w = st.writer
        writing = w is not None and not w.closed and (w.changed or w.size != attr.size)
        if not writing and st.hidden is None:
            return attr
        a = pb.Attr()
        a.CopyFrom(attr)
        if st.hidden is not None:
            a.nlink = 0       # unlinked while open (kept under a hidden name until released)
        if writing and w is not None:
            a.size = w.size
            a.allocated = vfsspace.allocated(w.present_blocks(), w.size, w.bs)   # (st_blocks of unflushed writes)
            if w.changed:
                a.mtime_ns = a.ctime_ns = max(a.mtime_ns, w.mtime_ns)
        return a

    # ------------------------------------------------------------------ drivers
    def run(self, op: Op[T]) -> T:
        """Run op here, blocking: master calls through MasterClient.call (its retries),
        Blocking steps called in this thread.  The one driver (drive) with steps that
        never suspend, so its coroutine completes in a single send."""
        async def call(method: Method[Any, Any], request: Any) -> Any:
            return self.meta.call(method, request)

        async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
            return fn(*args)

        coro = self.drive(op, call, blocking)
        try:
            coro.send(None)
        except StopIteration as done:
            return typing.cast(T, done.value)
        coro.close()
        raise RuntimeError("a VFS operation waited for an event loop in VFS.run")

    @staticmethod
    async def drive(op: Op[T], call: MasterCall, blocking: Callable[..., Awaitable[Any]],
                    landed: Callable[[list[Future[Any]]], Awaitable[Any]] | None = None) -> T:
        """Run op on an event loop: master calls awaited through call, Blocking steps
        through blocking(fn, *args) (the mount's thread hop), Landed ones through landed
        (when given: a wait on the loop).  Each step's result is sent into op, its error
        thrown in (op may handle it: EEXIST, say).  A cancelled drive closes op, whose
        cleanups (a commit that did not go) then run."""
        reply: Any = None
        error: Exception | None = None
        try:
            while True:
                try:
                    step = op.throw(error) if error is not None else op.send(reply)
                except StopIteration as done:
                    return typing.cast(T, done.value)
                reply, error = None, None
                try:
                    if isinstance(step, Landed) and landed is not None:
                        reply = await landed(step.futures)
                    elif isinstance(step, Blocking):
                        reply = await blocking(step.fn, *step.args)
                    else:
                        reply = await call(*step)
                except Exception as e:
                    error = e
        finally:
            op.close()

    # ------------------------------------------------------------------ attributes
    def getattr(self, ino: int, ident: Identity) -> Op[pb.Attr]:
        ino = self._in(ino)
        cached = self.cached_dir_attr(ino)
        if cached is None and self.cache is not None:
            cached = self.cache.attr(ino)
        if cached is not None:
            return self.overlay(cached)
        request = self.meta.getattr_request(ino, ident)
        reply = yield from ask(Master.GetAttr, request)
        if self.cache is not None:
            self.cache.granted(request.caller.session, reply.lease_seq, (reply.attr,))
        return self.overlay(reply.attr)

    def lookup(self, parent: int, name: str, ident: Identity) -> Op[pb.Attr]:
        parent = self._in(parent)
        # not "." or "..": a move changes "..", and no key says so; not a name the master
        # refuses (ENAMETOOLONG): a listing would answer ENOENT
        cache = self.cache if name not in DOTS and len(name.encode("utf-8", "surrogateescape")) <= NAME_MAX else None
        if cache is not None:
            hit = cache.lookup(parent, name, ident)
            if isinstance(hit, pb.Attr):
                # A one-block file a listing brought, where the mount checks or fetches such
                # files' blocks at lookups: its first lookup uses the block the listing gave,
                # or asks for it beside (blocks_wanted), or now with the answer (no loop)
                first = cache.first_from_listing(parent, name, hit, ident) \
                    if self.opens.one_block and one_block(hit) else False
                if first is not True:
                    if first is not False:
                        self._listed_lookup(hit, first)
                    return self.overlay(hit)
                if self.blocks_wanted is not None and self.blocks_wanted(parent, name, ident):
                    return self.overlay(hit)
            elif hit is not None:
                raise err(errno.ENOENT)
        request = self.meta.lookup_request(parent, name, ident)
        request.one_block = self.opens.one_block
        request.miss_ok = cache is not None
        if cache is not None and request.caller.session:
            request.listing_max = cache.listing_max(parent)
        with self.opens.looking_up():   # (a mount starts no fetch ahead meanwhile)
            reply = yield from ask(Master.Lookup, request)
        if cache is not None:
            found = (reply.attr,) if reply.attr.ino else ()
            if request.listing_max and not reply.listed:
                cache.unlisted(parent, refused=not reply.lease_seq)
            cache.granted(request.caller.session, reply.lease_seq, found, (parent, name, reply.attr.ino),
                          reply.parent if reply.HasField("parent") else None,
                          listing=reply.listing if reply.listed else None,
                          listed_for=ident if reply.listing_blocks else None)
            if not reply.attr.ino:
                raise err(errno.ENOENT)
        self.opens.after_lookup(reply.attr, reply.blocks)
        return self.overlay(reply.attr)

    def _listed_lookup(self, attr: pb.Attr, blocks: typing.Sequence[pb.BlockInfo]) -> None:
        """A one-block file's first lookup answered with its listing's attributes and block
        (AttrReply.listing_blocks): what its own master call would have started.  Counted
        among the lookups (an empty one), whose pause the checks and fetches ahead wait
        for: started beside a run of stats, they slowed each one (localfiles._check)."""
        with self.opens.looking_up():
            pass
        self.opens.after_lookup(attr, blocks)

    def lookup_blocks(self, parent: int, name: str, ident: Identity) -> Op[None]:
        """A one-block file's block, asked for after a listing answered its lookup: what
        that lookup's own master call would have brought for the mount's checks and
        fetches ahead (OpenPolicy.after_lookup).  parent: the master's inode.  Only where
        the listing brought no block for it (an older master's; another caller's tokens;
        attributes changed since; LISTED_BLOCKS_S old: MetaCache.first_from_listing)."""
        request = self.meta.lookup_request(parent, name, ident)
        request.one_block = request.miss_ok = True
        with self.opens.looking_up():   # (no fetch ahead starts meanwhile, as for any lookup)
            reply = yield from ask(Master.Lookup, request)
        if reply.attr.ino:
            self.opens.after_lookup(reply.attr, reply.blocks)

    def kernel_may_keep_miss(self, parent: int, name: str) -> bool:
        """May the kernel keep a lookup's "no such name" (fuse.negative_timeout_s)?  Not one
        a directory's listing answered: no push ends it when another mount makes the name
        (the listing's lease ends, the name had none of its own)."""
        return self.cache is None or not self.cache.listed_miss(self._in(parent), name)

    def getxattr(self, ino: int, name: str, ident: Identity) -> Op[bytes]:
        """The kernel asks for security.capability before every write(2) to a file, and
        (FUSE_POSIX_ACL) for the access ACL of an inode whose permission it checks for
        someone other than its owner, again after each revalidation of its name: for an
        inode whose cached attributes say it has none, that is answered here.  A
        capability's absence is learnt from the master's first answer while the file is
        open here and kept until its last close: close-to-open, as its bytes are."""
        if name == ACL_ACCESS:
            cached = self.cached_dir_attr(self._in(ino))
            if cached is None and self.cache is not None:
                cached = self.cache.attr(self._in(ino))
            if cached is not None and not cached.acl:
                raise err(errno.ENODATA)
        opened = self._open_state(ino) if name == CAPABILITY_XATTR else None
        if opened is not None and opened.no_capability:
            raise err(errno.ENODATA)
        req = pb.XattrRequest(caller=self.meta.caller(ident), ino=self._in(ino), name=name)
        try:
            reply = yield from ask(Master.GetXattr, req)
        except CurvineError as e:
            if opened is not None and e.errno == errno.ENODATA:
                opened.no_capability = True
            raise
        return bytes(reply.value)

    def create(self, parent: int, name: str, mode: int, flags: int, umask: int, ident: Identity,
               block_size: int = 0, path: str = "") -> Op[Opened]:
        """block_size: the new file's (0: client.block_size); path: its whole path, when
        the caller knows it (the SDK), for the writer's logs."""
        req = self.meta.create_request(self._in(parent), name, stat.S_IFREG | (mode & 0o7777), flags, umask=umask,
                                       exclusive=bool(flags & os.O_EXCL),
                                       block_size=block_size or self.core.cfg.client.block_size, ident=ident)
        try:
            reply = self.meta.saw_dirs((yield from ask(Master.Create, req)))
        except CurvineError as e:   # an existing file another client writes now: open (see open)
            if not shares_writes(e, flags) or flags & os.O_EXCL:
                raise
            attr = yield from self.lookup(parent, name, ident)
            return (yield from self.open(attr.ino, flags, ident))
        if self.cache is not None:
            self.cache.granted(req.caller.session, reply.lease_seq, (reply.attr,), (req.parent, name, reply.attr.ino),
                               keys=reply.granted)
        opened = self._open_writer(reply, flags, ident)
        w = self._writer_of(opened.attr.ino)
        if w is not None:
            w.label = f"{path or repr(name)} (inode {opened.attr.ino})"
        if self.opens.direct_creates and flags & os.O_ACCMODE == os.O_WRONLY:
            # A file made here and opened write-only: its bytes go straight from the writer's
            # memory to the mount, without filling page-cache pages first (KV write ~10% faster
            # at less CPU, docs/performance.md).  Nobody can mmap a write-only descriptor, and
            # the kernel (6.6+) invalidates cached pages of the range of a direct write, so
            # another descriptor of the file reading through the page cache stays coherent.
            opened = replace(opened, direct=True)
        return opened

    def _keep(self) -> tuple[int, ...] | None:
        """The inodes open here, for the master to keep (UnlinkRequest.keep) instead of a
        lookup of the name first; None when there are more than a request should carry."""
        keep = tuple(self._inodes)   # one C call: atomic under the GIL
        return keep if len(keep) <= KEEP_MAX else None

    def cached_dir_attr(self, ino: int) -> pb.Attr | None:
        """A directory's attributes from this client's own recent change of it (no call)."""
        cached = self._dir_attrs.get(ino)
        if cached is not None and time.monotonic() - cached[0] < self.opens.dir_attr_ttl:
            return cached[1]
        return None

    def _learn_dirs(self, dirs: list[pb.Attr]) -> None:
        if not self.opens.dir_attr_ttl:   # the SDK keeps none (cached_dir_attr would never answer)
            return
        now = time.monotonic()
        for a in dirs:
            self._dir_attrs[a.ino] = (now, a)
        if len(self._dir_attrs) > 4096:
            self._dir_attrs = {k: v for k, v in self._dir_attrs.items() if now - v[0] < self.opens.dir_attr_ttl}

    def setattr(self, ino: int, req: pb.SetAttrRequest, ident: Identity) -> Op[pb.Attr]:
        ino = req.ino = self._in(ino)
        st = self._inodes.get(ino)
        if req.valid & SETATTR_SIZE and st is not None:
            st.version += 1   # readers open here reload their block lists
        if req.valid & SETATTR_SIZE and st is not None and st.writer is not None and not st.writer.closed:
            try:
                yield Blocking(_truncate_and_flush, st.writer, req.size)
            except WriterClosed:   # closed meanwhile (another descriptor's close): the master truncates
                yield Blocking(st.writer.wait_closing)
            else:
                req.valid &= ~SETATTR_SIZE
                if not req.valid:
                    return (yield from self.getattr(ino, ident))
        req.caller.CopyFrom(self.meta.caller(ident, mutation=True))
        self._dir_attrs.pop(ino, None)
        return self.overlay((yield from ask(Master.SetAttr, req)).attr)

    # ------------------------------------------------------------------ namespace
    def mknod(self, parent: int, name: str, mode: int, rdev: int, umask: int, ident: Identity,
              target: str = "") -> Op[pb.Attr]:
        """Any node: a file, a directory (mkdir), a symlink (target), a device or fifo."""
        bs = self.core.cfg.client.block_size if stat.S_ISREG(mode) else 0
        req = self.meta.mknod_request(self._in(parent), name, mode, umask=umask, rdev=rdev, target=target,
                                      block_size=bs, ident=ident)
        reply = self.meta.saw_dirs((yield from ask(Master.Mknod, req)))
        if self.cache is not None:
            # its mode and owner are granted unless an inherited ACL decides who may search it
            mode_granted = any(k.ino == reply.attr.ino and k.entry and not k.name for k in reply.granted)
            new_dir = reply.attr if stat.S_ISDIR(reply.attr.mode) and mode_granted else None
            self.cache.granted(req.caller.session, reply.lease_seq, (reply.attr,), (req.parent, name, reply.attr.ino),
                               new_dir, reply.granted)
        return reply.attr

    def link(self, ino: int, new_parent: int, new_name: str, ident: Identity) -> Op[pb.Attr]:
        """A hard link; for a file open here with no name (O_TMPFILE: linkat gives it one),
        its hidden name goes at once, so the file is left with the new one alone."""
        req = pb.LinkRequest(caller=self.meta.caller(ident, True), ino=ino, new_parent=self._in(new_parent),
                             new_name=new_name)
        attr = self.meta.saw_dirs((yield from ask(Master.Link, req))).attr
        st = self._inodes.get(ino)
        if st is not None and st.hidden is not None:
            parent, name, who = st.hidden
            st.hidden = None
            try:
                self.meta.saw_dirs((yield from ask(Master.Unlink, self.meta.unlink_request(parent, name, who))))
                attr = replace_attr(attr, nlink=attr.nlink - 1)
            except CurvineError as e:   # (kept, and removed with the file's last name as any link)
                log.warning("removing hidden %s after its link: %s", name, e)
        return self.overlay(attr)

    def tmpfile(self, parent: int, mode: int, flags: int, umask: int, ident: Identity) -> Op[Opened]:
        """O_TMPFILE: an open file with no name until a linkat gives it one (link).  Made
        as create makes a file (the caller's permissions in parent, its owner, an
        inherited ACL) under a hidden name, then kept in the trash directory as a file
        unlinked while open is (_hide_if_open): its last release removes it.  The reply
        says nlink 0 (overlay): the kernel takes it as it is, and refuses a linkat of an
        O_EXCL one (ENOENT) only when it sees no link."""
        name = f"{HIDDEN_PREFIX}tmp{os.urandom(8).hex()}"
        opened = yield from self.create(parent, name, mode, (flags & ~os.O_TMPFILE) | os.O_CREAT | os.O_EXCL,
                                        umask, ident)
        parent = self._in(parent)
        st = self._handles[opened.fh].state
        st.hidden = (parent, name, ident)
        yield from self._to_trash(st, parent, name)
        return replace(opened, attr=self.overlay(opened.attr))

    def unlink(self, parent: int, name: str, ident: Identity) -> Op[None]:
        """POSIX keeps an unlinked file readable while it is open: the request carries the
        inodes open here (keep), and a name the master kept for that is hidden instead
        (_hide), to be removed at the file's last release."""
        parent = self._in(parent)
        keep = self._keep()
        if keep is not None:
            req = self.meta.unlink_request(parent, name, ident)
            req.keep.extend(keep)
            if not self._changed(req, self.meta.saw_dirs((yield from ask(Master.Unlink, req)))).kept:
                return
        if not (yield from self._hide_if_open(parent, name, ident)):
            req = self.meta.unlink_request(parent, name, ident)
            self._changed(req, self.meta.saw_dirs((yield from ask(Master.Unlink, req))))

    def _changed(self, req: pb.UnlinkRequest | pb.RenameRequest, reply: pb.DirsReply) -> pb.DirsReply:
        """An unlink's, rmdir's or rename's reply: what this mount may cache after its own
        change (the listings it kept, a renamed file's new name)."""
        if self.cache is not None and reply.lease_seq:
            if reply.attr.ino and isinstance(req, pb.RenameRequest):
                self.cache.granted(req.caller.session, reply.lease_seq, (reply.attr,),
                                   (req.new_parent, req.new_name, reply.attr.ino), keys=reply.granted)
            else:
                self.cache.granted(req.caller.session, reply.lease_seq, (), keys=reply.granted)
        return reply

    def _hide_if_open(self, parent: int, name: str, ident: Identity) -> Op[bool]:
        """Like libfuse's 'hard_remove' off, a file open here is renamed to a hidden name
        instead and unlinked when its last handle is released."""
        if not self._inodes:
            return False
        try:
            attr = (yield from ask(Master.Lookup, self.meta.lookup_request(parent, name, ident))).attr
        except CurvineError:
            return False
        with self._lock:
            st = self._inodes.get(attr.ino)
            if st is None or not stat.S_ISREG(attr.mode) or attr.nlink > 1:
                return False
        hidden = f"{HIDDEN_PREFIX}{attr.ino:x}_{next(self._fhs):x}"
        # as the caller: unlink's permissions
        self.meta.saw_dirs((yield from ask(Master.Rename,
                                           self.meta.rename_request(parent, name, parent, hidden, 0, ident))))
        st.hidden = (parent, hidden, ident)
        yield from self._to_trash(st, parent, hidden)   # then out of the directory, as on ext4
        return True

    def _to_trash(self, st: InodeState, parent: int, name: str) -> Op[None]:
        """Move an open file's hidden name out of its directory into the trash directory,
        where its last release removes it (as root: the trash is root's); left where it
        is, still hidden, when that fails."""
        try:
            trash = yield from self._trash()
            kept = trash_names.kept_name(name, self.meta.client_id)   # (names this client: common/trash.py)
            self.meta.saw_dirs((yield from ask(Master.Rename,
                                               self.meta.rename_request(parent, name, trash, kept, 0, ROOT))))
            st.hidden = (trash, kept, ROOT)
            self.core.leases.watch_trash(self._keeps_trash)   # (this client says it lives while it keeps one)
        except CurvineError as e:
            log.warning("could not move %s to the trash directory: %s", name, e)

    def _keeps_trash(self) -> bool:
        """Does this client keep a file in the trash now (one open here with no name)?"""
        with self._lock:
            return any(st.hidden is not None and trash_names.owner_of(st.hidden[1]) is not None
                       for st in self._inodes.values())

    def _trash(self) -> Op[int]:
        """The root-owned directory where files unlinked while open wait for their last close."""
        try:
            req = self.meta.mknod_request(ROOT_INO, TRASH_NAME, stat.S_IFDIR | 0o700, ident=ROOT)
            return int(self.meta.saw_dirs((yield from ask(Master.Mknod, req))).attr.ino)
        except CurvineError as e:
            if e.errno != errno.EEXIST:
                raise
            return int((yield from ask(Master.Lookup, self.meta.lookup_request(ROOT_INO, TRASH_NAME, ROOT))).attr.ino)

    def rmdir(self, parent: int, name: str, ident: Identity) -> Op[None]:
        self._dir_attrs.clear()   # the removed directory's own entry must not outlive it
        req = self.meta.unlink_request(self._in(parent), name, ident)
        self._changed(req, self.meta.saw_dirs((yield from ask(Master.Rmdir, req))))

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int,
               ident: Identity) -> Op[None]:
        """A file it replaces that is open here stays readable: kept by the master (keep),
        then hidden first (as unlink).  NOREPLACE and EXCHANGE drop no file."""
        parent, new_parent = self._in(parent), self._in(new_parent)
        keep = self._keep() if not flags else ()
        self._dir_attrs.clear()   # a moved directory's ctime changes too; the parents come back
        if keep is not None:
            req = self.meta.rename_request(parent, name, new_parent, new_name, flags, ident)
            req.keep.extend(keep)
            if not self._changed(req, self.meta.saw_dirs((yield from ask(Master.Rename, req)))).kept:
                return
        yield from self._hide_if_open(new_parent, new_name, ident)
        req = self.meta.rename_request(parent, name, new_parent, new_name, flags, ident)
        self._changed(req, self.meta.saw_dirs((yield from ask(Master.Rename, req))))

    def readlink(self, ino: int, ident: Identity) -> Op[str]:
        return str((yield from ask(Master.Readlink, pb.InodeRequest(caller=self.meta.caller(ident), ino=ino))).target)

    def readdir(self, ino: int, offset: int, ident: Identity, limit: int = 1000) -> Op[pb.ReadDirReply]:
        ino = self._in(ino)
        reply = yield from ask(Master.ReadDir, pb.ReadDirRequest(caller=self.meta.caller(ident), ino=ino,
                                                                 offset=offset, limit=limit, plus=True))
        if any(e.name.startswith(HIDDEN_PREFIX) for e in reply.entries):
            kept = [e for e in reply.entries if not e.name.startswith(HIDDEN_PREFIX)]
            last = reply.entries[-1].offset
            reply = pb.ReadDirReply(entries=kept, eof=reply.eof)
            if not kept and not reply.eof:   # keep paging: the caller stops at an empty page
                return (yield from self.readdir(ino, last, ident, limit))
        return reply

    def statfs(self) -> Op[pb.StatFsReply]:
        return (yield from ask(Master.StatFs, pb.Empty()))

    def _open_state(self, ino: int) -> InodeState | None:
        with self._lock:
            return self._inodes.get(ino)

    def _capability_changed(self, ino: int, name: str) -> None:
        opened = self._open_state(ino) if name == CAPABILITY_XATTR else None
        if opened is not None:
            opened.no_capability = False

    def setxattr(self, ino: int, name: str, value: bytes, flags: int, ident: Identity) -> Op[None]:
        self._capability_changed(ino, name)
        yield from ask(Master.SetXattr, pb.XattrRequest(caller=self.meta.caller(ident, True), ino=self._in(ino),
                                                        name=name, value=value, flags=flags))
        self._dir_attrs.pop(self._in(ino), None)   # an ACL sets the mode bits

    def listxattr(self, ino: int, ident: Identity) -> Op[list[str]]:
        req = pb.XattrRequest(caller=self.meta.caller(ident), ino=self._in(ino))
        return list((yield from ask(Master.ListXattr, req)).names)

    def removexattr(self, ino: int, name: str, ident: Identity) -> Op[None]:
        self._capability_changed(ino, name)
        yield from ask(Master.RemoveXattr, pb.XattrRequest(caller=self.meta.caller(ident, True), ino=self._in(ino),
                                                           name=name))
        self._dir_attrs.pop(self._in(ino), None)

    # ------------------------------------------------------------------ open files
    def open(self, ino: int, flags: int, ident: Identity, prefetch: bool = True) -> Op[Opened]:
        """prefetch: a small file's blocks start coming at a read-only open (the KV reader
        reads the whole chunk next); False when the caller reads it all into a buffer of
        its own at once (the SDK's get_into), which fetches straight there."""
        write = opens_for_writing(flags)
        shared = self._writer_of(ino)
        if write and shared is None:
            if lease_at_first_write(flags):
                # Opened as for reading (the master checks read and write access); the
                # first write takes a lease (_writer_for), beside any other client's.
                reply = yield from ask(Master.Open, self.meta.open_request(ino, flags, write=False, ident=ident))
                return self._new_handle(ino, flags, reply, True, ident)
            reply = yield from ask(Master.Open, self.meta.open_request(ino, flags, write=True, ident=ident))
            return self._open_writer(reply, flags, ident)
        reply = yield from ask(Master.Open, self.meta.open_request(ino, flags & ~os.O_TRUNC, write=False, ident=ident))
        if write and shared is not None:   # (always shared: a write without one returned above)
            if flags & os.O_TRUNC:
                try:
                    yield Blocking(shared.truncate, 0)
                except WriterClosed:   # closed meanwhile by another descriptor's close: a lease of our own
                    yield Blocking(shared.wait_closing)
                    reply = yield from ask(Master.Open, self.meta.open_request(ino, flags, write=True, ident=ident))
                    return self._open_writer(reply, flags, ident)
            return self._new_handle(ino, flags, reply, True, ident)
        return self._new_handle(ino, flags, reply, False, ident, prefetch)

    def _writer_of(self, ino: int) -> FileWriter | None:
        """The file's open writer here, if any: new opens of the file share it."""
        with self._lock:
            st = self._inodes.get(ino)
            return st.writer if st is not None and st.writer is not None and not st.writer.closed else None

    def _open_writer(self, reply: pb.OpenReply, flags: int, ident: Identity) -> Opened:
        ino = reply.attr.ino
        with self._lock:
            st = self._inodes.setdefault(ino, InodeState(ino))
            if st.writer is None or st.writer.closed:
                st.writer = FileWriter(self.core, reply, ident)
        return self._new_handle(ino, flags, reply, True, ident)

    def _new_handle(self, ino: int, flags: int, reply: pb.OpenReply, writer_handle: bool,
                    ident: Identity, prefetch: bool = True) -> Opened:
        with self._lock:
            st = self._inodes.setdefault(ino, InodeState(ino))
            h = Handle(next(self._fhs), ino, flags, st, writes=writer_handle, ident=ident)
            h.version = st.version
            if writer_handle:
                st.writers += 1
            elif st.writer is None or st.writer.closed:
                h.reader = FileReader(self.core, reply)
                h.local_block, h.staged = self.opens.opened(ino, h.reader, reply, flags, prefetch)
                if h.local_block is None and h.staged is None and prefetch:
                    # In the background: it may wait for a free buffer, and the mount's
                    # awaited open runs this on its event loop.
                    self.core.executor.submit(h.reader.prefetch_small)
            st.handles += 1
            self._handles[h.fh] = h
            gen = reply.attr.generation
            keep = self._seen_generation.get(ino) == gen and not writer_handle
            self._seen_generation[ino] = gen
            # A complete file read here, with no writer here: its bytes cannot change under
            # this handle, so the kernel need not cache them (direct I/O skips filling new
            # page-cache pages, the costliest step of a read through the mount).
            direct = self.opens.direct_reads and h.reader is not None and reply.attr.complete
        backed = h.local_block is not None or h.staged is not None
        return Opened(h.fh, self.overlay(reply.attr), keep, direct, backed, writer_handle)

    def backing_file(self, fh: int) -> int | None:
        """For a handle opened with Opened.backed: a read-only descriptor of the file the
        kernel reads by itself, whole: the local replica's block file, verified
        (ShortCircuit.open_verified), or the block staged in memory (StagedBlocks.file_of,
        fetched now if it is not yet).  None when that fails, and then the handle reads as
        any other (its blocks are fetched now)."""
        h = self.handle(fh)
        if h.staged is not None:
            fd = self.opens.staged_file(h.staged)
            if fd is None:
                self.read_normally(fh)
            return fd
        block = h.local_block
        if block is None or h.reader is None:
            return None
        sc, addr = self.core.paths.shortcircuit, self.core.paths.local_replica(block)
        fd = sc.open_verified(addr, block) if sc is not None and addr is not None else None
        if fd is not None:
            return fd
        self.read_normally(fh)
        return None

    def read_normally(self, fh: int) -> None:
        """The handle's file is not read by the kernel after all: fetch its blocks now."""
        h = self.handle(fh)
        staged, h.staged = h.staged, None
        if staged is not None:
            self.opens.release(staged)
        if (h.local_block is not None or staged is not None) and h.reader is not None:
            h.local_block = None
            self.core.executor.submit(h.reader.prefetch_small)

    def drop_caches(self) -> int:
        """Drop the block copies this mount keeps beside the kernel's page cache (staged
        blocks, blocks fetched ahead) that nothing uses: what a `drop_caches` leaves
        behind; bytes of staged copies dropped."""
        return self.opens.drop_unused()

    def stop_staging(self) -> None:
        """The kernel takes no backing files after all: stage nothing more (handles holding
        a staged block read normally; client/mount/staging.py)."""
        self.opens.stop_staging()

    def open_handles(self, ino: int) -> int:
        """How many handles of ino are open here."""
        with self._lock:
            st = self._inodes.get(ino)
            return st.handles if st is not None else 0

    def handle(self, fh: int) -> Handle:
        h = self._handles.get(fh)
        if h is None:
            raise err(errno.EBADF)
        return h

    def read(self, fh: int, offset: int, size: int) -> bytes:
        h = self.handle(fh)
        st = h.state
        if st.writer is not None and not st.writer.closed:
            buf = bytearray(size)
            n = st.writer.pread(offset, memoryview(buf))
            del buf[n:]
            return bytes(buf)
        return self._current_reader(h).read_bytes(offset, size)

    def read_into(self, fh: int, offset: int, into: memoryview) -> int:
        """read() into the caller's buffer (the SDK's readinto): bytes read, short at the end."""
        h = self.handle(fh)
        st = h.state
        if st.writer is not None and not st.writer.closed:
            return st.writer.pread(offset, into)
        return self._current_reader(h).pread(offset, into)

    def read_all_into(self, fh: int, into: memoryview) -> int:
        """The whole file into the caller's buffer (len >= its size), blocks fetched in
        parallel (the SDK's get_into); its size."""
        h = self.handle(fh)
        if h.state.writer is not None and not h.state.writer.closed:
            return self.read_into(fh, 0, into)
        reader = self._current_reader(h)
        if len(into) < reader.size:
            raise err(errno.EOVERFLOW, f"buffer of {len(into)} bytes < file size {reader.size}")
        return reader.read_all_into(into)

    def _current_reader(self, h: Handle) -> FileReader:
        """h's reader, loaded again when this client committed the file since it loaded."""
        st = h.state
        if h.reader is None or h.version != st.version:
            reply = self.meta.open(h.ino, os.O_RDONLY, write=False)
            if h.reader is not None:
                h.reader.close()
            h.reader = FileReader(self.core, reply)
            h.version = st.version
        return h.reader

    def size(self, fh: int) -> int:
        """The file's size as this handle sees it (this client's writes included)."""
        h = self.handle(fh)
        w = h.state.writer
        if w is not None and not w.closed:
            return w.size
        return self._current_reader(h).size

    def write_whole(self, fh: int, data: memoryview, progress: Callable[[int], None] | None = None) -> None:
        """A whole object from memory through a handle just created with O_TRUNC (the SDK's
        put_bytes): block ids asked for in one batch, full blocks sent straight from data."""
        w = self._writer_for(self.handle(fh))
        w.ids.expected = (len(data) + w.bs - 1) // w.bs
        w.truncate(0)   # (no change, and no lease taken, when the create truncated it already)
        step = w.bs * 8
        for off in range(0, len(data), step):
            w.pwrite(off, data[off:off + step])   # (a handle of its own: no other close takes its writer)
            if progress:
                progress(min(step, len(data) - off))

    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2) through a handle open for writing (client/vfsspace.py says what each
        mode does): the whole blocks of a zeroed range emptied (holes: the commit frees
        them on the workers), zeros written through the file's writer into the blocks it
        covers in part, the size grown; visible to other clients at the commit (close,
        fsync, unlock), as a write is."""
        h = self.handle(fh)
        if not h.writes or (h.flags & os.O_ACCMODE) == os.O_RDONLY:
            raise err(errno.EBADF, "file not open for writing")
        size = self.size(fh)
        plan = vfsspace.fallocation(mode, offset, length, size)
        if plan.zero_start >= plan.zero_end and plan.size <= size:
            return   # (KEEP_SIZE, mode 0 inside the file: nothing to change, no lease taken)
        while True:   # (a writer closed under this call by another descriptor's close: taken again)
            w = self._writer_for(h)
            plan = vfsspace.fallocation(mode, offset, length, w.size)
            try:
                holes = vfsspace.whole_slots(plan.zero_start, plan.zero_end, w.size, w.bs)
                if holes:
                    w.punch(holes)   # (whole blocks become holes, freed at the commit)
                present = w.present_blocks()   # (a hole reads zeros already: left a hole)
                for at, n in vfsspace.pieces(plan.zero_start, plan.zero_end, w.bs, len(_ZEROS)):
                    if at // w.bs in present:
                        w.pwrite(at, _ZEROS[:n])
                if plan.size > w.size:
                    w.truncate(plan.size)
                return
            except WriterClosed:
                continue

    def seek_data(self, fh: int, offset: int, whence: int) -> int:
        """lseek(SEEK_DATA or SEEK_HOLE) from the file's block map: this client's writer's
        when it writes the file, else the blocks the handle's reader loaded."""
        h = self.handle(fh)
        w = h.state.writer
        if w is not None and not w.closed:
            return vfsspace.seek_data(w.present_blocks(), w.size, w.bs, offset, whence)
        reader = self._current_reader(h)
        return vfsspace.seek_data(reader.blocks.keys(), reader.size, reader.bs, offset, whence)

    def abort(self, fh: int) -> None:
        """Give up a handle's writes since the last commit (the SDK's abort), then release it."""
        w = self.handle(fh).state.writer
        if w is not None and not w.closed:
            w.abort()
        self.run(self.release(fh))

    def read_view(self, fh: int, offset: int, size: int) -> LentView:
        """read() lent out of the block cache where it can be (waiting for the bytes, not for
        the whole block); released once the view has been used."""
        reader = self._settled_reader(self.handle(fh))
        if reader is None:
            return LentView.copied(self.read(fh, offset, size))
        return reader.view_wait(offset, size)

    def view_nowait(self, fh: int, offset: int, size: int) -> LentView | None:
        """The bytes lent out of the block cache if they can be had without blocking (already
        fetched); else None."""
        h = self._handles.get(fh)
        reader = None if h is None else self._settled_reader(h)
        return None if reader is None else reader.view_nowait(offset, size)

    @staticmethod
    def _settled_reader(h: Handle) -> FileReader | None:
        """h's reader when the block cache may serve it as it is: loaded since this client's
        last commit of the file, and no writer of the file open here; else None (read())."""
        if h.reader is None or h.version != h.state.version or \
                (h.state.writer is not None and not h.state.writer.closed):
            return None
        return h.reader

    def write(self, fh: int, offset: int, data: bytes | bytearray | memoryview) -> int:
        h = self.handle(fh)
        if not h.writes or (h.flags & os.O_ACCMODE) == os.O_RDONLY:  # O_RDONLY|O_TRUNC too
            raise err(errno.EBADF, "file not open for writing")
        while True:   # (a writer closed under this write by another descriptor's close: taken again)
            w = self._writer_for(h)
            try:
                return w.pwrite(w.size if h.flags & os.O_APPEND else offset, data)
            except WriterClosed:
                continue

    def write_nowait(self, fh: int, offset: int, data: bytes | memoryview) -> int | None:
        """The write if it can be done without blocking (copied into a dirty block), else None."""
        h = self._handles.get(fh)
        w = h.state.writer if h is not None else None
        if h is None or w is None or w.closed or not h.writes or (h.flags & os.O_ACCMODE) == os.O_RDONLY:
            return None
        return w.try_pwrite(offset, data, append=bool(h.flags & os.O_APPEND))

    def harden_begin(self, fh: int) -> tuple[FileWriter, pb.AllocateBlocksRequest] | None:
        """At the first write of a file created here: its writer and the AllocateBlocks that
        makes its soft lease binding with the first batch of block ids.  The mount sends it
        before answering that write but takes the answer in the background (then
        writer.hardened): the writes meanwhile fill the dirty block, and the block's stream
        starts once the ids are here.  None: not such a writer; the write's own path does
        what is needed."""
        h = self._handles.get(fh)
        w = h.state.writer if h is not None and h.writes else None
        req = w.harden_request_nowait() if w is not None else None
        return (w, req) if w is not None and req is not None else None

    def _writer_for(self, h: Handle) -> FileWriter:
        """The inode's write state; retaken (a new lease) when a write follows the close that
        gave it up: a dup'd descriptor, or the kernel writing back a shared mmap."""
        st = h.state
        while True:
            with self._lock:
                w = st.writer
                if w is not None and not w.closed:
                    return w
            if w is None or w.phase is not Phase.CLOSING:
                break
            w.wait_closing()   # a close's Commit on its way: closed by it, or open again if it failed
        reply = self.meta.open(h.ino, h.flags & ~os.O_TRUNC, write=True, ident=h.ident)
        with self._lock:
            if st.writer is None or st.writer.closed:
                st.writer = FileWriter(self.core, reply, h.ident)
            return st.writer

    def flush(self, fh: int) -> Op[None]:
        """close(2) of one descriptor: make its writes visible to every client.

        When no other descriptor of this client writes the file, the lease goes too, right
        here: the kernel sends RELEASE only later, asynchronously, and another node opening
        the file for writing right after our close must not find it busy.  When the last
        blocks need no more than to finish their streams (a KV chunk, written in order),
        that is a Landed step (on the mount's loop: a wait with no thread hop) and then one
        Commit that also releases the lease; anything else is a Blocking flush.  A read-only
        descriptor, or a writer already closed, needs no step at all.
        """
        h = self.handle(fh)
        st = h.state
        w = st.writer
        if w is None or not h.writes:
            return
        if w.phase is Phase.CLOSING:   # another descriptor's close commits it (a forked child's): wait
            yield Blocking(w.wait_closing)
        if w.closed:
            return
        with self._lock:
            last = st.writers == 1
        if not last:
            if (yield Blocking(w.flush, False, True)) is not None:
                st.version += 1
        elif not w.close_soft_nowait():   # (created here, never written: nothing to tell the master)
            st.version += 1
            landing = w.land_nowait()
            if landing:   # (a KV chunk's close: its streamed last block, on its way)
                yield Landed(landing)
            req = w.close_request_nowait()
            if req is not None:
                try:
                    yield from ask(Master.Commit, req)
                except CurvineError as e:   # kept for the next flush, unless nothing was lost
                    w.close_sent(ok=w.lost_nothing(e, req.blocks))
                    if not w.closed:
                        raise
                except BaseException:   # a failure, or the drive closed (cancelled): kept for the next
                    w.close_sent(ok=False)
                    raise
                else:
                    w.close_sent(ok=True)
            else:
                # Not close(): a failed commit (master restarting) must keep the data for the
                # next flush or the release, not drop it; close(2) reports the error meanwhile.
                # A forked child closing an inherited descriptor lands here too: the lease goes,
                # and the parent's next write takes it again (_writer_for).  So can a close that
                # found another descriptor's close already under way: flush waits for that one.
                yield Blocking(w.flush, True, True)
            # Again once committed: a read or seek of this file while the commit was on its way
            # (the writer counts as closed from CLOSING on; the kernel's readahead, say) may
            # have loaded the block map from before the commit under the version bumped above.
            st.version += 1
        self._seen_generation.pop(h.ino, None)

    def fsync(self, fh: int) -> Op[None]:
        h = self.handle(fh)
        w = h.state.writer
        if w is not None and not w.closed and h.writes and (yield Blocking(w.flush, False, True)) is not None:
            h.state.version += 1

    def release(self, fh: int) -> Op[None]:
        """The last reference to a descriptor went away; the last writer gives up the lease.
        Steps only where it must wait: the last writer's close, a reader's fetches still
        running, the hidden name of a file unlinked while open."""
        with self._lock:
            h = self._handles.pop(fh, None)
            if h is None:
                return
            st = h.state
            st.handles -= 1
            last_writer = h.writes and st.writers == 1
            if h.writes:
                st.writers -= 1
            if st.handles == 0:
                self._inodes.pop(h.ino, None)
        if h.staged is not None:
            self.opens.release(h.staged)
        if h.reader is not None:
            if h.reader.idle():
                h.reader.close()
            else:
                yield Blocking(h.reader.close)
        if last_writer and st.writer is not None and not st.writer.closed:
            st.version += 1
            try:
                yield Blocking(st.writer.close)
            except CurvineError as e:
                log.error("closing inode %d: %s", h.ino, e)
        for owner, flock in h.lock_owners:   # an OFD lock's, or one a no-FLUSH close left (after the commit)
            yield from self._unlock(h.ino, owner, flock)
        if st.handles == 0 and st.hidden is not None:
            parent, name, ident = st.hidden
            try:
                self.meta.saw_dirs((yield from ask(Master.Unlink, self.meta.unlink_request(parent, name, ident))))
            except CurvineError as e:
                log.warning("removing hidden %s: %s", name, e)

    def close(self) -> None:
        """Unmount: flush and release everything still open."""
        for fh in list(self._handles):
            try:
                h = self._handles[fh]
                if h.state.writer is not None and not h.state.writer.closed:
                    h.state.writer.close()
                self.run(self.release(fh))
            except Exception as e:  # best effort at shutdown
                log.error("release of handle %d at unmount: %s", fh, e)
        self.opens.close()


    # ------------------------------------------------------------------ locks (client/locks.py)
    def getlk(self, fh: int, a: LockAsk) -> Op[Range | None]:
        """F_GETLK: the lock of another owner in a's way, None when a could be had."""
        a = replace(a, ino=self.handle(fh).ino)
        reply = yield from ask(Master.Lock, a.request(self.meta.caller(), test=True))
        c = reply.conflict
        return None if reply.granted else Range(c.type, c.start, c.end, c.pid)

    def setlk(self, fh: int, a: LockAsk, waiting: bool = False) -> Op[bool]:
        """One try at taking (or with UNLCK, giving up) a lock through fh: granted or not
        (waiting: a blocked waiter's try again, EDEADLK when its wait closes a cycle).

        NFS's rule for locked data: this client's writes of the file reach the master
        before an unlock does (the writer flushed, its lease kept), and a lock taken makes
        this client's readers of the file load it again from the master, so the lock
        holder reads what the previous holder wrote (the kernel's cache: the mount's)."""
        h = self.handle(fh)
        a = replace(a, ino=h.ino)
        # The last unlock of the file here gives the lease up too, so a writer on another
        # host may take its turn; an unlock while another lock of the file is held here
        # (another process's: it may be writing under it) or a change to a read lock keeps
        # it.  Every unlock counts itself done before it looks (MountLocks.unlocking), so of
        # two at once the later one sees none left.  Readers here reload after the commit.
        # A commit that fails keeps the written blocks for the close, which reports it; the
        # unlock goes on.
        release = a.type == UNLCK and not self.locks.unlocking(a)
        if a.type != WRLCK:
            yield from self._commit(h.state, release, "before an unlock")
        try:
            reply = yield from ask(Master.Lock, a.request(self.meta.caller(), wait=waiting))
        except BaseException:
            if a.type == UNLCK:
                self.locks.unlock_failed(a)
            raise
        if reply.granted:
            self.locks.granted(a, reply.lease_ms)
            if a.type != UNLCK:
                h.lock_owners.add((a.owner, a.flock))
                yield from self._reload(h.state, "at a lock")
        return reply.granted

    def reload_at_lock(self, ino: int, at: str = "at a lock") -> Op[None]:
        """A lock that covers ino was taken other than through a handle of it (a WAL
        index's gate, client/walgate.py): what this client has open of ino is loaded
        again, as at a lock of ino itself (setlk).  Nothing open here: nothing to do."""
        st = self._open_state(ino)
        if st is not None:
            yield from self._reload(st, at)

    def commit_writer(self, ino: int, at: str = "before an unlock") -> Op[None]:
        """ino's writes here reach the master, the lease kept, as before an unlock (setlk):
        for a lock given up other than through a handle of ino (client/walgate.py)."""
        st = self._open_state(ino)
        if st is not None:
            yield from self._commit(st, False, at)

    def _reload(self, st: InodeState, at: str) -> Op[None]:
        """NFS's rule after a lock: this client's readers of st's file load it again, and
        its writer, which sees the file as it was when it began (another host may have
        committed since: several writers), commits and closes; the next write takes a
        writer that sees the new holder's file.  Readers are told again once committed
        (a read meanwhile may have loaded the block map from before the commit: flush)."""
        st.version += 1
        w = st.writer
        if w is not None and not w.closed:
            try:
                yield Blocking(functools.partial(w.flush, True, True))
            except CurvineError as e:
                log.error("inode %d: committing %s: %s", st.ino, at, e)
            st.version += 1

    def _commit(self, st: InodeState, release: bool, at: str) -> Op[None]:
        """NFS's rule before an unlock: this client's writes of st's file reach the master
        (release: the lease goes too); a commit that fails keeps the written blocks for
        the close, which reports it."""
        w = st.writer
        if w is None or w.closed:
            return
        try:
            if (yield Blocking(functools.partial(w.flush, release, True))) is not None or release:
                st.version += 1
        except CurvineError as e:
            log.error("inode %d: committing %s: %s", st.ino, at, e)

    def unlock_owner_nowait(self, fh: int, owner: int, flock: bool) -> bool:
        """unlock_owner's work when it needs no call, as at almost every close (owner holds
        no lock of the file here): done now, True; False: drive unlock_owner."""
        h = self._handles.get(fh)
        if h is None:
            return True
        if self.locks.holds(h.ino, owner, flock):
            return False
        h.lock_owners.discard((owner, flock))
        return True

    def unlock_owner(self, fh: int, owner: int, flock: bool) -> Op[None]:
        """A close that ends owner's locks on fh's file (FLUSH for POSIX locks, the last
        RELEASE for flock): one call when it holds any, none otherwise."""
        h = self._handles.get(fh)
        if h is not None:
            h.lock_owners.discard((owner, flock))
            yield from self._unlock(h.ino, owner, flock)

    def _unlock(self, ino: int, owner: int, flock: bool) -> Op[None]:
        if not self.locks.holds(ino, owner, flock):
            return
        a = LockAsk(ino, owner, flock, UNLCK)
        reply = yield from ask(Master.Lock, a.request(self.meta.caller()))
        self.locks.granted(a, reply.lease_ms)

    def renew_locks(self) -> Op[float]:
        """Renew this client's lock lease: the pause until the next renewal (0: it holds
        none).  The renewal carries what it holds, which a new leader takes back in its
        grace (reclaim); a master that dropped them (the lease ran out) says so, and they
        are logged lost."""
        if not self.locks.any():
            return 0.0
        reply = yield from ask(Master.RenewLocks, self.locks.reclaim(self.meta.caller()))
        if not reply.held:
            log.error("the master dropped this mount's %d locks: its lock lease (%.1f s) ran out while it "
                      "was cut off or stalled", self.locks.lost(), reply.lease_ms / 1000)
        return max(reply.lease_ms / 3000, 0.1)


def _truncate_and_flush(w: FileWriter, size: int) -> None:
    """A truncate through a file's open writer here, committed at once (setattr)."""
    w.truncate(size)
    w.flush()
