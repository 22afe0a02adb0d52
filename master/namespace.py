"""The namespace: inodes and directory entries in SQLite, changed only by op records.

Every mutation is an *op record* (a typed, frozen dataclass of ``records.py``: ``Mknod``,
``Rename``, ...) applied by ``Namespace.apply`` inside the journal's transaction; the op
method of each record type is marked ``@applies(Type)`` (``handlers.py``).  ``apply`` depends only on
the record and the store, never on the clock or on memory, so replaying the same records
on another master (the future Raft log) yields the same namespace.  POSIX rules come from
``posix.py``; side effects outside the store (telling workers to delete blocks) are
returned in the result (``freed``) and carried out by the caller after the commit.
"""
from __future__ import annotations

import errno
import operator
import sqlite3
import stat
from dataclasses import dataclass
from typing import Any, Callable

from curvine_py.common.errors import err
from curvine_py.common.policy import KV, KV_BLOCK_SIZE
from curvine_py.common.types import (
    CAPABILITY_XATTR, DIR_SIZE, RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO, SETATTR_ATIME, SETATTR_ATIME_NOW,
    SETATTR_GID, SETATTR_MODE, SETATTR_MTIME, SETATTR_MTIME_NOW, SETATTR_SIZE, SETATTR_UID,
    XATTR_CREATE, XATTR_REPLACE,
)
from curvine_py.master import acl, cachepolicy, posix, schema
from curvine_py.master.cacheops import CacheOps
from curvine_py.master.events import EventOps
from curvine_py.master.files import FileOps
from curvine_py.master.groupops import GroupOps
from curvine_py.master.handlers import applies, handlers
from curvine_py.master.posix import R, W, X, Cred
from curvine_py.master.records import (
    Link, Mknod, Record, RegisterWorker, Removexattr, Rename, Rmdir, Setattr, Setxattr, Unlink,
)
from curvine_py.master.schema import NAME_AT
from curvine_py.master.store import (DELETE_NAME, INODE_COLS, INODE_FIELDS, RETURNING, BlockRow, InodeRow, Result)
from curvine_py.master.ufsops import UfsOps

MAX_SYMLINKS = 40
MIN_BLOCK = 4096             # block sizes: multiples of the O_DIRECT unit...
MAX_BLOCK = 1 << 30         # ...up to 1 GiB
XATTR_MAX = 64 * 1024
MAX_PENDING_ASKED = 1024     # GetBlockLocations: pending block ids looked at per call
_ACL_COLUMN = {acl.ACCESS: "acl", acl.DEFAULT: "default_acl"}   # where an inode keeps each ACL


def _kept(keep: tuple[int, ...], victim: InodeRow) -> bool:
    """Would removing this name drop a file the caller has open (in keep)?  Then the
    caller hides it instead (UnlinkRequest.keep): only a regular file's last link counts."""
    return bool(keep) and victim.ino in keep and stat.S_ISREG(victim.mode) and victim.nlink == 1


@dataclass(slots=True, frozen=True)
class DirEntry:
    """One name of a listing (readdir): its inode and mode, and with plus its attributes."""
    name: str
    seq: int
    ino: int
    mode: int
    attr: InodeRow | None


# A listing's page: name, seq, then the inode's columns (plus) or its number and mode only.
_READDIR_PLUS = ("SELECT d.name, d.seq, " + ", ".join(f"i.{c}" for c in INODE_FIELDS) +
                 " FROM dirents d JOIN inodes i ON i.ino = d.ino WHERE d.parent=? AND d.seq>? ORDER BY d.seq LIMIT ?")
_INSERT_INODE = f"INSERT INTO inodes({INODE_COLS}) VALUES ({', '.join('?' * len(INODE_FIELDS))})"
_values = operator.attrgetter(*INODE_FIELDS)   # an InodeRow's values in INODE_COLS' order
_N = len(INODE_FIELDS)
# A directory's row and one name's inode in it (NULLs: no such name), for _writable_dir_and_child.
_DIR_AND_CHILD = ("SELECT " + ", ".join([f"d.{c}" for c in INODE_FIELDS] + [f"i.{c}" for c in INODE_FIELDS]) +
                  " FROM inodes d LEFT JOIN dirents e INDEXED BY dirents_name ON e.parent = d.ino"
                  " AND name_key(e.name) = name_key(?1)"
                  " AND +e.name = ?1 LEFT JOIN inodes i ON i.ino = e.ino WHERE d.ino = ?2")
# a name's inode (an exchange)
_SET_INO = "UPDATE dirents SET ino=?1 WHERE " + NAME_AT.format(a=2, b=3)
_TOUCH = "UPDATE inodes SET mtime_ns=?, ctime_ns=?, nlink=nlink+? WHERE ino=?"
_TOUCH_RETURNING = f"{_TOUCH} RETURNING {INODE_COLS}"
_READDIR = ("SELECT d.name, d.seq, d.ino, i.mode FROM dirents d JOIN inodes i ON i.ino = d.ino"
            " WHERE d.parent=? AND d.seq>? ORDER BY d.seq LIMIT ?")
