"""The S3 provider (``s3://bucket[/prefix]``), on OpenDAL's Python binding.

Why OpenDAL (bench/ufs_libs.py: SeaweedFS on loopback, 2 cores, 512 MiB object, ranged
GETs into a reused buffer; MB/s / this process's CPU s per GB, best of 3; load ~1):

    library            4 MiB x1     4 MiB x4      16 MiB x1    16 MiB x4
    boto3              627 / 0.82   867 / 0.96    960 / 0.52   1139 / 0.64
    opendal read()     684 / 0.50   1111 / 0.67   882 / 0.53   1123 / 0.68
    opendal readinto   770 / 0.44   1144 / 0.66   856 / 0.41    910 / 0.52   (load ~2)
    obstore            659 / 0.55   1050 / 0.75   929 / 0.54   1198 / 0.59

At the worker's 4 MiB blocks boto3 moves 20-30 % less and burns 40-70 % more CPU per
GB; OpenDAL and obstore tie (SeaweedFS on the same two cores is the ceiling; runs vary
by ~15 %).  Between those two the API decides: obstore (object_store) cannot name a
"key/" directory marker (it strips the trailing slash) and reads no ~/.aws files;
OpenDAL makes markers, reads the AWS credential chain (env, ~/.aws/credentials + config,
AWS_PROFILE, web identity), reads a bounded range straight into our buffer (readinto:
the least CPU), and is what Curvine itself uses.  Its one gap: the Python binding
cannot abort a multipart upload, so ``abort()`` drops the writer: nothing becomes
visible and no object is replaced, but parts already sent stay as an incomplete upload
until the bucket's AbortIncompleteMultipartUpload lifecycle rule removes them.

Thread safety: one ``opendal.Operator`` per mount, shared by every thread (it is Sync;
calls release the GIL).  Every call is bounded by a TimeoutLayer (timeout_s).
"""
from __future__ import annotations

import errno
import os
import typing
from collections.abc import Iterator, Mapping
from datetime import datetime

import opendal
import opendal.exceptions as oe
from opendal.layers import TimeoutLayer

from curvine_py.common.config import parse_size
from curvine_py.common.errors import ConfigError
from curvine_py.ufs.base import ObjectInfo, UfsError, invalid, parse_options
from curvine_py.ufs.keys import check_key

MiB = 1 << 20
DEFAULT_PART_SIZE = 16 * MiB
MIN_PART_SIZE = 5 * MiB        # S3's minimum (every part but the last)
DEFAULT_REGION = "us-east-1"   # what S3-compatible servers (SeaweedFS, MinIO, moto) accept

OPTIONS = frozenset({"endpoint_url", "region", "access_key_id", "secret_access_key", "session_token",
                     "virtual_hosted_style", "profile", "part_size"})
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def parse_bool(uri: str, name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in TRUE or v in FALSE:
        return v in TRUE
    raise invalid(uri, f"option {name}={value!r}: not a boolean (true/false)")


def parse_part_size(uri: str, value: str | None) -> int:
    if value is None:
        return DEFAULT_PART_SIZE
    try:
        size = parse_size(value)
    except ConfigError as e:
        raise invalid(uri, f"option part_size={value!r}: {e}") from None
    if size < MIN_PART_SIZE:
        raise invalid(uri, f"option part_size={value!r}: S3 parts are at least 5 MiB")
    return size


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


KIND_ERRNO = {"NotFound": errno.ENOENT, "PermissionDenied": errno.EACCES, "ConfigInvalid": errno.EINVAL,
              "Unsupported": errno.EINVAL, "IsADirectory": errno.EISDIR, "NotADirectory": errno.ENOTDIR}


def error_kind(e: BaseException) -> str:
    """OpenDAL's ErrorKind: the exception's class, or (from a File's readinto, which
    raises a plain OSError) the first word of its message."""
    if isinstance(e, oe.Error) and type(e) is not oe.Error:
        return type(e).__name__
    words = _one_line(e).split()
    return words[0] if words else ""


def past_end(e: BaseException) -> bool:
    """A ranged read that ran past the object's end (OpenDAL checks the length)."""
    return error_kind(e) == "RangeNotSatisfied" or "too little data" in str(e)


def ufs_error(uri: str, what: str, e: BaseException) -> UfsError:
    """An OpenDAL exception as a UfsError with the errno the caller passes on:
    ENOENT (no object, no bucket), EACCES (refused or no credentials), EINVAL (bad
    settings), EIO for the rest (unreachable, timed out, 5xx, rate limited)."""
    line, kind = _one_line(e), error_kind(e)
    code = KIND_ERRNO.get(kind, errno.EIO)
    if "NoSuchBucket" in line:
        code, line = errno.ENOENT, "the bucket does not exist"
    elif kind == "Unexpected" and "signing" in line:
        code, line = errno.EACCES, "no credentials (options, AWS_* environment, ~/.aws files)"
    return UfsError(code, f"{uri}: {what}: {line}")


class _Errors:
    """``with self._errors("stat", key):`` turns any library exception into a UfsError."""

    def __init__(self, uri: str, what: str) -> None:
        self.uri, self.what = uri, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: type[BaseException] | None, e: BaseException | None, tb: object) -> typing.Literal[False]:
        if e is None or isinstance(e, UfsError) or not isinstance(e, Exception):
            return False
        raise ufs_error(self.uri, self.what, e) from None


def mtime_ns(when: datetime | None) -> int:
    if when is None:
        return 0
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def info(key: str, meta: typing.Any) -> ObjectInfo:
    """ObjectInfo of an OpenDAL Metadata (a stat's or a list entry's)."""
    if meta.is_dir:
        return ObjectInfo(key=key, size=0, mtime_ns=mtime_ns(meta.last_modified), etag="", is_dir=True)
    return ObjectInfo(key=key, size=int(meta.content_length or 0), mtime_ns=mtime_ns(meta.last_modified),
                      etag=meta.etag or "", is_dir=False)


class S3Ufs:
    """One S3 mount: bucket + prefix, one shared Operator."""

    def __init__(self, uri: str, bucket: str, prefix: str, options: Mapping[str, str],
                 timeout_s: float = 30.0) -> None:
        opts = parse_options(uri, options, OPTIONS)
        self.uri = uri
        self.bucket = bucket
        self.part_size = parse_part_size(uri, opts.get("part_size"))
        self.timeout_s = timeout_s
        config = self._config(uri, bucket, prefix, opts)
        with _Errors(uri, "open"):
            op = opendal.Operator("s3", **config)
            self._op = op.layer(TimeoutLayer(timeout=timeout_s, io_timeout=timeout_s))

    @staticmethod
    def _config(uri: str, bucket: str, prefix: str, opts: dict[str, str]) -> dict[str, str]:
        """OpenDAL's S3 settings.  Keys left out come from the AWS chain (env, ~/.aws)."""
        region = (opts.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                  or DEFAULT_REGION)
        config = {"bucket": bucket, "root": f"/{prefix}/" if prefix else "/", "region": region,
                  "enable_virtual_host_style": str(parse_bool(
                      uri, "virtual_hosted_style", opts.get("virtual_hosted_style", "false"))).lower()}
        for ours, theirs in (("endpoint_url", "endpoint"), ("access_key_id", "access_key_id"),
                             ("secret_access_key", "secret_access_key"), ("session_token", "session_token"),
                             ("profile", "profile")):
            if opts.get(ours):
                config[theirs] = opts[ours]
        if "endpoint" not in config and os.environ.get("AWS_ENDPOINT_URL"):
            config["endpoint"] = os.environ["AWS_ENDPOINT_URL"]
        if config.get("endpoint") and not config["endpoint"].startswith(("http://", "https://")):
            raise invalid(uri, f"option endpoint_url={config['endpoint']!r}: not an http(s):// URL")
        return config

    def _errors(self, what: str, key: str = "") -> _Errors:
        return _Errors(self.uri, f"{what} {key!r}" if key else what)

    # ------------------------------------------------------------ metadata

    def check(self) -> None:
        """One list call: the endpoint answers, the bucket exists, the keys may list it."""
        with self._errors("check"):
            self._op.check()

    def stat(self, key: str) -> ObjectInfo | None:
        """HEAD key; when there is no such object, the directory key/ (marker or prefix)."""
        check_key(self.uri, key, root_ok=True)
        if key:
            found = self._stat_or_none(key)
            if found is not None:
                return info(key, found)
        if self._stat_or_none(key + "/" if key else "/") is None:
            return None
        return ObjectInfo(key=key, size=0, mtime_ns=0, etag="", is_dir=True)

    def _stat_or_none(self, path: str) -> typing.Any:
        """OpenDAL's Metadata of path (for "dir/": a marker or a listing), None if absent."""
        try:
            with self._errors("stat", path):
                return self._op.stat(path)
        except UfsError as e:
            if e.errno == errno.ENOENT and "bucket" not in str(e):
                return None
            raise

    def list(self, key: str) -> Iterator[ObjectInfo]:
        """ListObjectsV2 with delimiter "/" (OpenDAL pages it): objects and common
        prefixes, each once, without the directory's own marker."""
        check_key(self.uri, key, root_ok=True)
        path = key + "/" if key else "/"
        seen: set[str] = set()
        with self._errors("list", key):
            for entry in self._op.list(path):
                name = entry.path.rstrip("/")
                if entry.path == path or name in seen or not name:
                    continue   # the marker "key/" itself; a marker also listed as a prefix
                seen.add(name)
                yield info(name, entry.metadata)

    # ------------------------------------------------------------ data

    def read_into(self, key: str, offset: int, into: memoryview) -> int:
        """One ranged GET of [offset, offset+len(into)) into the caller's buffer.  Past
        the end: fewer bytes (a HEAD then the exact range), 0 at or after the end."""
        check_key(self.uri, key)
        want = len(into)
        if want == 0:
            return 0
        try:
            return self._read_range(key, offset, into)
        except Exception as e:
            if not past_end(e):
                raise ufs_error(self.uri, f"read {key!r}", e) from None
        size = self._size(key)   # the range ran past the end: read what is there
        if offset >= size:
            return 0
        with self._errors("read", key):
            return self._read_range(key, offset, into[:size - offset])

    def _read_range(self, key: str, offset: int, into: memoryview) -> int:
        """readinto from an OpenDAL reader bound to the range: no intermediate bytes."""
        n, want = 0, len(into)
        with self._op.open(key, "rb", offset=offset, size=want) as f:
            while n < want:
                got = f.readinto(into[n:])
                if not got:
                    break
                n += got
        return n

    def _size(self, key: str) -> int:
        with self._errors("stat", key):
            return int(self._op.stat(key).content_length or 0)

    def writer(self, key: str) -> "S3Writer":
        check_key(self.uri, key)
        return S3Writer(self, key)

    def put(self, key: str, data: bytes) -> ObjectInfo:
        check_key(self.uri, key)
        with self._errors("put", key):
            self._op.write(key, bytes(data))
        return self._info(key)

    def _info(self, key: str) -> ObjectInfo:
        with self._errors("stat", key):
            return info(key, self._op.stat(key))

    # ------------------------------------------------------------ names

    def mkdir(self, key: str) -> None:
        """Put the "key/" marker (an empty object)."""
        check_key(self.uri, key)
        with self._errors("mkdir", key):
            self._op.create_dir(key + "/")

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """Server-side CopyObject (S3 caps one copy at 5 GiB)."""
        check_key(self.uri, src)
        check_key(self.uri, dst)
        with self._errors("copy", f"{src} -> {dst}"):
            self._op.copy(src, dst)
        return self._info(dst)

    def delete(self, key: str) -> None:
        check_key(self.uri, key)
        with self._errors("delete", key):
            self._op.delete(key)

    def rmdir(self, key: str) -> None:
        """Delete the "key/" marker; objects under the prefix are the caller's business."""
        check_key(self.uri, key)
        with self._errors("rmdir", key):
            self._op.delete(key + "/")

    def close(self) -> None:
        """OpenDAL's connection pool goes with the Operator."""
        self._op = typing.cast(typing.Any, _Closed(self.uri))


