"""File data in the namespace: write leases, block allocation, commits, truncation.

Part of the op-record machinery of ``namespace.py`` (``Namespace`` inherits these ops);
kept apart because it is about one file's blocks and its writers, not about names.

Several clients may write one file at once (docs/posix.md "Several writers"): each holds
a write lease of its own (a ``writers`` row; a file's only lease, until a second one joins
it, only the inode's lease columns: ``_own_row``); a commit merges the caller's blocks per
block slot (the last commit wins a slot) and only grows the size, unless it carries the
writer's truncation.  A truncation (an ``O_TRUNC`` open, a truncating setattr, a commit
with ``truncate_to``) starts a new generation of the content: every other writer of the
file loses its lease, so its commit gets ``ESTALE`` and its uncommitted blocks are freed
-- two writers that each truncated never leave a mix of their bytes.  The inode's own
lease columns summarize its writers (any live one's id, the latest expiry, ``complete``
0 while one is hard) for the modules that only ask "is it being written".
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import replace
from typing import Callable

from curvine_py.common.errors import err
from curvine_py.master import posix
from curvine_py.master.handlers import applies
from curvine_py.master.posix import W
from curvine_py.master.records import Allocate, Commit, Create, ExpireLeases, Mknod, OpenWrite, Renew
from curvine_py.master.store import INODE_COLS, RETURNING, InodeRow, Result, Store, to_i64

_SET_LEASE = "UPDATE inodes SET lease_id=?, lease_client=?, lease_expiry_ms=?, complete=? WHERE ino=?"
EXPIRE_BATCH = 2000   # lapsed hard leases released per record (each may free blocks, delete an inode)


class FileOps(Store):
    """op_create, op_open_write, op_allocate, op_commit, op_renew, op_expire_leases."""

    default_block_size: int
    make_node: Callable[..., Result]   # namespace.py's: a create makes its name (and its lease) first

    def ufs_dirty(self, ino: int, now: int) -> None:
        """Mark a UFS file's pool copy newer than its UFS copy (ufsops.py overrides)."""

    def _truncate(self, row: InodeRow, size: int) -> list[int]:
        """Drop block slots past size and shorten the boundary block; returns freed blocks."""
        bs = row.block_size or self.default_block_size
        keep = (size + bs - 1) // bs
        freed = [r[0] for r in self.conn.execute(
            "SELECT block_id FROM blocks WHERE ino=? AND idx>=?", (row.ino, keep))]
        self.conn.execute("DELETE FROM blocks WHERE ino=? AND idx>=?", (row.ino, keep))
        if size % bs:
            self.conn.execute("UPDATE blocks SET length=min(length, ?) WHERE ino=? AND idx=?",
                              (size % bs, row.ino, keep - 1))
        return freed

    @staticmethod
    def _hard_lease(row: InodeRow) -> bool:
        """A writer holds the file (a soft lease -- one held with complete=1 -- binds nobody)."""
        return bool(row.lease_id) and not row.complete

    def is_writer(self, ino: int, lease_id: int, client: str) -> bool:
        """Does client hold lease_id, a live write lease of ino (a writers row, or a soft
        lease the inode's columns hold alone)?"""
        return bool(lease_id) and self.conn.execute(
            "SELECT 1 FROM writers WHERE lease_id=? AND ino=? AND client=?"
            " UNION ALL SELECT 1 FROM inodes WHERE ino=? AND lease_id=? AND lease_client=?",
            (lease_id, ino, client, ino, lease_id, client)).fetchone() is not None

    def _own_row(self, ino: int) -> None:
        """A file's only lease is kept in its inode's lease columns alone: a create writes
        no writers row, nor does its writer's first allocate, nor its close delete one
        (three b-trees, three WAL pages each time); most files are written by one client.
        Before anything reads or adds writers rows of ino (another client's lease, a
        truncation) such a lease gets its row, so that it counts as every other writer
        does.  (A store from before writers rows holds such leases too.)"""
        self.conn.execute("INSERT INTO writers(lease_id, ino, client, expiry_ms, hard)"
                          " SELECT lease_id, ino, lease_client, lease_expiry_ms, 1 - complete FROM inodes"
                          " WHERE ino=? AND lease_id != 0 AND NOT EXISTS"
                          " (SELECT 1 FROM writers w WHERE w.lease_id = inodes.lease_id)", (ino,))

    def _summarize(self, ino: int) -> InodeRow | None:
        """Set the inode's lease columns from its writers: the newest one's id and client,
        the latest expiry, complete unless one is hard; all cleared when none is left.
        Returns the inode's row as it is now (None: no such inode), from the same UPDATE."""
        rows = self.conn.execute("SELECT lease_id, client, expiry_ms, hard FROM writers WHERE ino=?"
                                 " ORDER BY lease_id DESC", (ino,)).fetchall()
        if not rows:
            return self._set_lease(ino, 0, "", 0, 1)
        return self._set_lease(ino, rows[0][0], rows[0][1], max(r[2] for r in rows), int(not any(r[3] for r in rows)))

    def _set_lease(self, ino: int, lease: int, client: str, expiry_ms: int, complete: int) -> InodeRow | None:
        """The inode's lease columns set; its row as it is now (UPDATE ... RETURNING), None if gone."""
        args = (lease, client, expiry_ms, complete, ino)
        if RETURNING:
            r = self.conn.execute(_SET_LEASE + f" RETURNING {INODE_COLS}", args).fetchone()
            return InodeRow(*r) if r is not None else None
        self.conn.execute(_SET_LEASE, args)
        return self.inode(ino) if self._exists(ino) else None

    def new_generation(self, ino: int, keep: int = 0, keep_client: str = "") -> list[int]:
        """A truncation: every writer of ino but lease keep (and keep_client's) loses its
        lease; their uncommitted blocks are returned, to be freed.  Their commits then get
        ESTALE: their writes began under the content the truncation replaced."""
        freed: list[int] = []
        self._own_row(ino)
        others = self.conn.execute("SELECT lease_id FROM writers WHERE ino=? AND lease_id != ? AND client != ?",
                                   (ino, keep, keep_client)).fetchall()
        for (lease,) in others:
            freed += self._drop_writer(ino, lease)
        if others:
            self._summarize(ino)
        return freed

    def _drop_writer(self, ino: int, lease: int) -> list[int]:
        """Forget one writer: its row and its allocated, uncommitted blocks (returned)."""
        if RETURNING:
            freed = [r[0] for r in self.conn.execute("DELETE FROM pending_blocks WHERE ino=? AND lease_id=?"
                                                     " RETURNING block_id", (ino, lease)).fetchall()]
        else:
            freed = [r[0] for r in self.conn.execute("SELECT block_id FROM pending_blocks WHERE ino=? AND lease_id=?",
                                                     (ino, lease))]
            self.conn.execute("DELETE FROM pending_blocks WHERE ino=? AND lease_id=?", (ino, lease))
        self.conn.execute("DELETE FROM writers WHERE lease_id=?", (lease,))
        return freed

    @applies(Create)
    def op_create(self, rec: Create) -> Result:
        """mknod of a regular file (or open of an existing one) plus the write lease.  A new
        file gets its creator's soft lease in its own INSERT (make_node): what _grant_lease
        would give it, without looking for a lease of a file that did not exist."""
        made = self.make_node(Mknod.of_checked(**rec.envelope(), parent=rec.parent, name=rec.name,
                                               mode=stat.S_IFREG | (rec.mode & 0o7777), umask=rec.umask,
                                               exclusive=rec.exclusive, block_size=rec.block_size),
                              lease=(rec.client_id, rec.now_ns // 1_000_000 + rec.lease_ms))
        row = made["attr"]
        if not made["created"]:
            return self.op_open_write(OpenWrite(**rec.envelope(), ino=row.ino, lease_ms=rec.lease_ms,
                                                flags=rec.flags))
        return {"attr": row, "lease_id": made["lease_id"], "lease_expiry_ms": made["lease_expiry_ms"], "freed": [],
                "soft": True, "dirs": made["dirs"]}

    @applies(OpenWrite)
    def op_open_write(self, rec: OpenWrite) -> Result:
        cred = rec.cred
        row = self.inode(rec.ino)
        if stat.S_ISDIR(row.mode):
            raise err(errno.EISDIR)
        if not stat.S_ISREG(row.mode):
            raise err(errno.EINVAL, "not a regular file")
        posix.require(row, cred, W)
        freed: list[int] = []
        if rec.flags & os.O_TRUNC:   # a new generation: other writers' uncommitted bytes never join it
            granted = self._grant_lease(row, rec.client_id, rec.now_ns, rec.lease_ms, freed)
            freed += self.new_generation(row.ino, keep=granted["lease_id"])
            if row.size:
                freed += self._truncate(row, 0)
                self.conn.execute("UPDATE inodes SET size=0, mtime_ns=?, ctime_ns=?, generation=generation+1,"
                                  " mode=? WHERE ino=?", (rec.now_ns, rec.now_ns,
                                                          posix.clear_suid(row.mode, cred), row.ino))
                self.ufs_dirty(row.ino, rec.now_ns)
            return {**granted, "attr": self.inode(row.ino), "freed": freed}
        return self._grant_lease(row, rec.client_id, rec.now_ns, rec.lease_ms, freed)

    def _grant_lease(self, row: InodeRow, client: str, now_ns: int, lease_ms: int, freed: list[int],
                     soft: bool = False) -> Result:
        """A write lease of the client's own, beside any other clients' (its own live one
        is kept).  A soft lease, for the creator of a new file, leaves the file complete: it
        binds nobody until its first allocate or commit (_leased), so a file created and
        closed unwritten needs no commit -- the lease just lapses."""
        now_ms, ino = now_ns // 1_000_000, row.ino
        self._own_row(ino)
        own = self.conn.execute("SELECT lease_id, hard FROM writers WHERE ino=? AND client=? AND expiry_ms > ?"
                                " ORDER BY lease_id DESC LIMIT 1", (ino, client, now_ms)).fetchone()
        lease = own[0] if own is not None else self.counter("next_lease")
        expiry = now_ms + lease_ms
        hard = int(not soft or (own is not None and own[1]))
        self.conn.execute("INSERT OR REPLACE INTO writers(lease_id, ino, client, expiry_ms, hard) VALUES (?,?,?,?,?)",
                          (lease, ino, client, expiry, hard))
        self._summarize(ino)
        return {"attr": self.inode(ino), "lease_id": lease, "lease_expiry_ms": expiry, "freed": freed,
                "soft": not hard}

    def _leased(self, rec: Allocate | Commit) -> InodeRow:
        """The file under the caller's lease, which this use makes hard (the file incomplete).
        ESTALE when the lease is gone: lapsed, or ended by another client's truncation."""
        row = self.inode(rec.ino)
        hard = self.conn.execute("SELECT hard, client FROM writers WHERE lease_id=? AND ino=?",
                                 (rec.lease_id, rec.ino)).fetchone()
        if hard is None and rec.lease_id and row.lease_id == rec.lease_id and row.lease_client == rec.client_id:
            # the file's only lease, which its inode holds alone (_own_row): made hard in place
            if row.complete:
                made = self._set_lease(rec.ino, rec.lease_id, row.lease_client, row.lease_expiry_ms, 0)
                assert made is not None   # (read above, in this transaction)
                return made
            return row
        if hard is None and rec.lease_id and row.lease_id == rec.lease_id:
            hard = (0, row.lease_client)   # another client's: EACCES below
        if hard is None:
            raise err(errno.ESTALE, "write lease lost (expired, or the file was truncated by another writer "
                                    "meanwhile: its writes since its last commit are dropped); reopen the file")
        if hard[1] != rec.client_id:   # (lease ids are a counter: one must not be usable by whoever guesses it)
            raise err(errno.EACCES, f"write lease {rec.lease_id} of inode {rec.ino} is another client's")
        if not hard[0]:
            self.conn.execute("UPDATE writers SET hard=1 WHERE lease_id=?", (rec.lease_id,))
            self._summarize(rec.ino)
            row = self.inode(rec.ino)
        return row

    @applies(Allocate)
    def op_allocate(self, rec: Allocate) -> Result:
        row = self._leased(rec)
        count = rec.count
        if not 1 <= count <= 1024:
            raise err(errno.EINVAL, "block count out of range")
        first = self.counter("next_block", count)
        ids = list(range(first, first + count))
        self.conn.executemany("INSERT INTO pending_blocks(block_id, ino, lease_id) VALUES (?,?,?)",
                              [(b, row.ino, rec.lease_id) for b in ids])
        return {"block_ids": ids, "block_size": row.block_size, "replicas": row.replicas}

    @applies(Commit)
    def op_commit(self, rec: Commit) -> Result:
        """Merge a writer's changes since its last commit; on release give up its lease.

        Per block slot, the last commit wins: each block replaces what its slot held, the
        other slots keep what other writers committed.  The size only grows (_merged_size),
        unless the writer truncated (truncate_to >= 0): then the file is first cut there --
        a new generation, which ends every other writer's lease -- and its size is the
        writer's, exactly."""
        row = self._leased(rec)
        ino, bs = row.ino, row.block_size or self.default_block_size
        freed: list[int] = []
        truncated = rec.truncate_to >= 0
        if truncated:
            freed += self._truncate(row, rec.truncate_to) + self.new_generation(ino, keep=rec.lease_id)
        size = rec.size if truncated else self._merged_size(ino, bs, row.size, rec)
        for b in rec.blocks:
            bid, idx = b.block_id, b.offset // bs
            if b.offset % bs or b.length > bs:
                raise err(errno.EINVAL, f"block {bid} does not fit the file's block size {bs}")
            if self.conn.execute("DELETE FROM pending_blocks WHERE block_id=? AND ino=? AND lease_id=?",
                                 (bid, ino, rec.lease_id)).rowcount != 1:
                raise err(errno.EINVAL, f"block {bid} was not allocated to this file under this lease")
            if self.conn.execute("INSERT INTO blocks(ino, idx, block_id, length, checksum) VALUES (?,?,?,?,?)"
                                 " ON CONFLICT(ino, idx) DO NOTHING",
                                 (ino, idx, bid, b.length, to_i64(b.checksum))).rowcount == 1:
                continue   # a new slot (a new file's: no SELECT of what it held first)
            # the slot's block is replaced: an UPDATE, not INSERT OR REPLACE, whose delete fires no trigger
            # (schema.COUNTS)
            old = self.conn.execute("SELECT block_id FROM blocks WHERE ino=? AND idx=?", (ino, idx)).fetchone()
            freed.append(old[0])
            self.conn.execute("UPDATE blocks SET block_id=?, length=?, checksum=? WHERE ino=? AND idx=?",
                              (bid, b.length, to_i64(b.checksum), ino, idx))
        freed += self._punch(ino, rec.holes)
        if truncated:   # (the writer's blocks end at its size; anything past it goes)
            freed += self._truncate(row, size)
        if rec.blocks or rec.holes or size != row.size or rec.mtime_ns:
            mtime = rec.mtime_ns or rec.now_ns
            mode = posix.clear_suid(row.mode, rec.cred) if rec.blocks or rec.holes else row.mode
            self.conn.execute("UPDATE inodes SET size=?, mtime_ns=?, ctime_ns=?, generation=generation+1, mode=?"
                              " WHERE ino=?", (size, mtime, rec.now_ns, mode, ino))
            self.ufs_dirty(ino, rec.now_ns)
        if rec.release:
            dropped, left = self._release_row(ino, rec.lease_id)
            return {"attr": left if left is not None else replace(row, nlink=0), "freed": freed + dropped}
        return {"attr": self.inode(ino), "freed": freed}

    def _merged_size(self, ino: int, bs: int, old: int, rec: Commit) -> int:
        """The larger of the writer's size and the file's -- but when this commit replaces
        the block the file ends in, that block is the writer's, and so is where the file
        ends in it: then the file's part is only what its other blocks hold.  (Two writers
        of a short file: "other" then "mine" leaves "mine", not "mine" and a zero.)"""
        slots = {b.offset // bs for b in rec.blocks}
        if old and (old - 1) // bs in slots:
            ends = [r[0] * bs + r[1] for r in self.conn.execute("SELECT idx, length FROM blocks WHERE ino=?", (ino,))
                    if r[0] not in slots]
            old = max(ends, default=0)
        return max(rec.size, old)

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

    def _release(self, ino: int, lease: int) -> list[int]:
        """Drop one writer's lease; blocks it allocated but never committed are orphans."""
        return self._release_row(ino, lease)[0]

    def _release_row(self, ino: int, lease: int) -> tuple[list[int], InodeRow | None]:
        """_release, and the inode's row as it is left (None: gone)."""
        freed = self._drop_writer(ino, lease)
        more, row = self._settle_row(ino)
        return freed + more, row

    def _settle(self, ino: int) -> list[int]:
        """After a writer left: the inode's lease columns again; an unlinked file with no
        writer left goes."""
        return self._settle_row(ino)[0]

    def _settle_row(self, ino: int) -> tuple[list[int], InodeRow | None]:
        """_settle, and the inode's row as it is left (None: gone)."""
        row = self._summarize(ino)
        if row is not None and row.nlink == 0 and not row.lease_id:
            return self._delete_inode(ino, row), None
        return [], row

    @applies(Renew)
    def op_renew(self, rec: Renew) -> Result:
        now_ms = rec.now_ns // 1_000_000
        expiry = now_ms + rec.lease_ms
        expired = []
        for lease in rec.lease_ids:
            n = self.conn.execute("UPDATE writers SET expiry_ms=? WHERE lease_id=? AND client=?",
                                  (expiry, lease, rec.client_id)).rowcount
            if n == 0:   # a soft lease in its inode alone (_own_row): found among the live leases' index
                n = self.conn.execute("UPDATE inodes SET lease_expiry_ms=max(lease_expiry_ms, ?)"
                                      " WHERE lease_id=? AND lease_id != 0 AND lease_client=?",
                                      (expiry, lease, rec.client_id)).rowcount
                if n == 0:
                    expired.append(lease)
                continue
            self.conn.execute("UPDATE inodes SET lease_expiry_ms=max(lease_expiry_ms, ?)"
                              " WHERE ino=(SELECT ino FROM writers WHERE lease_id=?)", (expiry, lease))
        return {"expired": expired}

    @applies(ExpireLeases)
    def op_expire_leases(self, rec: ExpireLeases) -> Result:
        """Release lapsed leases: soft ones all at once (nothing allocated under them; those
        an inode holds alone too, _own_row), then up to EXPIRE_BATCH hard ones, then up to
        EXPIRE_BATCH hard ones held by their inodes alone."""
        now_ms = rec.now_ns // 1_000_000
        freed: list[int] = []
        soft = [r[0] for r in self.conn.execute("SELECT DISTINCT ino FROM writers WHERE hard=0 AND expiry_ms < ?",
                                                (now_ms,))]
        self.conn.execute("DELETE FROM writers WHERE hard=0 AND expiry_ms < ?", (now_ms,))
        soft += [r[0] for r in self.conn.execute(
            "SELECT ino FROM inodes WHERE lease_id != 0 AND complete = 1 AND lease_expiry_ms < ? AND NOT EXISTS"
            " (SELECT 1 FROM writers w WHERE w.ino = inodes.ino)", (now_ms,))]
        for ino in dict.fromkeys(soft):
            freed += self._settle(ino)
        for lease, ino in self.conn.execute("SELECT lease_id, ino FROM writers WHERE expiry_ms < ?"
                                            " ORDER BY expiry_ms, lease_id LIMIT ?", (now_ms, EXPIRE_BATCH)).fetchall():
            freed += self._release(ino, lease)
        for ino, lease in self.conn.execute(
                "SELECT ino, lease_id FROM inodes WHERE lease_id != 0 AND lease_expiry_ms < ? AND NOT EXISTS"
                " (SELECT 1 FROM writers w WHERE w.ino = inodes.ino) LIMIT ?", (now_ms, EXPIRE_BATCH)).fetchall():
            freed += self._release(ino, lease)
        return {"freed": freed}
