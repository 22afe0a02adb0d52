"""File data in the namespace: write leases, block allocation, commits, truncation.

Part of the op-record machinery of ``namespace.py`` (``Namespace`` inherits these ops);
kept apart because it is about one file's blocks and its writer, not about names.
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Callable

from curvine_py.common.errors import err
from curvine_py.master import posix
from curvine_py.master.handlers import applies
from curvine_py.master.posix import W
from curvine_py.master.records import Allocate, Commit, Create, ExpireLeases, Mknod, OpenWrite, Renew
from curvine_py.master.store import Row, Store, to_i64

EXPIRE_BATCH = 2000   # lapsed hard leases released per record (each may free blocks, delete an inode)


class FileOps(Store):
    """op_create, op_open_write, op_allocate, op_commit, op_renew, op_expire_leases."""

    default_block_size: int
    op_mknod: Callable[[Mknod], Row]   # namespace.py's: a create makes its name first

    def ufs_dirty(self, ino: int, now: int) -> None:
        """Mark a UFS file's pool copy newer than its UFS copy (ufsops.py overrides)."""

    def _truncate(self, row: Row, size: int) -> list[int]:
        """Drop block slots past size and shorten the boundary block; returns freed blocks."""
        bs = row["block_size"] or self.default_block_size
        keep = (size + bs - 1) // bs
        freed = [r[0] for r in self.conn.execute(
            "SELECT block_id FROM blocks WHERE ino=? AND idx>=?", (row["ino"], keep))]
        self.conn.execute("DELETE FROM blocks WHERE ino=? AND idx>=?", (row["ino"], keep))
        if size % bs:
            self.conn.execute("UPDATE blocks SET length=min(length, ?) WHERE ino=? AND idx=?",
                              (size % bs, row["ino"], keep - 1))
        return freed

    @staticmethod
    def _hard_lease(row: Row) -> bool:
        """A writer holds the file (a soft lease -- one held with complete=1 -- binds nobody)."""
        return bool(row["lease_id"]) and not row["complete"]

    def _lease_busy(self, row: Row, client: str, now_ms: int) -> bool:
        """Another client's live, hard lease."""
        return self._hard_lease(row) and row["lease_client"] != client and row["lease_expiry_ms"] > now_ms

    @applies(Create)
    def op_create(self, rec: Create) -> Row:
        """mknod of a regular file (or open of an existing one) plus the write lease."""
        made = self.op_mknod(Mknod(**rec.envelope(), parent=rec.parent, name=rec.name,
                                   mode=stat.S_IFREG | (rec.mode & 0o7777), umask=rec.umask,
                                   exclusive=rec.exclusive, block_size=rec.block_size))
        row = made["attr"]
        if not made["created"]:
            return self.op_open_write(OpenWrite(**rec.envelope(), ino=row["ino"], lease_ms=rec.lease_ms,
                                                flags=rec.flags))
        return {**self._grant_lease(row, rec.client_id, rec.now_ns, rec.lease_ms, [], soft=True),
                "dirs": made["dirs"]}

    @applies(OpenWrite)
    def op_open_write(self, rec: OpenWrite) -> Row:
        cred, now_ms = rec.cred, rec.now_ns // 1_000_000
        row = self.inode(rec.ino)
        if stat.S_ISDIR(row["mode"]):
            raise err(errno.EISDIR)
        if not stat.S_ISREG(row["mode"]):
            raise err(errno.EINVAL, "not a regular file")
        posix.require(row, cred, W)
        if self._lease_busy(row, rec.client_id, now_ms):
            raise err(errno.EBUSY, "file is open for writing on another client")
        freed: list[int] = []
        if rec.flags & os.O_TRUNC and row["size"]:
            freed = self._truncate(row, 0)
            self.conn.execute("UPDATE inodes SET size=0, mtime_ns=?, ctime_ns=?, generation=generation+1,"
                              " mode=? WHERE ino=?", (rec.now_ns, rec.now_ns,
                                                      posix.clear_suid(row["mode"], cred), row["ino"]))
            row = self.inode(row["ino"])
            self.ufs_dirty(row["ino"], rec.now_ns)
        return self._grant_lease(row, rec.client_id, rec.now_ns, rec.lease_ms, freed)

    def _grant_lease(self, row: Row, client: str, now_ns: int, lease_ms: int, freed: list[int],
                     soft: bool = False) -> Row:
        """The write lease (the holder's own live one is kept).  A soft lease, for the creator
        of a new file, leaves the file complete: it binds nobody until its first allocate or
        commit (_leased), so a file created and closed unwritten needs no commit -- the lease
        just lapses -- at the price that another client may take it over meanwhile."""
        now_ms = now_ns // 1_000_000
        if row["lease_id"] and row["lease_client"] == client and row["lease_expiry_ms"] > now_ms:
            lease = row["lease_id"]
        else:
            lease = self.counter("next_lease")
        expiry = now_ms + lease_ms
        self.conn.execute("UPDATE inodes SET lease_id=?, lease_client=?, lease_expiry_ms=?, complete=? WHERE ino=?",
                          (lease, client, expiry, int(soft), row["ino"]))
        return {"attr": self.inode(row["ino"]), "lease_id": lease, "lease_expiry_ms": expiry, "freed": freed,
                "soft": soft}

    def _leased(self, rec: Allocate | Commit) -> Row:
        """The file under the caller's lease, which this use makes hard (the file incomplete)."""
        row = self.inode(rec.ino)
        if not row["lease_id"] or row["lease_id"] != rec.lease_id:
            raise err(errno.ESTALE, "write lease lost (expired or taken over); reopen the file")
        if row["complete"]:
            self.conn.execute("UPDATE inodes SET complete=0 WHERE ino=?", (row["ino"],))
            row = {**row, "complete": 0}
        return row

    @applies(Allocate)
    def op_allocate(self, rec: Allocate) -> Row:
        row = self._leased(rec)
        count = rec.count
        if not 1 <= count <= 1024:
            raise err(errno.EINVAL, "block count out of range")
        first = self.counter("next_block", count)
        ids = list(range(first, first + count))
        self.conn.executemany("INSERT INTO pending_blocks(block_id, ino, lease_id) VALUES (?,?,?)",
                              [(b, row["ino"], rec.lease_id) for b in ids])
        return {"block_ids": ids, "block_size": row["block_size"], "replicas": row["replicas"]}

    @applies(Commit)
    def op_commit(self, rec: Commit) -> Row:
        """Install written blocks, set the size; on release give up the lease."""
        row = self._leased(rec)
        ino, bs, size = row["ino"], row["block_size"] or self.default_block_size, rec.size
        freed: list[int] = []
        for b in rec.blocks:
            bid, idx = b.block_id, b.offset // bs
            if b.offset % bs or b.length > bs:
                raise err(errno.EINVAL, f"block {bid} does not fit the file's block size {bs}")
            if self.conn.execute("DELETE FROM pending_blocks WHERE block_id=? AND ino=?", (bid, ino)).rowcount != 1:
                raise err(errno.EINVAL, f"block {bid} was not allocated to this file")
            old = self.conn.execute("SELECT block_id FROM blocks WHERE ino=? AND idx=?", (ino, idx)).fetchone()
            if old is not None:   # an UPDATE, not INSERT OR REPLACE: its delete fires no trigger (schema.COUNTS)
                freed.append(old[0])
                self.conn.execute("UPDATE blocks SET block_id=?, length=?, checksum=? WHERE ino=? AND idx=?",
                                  (bid, b.length, to_i64(b.checksum), ino, idx))
            else:
                self.conn.execute("INSERT INTO blocks(ino, idx, block_id, length, checksum) VALUES (?,?,?,?,?)",
                                  (ino, idx, bid, b.length, to_i64(b.checksum)))
        freed += self._punch(ino, rec.holes)
        if size < row["size"] or rec.blocks:
            freed += self._truncate(row, size)
        if rec.blocks or rec.holes or size != row["size"] or rec.mtime_ns:
            mtime = rec.mtime_ns or rec.now_ns
            mode = posix.clear_suid(row["mode"], rec.cred) if rec.blocks or rec.holes else row["mode"]
            self.conn.execute("UPDATE inodes SET size=?, mtime_ns=?, ctime_ns=?, generation=generation+1, mode=?"
                              " WHERE ino=?", (size, mtime, rec.now_ns, mode, ino))
            self.ufs_dirty(ino, rec.now_ns)
        if rec.release:
            freed += self._release(ino)
        return {"attr": self.inode(ino) if self._exists(ino) else {**row, "nlink": 0}, "freed": freed}

    def _punch(self, ino: int, holes: tuple[int, ...]) -> list[int]:
        """Empty the slots in holes (fallocate's punch or zero range over a whole block,
        applied after the commit's blocks): each becomes a hole, which every client reads
        as zeros, and its block is returned to be freed on the workers as a deleted
        file's blocks are."""
        freed: list[int] = []
        for idx in holes:
            old = self.conn.execute("SELECT block_id FROM blocks WHERE ino=? AND idx=?", (ino, idx)).fetchone()
            if old is not None:
                freed.append(old[0])
                self.conn.execute("DELETE FROM blocks WHERE ino=? AND idx=?", (ino, idx))
        return freed

    def _exists(self, ino: int) -> bool:
        return self.conn.execute("SELECT 1 FROM inodes WHERE ino=?", (ino,)).fetchone() is not None

    def _release(self, ino: int) -> list[int]:
        """Drop the lease; blocks allocated but never committed are orphans; unlinked files go."""
        freed = [r[0] for r in self.conn.execute("SELECT block_id FROM pending_blocks WHERE ino=?", (ino,))]
        self.conn.execute("DELETE FROM pending_blocks WHERE ino=?", (ino,))
        self.conn.execute("UPDATE inodes SET lease_id=0, lease_client='', lease_expiry_ms=0, complete=1"
                          " WHERE ino=?", (ino,))
        row = self.inode(ino)
        if row["nlink"] == 0:
            freed += self._delete_inode(ino)
        return freed

    @applies(Renew)
    def op_renew(self, rec: Renew) -> Row:
        now_ms = rec.now_ns // 1_000_000
        expired = []
        for lease in rec.lease_ids:
            n = self.conn.execute("UPDATE inodes SET lease_expiry_ms=? WHERE lease_id=? AND lease_client=?",
                                  (now_ms + rec.lease_ms, lease, rec.client_id)).rowcount
            if n == 0:
                expired.append(lease)
        return {"expired": expired}

    @applies(ExpireLeases)
    def op_expire_leases(self, rec: ExpireLeases) -> Row:
        """Release lapsed leases: soft ones all at once (nothing allocated under them, and
        an unlink already took their unlinked files), then up to EXPIRE_BATCH hard ones."""
        now_ms = rec.now_ns // 1_000_000
        self.conn.execute("UPDATE inodes SET lease_id=0, lease_client='', lease_expiry_ms=0"
                          " WHERE lease_id != 0 AND complete = 1 AND lease_expiry_ms < ?", (now_ms,))
        freed: list[int] = []
        for (ino,) in self.conn.execute("SELECT ino FROM inodes WHERE lease_id != 0 AND lease_expiry_ms < ?"
                                        " ORDER BY lease_expiry_ms, ino LIMIT ?", (now_ms, EXPIRE_BATCH)).fetchall():
            freed += self._release(ino)
        return {"freed": freed}