class _Closed:
    """Stands in for the Operator after close(): every call is an EIO, not a crash."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def __getattr__(self, name: str) -> typing.Any:
        raise UfsError(errno.EIO, f"{self.uri}: closed")


class S3Writer:
    """A streaming upload: a single PUT below one part, else a multipart upload with
    parts of part_size (OpenDAL's writer with chunk=part_size does both)."""

    def __init__(self, ufs: S3Ufs, key: str) -> None:
        self.ufs, self.key = ufs, key
        self._file: typing.Any = None
        self._done = False

    def write(self, data: memoryview | bytes) -> None:
        if self._done:
            raise UfsError(errno.EINVAL, f"{self.ufs.uri}: write {self.key!r}: the upload is finished")
        with self.ufs._errors("write", self.key):
            if self._file is None:
                self._file = self.ufs._op.open(self.key, "wb", chunk=self.ufs.part_size)
            self._file.write(data if isinstance(data, bytes) else bytes(data))

    def close(self) -> ObjectInfo:
        if self._done:
            raise UfsError(errno.EINVAL, f"{self.ufs.uri}: close {self.key!r}: the upload is finished")
        self._done = True
        f, self._file = self._file, None
        with self.ufs._errors("upload", self.key):
            if f is None:
                self.ufs._op.write(self.key, b"")
            else:
                f.close()
        return self.ufs._info(self.key)

    def abort(self) -> None:
        """Drop the writer without completing it: nothing becomes visible (see the module
        docstring on the parts an initiated multipart upload leaves)."""
        self._done = True
        self._file = None
