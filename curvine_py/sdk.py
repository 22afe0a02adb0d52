"""The Python SDK: paths on top of the inode API, file objects, whole-object helpers.

    from curvine_py import Client
    c = Client("127.0.0.1:8995")
    c.put_bytes("/kv/chunk.data", payload)
    assert c.get_bytes("/kv/chunk.data") == payload

Every failure raises ``CurvineError`` (an ``OSError`` with ``errno`` and the path).
"""
from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
import typing
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from curvine_py.client.core import ClientCore
from curvine_py.client.reader import FileReader
from curvine_py.client.writer import FileWriter, write_all
from curvine_py.common import config as config_mod
from curvine_py.common.buffers import fresh_bytes
from curvine_py.common.config import Config
from curvine_py.common.errors import CurvineError, err
from curvine_py.common.policy import PIN, POLICY_XATTRS, TIER, TTL
from curvine_py.common.types import HIDDEN_PREFIX, ROOT_INO
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.ufsadmin import UfsAdmin

if typing.TYPE_CHECKING:
    from _typeshed import WriteableBuffer

T = TypeVar("T")

Progress = Callable[[int], None] | None


@dataclass(frozen=True)
class FileStatus:
    path: str
    name: str
    ino: int
    mode: int
    size: int
    nlink: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    block_size: int
    replicas: int
    complete: bool

    @classmethod
    def of(cls, path: str, a: pb.Attr) -> "FileStatus":
        return cls(path, posixpath.basename(path) or "/", a.ino, a.mode, a.size, a.nlink, a.uid, a.gid,
                   a.atime_ns, a.mtime_ns, a.ctime_ns, a.block_size, a.replicas, a.complete)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def mtime(self) -> float:
        return self.mtime_ns / 1e9


@dataclass(frozen=True)
class WorkerRef:
    worker_id: int
    host: str
    ip: str
    rpc_port: int
    data_port: int


