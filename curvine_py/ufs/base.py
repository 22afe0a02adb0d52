"""The under storage (UFS) as curvine-py sees it: one small interface per provider.

A UFS mount (docs/ufs.md) backs a namespace directory with an object store or a shared
directory.  The master asks it for metadata (stat, list) and changes names in it (copy,
delete, directory markers); workers read block ranges from it and upload files to it.
Every provider implements ``Ufs``; ``curvine_py.ufs.open_ufs`` picks one by the URI's
scheme, so GCS, Azure or HDFS is one module away.

Keys are relative to the mount's root ("" is the root itself) and use "/" separators;
a directory's key has no trailing slash here (providers add what their store needs).
Every failure is a ``UfsError``: a ``CurvineError`` with the errno the caller passes on
(ENOENT, EACCES, EINVAL for bad input, EIO for an unreachable or failing store) and a
one-line message naming the URI.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Iterator, Mapping, Protocol

from curvine_py.common.errors import CurvineError


class UfsError(CurvineError):
    """A UFS call failed: errno + one line (no traceback reaches a user)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One entry of the UFS: an object (file) or a directory (an S3 common prefix)."""

    key: str           # relative to the mount root, no trailing "/"
    size: int          # 0 for a directory
    mtime_ns: int      # last modification (0 when the store has none, e.g. a common prefix)
    etag: str          # the version: the ETag, or "size:mtime_ns" where there is none
    is_dir: bool = False


class UfsWriter(Protocol):
    """A streaming upload of one object (multipart where the store has it)."""

    def write(self, data: memoryview | bytes) -> None:
        """Append data (any size; the provider buffers to its part size)."""

    def close(self) -> ObjectInfo:
        """Finish the upload; the object is visible, complete, once this returns."""

    def abort(self) -> None:
        """Drop the upload; nothing is left visible (idempotent, never raises)."""


class Ufs(Protocol):
    """One mounted under storage.  Thread-safe: the master and the workers call it from
    many threads.  Every call is bounded by the timeout given to open_ufs."""

    uri: str           # as mounted, e.g. s3://bucket/prefix

    def check(self) -> None:
        """Raise UfsError unless the store is reachable, the bucket/directory exists and
        the credentials may list it (cv ufs mount refuses to mount otherwise)."""

    def stat(self, key: str) -> ObjectInfo | None:
        """The object at key, or the directory key (an S3 prefix with entries under it or
        a "key/" marker); None when neither exists."""

    def list(self, key: str) -> Iterator[ObjectInfo]:
        """The direct children of directory key ("" = the root): objects and
        subdirectories (common prefixes), each once, in no particular order."""

    def read_into(self, key: str, offset: int, into: memoryview) -> int:
        """Read [offset, offset + len(into)) of the object into `into` (one ranged GET);
        returns the bytes read (fewer only at the object's end)."""

    def writer(self, key: str) -> UfsWriter:
        """Start an upload of key (replacing any object there once it is closed)."""

    def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write a small object in one call (directory markers, empty files)."""

    def mkdir(self, key: str) -> None:
        """Make directory key exist (an S3 "key/" marker; mkdir on a file system)."""

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """Copy object src to dst inside the store (S3 has no rename: copy + delete)."""

    def delete(self, key: str) -> None:
        """Remove object key; a missing key is not an error."""

    def rmdir(self, key: str) -> None:
        """Remove directory key's marker (S3) or the empty directory (file systems)."""

    def close(self) -> None:
        """Release connections."""


def invalid(uri: str, why: str) -> UfsError:
    return UfsError(errno.EINVAL, f"{uri}: {why}")


def parse_options(uri: str, options: Mapping[str, str], known: frozenset[str]) -> dict[str, str]:
    """The options a provider understands, or a UfsError naming the first unknown one."""
    unknown = sorted(set(options) - known)
    if unknown:
        takes = f"known: {', '.join(sorted(known))}" if known else "this scheme takes no options"
        raise invalid(uri, f"unknown option {unknown[0]!r} ({takes})")
    return dict(options)
