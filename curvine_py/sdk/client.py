"""The Python SDK: paths over the client's VFS (the mount's one form of every operation,
client/vfs.py), file objects, whole-object helpers, typed results.

    from curvine_py import Client
    c = Client("127.0.0.1:8995")
    c.put_bytes("/kv/chunk.data", payload)
    assert c.get_bytes("/kv/chunk.data") == payload

Every failure raises ``CurvineError`` (an ``OSError`` with ``errno`` and the path).
"""
from __future__ import annotations

import errno
import io
import math
import os
import posixpath
import stat
import typing
from typing import Callable, Iterator, TypeVar

from curvine_py.client.core import ClientCore
from curvine_py.client.vfs import VFS, Op, Opened, ask
from curvine_py.common import config as config_mod
from curvine_py.common.buffers import fresh_bytes
from curvine_py.common.config import Config
from curvine_py.common.errors import CurvineError, err
from curvine_py.common.policy import KV, PIN, POLICY_XATTRS, TIER, TTL
from curvine_py.common.types import ROOT_INO, SETATTR_ATIME_NOW, SETATTR_MODE, SETATTR_MTIME_NOW, SETATTR_SIZE
from curvine_py.client.metagroup import STATUS_TIMEOUT_S, MasterGroup
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.sdk.results import (
    BlockLocation, CachePolicy, FileStatus, Location, MasterInfo, Report, StatFs, WorkerRef,
)
from curvine_py.sdk.ufsadmin import UfsAdmin
from curvine_py.sdk.watch import Watch
from curvine_py.pb.methods import Master

if typing.TYPE_CHECKING:
    from _typeshed import WriteableBuffer

T = TypeVar("T")

Progress = Callable[[int], None] | None
LOCATE_BATCH = 1000   # paths per Locate call (the master's limit, master/locate.py)


def normpath(path: str) -> str:
    """Absolute, normalized path; relative paths are taken from the root."""
    if not isinstance(path, str) or not path:
        raise err(errno.EINVAL, "empty path")
    if "\0" in path:
        raise err(errno.EINVAL, "path contains NUL")
    p = posixpath.normpath("/" + path)
    return "/" + p.lstrip("/")


def split(path: str) -> tuple[str, str]:
    p = normpath(path)
    parent, name = posixpath.split(p)
    return parent, name