@dataclass(frozen=True)
class BlockLocation:
    block_id: int
    offset: int
    length: int
    checksum: int
    workers: list[WorkerRef]


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
    """A file opened through the SDK: binary, sequential writes, random reads."""

    def __init__(self, client: "Client", path: str, mode: str, reader: FileReader | None,
                 writer: FileWriter | None) -> None:
        super().__init__()
        self._client, self.name, self.mode = client, path, mode
        self._reader, self._writer = reader, writer
        self._pos = writer.size if writer else 0

    def readable(self) -> bool:
        return self._reader is not None

    def writable(self) -> bool:
        return self._writer is not None

    def seekable(self) -> bool:
        return True

    @property
    def size(self) -> int:
        return self._writer.size if self._writer else self._reader.size if self._reader else 0

    def readinto(self, b: WriteableBuffer) -> int:
        reader = self._reader
        if reader is None:
            raise io.UnsupportedOperation("file not open for reading")
        view = memoryview(b).cast("B")
        n = self._wrap(lambda: reader.pread(self._pos, view))
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        if self._reader is None:
            raise io.UnsupportedOperation("file not open for reading")
        if size is None or size < 0:
            size = max(0, self._reader.size - self._pos)
        buf = bytearray(min(size, max(0, self._reader.size - self._pos)))
        n = self.readinto(buf)
        del buf[n:]
        return bytes(buf)

    def readall(self) -> bytes:
        return self.read(-1)

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]  # FileWriter.pwrite takes these three
        writer = self._writer
        if writer is None:
            raise io.UnsupportedOperation("file not open for writing")
        n = self._wrap(lambda: writer.pwrite(self._pos, b))
        self._pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        writer = self._writer
        if writer is None:
            raise io.UnsupportedOperation("file not open for writing")
        size = self._pos if size is None else size
        self._wrap(lambda: writer.truncate(size))
        return size

    def flush(self) -> None:
        """Make what was written so far visible to other clients (commit without closing)."""
        writer = self._writer
        if writer is not None and not writer.closed:
            self._wrap(lambda: writer.flush())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise err(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._writer is not None:
                self._wrap(self._writer.close)
            if self._reader is not None:
                self._reader.close()
        finally:
            super().close()

    def abort(self) -> None:
        """Close a file being written without committing what was written since open."""
        if self._writer is not None and not self._writer.closed:
            self._writer.abort()
        super().close()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and self._writer is not None:
            self.abort()
        else:
            self.close()

    def _wrap(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except CurvineError as e:
            raise e.with_path(self.name) from None


@dataclass
class CachePolicy:
    """A path's effective cache policy (docs/eviction.md) and where each part is set."""
    pinned: bool
    pinned_by: str
    ttl_s: int | None
    ttl_from: str
    tier: str
    tier_from: str


class Client:
    """A connection to one curvine-py cluster."""

    def __init__(self, master: str | None = None, config: Config | None = None) -> None:
        self.config = config or config_mod.load()
        if master is None and os.environ.get("CURVINE_MASTER"):
            master = os.environ["CURVINE_MASTER"]
        self.core = ClientCore(self.config, master)
        self.meta = self.core.meta
        self.ufs = UfsAdmin(self)   # UFS mounts, load, free (curvine_py/ufsadmin.py)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
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
            reply = self._do(path, lambda: self.meta.readdir(a.ino, offset, 1000, plus=True))
            for e in reply.entries:
                offset = e.offset
                if not e.name.startswith(HIDDEN_PREFIX):
                    out.append(FileStatus.of(posixpath.join(base, e.name), e.attr))
            if reply.eof or not reply.entries:
                return out

    def listdir(self, path: str) -> list[str]:
        return [s.name for s in self.scandir(path)]

    def mkdir(self, path: str, mode: int = 0o755, parents: bool = False, exist_ok: bool = False,
              block_size: int = 0) -> None:
        """block_size: the block size of files created below the new directory (and of its
        new subdirectories) by clients that do not ask for one; 0 = its parent's."""
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
            self.meta.mknod(ino, name, stat.S_IFDIR | mode, umask=0, block_size=block_size)
        except CurvineError as e:
            if e.errno == errno.EEXIST and (exist_ok or parents) and self.stat(p).is_dir:
                return
            raise e.with_path(path) from None

    def makedirs(self, path: str, mode: int = 0o755, exist_ok: bool = True) -> None:
        self.mkdir(path, mode, parents=True, exist_ok=exist_ok)

    def remove(self, path: str) -> None:
        ino, name = self._parent(path)
        self._do(path, lambda: self.meta.unlink(ino, name))

    unlink = remove

    def rmdir(self, path: str) -> None:
        ino, name = self._parent(path)
        self._do(path, lambda: self.meta.rmdir(ino, name))

    def rename(self, src: str, dst: str, replace: bool = True) -> None:
        sino, sname = self._parent(src)
        dino, dname = self._parent(dst)
        self._do(src, lambda: self.meta.rename(sino, sname, dino, dname, 0 if replace else 1))

    def symlink(self, target: str, path: str) -> None:
        ino, name = self._parent(path)
        self._do(path, lambda: self.meta.mknod(ino, name, stat.S_IFLNK | 0o777, target=target))

    def readlink(self, path: str) -> str:
        a = self._attr(path, follow=False)
        return self._do(path, lambda: self.meta.call(
            "Readlink", pb.InodeRequest(caller=self.meta.caller(), ino=a.ino)).target)

    def chmod(self, path: str, mode: int) -> None:
        from curvine_py.common.types import SETATTR_MODE
        a = self._attr(path)
        self._do(path, lambda: self.meta.call("SetAttr", pb.SetAttrRequest(
            caller=self.meta.caller(mutation=True), ino=a.ino, valid=SETATTR_MODE, mode=mode)))

    def touch(self, path: str) -> None:
        """Create an empty file, or set an existing one's times to now."""
        from curvine_py.common.types import SETATTR_ATIME_NOW, SETATTR_MTIME_NOW
        ino, name = self._parent(path)
        try:
            self.meta.mknod(ino, name, stat.S_IFREG | 0o644, umask=0o022)
            return
        except CurvineError as e:
            if e.errno != errno.EEXIST:
                raise e.with_path(path) from None
        a = self._attr(path)
        self._do(path, lambda: self.meta.call("SetAttr", pb.SetAttrRequest(
            caller=self.meta.caller(mutation=True), ino=a.ino, valid=SETATTR_ATIME_NOW | SETATTR_MTIME_NOW)))

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
            reply = self._do(path, lambda: self.meta.open(a.ino, os.O_RDONLY, write=False))
            reader = FileReader(self.core, reply)
            return File(self, normpath(path), mode, reader, None)
        ino, name = self._parent(path)
        flags = os.O_WRONLY | (os.O_TRUNC if m == "w" else 0)
        bs = block_size or self.config.client.block_size
        reply = self._do(path, lambda: self.meta.create(ino, name, stat.S_IFREG | 0o644, flags, umask=0o022,
                                                        exclusive=m == "x", block_size=bs))
        if stat.S_ISDIR(reply.attr.mode):
            raise err(errno.EISDIR).with_path(path)
        writer = self._do(path, lambda: FileWriter(self.core, reply))
        f = File(self, normpath(path), mode, None, writer)
        if m == "a":
            f.seek(0, io.SEEK_END)
        return f

    def put_bytes(self, path: str, data: bytes | bytearray | memoryview, block_size: int = 0) -> None:
        """Store a whole object (replacing any previous content); visible to all once this returns."""
        ino, name = self._parent(path)
        bs = block_size or self.config.client.block_size
        reply = self._do(path, lambda: self.meta.create(ino, name, stat.S_IFREG | 0o644, os.O_WRONLY | os.O_TRUNC,
                                                        umask=0o022, block_size=bs))
        self._do(path, lambda: write_all(self.core, reply, memoryview(data).cast("B")))

    def get_into(self, path: str, buffer: bytearray | memoryview) -> int:
        """Read a whole object into a caller-owned buffer (no allocation); returns its size."""
        a = self._attr(path)
        reply = self._do(path, lambda: self.meta.open(a.ino, os.O_RDONLY, write=False))
        reader = FileReader(self.core, reply)
        view = memoryview(buffer).cast("B")
        if len(view) < reader.size:
            raise err(errno.EOVERFLOW, f"buffer of {len(view)} bytes < file size {reader.size}").with_path(path)
        return self._do(path, lambda: reader.read_all_into(view))

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
            _copy(src, dst, callback)

    def get_file(self, path: str, local_path: str, callback: Progress = None) -> None:
        with self.open(path, "rb") as src, open(local_path, "wb") as dst:
            _copy(src, dst, callback)

    # ------------------------------------------------------------------ xattrs and cache policy
    def getxattr(self, path: str, name: str) -> bytes:
        a = self._attr(path)
        return self._do(path, lambda: self.meta.call(
            "GetXattr", pb.XattrRequest(caller=self.meta.caller(), ino=a.ino, name=name)).value)

    def setxattr(self, path: str, name: str, value: bytes) -> None:
        a = self._attr(path)
        self._do(path, lambda: self.meta.call("SetXattr", pb.XattrRequest(
            caller=self.meta.caller(mutation=True), ino=a.ino, name=name, value=value)))

    def removexattr(self, path: str, name: str, missing_ok: bool = False) -> None:
        a = self._attr(path)
        try:
            self.meta.call("RemoveXattr", pb.XattrRequest(caller=self.meta.caller(mutation=True), ino=a.ino,
                                                          name=name))
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

    def cache_policy(self, path: str) -> "CachePolicy":
        """The effective pin, ttl and tier of path, with the path each comes from."""
        p = normpath(path)
        parts = [q for q in p.split("/") if q]
        chain = ["/" + "/".join(parts[:i]) for i in range(len(parts) + 1)]
        pinned_by, ttl, tier = "", ("", ""), ("", "")
        for prefix in chain:   # root first: a nearer ttl or tier overrides, any pin holds
            a = self._attr(prefix)
            names = typing.cast(list[str], self._do(prefix, lambda: self.meta.call(
                "ListXattr", pb.XattrRequest(caller=self.meta.caller(), ino=a.ino)).names))
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
                           tier=tier[0], tier_from=tier[1])

    # ------------------------------------------------------------------ cluster
    def block_locations(self, path: str) -> list[BlockLocation]:
        a = self._attr(path)
        reply = self._do(path, lambda: self.meta.block_locations(a.ino))
        addrs = {w.worker_id: w for w in reply.workers}
        out = []
        for b in reply.blocks:
            refs = [WorkerRef(w, addrs[w].host, addrs[w].ip, addrs[w].rpc_port, addrs[w].data_port)
                    for w in b.workers if w in addrs]
            out.append(BlockLocation(b.block_id, b.offset, b.length, b.checksum, refs))
        return out

    def report(self) -> pb.ReportReply:
        return self.meta.call("Report", pb.Empty())

    def statfs(self) -> pb.StatFsReply:
        return self.meta.call("StatFs", pb.Empty())

    def root_ino(self) -> int:
        return ROOT_INO


def _copy(src: typing.Any, dst: typing.Any, callback: Progress) -> None:
    """Stream src to dst through one reused 8 MiB buffer."""
    chunk = bytearray(8 << 20)
    view = memoryview(chunk)
    while True:
        n = src.readinto(view)
        if not n:
            return
        dst.write(view[:n])
        if callback:
            callback(n)
