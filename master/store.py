"""Row-level access to the master's SQLite store, shared by the namespace and file ops."""
from __future__ import annotations

import errno
import sqlite3
import stat
from typing import Any

from curvine_py.common.errors import err
from curvine_py.common.types import ROOT_INO

Row = dict[str, Any]
ATTR_COLS = ("ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns, rdev, block_size, "
             "replicas, complete, generation, lease_id, lease_client, lease_expiry_ms, acl, default_acl, kv, allocated")
# A name's inode in one statement (a lookup, and every mutation's checks of its names).
CHILD = ("SELECT " + ", ".join(f"i.{c.strip()}" for c in ATTR_COLS.split(",")) + ", i.target"
         " FROM dirents d JOIN inodes i ON i.ino = d.ino WHERE d.parent=? AND d.name=?")
# UPDATE ... RETURNING (SQLite 3.35+) takes a counter's values in one statement, not two.
RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)


def to_i64(u: int) -> int:
    """SQLite integers are signed 64-bit; xxh3 checksums are unsigned."""
    return u - (1 << 64) if u >= 1 << 63 else u


def to_u64(i: int) -> int:
    return i + (1 << 64) if i < 0 else i


class Store:
    """Row-level helpers over one SQLite connection (a reader's or the writer's)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def q1(self, sql: str, args: tuple = ()) -> Row | None:
        r = self.conn.execute(sql, args).fetchone()
        return dict(r) if r is not None else None

    def inode(self, ino: int) -> Row:
        row = self.q1(f"SELECT {ATTR_COLS}, target FROM inodes WHERE ino=?", (ino,))
        if row is None:
            raise err(errno.ENOENT, f"no inode {ino}")
        return row

    def child(self, parent: int, name: str) -> Row | None:
        return self.q1(CHILD, (parent, name))

    def dir_inode(self, ino: int) -> Row:
        row = self.inode(ino)
        if not stat.S_ISDIR(row["mode"]):
            raise err(errno.ENOTDIR)
        return row

    def parent_of_dir(self, ino: int) -> int:
        if ino == ROOT_INO:
            return ROOT_INO
        r = self.conn.execute("SELECT parent FROM dirents WHERE ino=? LIMIT 1", (ino,)).fetchone()
        return r[0] if r else ROOT_INO

    def blocks(self, ino: int) -> list[Row]:
        rows = [dict(r) for r in self.conn.execute(
            "SELECT idx, block_id, length, checksum FROM blocks WHERE ino=? ORDER BY idx", (ino,))]
        for r in rows:
            r["checksum"] = to_u64(r["checksum"])
        return rows

    def counter(self, key: str, n: int = 1) -> int:
        """Take n values of a counter; returns the first."""
        if RETURNING:
            return int(self.conn.execute("UPDATE meta SET value=value+? WHERE key=? RETURNING value",
                                         (n, key)).fetchone()[0]) - n
        first = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0]
        self.conn.execute("UPDATE meta SET value=? WHERE key=?", (first + n, key))
        return int(first)

    def is_empty_dir(self, ino: int) -> bool:
        return self.conn.execute("SELECT 1 FROM dirents WHERE parent=? LIMIT 1", (ino,)).fetchone() is None

    def _delete_inode(self, ino: int) -> list[int]:
        freed = [r[0] for r in self.conn.execute("SELECT block_id FROM blocks WHERE ino=?", (ino,))]
        freed += [r[0] for r in self.conn.execute("SELECT block_id FROM pending_blocks WHERE ino=?", (ino,))]
        for table in ("inodes", "blocks", "pending_blocks", "writers", "xattrs", "reads", "ufs_files", "ufs_dirs"):
            self.conn.execute(f"DELETE FROM {table} WHERE ino=?", (ino,))
        return freed