# A directory's names with their attributes (Namespace.listing; pb.Attr's fields in this order)
LISTING_COLUMNS = ("ino", "mode", "uid", "gid", "size", "nlink", "atime_ns", "mtime_ns", "ctime_ns", "rdev",
                   "block_size", "replicas", "generation", "allocated", "complete", "kv")
_LISTING = ("SELECT d.name, " + ", ".join(f"i.{c}" for c in LISTING_COLUMNS) + ", coalesce(length(i.acl), 0)"
            " FROM dirents d JOIN inodes i ON i.ino = d.ino WHERE d.parent=? LIMIT ?")
# The complete one-block regular files, whose blocks a listing carries: the rule of
# LookupRequest.one_block.  _LISTING with them (Namespace.listing_with_blocks): _LISTING's
# columns, then a one-block file's block (LISTED_BLOCK: idx, block_id, length, checksum;
# NULLs for every other name) and the inode's access ACL (NULL for nearly all).  One
# statement: ~25 us less than a second SELECT of the blocks for 32 names here
_ONE_BLOCK = f"i.complete AND (i.mode & {0o170000}) = {stat.S_IFREG} AND i.size > 0 AND i.size <= i.block_size"
LISTED_BLOCK = len(LISTING_COLUMNS) + 2
_LISTING_WITH_BLOCKS = (_LISTING.split(" FROM ")[0] + ", b.idx, b.block_id, b.length, b.checksum, i.acl"
                        " FROM dirents d JOIN inodes i ON i.ino = d.ino"
                        f" LEFT JOIN blocks b ON b.ino = d.ino AND {_ONE_BLOCK} WHERE d.parent=? LIMIT ?")


