"""Key checks shared by the providers.

A key names an entry relative to the mount's root.  Providers refuse keys with empty,
"." or ".." segments: a file system would resolve them out of the root, and OpenDAL
normalizes them away ("a/../b" becomes "b"), so on S3 they would silently name another
object, possibly outside the mount's prefix.
"""
from __future__ import annotations

from curvine_py.ufs.base import invalid


def check_key(uri: str, key: str, root_ok: bool = False) -> str:
    """key, or UfsError(EINVAL) when it is not a clean relative path ("" only if root_ok)."""
    if key == "":
        if root_ok:
            return key
        raise invalid(uri, "an empty key names the root, not an object")
    if key.startswith("/") or key.endswith("/"):
        raise invalid(uri, f"key {key!r}: no leading or trailing '/'")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise invalid(uri, f"key {key!r}: empty, '.' or '..' path segment")
    if "\0" in key:
        raise invalid(uri, f"key {key!r}: NUL character")
    return key


def child_key(parent: str, name: str) -> str:
    """The key of name inside directory parent ("" = the root)."""
    return f"{parent}/{name}" if parent else name