class File(io.RawIOBase):
    """A file opened through the SDK: a handle of the client's VFS (the mount's POSIX
    semantics: one write state per file, close-to-open), binary, with a position."""

    def __init__(self, client: "Client", path: str, mode: str, opened: Opened) -> None:
        super().__init__()
        self._client, self.name, self.mode = client, path, mode
        self._vfs = client.vfs
        self._fh = opened.fh
        self._writes = opened.writes
        self._released = False   # the handle went (IOBase.close calls flush() after that)
        self._pos = 0

    def readable(self) -> bool:
        return not self._writes

    def writable(self) -> bool:
        return self._writes

    def seekable(self) -> bool:
        return True

    @property
    def size(self) -> int:
        return self._wrap(lambda: self._vfs.size(self._fh))

    def readinto(self, b: WriteableBuffer) -> int:
        if self._writes:
            raise io.UnsupportedOperation("file not open for reading")
        view = memoryview(b).cast("B")
        n = self._wrap(lambda: self._vfs.read_into(self._fh, self._pos, view))
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        if self._writes:
            raise io.UnsupportedOperation("file not open for reading")
        left = max(0, self.size - self._pos)
        buf = bytearray(left if size is None or size < 0 else min(size, left))
        n = self.readinto(buf)
        del buf[n:]
        return bytes(buf)

    def readall(self) -> bytes:
        return self.read(-1)

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]  # FileWriter.pwrite takes these three
        if not self._writes:
            raise io.UnsupportedOperation("file not open for writing")
        n = self._wrap(lambda: self._vfs.write(self._fh, self._pos, b))
        self._pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        if not self._writes:
            raise io.UnsupportedOperation("file not open for writing")
        size = self._pos if size is None else size
        ino = self._vfs.handle(self._fh).ino
        req = pb.SetAttrRequest(valid=SETATTR_SIZE, size=size)
        self._wrap(lambda: self._vfs.run(self._vfs.setattr(ino, req, self._client.meta.identity)))
        return size

    def flush(self) -> None:
        """Make what was written so far visible to other clients (commit without closing)."""
        if self._writes and not self._released:
            self._wrap(lambda: self._vfs.run(self._vfs.fsync(self._fh)))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise err(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        """Commit (a writer: the file is complete for everyone once this returns) and let
        the handle go; a failed commit aborts, so no half-written file is presented."""
        if self._released:
            return
        self._released = True
        try:
            self._wrap(lambda: self._vfs.run(self._vfs.flush(self._fh)))
        except BaseException:
            self._vfs.abort(self._fh)
            super().close()
            raise
        try:
            self._vfs.run(self._vfs.release(self._fh))
        finally:
            super().close()

    def abort(self) -> None:
        """Close a file being written without committing what was written since open."""
        if not self._released:
            self._released = True
            self._vfs.abort(self._fh)
        super().close()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and self._writes:
            self.abort()
        else:
            self.close()

    def _wrap(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except CurvineError as e:
            raise e.with_path(self.name) from None


class Client:
    """A connection to one curvine-py cluster."""

    def __init__(self, master: str | None = None, config: Config | None = None) -> None:
        self.config = config or config_mod.load()
        if master is None and os.environ.get("CURVINE_MASTER"):
            master = os.environ["CURVINE_MASTER"]
        # every master of the group, as given: masters() asks each, not only the leader
        self.master_addresses = config_mod.addresses(master or self.config.client.master)
        self.core = ClientCore(self.config, master)
        self.meta = self.core.meta
        self.vfs = VFS(self.core)   # every operation below goes through it, as the mount's do
        self._me = self.meta.identity
        self.ufs = UfsAdmin(self.meta, self.config.ufs)   # UFS mounts, load, free (curvine_py/sdk/ufsadmin.py)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.vfs.close()
        self.core.close()

    # ------------------------------------------------------------------ helpers
    def _attr(self, path: str, follow: bool = True) -> pb.Attr:
        p = normpath(path)
        try:
            return self.meta.resolve(p, follow)
        except CurvineError as e:
            raise e.with_path(path) from None

    def _parent(self, path: str) -> tuple[int, str]:
        parent, name = split(path)
        if not name:
            raise err(errno.EINVAL, "the root has no parent").with_path(path)
        a = self._attr(parent)
        if not stat.S_ISDIR(a.mode):
            raise err(errno.ENOTDIR).with_path(parent)
        return a.ino, name

    def _do(self, path: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except CurvineError as e:
            raise e.with_path(path) from None

    def _run(self, path: str, op: Op[T]) -> T:
        """A VFS operation, run here; its error names path."""
        try:
            return self.vfs.run(op)
        except CurvineError as e:
            raise e.with_path(path) from None

    # ------------------------------------------------------------------ namespace
    def stat(self, path: str) -> FileStatus:
        return FileStatus.of(normpath(path), self._attr(path))

    def lstat(self, path: str) -> FileStatus:
        return FileStatus.of(normpath(path), self._attr(path, follow=False))

    def exists(self, path: str) -> bool:
        try:
            self._attr(path)
            return True
        except CurvineError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise

    def scandir(self, path: str) -> list[FileStatus]:
        a = self._attr(path)
        if not stat.S_ISDIR(a.mode):
            raise err(errno.ENOTDIR).with_path(path)
        base, out, offset = normpath(path), [], 0
        while True:
            reply = self._run(path, self.vfs.readdir(a.ino, offset, self._me))
            for e in reply.entries:
                offset = e.offset
                out.append(FileStatus.of(posixpath.join(base, e.name), e.attr))
            if reply.eof or not reply.entries:
                return out

    def listdir(self, path: str) -> list[str]:
        return [s.name for s in self.scandir(path)]

    def mkdir(self, path: str, mode: int = 0o755, parents: bool = False, exist_ok: bool = False,
              block_size: int = 0, kv: bool = False) -> None:
        """block_size: the block size of files created below the new directory (and of its
        new subdirectories) by clients that do not ask for one; 0 = its parent's.  kv: a
        KV directory (set_kv), the one made or, with exist_ok, the one there."""
        if kv:
            self.mkdir(path, mode, parents, exist_ok, block_size)
            self.set_kv(path, True)
            return
        p = normpath(path)
        if p == "/":
            if exist_ok or parents:
                return
            raise err(errno.EEXIST).with_path(path)
        if parents:
            parent, _ = split(p)
            if not self.exists(parent):
                self.mkdir(parent, mode, parents=True, exist_ok=True)
        ino, name = self._parent(p)
        try:
            self.vfs.run(self._mkdir(ino, name, mode, block_size))
        except CurvineError as e:
            if e.errno == errno.EEXIST and (exist_ok or parents) and self.stat(p).is_dir:
                return
            raise e.with_path(path) from None

    def _mkdir(self, parent: int, name: str, mode: int, block_size: int) -> Op[pb.Attr]:
        """A directory whose block_size is given (the VFS's mknod takes the parent's)."""
        req = self.meta.mknod_request(parent, name, stat.S_IFDIR | mode, umask=0, block_size=block_size)
        return self.meta.saw_dirs((yield from ask(Master.Mknod, req))).attr

    def makedirs(self, path: str, mode: int = 0o755, exist_ok: bool = True) -> None:
        self.mkdir(path, mode, parents=True, exist_ok=exist_ok)

    def remove(self, path: str) -> None:
        ino, name = self._parent(path)
        self._run(path, self.vfs.unlink(ino, name, self._me))

    unlink = remove

    def rmdir(self, path: str) -> None:
        ino, name = self._parent(path)
        self._run(path, self.vfs.rmdir(ino, name, self._me))

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        sino, sname = self._parent(src)
        dino, dname = self._parent(dst)
        self._run(src, self.vfs.rename(sino, sname, dino, dname, 0 if replace else 1, self._me))

    def symlink(self, target: str, path: str) -> None:
        ino, name = self._parent(path)
        self._run(path, self.vfs.mknod(ino, name, stat.S_IFLNK | 0o777, 0, 0, self._me, target=target))

    def readlink(self, path: str) -> str:
        a = self._attr(path, follow=False)
        return self._run(path, self.vfs.readlink(a.ino, self._me))

    def chmod(self, path: str, mode: int) -> None:
        a = self._attr(path)
        self._run(path, self.vfs.setattr(a.ino, pb.SetAttrRequest(valid=SETATTR_MODE, mode=mode), self._me))

    def touch(self, path: str) -> None:
        """Create an empty file, or set an existing one's times to now."""
        ino, name = self._parent(path)
        try:
            self.vfs.run(self.vfs.mknod(ino, name, stat.S_IFREG | 0o644, 0, 0o022, self._me))
            return
        except CurvineError as e:
            if e.errno != errno.EEXIST:
                raise e.with_path(path) from None
        a = self._attr(path)
        now = pb.SetAttrRequest(valid=SETATTR_ATIME_NOW | SETATTR_MTIME_NOW)
        self._run(path, self.vfs.setattr(a.ino, now, self._me))

    def walk(self, top: str) -> Iterator[tuple[str, list[str], list[str]]]:
        entries = self.scandir(top)
        dirs = [e.name for e in entries if e.is_dir]
        files = [e.name for e in entries if not e.is_dir]
        yield normpath(top), dirs, files
        for d in dirs:
            yield from self.walk(posixpath.join(normpath(top), d))

    def du(self, path: str) -> tuple[int, int, int]:
        st = self.stat(path)
        if not st.is_dir:
            return st.size, 1, 0
        total, files, dirs = 0, 0, 1
        for entry in self.scandir(path):
            if entry.is_dir:
                t, f, d = self.du(entry.path)
                total, files, dirs = total + t, files + f, dirs + d
            else:
                total, files = total + entry.size, files + 1
        return total, files, dirs

    # ------------------------------------------------------------------ files
    def open(self, path: str, mode: str = "rb", block_size: int = 0) -> File:
        m = mode.replace("b", "")
        if m not in ("r", "w", "x", "a"):
            raise err(errno.EINVAL, f"unsupported mode {mode!r} (use rb, wb, xb or ab)").with_path(path)
        if m == "r":
            a = self._attr(path)
            opened = self._run(path, self.vfs.open(a.ino, os.O_RDONLY, self._me, prefetch=False))
            return File(self, normpath(path), mode, opened)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if m == "w" else 0) | (os.O_EXCL if m == "x" else 0)
        f = File(self, normpath(path), mode, self._create(path, flags, block_size))
        if m == "a":
            f.seek(0, io.SEEK_END)
        return f

    def _create(self, path: str, flags: int, block_size: int) -> Opened:
        ino, name = self._parent(path)
        opened = self._run(path, self.vfs.create(ino, name, 0o644, flags, 0o022, self._me, block_size, path))
        if stat.S_ISDIR(opened.attr.mode):
            self.vfs.run(self.vfs.release(opened.fh))
            raise err(errno.EISDIR).with_path(path)
        return opened

    def put_bytes(self, path: str, data: bytes | bytearray | memoryview, block_size: int = 0) -> None:
        """Store a whole object (replacing any previous content); visible to all once this
        returns.  A failure leaves the previous content (or no content), never part of data:
        the file is opened without O_TRUNC (the master would empty it at the open), every
        block is written new and one Commit replaces them all with the size."""
        try:   # a wrong type fails here, before the file is touched
            view = memoryview(data).cast("B")
        except TypeError:
            raise TypeError(f"put_bytes {path}: data must be bytes-like (bytes, bytearray, memoryview), "
                            f"not {type(data).__name__}") from None
        with File(self, normpath(path), "wb", self._create(path, os.O_WRONLY | os.O_CREAT, block_size)) as f:
            f._wrap(lambda: self.vfs.write_whole(f._fh, view))

    def get_into(self, path: str, buffer: bytearray | memoryview) -> int:
        """Read a whole object into a caller-owned buffer (no allocation); returns its size."""
        a = self._attr(path)
        opened = self._run(path, self.vfs.open(a.ino, os.O_RDONLY, self._me, prefetch=False))
        with File(self, normpath(path), "rb", opened) as f:
            return f._wrap(lambda: self.vfs.read_all_into(f._fh, memoryview(buffer).cast("B")))

    def get_bytes(self, path: str) -> bytes:
        a = self._attr(path)
        if stat.S_ISDIR(a.mode):
            raise err(errno.EISDIR).with_path(path)
        obj, view = fresh_bytes(a.size)
        n = self.get_into(path, view)
        if n != len(view):  # the object changed between stat and open
            return self.get_bytes(path)
        return bytes(obj)   # no copy when obj already is bytes

    def put_file(self, local_path: str, path: str, callback: Progress = None, block_size: int = 0) -> None:
        with open(local_path, "rb") as src, self.open(path, "wb", block_size) as dst:
            copy_stream(src, dst, callback)

    def get_file(self, path: str, local_path: str, callback: Progress = None) -> None:
        with self.open(path, "rb") as src, open(local_path, "wb") as dst:
            copy_stream(src, dst, callback)

    # ------------------------------------------------------------------ xattrs and cache policy
    def getxattr(self, path: str, name: str) -> bytes:
        a = self._attr(path)
        return self._run(path, self.vfs.getxattr(a.ino, name, self._me))

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        a = self._attr(path)
        self._run(path, self.vfs.setxattr(a.ino, name, value, 0, self._me))

    def listxattr(self, path: str) -> list[str]:
        a = self._attr(path)
        return self._run(path, self.vfs.listxattr(a.ino, self._me))

    def removexattr(self, path: str, name: str, missing_ok: bool = False) -> None:
        a = self._attr(path)
        try:
            self.vfs.run(self.vfs.removexattr(a.ino, name, self._me))
        except CurvineError as e:
            if not (missing_ok and e.errno == errno.ENODATA):
                raise e.with_path(path) from None

    def pin(self, path: str) -> None:
        """Exempt a file, or every file below a directory, from eviction and TTL sweeps."""
        self.setxattr(path, PIN, b"1")

    def unpin(self, path: str) -> None:
        self.removexattr(path, PIN, missing_ok=True)

    def set_ttl(self, path: str, ttl: str | int | None) -> None:
        """Files below path (or path itself) go ttl after their last change ('7d', 3600); None clears."""
        if ttl is None:
            self.removexattr(path, TTL, missing_ok=True)
        else:
            self.setxattr(path, TTL, str(ttl).encode())

    def set_tier(self, path: str, tier: str | None) -> None:
        """New blocks below path prefer this tier (mem, ssd, hdd, disk); None clears."""
        if tier is None:
            self.removexattr(path, TIER, missing_ok=True)
        else:
            self.setxattr(path, TIER, tier.encode())

    def set_kv(self, path: str, on: bool) -> None:
        """Mark a directory for the KV cache (on) or unmark it: files made below it from now
        on have blocks of at least 16 MiB unless their client names a block size (a 14 MiB
        KV chunk is one block, which a mount on a replica's host hands to the kernel);
        subdirectories made below it are KV directories.
        What is there already keeps its own setting (as a block size does)."""
        if on:
            self.setxattr(path, KV, b"1")
        else:
            self.removexattr(path, KV, missing_ok=True)

    def cache_policy(self, path: str) -> "CachePolicy":
        """The effective pin, ttl and tier of path, with the path each comes from; and
        whether it is KV, from the top of the unbroken run of KV directories above it."""
        p = normpath(path)
        parts = [q for q in p.split("/") if q]
        chain = ["/" + "/".join(parts[:i]) for i in range(len(parts) + 1)]
        pinned_by, ttl, tier, kv_from = "", ("", ""), ("", ""), ""
        for prefix in chain:   # root first: a nearer ttl or tier overrides, any pin holds
            names = self.listxattr(prefix)
            kv_from = (kv_from or prefix) if KV in names else ""
            for name in set(names) & set(POLICY_XATTRS):
                value = self.getxattr(prefix, name).decode("ascii", "replace")
                if name == PIN and value == "1" and not pinned_by:
                    pinned_by = prefix
                elif name == TTL:
                    ttl = (value, prefix)
                elif name == TIER:
                    tier = (value, prefix)
        return CachePolicy(pinned=bool(pinned_by), pinned_by=pinned_by,
                           ttl_s=int(ttl[0]) if ttl[0].isdigit() else None, ttl_from=ttl[1],
                           tier=tier[0], tier_from=tier[1], kv=bool(kv_from), kv_from=kv_from)

    # ------------------------------------------------------------------ cluster
    def block_locations(self, path: str) -> list[BlockLocation]:
        a = self._attr(path)
        reply = self._do(path, lambda: self.meta.block_locations(a.ino))
        addrs = {w.worker_id: w for w in reply.workers}
        out = []
        for b in reply.blocks:
            refs = [WorkerRef.of(addrs[w]) for w in b.workers if w in addrs]
            out.append(BlockLocation(b.block_id, b.offset, b.length, b.checksum, refs))
        return out

    def locate(self, paths: typing.Sequence[str], pin_s: float = 0.0) -> list[Location]:
        """Each path's status (or the errno of its absence), the hosts holding all of its
        blocks, and its tier: one master call per LOCATE_BATCH paths, answers in order.
        pin_s > 0 also pins every found file against eviction for this client for pin_s
        seconds (asking again renews; ``unpin`` ends it; a client gone lets it run out)."""
        if pin_s < 0:
            raise err(errno.EINVAL, f"pin_s must be >= 0, not {pin_s}")
        norm = [normpath(p) for p in paths]
        out: list[Location] = []
        for k in range(0, len(norm), LOCATE_BATCH):
            part = norm[k:k + LOCATE_BATCH]
            reply = self.meta.call(Master.Locate, pb.LocateRequest(caller=self.meta.caller(), paths=part,
                                                                   pin_ms=math.ceil(pin_s * 1000)))
            out += [Location.from_pb(p, m) for p, m in zip(part, reply.files, strict=True)]
        return out

    def prefix_hosts(self, paths: typing.Sequence[str]) -> dict[str, int]:
        """For chunk files named in prefix order (a prompt's KV chunks, first to last):
        how many leading chunks each host holds whole, most first; a host that lacks the
        first chunk is absent.  What a router needs to send a request where most of its
        prefix is read from local disk (docs/integrations.md); one ``locate``."""
        return leading_counts(self.locate(paths))

    def unpin_located(self, paths: typing.Sequence[str]) -> None:
        """Drop this client's pins (``locate(..., pin_s=)``) on paths; others' pins stay."""
        norm = [normpath(p) for p in paths]
        for k in range(0, len(norm), LOCATE_BATCH):
            self.meta.call(Master.Locate, pb.LocateRequest(caller=self.meta.caller(), paths=norm[k:k + LOCATE_BATCH],
                                                           unpin=True))

    def watch(self, path: str, since: int | None = None, kinds: typing.Collection[str] | None = None) -> Watch:
        """The events of directory path's entries (created, removed, evicted, replica_added,
        replica_lost; only kinds, if given), in order, as an iterator of ``WatchEvent``: from
        its return on, or after position since (a previous watch's ``position``).  It follows
        failover to the next leader without losing or repeating events; ``PositionTooOld``
        and ``WatchCutOff`` end it (curvine_py/sdk/watch.py)."""
        if since is not None and since < 0:
            raise err(errno.EINVAL, f"since must be a position >= 0, not {since}")
        return Watch(self.meta, self.config.cluster.secret, normpath(path), since, self.config.client.retry_s,
                     kinds).open()

    def report(self) -> Report:
        """The cluster as the leader sees it: workers, ring epoch, pool, replication; and
        every master of the group as it sees itself (``masters()``)."""
        return Report.from_pb(self.meta.call(Master.Report, pb.Empty()), self.masters())

    def masters(self, timeout: float = STATUS_TIMEOUT_S) -> tuple[MasterInfo, ...]:
        """Each master of this client's list as it reports itself (role, term, commit and
        applied index, lag behind the leader), asked of all at once over gRPC with a
        short deadline: one that does not answer within timeout is ``unreachable``, so
        this shows a group with a master down rather than waiting for it."""
        with MasterGroup(self.master_addresses, self.config.cluster.secret, self.meta.tls) as group:
            return group.infos(timeout)

    def statfs(self) -> StatFs:
        s = self.vfs.run(self.vfs.statfs())
        return StatFs(s.capacity, s.used, s.available, s.files, s.block_size)

    def root_ino(self) -> int:
        return ROOT_INO


COPY_CHUNK = 8 << 20


def leading_counts(located: typing.Sequence[Location]) -> dict[str, int]:
    """Per host, the count of leading entries of `located` that it holds, most first."""
    counts: dict[str, int] = {}
    holding: set[str] | None = None   # hosts holding every chunk so far
    for loc in located:
        here = set(loc.hosts) if loc.found else set()
        holding = here if holding is None else holding & here
        if not holding:
            break
        for h in holding:
            counts[h] = counts.get(h, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def copy_stream(src: typing.Any, dst: typing.Any, callback: Progress = None, size: int | None = None) -> None:
    """Stream src to dst through one reused buffer of 8 MiB, or of size when it is known
    and smaller (a small file's copy needs no 8 MiB of fresh memory); callback(bytes)
    after each piece.  put_file, get_file, and the fsspec filesystem's copies."""
    view = memoryview(bytearray(COPY_CHUNK if size is None else max(1, min(size, COPY_CHUNK))))
    while True:
        n = src.readinto(view)
        if not n:
            return
        dst.write(view[:n])
        if callback:
            callback(n)
