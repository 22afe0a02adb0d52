"""The shared-directory provider (``file:///abs/dir``): a NAS or NFS export that every
worker host mounts at the same path.

Keys map to paths under the root; ".." and the like are refused (EINVAL), so no key
names a file outside it.  A file's version is ``f"{size}:{mtime_ns}"`` (no ETag here).
Uploads go to a hidden temp file in the target's directory, renamed over the target at
close (atomic on one file system, so readers see the old or the new file, never a
partial one); abort unlinks it.  Plain os calls: thread-safe, no shared state.
"""
from __future__ import annotations

import errno
import os
import stat as st
import typing
from collections.abc import Iterator, Mapping

from curvine_py.ufs.base import ObjectInfo, UfsError, parse_options
from curvine_py.ufs.keys import check_key, child_key

OPTIONS: frozenset[str] = frozenset()
TMP_PREFIX = ".cv-upload-"


def os_error(uri: str, what: str, e: OSError) -> UfsError:
    """An OSError as a one-line UfsError with its errno (EIO when it has none)."""
    return UfsError(e.errno or errno.EIO, f"{uri}: {what}: {e.strerror or e}")


def info_of(key: str, s: os.stat_result) -> ObjectInfo:
    if st.S_ISDIR(s.st_mode):
        return ObjectInfo(key=key, size=0, mtime_ns=s.st_mtime_ns, etag="", is_dir=True)
    return ObjectInfo(key=key, size=s.st_size, mtime_ns=s.st_mtime_ns, etag=f"{s.st_size}:{s.st_mtime_ns}")


class LocalUfs:
    """One directory mount.  timeout_s is not enforced here: a hung NFS server blocks
    the calling thread in the kernel, which no user-space timeout can interrupt."""

    def __init__(self, uri: str, root: str, options: Mapping[str, str], timeout_s: float = 30.0) -> None:
        parse_options(uri, options, OPTIONS)
        self.uri = uri
        self.root = os.path.normpath(root)
        self.timeout_s = timeout_s

    def path(self, key: str, root_ok: bool = True) -> str:
        return os.path.join(self.root, check_key(self.uri, key, root_ok=root_ok)) if key else self.root

    def _err(self, what: str, key: str, e: OSError) -> UfsError:
        return os_error(self.uri, f"{what} {key!r}" if key else what, e)

    def check(self) -> None:
        """The root exists, is a directory, and may be listed."""
        try:
            if not os.path.isdir(self.root):
                raise UfsError(errno.ENOENT, f"{self.uri}: no such directory")
            with os.scandir(self.root):
                pass
        except OSError as e:
            if isinstance(e, UfsError):
                raise
            raise self._err("check", "", e) from None

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            return info_of(key, os.stat(self.path(key)))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except UfsError:
            raise
        except OSError as e:
            raise self._err("stat", key, e) from None

    def list(self, key: str) -> Iterator[ObjectInfo]:
        """The directory's entries (our own unfinished uploads left out)."""
        try:
            with os.scandir(self.path(key)) as it:
                for entry in it:
                    if entry.name.startswith(TMP_PREFIX):
                        continue
                    try:
                        yield info_of(child_key(key, entry.name), entry.stat())
                    except FileNotFoundError:
                        continue   # removed while listing
        except UfsError:
            raise
        except OSError as e:
            raise self._err("list", key, e) from None

    def read_into(self, key: str, offset: int, into: memoryview) -> int:
        """preadv straight into the caller's buffer, looping over short reads."""
        path = self.path(key, root_ok=False)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise self._err("read", key, e) from None
        try:
            n = 0
            while n < len(into):
                got = os.preadv(fd, [into[n:]], offset + n)
                if got == 0:
                    break
                n += got
            return n
        except OSError as e:
            raise self._err("read", key, e) from None
        finally:
            os.close(fd)

    def writer(self, key: str) -> "LocalWriter":
        path = self.path(key, root_ok=False)
        return LocalWriter(self, key, path)

    def put(self, key: str, data: bytes) -> ObjectInfo:
        w = self.writer(key)
        try:
            w.write(data)
            return w.close()
        except BaseException:
            w.abort()
            raise

    def mkdir(self, key: str) -> None:
        try:
            os.makedirs(self.path(key, root_ok=False), exist_ok=True)
        except UfsError:
            raise
        except OSError as e:
            raise self._err("mkdir", key, e) from None

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """Copied in the kernel where it can (copy_file_range; NFS 4.2 does it server-side)."""
        source = self.path(src, root_ok=False)
        w = self.writer(dst)
        try:
            with open(source, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                done = 0
                while done < size:
                    n = os.copy_file_range(f.fileno(), w.fd, size - done, done, done)
                    if n == 0:
                        break
                    done += n
            return w.close()
        except OSError as e:
            w.abort()
            if isinstance(e, UfsError):
                raise
            raise self._err("copy", f"{src} -> {dst}", e) from None

    def delete(self, key: str) -> None:
        self._remove("delete", os.unlink, key)

    def rmdir(self, key: str) -> None:
        self._remove("rmdir", os.rmdir, key)

    def _remove(self, op: str, remove: typing.Callable[[str], None], key: str) -> None:
        """remove(key's path); a missing one is not an error (S3's delete is idempotent too)."""
        try:
            remove(self.path(key, root_ok=False))
        except FileNotFoundError:
            pass
        except UfsError:
            raise
        except OSError as e:
            raise self._err(op, key, e) from None

    def close(self) -> None:
        """Nothing held between calls."""


class LocalWriter:
    """A temp file next to the target, renamed over it at close."""

    def __init__(self, ufs: LocalUfs, key: str, path: str) -> None:
        self.ufs, self.key, self.target = ufs, key, path
        directory, name = os.path.split(path)
        self.tmp = os.path.join(directory, f"{TMP_PREFIX}{name}.{os.getpid()}.{os.urandom(4).hex()}")
        try:
            os.makedirs(directory, exist_ok=True)
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ufs._err("write", key, e) from None
        self._open = True

    def write(self, data: memoryview | bytes) -> None:
        if not self._open:
            raise UfsError(errno.EINVAL, f"{self.ufs.uri}: write {self.key!r}: the upload is finished")
        view = memoryview(data)
        try:
            while view:
                n = os.write(self.fd, view)
                view = view[n:]
        except OSError as e:
            self.abort()
            raise self.ufs._err("write", self.key, e) from None

    def close(self) -> ObjectInfo:
        if not self._open:
            raise UfsError(errno.EINVAL, f"{self.ufs.uri}: close {self.key!r}: the upload is finished")
        try:
            os.close(self.fd)
            self._open = False
            os.rename(self.tmp, self.target)
            return info_of(self.key, os.stat(self.target))
        except OSError as e:
            self.abort()
            raise self.ufs._err("upload", self.key, e) from None

    def abort(self) -> None:
        if self._open:
            self._open = False
            try:
                os.close(self.fd)
            except OSError:
                pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass
