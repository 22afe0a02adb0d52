"""Row-level access to the master's SQLite store, shared by the namespace and file ops."""
from __future__ import annotations

import errno
import sqlite3
import stat
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict

from curvine_py.common.errors import err
from curvine_py.common.types import ROOT_INO
from curvine_py.master.schema import NAME_AT

if TYPE_CHECKING:
    from curvine_py.master.sessions import Barrier, Key

Row = dict[str, Any]
"""A row of another table as a dict (a ufs_mounts row: results carry it, ufsmounts.Mount reads it)."""


@dataclass(slots=True, frozen=True)
class InodeRow:
    """One ``inodes`` row as the master's handlers read it: a typed, immutable value (a
    change goes through SQL, never through the row; ``dataclasses.replace`` makes a copy
    with a field changed).  Built positionally from the SELECT's tuple (``InodeRow(*r)``,
    INODE_COLS' order): no dict per row; the journal's retry cache stores it as the list
    of its values (journal.encode_result)."""
    ino: int
    mode: int
    uid: int
    gid: int
    size: int
    nlink: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    rdev: int
    block_size: int
    replicas: int
    complete: int
    generation: int
    lease_id: int
    lease_client: str
    lease_expiry_ms: int
    acl: bytes | None
    default_acl: bytes | None
    kv: int
    allocated: int
    target: str | None


@dataclass(slots=True, frozen=True)
class BlockRow:
    """One ``blocks`` row of a file: its slot (idx), the block in it, the bytes it holds,
    and their xxh3 checksum as the unsigned value clients see (stored signed: to_i64)."""
    idx: int
    block_id: int
    length: int
    checksum: int


class Result(TypedDict, total=False):
    """What applying an op record returns: its caller's answer, and what a retry of its
    request id gets back.  A dict typed by key (each op sets the keys of its family), not
    a dataclass: the retry cache keeps it as JSON (journal.encode_result, an InodeRow as
    its values) and a retry decodes it back as it was, whichever op it came from."""
    # names and attributes (mknod, link, unlink, rmdir, rename, setattr, commit, create, open)
    attr: InodeRow
    created: bool
    dirs: list[InodeRow]
    kept: bool
    freed: list[int]          # blocks to delete on the workers after the commit
    # write leases and blocks (create, open_write, allocate, renew)
    lease_id: int
    lease_expiry_ms: int
    soft: bool
    block_ids: list[int]
    block_size: int
    replicas: int
    expired: list[int]
    # the cluster, the cache and the UFS (register_worker, evict, ufs_*, prune_*, events)
    worker_id: int
    evicted: list[int]
    bytes: int
    files: int
    skipped: int
    mount: Row
    gone: bool
    stale: bool
    pruned: int
    events: int
    # the cache sessions' entries, added after the commit (journal, MasterService.submit)
    _changes: Barrier
    _wait_seq: int
    _epoch: int
    _listings: list[Key]
    _own_keys: list[Key]


@dataclass(slots=True, frozen=True)
class UfsDirRow:
    """One ``ufs_dirs`` row: a directory under a UFS mount, its key, when it was listed."""
    ino: int
    mount_id: int
    ukey: str
    listed_ns: int


@dataclass(slots=True, frozen=True)
class UfsFileRow:
    """One ``ufs_files`` row: a file under a UFS mount, its key, the object's version last
    seen, and its upload state (ufsops.PERSISTED, PENDING, FAILED)."""
    ino: int
    mount_id: int
    ukey: str
    state: str
    etag: str
    ufs_size: int
    ufs_mtime_ns: int
    checked_ns: int
    dirty_ns: int
    message: str
    attempts: int


UFS_DIR_COLS = ", ".join(f.name for f in fields(UfsDirRow))
UFS_FILE_COLS = ", ".join(f.name for f in fields(UfsFileRow))
INODE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(InodeRow))
"""The inodes columns an InodeRow holds, in its fields' order: every SELECT of one uses it."""
INODE_COLS = ", ".join(INODE_FIELDS)
# A name's inode in one statement (a lookup, and every mutation's checks of its names).
CHILD = ("SELECT " + ", ".join(f"i.{c}" for c in INODE_FIELDS) +
         " FROM dirents d INDEXED BY dirents_name JOIN inodes i ON i.ino = d.ino"
         " WHERE d.parent=?1 AND name_key(d.name)=name_key(?2)"
         " AND +d.name=?2")
