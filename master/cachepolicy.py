"""Cache policies kept as xattrs: pin, time-to-live and preferred tier.

``user.curvine.pin`` = ``"1"`` exempts a file, or every file below a directory, from
eviction and TTL sweeps.  ``user.curvine.ttl`` = seconds (stored normalised; ``"7d"``,
``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` are accepted when set) removes files whose last
modification is older than that.  ``user.curvine.tier`` = ``mem``/``ssd``/``hdd``/``disk``
is the tier new blocks should land on.  TTL and tier come from the nearest ancestor
(the file itself first); pin holds if the file or any ancestor is pinned.

Policies are ordinary xattrs so the mount (getfattr/setfattr), the SDK and the CLI all
see and change the same values; validation happens when the op record is applied, so
a bad value is an EINVAL with a clear message whatever the path it came through.
"""
from __future__ import annotations

import errno
import re
import sqlite3

from curvine_py.common.errors import err
from curvine_py.common.types import ROOT_INO

PIN = "user.curvine.pin"
TTL = "user.curvine.ttl"
TIER = "user.curvine.tier"
POLICY_XATTRS = (PIN, TTL, TIER)
TIERS = ("mem", "ssd", "hdd", "disk")
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_TTL_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)
MAX_DEPTH = 4096


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
    if name == PIN:
        if text.lower() in ("1", "true", "yes", "on"):
            return b"1"
        if text.lower() in ("0", "false", "no", "off"):
            return b"0"
        raise err(errno.EINVAL, f"bad {PIN} value {text!r}: use 1 or 0")
    if name == TTL:
        return str(parse_ttl(text)).encode()
    if name == TIER:
        if text.lower() not in TIERS:
            raise err(errno.EINVAL, f"bad {TIER} value {text!r}: one of {', '.join(TIERS)}")
        return text.lower().encode()
    return bytes(value)


class Policies:
    """Effective policies of inodes, read from one connection (one eviction pass or call).

    Loads every policy xattr once (they are few: set on directories by operators) and
    walks parents through ``dirents``, memoising directories, so a pass over many files
    costs one lookup per directory.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.values: dict[str, dict[int, str]] = {n: {} for n in POLICY_XATTRS}
        for ino, name, value in conn.execute(
                "SELECT ino, name, value FROM xattrs WHERE name IN (?,?,?)", POLICY_XATTRS):
            self.values[name][ino] = bytes(value).decode("ascii", "replace")
        self._parents: dict[int, list[int]] = {}
        self._pinned: dict[int, bool] = {}

    @property
    def any_pins(self) -> bool:
        return any(v == "1" for v in self.values[PIN].values())

    def parents(self, ino: int) -> list[int]:
        """Directories holding a name of ino (several for a hard-linked file)."""
        got = self._parents.get(ino)
        if got is None:
            got = [r[0] for r in self.conn.execute("SELECT DISTINCT parent FROM dirents WHERE ino=?", (ino,))]
            self._parents[ino] = got
        return got

    def pinned(self, ino: int, depth: int = 0) -> bool:
        """Is ino or any ancestor (through any of its names) pinned?"""
        if self.values[PIN].get(ino) == "1":
            return True
        if ino == ROOT_INO or depth > MAX_DEPTH or not self.any_pins:
            return False
        known = self._pinned.get(ino)
        if known is None:
            known = any(self.pinned(p, depth + 1) for p in self.parents(ino) if p != ino)
            self._pinned[ino] = known
        return known

    def nearest(self, name: str, ino: int) -> str | None:
        """The value of policy `name` on ino or its nearest ancestor (first name's path)."""
        table = self.values[name]
        if not table:
            return None
        for _ in range(MAX_DEPTH):
            if ino in table:
                return table[ino]
            if ino == ROOT_INO:
                return None
            parents = self.parents(ino)
            if not parents:
                return None
            ino = parents[0]
        return None

    def ttl_s(self, ino: int) -> int | None:
        v = self.nearest(TTL, ino)
        return int(v) if v and v.isdigit() else None

    def tier(self, ino: int) -> str:
        """Preferred tier name in upper case (as data dirs are labelled), '' = any."""
        v = self.nearest(TIER, ino)
        return v.upper() if v else ""
