"""A trivial pyfuse3 passthrough of a local directory: the FUSE limit of this machine.

BRIEF.md measures us against the local disk (the physical limit), MooseFS, and "a trivial
FUSE passthrough (the FUSE limit)".  This is that third peer for ``bench/compare
--systems ...,fuse``: every request goes to the directory below with one plain system
call on the trio loop, no cluster, no network, no checksums, no copies of our own -- what
any pyfuse3 filesystem pays before it does anything.  With the same kernel cache times
and read-ahead as our mount, the gap between its column and MooseFS's shows how much of
a target is reachable through pyfuse3 at all.

    python -m curvine_py.testing.fuselimit SOURCE MOUNTPOINT     (foreground; unmount to stop)
"""
from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
from typing import Any, Callable, Sequence, TypeVar

import pyfuse3
import trio

from curvine_py.common.config import FuseConfig
from curvine_py.fuse import readahead
from curvine_py.fuse.watchdog import MountCheck

T = TypeVar("T")


def _call(fn: Callable[..., T], *args: Any) -> T:
    """The system call's OSError as the FUSE errno."""
    try:
        return fn(*args)
    except OSError as e:
        raise pyfuse3.FUSEError(e.errno or errno.EIO) from None


class Passthrough(pyfuse3.Operations):
    """Inode numbers are the source's; each inode's path is the one it was last seen at."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, source: str, cfg: FuseConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: source}
        self.root_ino = os.lstat(source).st_ino

    def _path(self, ino: int) -> str:
        try:
            return self.paths[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def _child(self, parent: int, name: bytes) -> str:
        return os.path.join(self._path(parent), os.fsdecode(name))

    def _entry(self, path: str) -> pyfuse3.EntryAttributes:
        st = _call(os.lstat, path)
        ino = pyfuse3.ROOT_INODE if st.st_ino == self.root_ino else st.st_ino
        self.paths.setdefault(ino, path)
        e = pyfuse3.EntryAttributes()
        e.st_ino = ino
        for field in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_blksize",
                      "st_blocks", "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
            setattr(e, field, getattr(st, field))
        e.attr_timeout = self.cfg.attr_timeout_s
        e.entry_timeout = self.cfg.entry_timeout_s
        return e

    # ------------------------------------------------------------------ names
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._entry(self._child(parent_inode, name))

    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._entry(self._path(inode))

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        if fields.update_size:
            _call(os.truncate, path, attr.st_size)
        if fields.update_mode:
            _call(os.chmod, path, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            _call(os.chown, path, attr.st_uid if fields.update_uid else -1,
                  attr.st_gid if fields.update_gid else -1)
        if fields.update_atime or fields.update_mtime:
            st = _call(os.lstat, path)
            times = (attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                     attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns)
            _call(lambda: os.utime(path, ns=times))
        return self._entry(path)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        _call(os.mkdir, path, mode & ~ctx.umask)
        return self._entry(path)

    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        _call(os.unlink, self._child(parent_inode, name))

    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        _call(os.rmdir, self._child(parent_inode, name))

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: Any) -> None:
        if flags:
            raise pyfuse3.FUSEError(errno.EINVAL)
        old, new = self._child(parent_inode_old, name_old), self._child(parent_inode_new, name_new)
        _call(os.rename, old, new)
        st = _call(os.lstat, new)
        self.paths[st.st_ino] = new
        if stat.S_ISDIR(st.st_mode):   # and every inode below it
            for ino, path in list(self.paths.items()):
                if path.startswith(old + "/"):
                    self.paths[ino] = new + path[len(old):]

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, _ in inode_list:
            if ino != pyfuse3.ROOT_INODE:
                self.paths.pop(ino, None)

    # ------------------------------------------------------------------ directories
    async def opendir(self, inode: int, ctx: Any) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        base = self._path(fh)
        names = sorted(_call(os.listdir, base))
        for i, name in enumerate(names[start_id:], start_id + 1):
            try:
                entry = self._entry(os.path.join(base, name))
            except pyfuse3.FUSEError:
                continue   # gone meanwhile
            if not pyfuse3.readdir_reply(token, os.fsencode(name), entry, i):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    # ------------------------------------------------------------------ files
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._child(parent_inode, name)
        fd = _call(os.open, path, flags | os.O_CREAT | os.O_CLOEXEC, mode & ~ctx.umask)
        return pyfuse3.FileInfo(fh=fd), self._entry(path)

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=_call(os.open, self._path(inode), flags | os.O_CLOEXEC))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return _call(os.pread, fh, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return _call(os.pwrite, fh, buf, off)

    async def flush(self, fh: int) -> None:
        return None

    async def fsync(self, fh: int, datasync: bool) -> None:
        _call(os.fdatasync if datasync else os.fsync, fh)

    async def release(self, fh: int) -> None:
        _call(os.close, fh)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = _call(os.statvfs, self.paths[pyfuse3.ROOT_INODE])
        out = pyfuse3.StatvfsData()
        for field in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                      "f_favail", "f_namemax"):
            setattr(out, field, getattr(s, field))
        return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m curvine_py.testing.fuselimit", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="the directory to pass through")
    p.add_argument("mountpoint")
    args = p.parse_args(argv)
    if not os.path.isdir(args.source) or not os.path.isdir(args.mountpoint):
        print(f"fuselimit: {args.source} and {args.mountpoint} must be directories", file=sys.stderr)
        return 2
    cfg = FuseConfig()   # our mount's cache times and read-ahead
    opts = set(pyfuse3.default_options) | {"fsname=fuselimit", "default_permissions"}
    real = os.path.realpath(args.mountpoint)   # before the mount: after it, realpath's lstat would wait on us
    ops = Passthrough(os.path.realpath(args.source), cfg)
    pyfuse3.init(ops, args.mountpoint, opts)
    mount = MountCheck.find(real)   # its device, from the mount table (never a stat of our own mount)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            if mount is not None:   # written after the INIT reply, as our mount does (fuse/readahead.py)
                answered = readahead.init_answered(ops)
                nursery.start_soon(readahead.apply_after, answered, mount.dev, args.mountpoint, cfg.read_ahead_kb)
            await pyfuse3.main()
    try:
        trio.run(serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