# Delete name ?2 of directory ?1 (schema.NAME_IS: found by its key in dirents_name)
DELETE_NAME = "DELETE FROM dirents WHERE " + NAME_AT.format(a=1, b=2)
INODE = f"SELECT {INODE_COLS} FROM inodes WHERE ino=?"
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

    def inode(self, ino: int) -> InodeRow:
        r = self.conn.execute(INODE, (ino,)).fetchone()
        if r is None:
            raise err(errno.ENOENT, f"no inode {ino}")
        return InodeRow(*r)

    def child(self, parent: int, name: str) -> InodeRow | None:
        r = self.conn.execute(CHILD, (parent, name)).fetchone()
        return InodeRow(*r) if r is not None else None

    def dir_inode(self, ino: int) -> InodeRow:
        row = self.inode(ino)
        if not stat.S_ISDIR(row.mode):
            raise err(errno.ENOTDIR)
        return row

    def parent_of_dir(self, ino: int) -> int:
        if ino == ROOT_INO:
            return ROOT_INO
        r = self.conn.execute("SELECT parent FROM dirents WHERE ino=? LIMIT 1", (ino,)).fetchone()
        return r[0] if r else ROOT_INO

    def blocks(self, ino: int) -> list[BlockRow]:
        """The file's blocks in slot order."""
        return [BlockRow(idx, bid, length, to_u64(checksum)) for idx, bid, length, checksum in self.conn.execute(
            "SELECT idx, block_id, length, checksum FROM blocks WHERE ino=? ORDER BY idx", (ino,))]

    def counters(self, *keys: str) -> dict[str, int]:
        """Take one value of each counter in keys, in one statement (a create takes an
        inode number, a listing position and a lease id: one UPDATE, not three)."""
        if not RETURNING:
            return {k: self.counter(k) for k in keys}
        marks = ",".join("?" * len(keys))
        return {k: int(v) - 1 for k, v in self.conn.execute(
            f"UPDATE meta SET value=value+1 WHERE key IN ({marks}) RETURNING key, value", keys)}

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

    def _delete_inode(self, ino: int, row: InodeRow | None = None) -> list[int]:
        """Delete inode ino and every row of it; returns its blocks, to be freed on the
        workers.  Given the inode's row, only the tables that can hold a row of it are
        visited: a file has no ufs_dirs row, a directory no blocks, writers or ufs_files
        row, and a file under no lease no writers or pending_blocks row (a lease's
        uncommitted blocks go when it ends): a written file's delete is 4 statements, not 9 (its last
        read is a column of its inode's row, schema.reads_in_inodes)."""
        is_dir = None if row is None else stat.S_ISDIR(row.mode)
        leased = row is None or bool(row.lease_id)
        freed: list[int] = []
        # the inode first: its blocks' delete triggers (schema.ALLOCATED_TRIGGERS) then find no row to update
        self.conn.execute("DELETE FROM inodes WHERE ino=?", (ino,))
        if not is_dir:
            for table in ("blocks", "pending_blocks") if leased else ("blocks",):
                if RETURNING:   # the rows' block ids as they go: one statement, not a SELECT and a DELETE
                    freed += [r[0] for r in self.conn.execute(f"DELETE FROM {table} WHERE ino=? RETURNING block_id",
                                                              (ino,)).fetchall()]
                else:
                    freed += [r[0] for r in self.conn.execute(f"SELECT block_id FROM {table} WHERE ino=?", (ino,))]
                    self.conn.execute(f"DELETE FROM {table} WHERE ino=?", (ino,))
        tables = ("xattrs",) + (("ufs_files",) if not is_dir else ()) + \
            (("writers",) if not is_dir and leased else ()) + (("ufs_dirs",) if is_dir is not False else ())
        for table in tables:
            self.conn.execute(f"DELETE FROM {table} WHERE ino=?", (ino,))
        return freed
