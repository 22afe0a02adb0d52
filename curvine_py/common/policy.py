"""Names and values of the cache-policy xattrs, shared by the master, the SDK and the CLI.

``user.curvine.pin`` = ``"1"`` exempts a file or a directory tree from eviction and TTL
sweeps; ``user.curvine.ttl`` = seconds after the last modification (``"7d"``, ``"12h"``,
``"30m"``, ``"45s"``, ``"2w"`` accepted, stored as seconds); ``user.curvine.tier`` = the
tier new blocks prefer (``mem``, ``ssd``, ``hdd``, ``disk``).  docs/eviction.md.

``user.curvine.kv`` = ``"1"`` marks a directory for the KV cache (docs/kvcache.md).  It is
no xattr row: the master keeps it in the inode (``inodes.kv``, ``Attr.kv``), copied into
every inode made under such a directory, so a mount knows a file is a KV chunk from the
attributes its lookup returns, with no further call.
"""
from __future__ import annotations

import errno
import re

from curvine_py.common.errors import err

PIN = "user.curvine.pin"
TTL = "user.curvine.ttl"
TIER = "user.curvine.tier"
POLICY_XATTRS = (PIN, TTL, TIER)
KV = "user.curvine.kv"
# The block size of a file made under a KV directory when its client names none: one block
# holds a 14 MiB chunk (256 tokens of a 7B model, with its header), as bench/compare's
# curvine-kv makes them.  Not 128 MiB, which would hold the largest chunk (~80 MiB, a 70B
# model): a client keeps buffer_pool_bytes of buffers per block size, 2 of 128 MiB, and 96
# chunks read at once through a mount made no progress in 200 s (4 MiB blocks: 40 s; 16 MiB:
# 16 buffers).  Bigger chunks are several blocks, read as by default.
KV_BLOCK_SIZE = 16 << 20
TIERS = ("mem", "ssd", "hdd", "disk")
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TTL_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_ttl(text: str) -> int:
    """'7d' -> 604800; a positive whole number of seconds with an optional unit."""
    m = _TTL_RE.match(text)
    if not m or int(m.group(1)) <= 0:
        raise err(errno.EINVAL, f"bad ttl {text!r}: use a positive number of seconds or e.g. 30m, 12h, 7d")
    return int(m.group(1)) * _TTL_UNITS[m.group(2).lower()]


def normalize(name: str, value: bytes) -> bytes:
    """The stored form of a policy xattr value; EINVAL for a bad one."""
    try:
        text = bytes(value).decode("ascii").strip().rstrip("\0").strip()
    except UnicodeDecodeError:
        raise err(errno.EINVAL, f"{name}: value must be ASCII text") from None
    if name in (PIN, KV):   # on/off flags
        if text.lower() in ("1", "true", "yes", "on"):
            return b"1"
        if text.lower() in ("0", "false", "no", "off"):
            return b"0"
        raise err(errno.EINVAL, f"bad {name} value {text!r}: use 1 or 0")
    if name == TTL:
        return str(parse_ttl(text)).encode()
    if name == TIER:
        if text.lower() not in TIERS:
            raise err(errno.EINVAL, f"bad {TIER} value {text!r}: one of {', '.join(TIERS)}")
        return text.lower().encode()
    return bytes(value)


def format_ttl(seconds: int) -> str:
    """604800 -> '7d' (the largest unit that divides it)."""
    for unit in ("d", "h", "m"):
        if seconds % _TTL_UNITS[unit] == 0:
            return f"{seconds // _TTL_UNITS[unit]}{unit}"
    return f"{seconds}s"
