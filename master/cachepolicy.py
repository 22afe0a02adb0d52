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

import sqlite3

from curvine_py.common.policy import PIN, POLICY_XATTRS, TIER, TTL, normalize, parse_ttl
from curvine_py.common.types import ROOT_INO

__all__ = ["PIN", "POLICY_XATTRS", "TIER", "TTL", "MAX_DEPTH", "Policies", "normalize", "parse_ttl"]

MAX_DEPTH = 4096


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
