"""Under storage providers behind UFS mounts (docs/ufs.md): ``open_ufs`` picks one by the
URI's scheme.  Adding GCS, Azure or HDFS is one module implementing ``Ufs`` and one line
in ``_open``."""
from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from curvine_py.ufs.base import ObjectInfo, Ufs, UfsError, UfsWriter, invalid

__all__ = ["ObjectInfo", "Ufs", "UfsError", "UfsWriter", "open_ufs", "SCHEMES"]

SCHEMES = ("s3", "file")


def open_ufs(uri: str, options: Mapping[str, str], timeout_s: float = 30.0) -> Ufs:
    """The provider for uri (``s3://bucket[/prefix]``, ``file:///abs/dir``), configured by
    options (``cv ufs mount -o KEY=VALUE``); every call it makes is bounded by timeout_s.
    Only parses and configures: ``check()`` is what talks to the store.  A bad URI or an
    unknown option is a UfsError(EINVAL) naming it."""
    if not isinstance(uri, str) or "://" not in uri:
        raise invalid(str(uri), f"not a URI (expected one of: {', '.join(s + '://...' for s in SCHEMES)})")
    if timeout_s <= 0:
        raise invalid(uri, f"timeout {timeout_s!r} s: must be positive")
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if parts.query or parts.fragment:
        raise invalid(uri, "no '?' query or '#' fragment here (pass settings with -o KEY=VALUE)")
    if scheme == "s3":
        return _open_s3(uri, parts.netloc, unquote(parts.path), options, timeout_s)
    if scheme == "file":
        return _open_file(uri, parts.netloc, unquote(parts.path), options, timeout_s)
    raise invalid(uri, f"unknown scheme {parts.scheme!r} (supported: {', '.join(SCHEMES)})")


def _open_s3(uri: str, bucket: str, path: str, options: Mapping[str, str], timeout_s: float) -> Ufs:
    if not bucket:
        raise invalid(uri, "no bucket (s3://BUCKET[/prefix])")
    if "@" in bucket or ":" in bucket:
        raise invalid(uri, "credentials or a port do not go in the URI (use -o access_key_id=..., -o endpoint_url=...)")
    prefix = path.strip("/")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        raise invalid(uri, "the prefix has an empty, '.' or '..' segment")
    from curvine_py.ufs.s3 import S3Ufs   # imported here: file:// mounts need no S3 library
    return S3Ufs(uri, bucket, prefix, options, timeout_s)


def _open_file(uri: str, host: str, path: str, options: Mapping[str, str], timeout_s: float) -> Ufs:
    if host not in ("", "localhost"):
        raise invalid(uri, f"file URIs name a local path (file:///abs/dir), not host {host!r}")
    if not path.startswith("/"):
        raise invalid(uri, "not an absolute path (file:///abs/dir)")
    if any(p in (".", "..") for p in path.split("/")):
        raise invalid(uri, "the path has a '.' or '..' segment")
    from curvine_py.ufs.local import LocalUfs
    return LocalUfs(uri, path, options, timeout_s)