class Namespace(UfsOps, FileOps, CacheOps, GroupOps, EventOps):
    """Reads answer directly; mutations are op records given to ``apply`` by the journal."""

    def __init__(self, conn: sqlite3.Connection, default_block_size: int, default_replicas: int) -> None:
        super().__init__(conn)
        self.default_block_size = default_block_size
        self.default_replicas = default_replicas

    # ------------------------------------------------------------------ apply
    def apply(self, rec: Record) -> Result:
        """Apply one op record inside the caller's transaction; return its result."""
        cls: type = type(self)   # a plain type: mypy checks type(self) against Hashable as an instance
        return handlers(cls)[type(rec)](self, rec)

    # ------------------------------------------------------------------ reads
    def lookup(self, cred: Cred, parent: int, name: str) -> InodeRow:
        row, _ = self.lookup_in(cred, parent, name)
        if row is None:
            raise err(errno.ENOENT)
        return row

    def lookup_in(self, cred: Cred, parent: int, name: str) -> tuple[InodeRow | None, InodeRow]:
        """The named inode (None: no such name) and the directory, as it was checked."""
        d = self.dir_inode(parent)
        posix.require(d, cred, X)
        if name == ".":
            return d, d
        if name == "..":
            return self.inode(self.parent_of_dir(parent)), d
        posix.check_name(name)
        return self.child(parent, name), d

    def resolve(self, cred: Cred, path: str, follow: bool = True,
                before: Callable[[int], object] | None = None) -> InodeRow:
        """Walk an absolute path from the root, following symlinks (at most 40); before(dir)
        runs ahead of each lookup in dir (the master refreshes UFS listings there)."""
        if not path.startswith("/"):
            raise err(errno.EINVAL, "path must be absolute")
        if len(path.encode("utf-8", "surrogateescape")) >= 4096:
            raise err(errno.ENAMETOOLONG)
        todo = [p for p in path.split("/") if p and p != "."]
        todo.reverse()
        cur = self.inode(ROOT_INO)
        links = 0
        while todo:
            name = todo.pop()
            if not stat.S_ISDIR(cur.mode):
                raise err(errno.ENOTDIR)
            parent = cur
            if before is not None:
                before(cur.ino)
            cur = self.lookup(cred, cur.ino, name)
            if stat.S_ISLNK(cur.mode) and (todo or follow):
                links += 1
                if links > MAX_SYMLINKS:
                    raise err(errno.ELOOP)
                target = cur.target or ""
                parts = [p for p in target.split("/") if p and p != "."]
                todo.extend(reversed(parts))
                cur = self.inode(ROOT_INO) if target.startswith("/") else parent
        return cur

    def readdir(self, cred: Cred, ino: int, offset: int, limit: int, plus: bool) -> list[DirEntry]:
        d = self.dir_inode(ino)
        posix.require(d, cred, R)
        limit = max(1, min(limit or 1000, 10000))
        if plus:
            return [DirEntry(r[0], r[1], r[2], r[3], InodeRow(*r[2:]))
                    for r in self.conn.execute(_READDIR_PLUS, (ino, offset, limit))]
        return [DirEntry(r[0], r[1], r[2], r[3], None) for r in self.conn.execute(_READDIR, (ino, offset, limit))]

    def listing(self, ino: int, most: int) -> list[tuple[Any, ...]] | None:
        """Directory ino's every name with its inode's attributes, when it has at most
        `most` names (None: more): plain tuples, (name, *LISTING_COLUMNS, acl's length);
        no InodeRow (half the time of 256 names).  No permission check: a Lookup's
        caller may search ino, and the mount answers only lookups from it (each caller's
        search permission checked there), never a readdir."""
        cur = self.conn.cursor()
        cur.row_factory = None
        rows = cur.execute(_LISTING, (ino, most + 1)).fetchall()
        return None if len(rows) > most else rows

    def listing_with_blocks(self, ino: int, most: int) -> list[tuple[Any, ...]] | None:
        """listing() and listing_blocks() in one statement: each row listing()'s, then its
        block (LISTED_BLOCK: idx, block_id, length, signed checksum; None for all but
        complete one-block regular files) and its access ACL's value.  A file with more
        than one such block row (none should have: a commit drops the slots past its
        size) comes once per block, its rows next to each other; None: more than `most`
        names."""
        cur = self.conn.cursor()
        cur.row_factory = None
        rows = cur.execute(_LISTING_WITH_BLOCKS, (ino, most + 1)).fetchall()
        if len(rows) > most:   # (the LIMIT counts rows: a name of two blocks counts twice)
            if len({r[0] for r in rows}) > most:
                return None
            rows = cur.execute(_LISTING_WITH_BLOCKS, (ino, -1)).fetchall()
            if len({r[0] for r in rows}) > most:
                return None
        return rows

    def readlink(self, ino: int) -> str:
        row = self.inode(ino)
        if not stat.S_ISLNK(row.mode):
            raise err(errno.EINVAL, "not a symlink")
        return row.target or ""

    def getxattr(self, cred: Cred, ino: int, name: str) -> bytes:
        row = self.inode(ino)
        self._xattr_access(row, cred, name, write=False)
        if name in acl.NAMES:
            value = getattr(row, _ACL_COLUMN[name])
            if not value:
                raise err(errno.ENODATA)
            return bytes(value)
        if name == KV:
            if not row.kv:
                raise err(errno.ENODATA)
            return b"1"
        r = self.conn.execute("SELECT value FROM xattrs WHERE ino=? AND name=?", (ino, name)).fetchone()
        if r is None:
            raise err(errno.ENODATA)
        return bytes(r[0])

    def listxattr(self, cred: Cred, ino: int) -> list[str]:
        row = self.inode(ino)
        names = [r[0] for r in self.conn.execute("SELECT name FROM xattrs WHERE ino=? ORDER BY name", (ino,))]
        names += [name for name in acl.NAMES if getattr(row, _ACL_COLUMN[name])]
        names += [KV] if row.kv else []
        if not cred.root:
            names = [n for n in names if not n.startswith("trusted.")]
        return names

    def file_blocks(self, ino: int) -> tuple[InodeRow, list[BlockRow]]:
        row = self.inode(ino)
        return row, self.blocks(ino)

    def pending_of(self, ino: int, lease_id: int, block_ids: list[int]) -> list[int]:
        """Those of block_ids that lease_id allocated to ino and has not committed."""
        ids = block_ids[:MAX_PENDING_ASKED]
        if not ids or not lease_id:
            return []
        marks = ",".join("?" * len(ids))
        return [r[0] for r in self.conn.execute(
            f"SELECT block_id FROM pending_blocks WHERE ino=? AND lease_id=? AND block_id IN ({marks})",
            (ino, lease_id, *ids))]

    def counts(self) -> tuple[int, int]:
        """Inodes and blocks, from the counts the store's triggers keep (schema.COUNTS)."""
        return schema.count(self.conn, "count_inodes"), schema.count(self.conn, "count_blocks")

    def dir_count(self) -> int:
        """Directories among the inodes (the root included)."""
        return schema.count(self.conn, "count_dirs")

    # ------------------------------------------------------------------ helpers
    def _xattr_access(self, row: InodeRow, cred: Cred, name: str, write: bool) -> None:
        if not name or len(name) > 255:
            raise err(errno.ERANGE if name else errno.EINVAL)
        ns = name.split(".", 1)[0]
        if ns == "trusted":
            if not cred.root:
                raise err(errno.EPERM)
        elif ns == "user":
            if not (stat.S_ISREG(row.mode) or stat.S_ISDIR(row.mode)):
                raise err(errno.EPERM)
            posix.require(row, cred, W if write else R)
        elif ns == "security":
            if write:
                posix.require_owner(row, cred)
        elif name in acl.NAMES:
            if stat.S_ISLNK(row.mode):
                raise err(errno.EOPNOTSUPP, "symlinks have no ACLs")
            if write:
                posix.require_owner(row, cred)
        else:   # system.* other than the ACLs: nothing here would enforce it, so it is not stored
            raise err(errno.EOPNOTSUPP, f"unsupported xattr {name!r}")

    def _dirs(self, *inos: int) -> list[InodeRow]:
        """The directories an op changed, as they now are (clients cache them)."""
        return [self.inode(i) for i in dict.fromkeys(inos)]

    def _touch_dir(self, ino: int, now: int, nlink_delta: int = 0) -> None:
        """A name in directory ino changed: its times (and its link count) are set."""
        self.conn.execute(_TOUCH, (now, now, nlink_delta, ino))

    def _touched(self, ino: int, now: int, nlink_delta: int = 0) -> InodeRow:
        """A name in directory ino changed: its times (and its link count) are set, and
        the row is returned as it now is -- the op's "dirs" -- by the same statement
        (UPDATE ... RETURNING), not read again.  Called last for each directory an op
        changes, so the row it returns is the one the commit leaves."""
        if RETURNING:
            return InodeRow(*self.conn.execute(_TOUCH_RETURNING, (now, now, nlink_delta, ino)).fetchone())
        self._touch_dir(ino, now, nlink_delta)
        return self.inode(ino)

    def _add_entry(self, parent: int, name: str, ino: int, seq: int = 0) -> None:
        """A name for ino in parent, at listing position seq (0: the next one)."""
        seq = seq or self.counter("next_seq")
        self.conn.execute("INSERT INTO dirents(parent, name, ino, seq) VALUES (?,?,?,?)", (parent, name, ino, seq))

    def _writable_dir(self, cred: Cred, parent: int) -> InodeRow:
        return self._writable(cred, self.dir_inode(parent))

    @staticmethod
    def _writable(cred: Cred, d: InodeRow) -> InodeRow:
        if d.nlink == 0:
            raise err(errno.ENOENT, "directory was removed")
        posix.require(d, cred, W | X)
        return d

    def _writable_dir_and_child(self, cred: Cred, parent: int, name: str) -> tuple[InodeRow, InodeRow | None]:
        """_writable_dir(parent) and child(parent, name), read by one statement (every
        create, unlink and rename asks both); the directory's errors come first, as before."""
        r = self.conn.execute(_DIR_AND_CHILD, (name, parent)).fetchone()
        if r is None:
            raise err(errno.ENOENT, f"no inode {parent}")
        d = InodeRow(*r[:_N])
        if not stat.S_ISDIR(d.mode):
            raise err(errno.ENOTDIR)
        return self._writable(cred, d), (InodeRow(*r[_N:]) if r[_N] is not None else None)

    def _drop_link(self, row: InodeRow, now: int) -> list[int]:
        """One name of row is gone: decrement nlink, delete the inode at zero. Returns freed blocks.

        A file under a hard write lease outlives its last name until the writer lets go;
        under a soft one (created, never written) it goes now: its writer has nothing to
        lose, and a later write of it fails with ESTALE, as on NFS."""
        nlink = 0 if stat.S_ISDIR(row.mode) else row.nlink - 1
        if nlink > 0 or self._hard_lease(row):
            self.conn.execute("UPDATE inodes SET nlink=?, ctime_ns=? WHERE ino=?", (max(nlink, 0), now, row.ino))
            return []
        return self._delete_inode(row.ino, row)

    def _check_removable(self, cred: Cred, d: InodeRow, victim: InodeRow) -> None:
        if not posix.sticky_ok(d, victim, cred):
            raise err(errno.EPERM, "sticky directory")

    # ------------------------------------------------------------------ mutations
    @applies(Mknod)
    def op_mknod(self, rec: Mknod) -> Result:
        return self.make_node(rec)

    def make_node(self, rec: Mknod, lease: tuple[str, int] | None = None) -> Result:
        """Mknod; lease (client, expiry ms): a new regular file is made with that client's
        soft write lease (a create) in its lease columns, by the same INSERT, and no
        writers row (files.py _own_row: a file's only lease is its inode's until another
        joins it); the result then also has lease_id and lease_expiry_ms.  The new inode's
        row is returned as it was inserted, not read back."""
        cred, now = rec.cred, rec.now_ns
        parent, name, mode = rec.parent, rec.name, rec.mode
        posix.check_name(name)
        d, existing = self._writable_dir_and_child(cred, parent, name)
        if existing is not None:
            if rec.exclusive or not stat.S_ISREG(mode):
                raise err(errno.EEXIST)
            if stat.S_ISDIR(existing.mode):
                raise err(errno.EISDIR)   # open(O_CREAT) of a directory
            if not stat.S_ISREG(existing.mode):
                raise err(errno.EEXIST)
            return {"attr": existing, "created": False}
        ftype = stat.S_IFMT(mode) or stat.S_IFREG
        if ftype not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK, stat.S_IFIFO, stat.S_IFSOCK,
                         stat.S_IFCHR, stat.S_IFBLK):
            raise err(errno.EINVAL, "bad file type")
        if ftype in (stat.S_IFCHR, stat.S_IFBLK) and not cred.root:
            raise err(errno.EPERM)
        default = acl.stored(d.default_acl) if ftype != stat.S_IFLNK else None
        if ftype == stat.S_IFLNK:
            perm = 0o777
        elif default is not None:   # POSIX.1e: the default ACL, not the umask, limits the mode
            perm = mode & 0o7777
        else:
            perm = (mode & 0o7777) & ~rec.umask
        access: acl.Acl | None = None
        if default is not None:
            access, perm = acl.inherit(default, perm)
        gid, full = posix.new_owner(d, cred, ftype | perm)
        leased = lease is not None and ftype == stat.S_IFREG
        taken = self.counters("next_ino", "next_seq", *(("next_lease",) if leased else ()))
        ino = taken["next_ino"]
        target = rec.target or None
        if ftype == stat.S_IFLNK:
            if not target or len(target.encode("utf-8", "surrogateescape")) >= 4096:
                raise err(errno.ENAMETOOLONG if target else errno.ENOENT)
        size = DIR_SIZE if ftype == stat.S_IFDIR else len(target.encode("utf-8", "surrogateescape")) if target else 0
        block_size = rec.block_size or d.block_size or self.default_block_size
        if d.kv and ftype == stat.S_IFREG and not rec.block_size:   # a KV chunk is one block
            block_size = max(block_size, KV_BLOCK_SIZE)
        if rec.block_size and not (MIN_BLOCK <= block_size <= MAX_BLOCK and block_size % MIN_BLOCK == 0):
            raise err(errno.EINVAL, f"block size {block_size}: must be a multiple of 4 KiB up to 1 GiB")
        client, expiry = lease if lease is not None and leased else ("", 0)
        row = InodeRow(ino, full, cred.uid, gid, size, 2 if ftype == stat.S_IFDIR else 1, now, now, now, rec.rdev,
                       block_size, d.replicas or self.default_replicas, 1, 0, taken.get("next_lease", 0), client,
                       expiry, access.to_bytes() if access is not None else None,
                       d.default_acl if ftype == stat.S_IFDIR else None,
                       d.kv if ftype in (stat.S_IFREG, stat.S_IFDIR) else 0, 0, target)
        self.conn.execute(_INSERT_INODE, _values(row))
        self._add_entry(parent, name, ino, taken["next_seq"])
        parent_row = self._touched(parent, now, 1 if ftype == stat.S_IFDIR else 0)
        self.ufs_new_entry(parent, name, ino, ftype, now)
        made: Result = {"attr": row, "created": True, "dirs": [parent_row]}
        if row.lease_id:
            made["lease_id"], made["lease_expiry_ms"] = row.lease_id, expiry
        return made

    @applies(Link)
    def op_link(self, rec: Link) -> Result:
        cred, now = rec.cred, rec.now_ns
        posix.check_name(rec.new_name)
        row = self.inode(rec.ino)
        if stat.S_ISDIR(row.mode):
            raise err(errno.EPERM, "hard links to directories are not allowed")
        self._writable_dir(cred, rec.new_parent)
        if self.child(rec.new_parent, rec.new_name) is not None:
            raise err(errno.EEXIST)
        if row.nlink == 0:
            raise err(errno.ENOENT)
        self.ufs_linked(row.ino, rec.new_parent)
        self._add_entry(rec.new_parent, rec.new_name, row.ino)
        self.conn.execute("UPDATE inodes SET nlink=nlink+1, ctime_ns=? WHERE ino=?", (now, row.ino))
        return {"attr": self.inode(row.ino), "dirs": [self._touched(rec.new_parent, now)]}

    @applies(Unlink)
    def op_unlink(self, rec: Unlink) -> Result:
        cred, now = rec.cred, rec.now_ns
        posix.check_name(rec.name)
        d, victim = self._writable_dir_and_child(cred, rec.parent, rec.name)
        if victim is None:
            raise err(errno.ENOENT)
        if stat.S_ISDIR(victim.mode):
            raise err(errno.EISDIR)
        self._check_removable(cred, d, victim)
        if _kept(rec.keep, victim):
            return {"freed": [], "kept": True}
        self.conn.execute(DELETE_NAME, (rec.parent, rec.name))
        freed = self._drop_link(victim, now)
        return {"freed": freed, "dirs": [self._touched(rec.parent, now)]}

    @applies(Rmdir)
    def op_rmdir(self, rec: Rmdir) -> Result:
        cred, now = rec.cred, rec.now_ns
        if rec.name == ".":
            raise err(errno.EINVAL)
        if rec.name == "..":
            raise err(errno.ENOTEMPTY)
        posix.check_name(rec.name)
        d, victim = self._writable_dir_and_child(cred, rec.parent, rec.name)
        if victim is None:
            raise err(errno.ENOENT)
        if not stat.S_ISDIR(victim.mode):
            raise err(errno.ENOTDIR)
        if not self.is_empty_dir(victim.ino):
            raise err(errno.ENOTEMPTY)
        self._check_removable(cred, d, victim)
        self.conn.execute(DELETE_NAME, (rec.parent, rec.name))
        freed = self._delete_inode(victim.ino, victim)
        return {"freed": freed, "dirs": [self._touched(rec.parent, now, -1)]}

    def _is_ancestor(self, anc: int, ino: int) -> bool:
        """Is anc an ancestor of (or equal to) directory ino?"""
        seen = 0
        while True:
            if ino == anc:
                return True
            if ino == ROOT_INO or seen > 100000:
                return False
            ino = self.parent_of_dir(ino)
            seen += 1

    @applies(Rename)
    def op_rename(self, rec: Rename) -> Result:
        cred, now = rec.cred, rec.now_ns
        sp, sn, dp, dn, flags = rec.parent, rec.name, rec.new_parent, rec.new_name, rec.flags
        posix.check_name(sn)
        posix.check_name(dn)
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) or flags == RENAME_NOREPLACE | RENAME_EXCHANGE:
            raise err(errno.EINVAL, "bad rename flags")
        sd, src = self._writable_dir_and_child(cred, sp, sn)
        dd = sd if dp == sp else self._writable_dir(cred, dp)
        if src is None:
            raise err(errno.ENOENT)
        dst = self.child(dp, dn)
        self._check_removable(cred, sd, src)
        if flags & RENAME_EXCHANGE:
            return self._exchange(cred, rec, src, dst, dd)
        if dst is not None and flags & RENAME_NOREPLACE:
            raise err(errno.EEXIST)
        if dst is not None and dst.ino == src.ino:
            return {"freed": [], "dirs": self._dirs(sp, dp)}
        src_dir = stat.S_ISDIR(src.mode)
        if src_dir:
            if self._is_ancestor(src.ino, dp):
                raise err(errno.EINVAL, "cannot move a directory into itself")
            if sp != dp:
                posix.require(src, cred, W)
        self.ufs_renamed(src, sp, dp, dn)
        freed: list[int] = []
        moved = 1 if src_dir and sp != dp else 0
        links = {sp: -moved, dp: moved} if sp != dp else {sp: 0}   # each directory's nlink change
        if dst is not None:
            self._check_removable(cred, dd, dst)
            if src_dir and not stat.S_ISDIR(dst.mode):
                raise err(errno.ENOTDIR)
            if not src_dir and stat.S_ISDIR(dst.mode):
                raise err(errno.EISDIR)
            if stat.S_ISDIR(dst.mode):
                if not self.is_empty_dir(dst.ino):
                    raise err(errno.ENOTEMPTY)
                links[dp] -= 1
            elif _kept(rec.keep, dst):
                return {"freed": [], "kept": True}
            self.conn.execute(DELETE_NAME, (dp, dn))
            freed = self._drop_link(dst, now)
        # the entry moves in one statement (the change triggers see its old and its new name)
        self.conn.execute("UPDATE dirents SET parent=?1, name=?2, seq=?3 WHERE " + NAME_AT.format(a=4, b=5),
                          (dp, dn, self.counter("next_seq"), sp, sn))
        self.conn.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (now, src.ino))
        return {"freed": freed, "dirs": [self._touched(ino, now, delta) for ino, delta in links.items()]}

    def _exchange(self, cred: Cred, rec: Rename, src: InodeRow, dst: InodeRow | None, dd: InodeRow) -> Result:
        if dst is None:
            raise err(errno.ENOENT)
        self._check_removable(cred, dd, dst)
        sp, dp, now = rec.parent, rec.new_parent, rec.now_ns
        if self.ufs_dir(sp) is not None or self.ufs_dir(dp) is not None:
            raise err(errno.EXDEV, "RENAME_EXCHANGE under a UFS mount")
        for a, b in ((src, dp), (dst, sp)):
            if stat.S_ISDIR(a.mode) and self._is_ancestor(a.ino, b) and sp != dp:
                raise err(errno.EINVAL, "cannot move a directory into itself")
        self.conn.execute(_SET_INO, (dst.ino, sp, rec.name))
        self.conn.execute(_SET_INO, (src.ino, dp, rec.new_name))
        if sp != dp:
            delta = int(stat.S_ISDIR(src.mode)) - int(stat.S_ISDIR(dst.mode))
            self._touch_dir(sp, now, -delta)
            self._touch_dir(dp, now, delta)
        else:
            self._touch_dir(sp, now)
        self.conn.execute("UPDATE inodes SET ctime_ns=? WHERE ino IN (?, ?)", (now, src.ino, dst.ino))
        return {"freed": [], "dirs": self._dirs(sp, dp)}

    @applies(Setattr)
    def op_setattr(self, rec: Setattr) -> Result:
        cred, now, valid = rec.cred, rec.now_ns, rec.valid
        row = self.inode(rec.ino)
        sets: dict[str, Any] = {}
        freed: list[int] = []
        mode = row.mode
        if valid & SETATTR_MODE:
            if posix.only_clears_suid(row.mode, rec.mode):
                mode = (row.mode & ~0o7777) | (rec.mode & 0o7777)
            else:
                mode = posix.chmod_mode(row, cred, rec.mode)
        if valid & (SETATTR_UID | SETATTR_GID):
            uid = rec.uid if valid & SETATTR_UID else None
            gid = rec.gid if valid & SETATTR_GID else None
            posix.chown_check(row, cred, uid, gid)
            if uid is not None:
                sets["uid"] = uid
            if gid is not None:
                sets["gid"] = gid
            if (uid is not None and uid != row.uid) or (gid is not None and gid != row.gid) or not cred.root:
                mode = posix.clear_suid(mode)
        if valid & SETATTR_SIZE:
            freed = self._setsize(row, cred, rec)
            self.ufs_dirty(row.ino, now)
            sets.update(size=rec.size, mtime_ns=now, generation=row.generation + 1)
            if rec.size != row.size or not cred.root:
                mode = posix.clear_suid(mode, cred)
        self._settimes(row, cred, rec, sets)
        sets["mode"] = mode
        current = acl.stored(row.acl)
        if current is not None and valid & SETATTR_MODE:   # chmod's group bits are the mask's
            sets["acl"] = current.chmod(mode).to_bytes()
        sets["ctime_ns"] = now
        cols = ", ".join(f"{k}=?" for k in sets)
        self.conn.execute(f"UPDATE inodes SET {cols} WHERE ino=?", (*sets.values(), row.ino))
        return {"attr": self.inode(row.ino), "freed": freed}

    def _setsize(self, row: InodeRow, cred: Cred, rec: Setattr) -> list[int]:
        if stat.S_ISDIR(row.mode):
            raise err(errno.EISDIR)
        if not stat.S_ISREG(row.mode):
            raise err(errno.EINVAL)
        if rec.size < 0 or rec.size > 1 << 50:
            raise err(errno.EFBIG if rec.size > 0 else errno.EINVAL)
        posix.require(row, cred, W)
        # A truncation starts a new generation: other clients' writers lose their leases
        # (files.py new_generation), so none of their older writes joins the new content.
        freed = self.new_generation(row.ino, keep_client=rec.client_id) if rec.size < row.size else []
        return freed + (self._truncate(row, rec.size) if rec.size < row.size else [])

    def _settimes(self, row: InodeRow, cred: Cred, rec: Setattr, sets: dict[str, Any]) -> None:
        valid, now = rec.valid, rec.now_ns
        explicit = valid & (SETATTR_ATIME | SETATTR_MTIME) and not valid & (SETATTR_ATIME_NOW | SETATTR_MTIME_NOW)
        if valid & (SETATTR_ATIME | SETATTR_MTIME | SETATTR_ATIME_NOW | SETATTR_MTIME_NOW):
            if explicit and not (cred.root or cred.uid == row.uid):
                raise err(errno.EPERM)
            if not explicit and not (cred.root or cred.uid == row.uid
                                     or posix.allowed(row.mode, row.uid, row.gid, cred, W, row.acl)):
                raise err(errno.EACCES)
        if valid & SETATTR_ATIME_NOW:
            sets["atime_ns"] = now
        elif valid & SETATTR_ATIME:
            sets["atime_ns"] = rec.atime_ns
        if valid & SETATTR_MTIME_NOW:
            sets["mtime_ns"] = now
        elif valid & SETATTR_MTIME:
            sets["mtime_ns"] = rec.mtime_ns

    @applies(Setxattr)
    def op_setxattr(self, rec: Setxattr) -> Result:
        cred, name, value = rec.cred, rec.name, rec.value
        row = self.inode(rec.ino)
        self._xattr_access(row, cred, name, write=True)
        if len(value) > XATTR_MAX:
            raise err(errno.E2BIG)
        if name in acl.NAMES:
            return self._set_acl(row, rec)
        if name == KV:
            return self._set_kv(row, rec)
        if name in cachepolicy.POLICY_XATTRS:
            value = cachepolicy.normalize(name, value)
        exists = self.conn.execute("SELECT 1 FROM xattrs WHERE ino=? AND name=?", (row.ino, name)).fetchone()
        if rec.flags & XATTR_CREATE and exists:
            raise err(errno.EEXIST)
        if rec.flags & XATTR_REPLACE and not exists:
            raise err(errno.ENODATA)
        self.conn.execute("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES (?,?,?)", (row.ino, name, value))
        self.conn.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (rec.now_ns, row.ino))
        return {}

    def _set_kv(self, row: InodeRow, rec: Setxattr) -> Result:
        """user.curvine.kv: kept in the inode (inodes.kv, Attr.kv) so that every lookup's
        reply tells a mount a file is a KV chunk; "0" clears it as removexattr does.  What
        is made under a directory later copies it (op_mknod); what is there stays as it is."""
        on = cachepolicy.normalize(KV, rec.value) == b"1"
        if rec.flags & XATTR_CREATE and row.kv:
            raise err(errno.EEXIST)
        if rec.flags & XATTR_REPLACE and not row.kv:
            raise err(errno.ENODATA)
        self.conn.execute("UPDATE inodes SET kv=?, ctime_ns=? WHERE ino=?", (int(on), rec.now_ns, row.ino))
        return {}

    def _set_acl(self, row: InodeRow, rec: Setxattr) -> Result:
        """setfacl: a valid ACL (else EINVAL) becomes the inode's.  An access ACL sets the
        mode's bits (owner, mask or owning group, other) and is kept only when it says more
        than they do; a default ACL only on a directory (EACCES elsewhere, as Linux).  An
        empty ACL removes it.  A caller outside the owning group (not root) drops setgid."""
        column, exists = _ACL_COLUMN[rec.name], bool(getattr(row, _ACL_COLUMN[rec.name]))
        if rec.flags & XATTR_CREATE and exists:
            raise err(errno.EEXIST)
        if rec.flags & XATTR_REPLACE and not exists:
            raise err(errno.ENODATA)
        parsed = acl.parse(bytes(rec.value))
        sets: dict[str, Any] = {"ctime_ns": rec.now_ns}
        if rec.name == acl.DEFAULT:
            if not stat.S_ISDIR(row.mode):
                if parsed is not None:
                    raise err(errno.EACCES, "a default ACL is for directories only")
                return {}
            sets[column] = parsed.to_bytes() if parsed is not None else None
        elif parsed is not None:
            mode = (row.mode & ~0o777) | parsed.mode_bits()
            if not rec.cred.root and not rec.cred.in_group(row.gid):
                mode &= ~stat.S_ISGID
            sets.update(mode=mode, acl=None if parsed.minimal else parsed.to_bytes())
        else:
            sets[column] = None
        cols = ", ".join(f"{k}=?" for k in sets)
        self.conn.execute(f"UPDATE inodes SET {cols} WHERE ino=?", (*sets.values(), row.ino))
        return {}

    @applies(Removexattr)
    def op_removexattr(self, rec: Removexattr) -> Result:
        row = self.inode(rec.ino)
        if rec.name == CAPABILITY_XATTR and not rec.cred.root and rec.cred.uid != row.uid:
            # The kernel drops a file's capability at a write by someone without
            # CAP_FSETID (killpriv), asking the mount as that writer; it refuses the
            # removexattr call itself to anyone without CAP_SETFCAP before it gets here.
            # So whoever may write the file may drop it, as on a local filesystem.
            posix.require(row, rec.cred, W)
        else:
            self._xattr_access(row, rec.cred, rec.name, write=True)
        if rec.name in acl.NAMES:
            if not getattr(row, _ACL_COLUMN[rec.name]):
                raise err(errno.ENODATA)
            self.conn.execute(f"UPDATE inodes SET {_ACL_COLUMN[rec.name]}=NULL, ctime_ns=? WHERE ino=?",
                              (rec.now_ns, row.ino))
            return {}
        if rec.name == KV:
            if not row.kv:
                raise err(errno.ENODATA)
            self.conn.execute("UPDATE inodes SET kv=0, ctime_ns=? WHERE ino=?", (rec.now_ns, row.ino))
            return {}
        if self.conn.execute("DELETE FROM xattrs WHERE ino=? AND name=?", (row.ino, rec.name)).rowcount == 0:
            raise err(errno.ENODATA)
        self.conn.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (rec.now_ns, row.ino))
        return {}

    @applies(RegisterWorker)
    def op_register_worker(self, rec: RegisterWorker) -> Result:
        r = self.conn.execute("SELECT worker_id FROM workers WHERE storage_id=?", (rec.storage_id,)).fetchone()
        if r is not None:
            self.conn.execute("UPDATE workers SET host=? WHERE storage_id=?", (rec.host, rec.storage_id))
            return {"worker_id": r[0]}
        wid = self.counter("next_worker")
        self.conn.execute("INSERT INTO workers(storage_id, worker_id, host) VALUES (?,?,?)",
                          (rec.storage_id, wid, rec.host))
        return {"worker_id": wid}


handlers(Namespace)   # every record type has its op method: checked at import
