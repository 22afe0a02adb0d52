"""Op records of UFS mounts: the mount table, what the UFS said, and each file's upload state.

Mixed into ``Namespace`` like the file and cache ops.  Like every op, these depend only
on the record and the tables: the master talks to the UFS *before* it submits a record
(a listing, a HEAD, an upload) and puts what the UFS answered into the record, so a
replay never asks the UFS again.

Tables (docs/formats.md): ``ufs_mounts`` (the mount table), ``ufs_dirs`` (a directory
under a mount: its key and when it was last listed), ``ufs_files`` (a file under a mount:
its key, the version last seen in the UFS, and its state: ``persisted``, ``pending``
(written in the pool, not yet in the UFS) or ``failed``).  A file with a row here keeps
its name when its blocks are evicted or lost: its block slots get fresh ids with no
replica, and the next read fetches them from the UFS again.
"""
from __future__ import annotations

import errno
import json
import stat
import typing

from curvine_py.common.errors import err
from curvine_py.common.policy import TTL
from curvine_py.common.types import DIR_SIZE, ROOT_INO
from curvine_py.master.handlers import applies
from curvine_py.master.records import UfsFree, UfsMount, UfsRefresh, UfsState, UfsSyncDir, UfsUmount
from curvine_py.master.store import (DELETE_NAME, UFS_DIR_COLS, UFS_FILE_COLS, InodeRow, Result, Row, Store, UfsDirRow,
                                     UfsFileRow)

PERSISTED, PENDING, FAILED = "persisted", "pending", "failed"
FILE_MODE, DIR_MODE = stat.S_IFREG | 0o644, stat.S_IFDIR | 0o755


def child_key(parent_key: str, name: str) -> str:
    return f"{parent_key}/{name}" if parent_key else name


class UfsOps(Store):
    """op_ufs_mount, op_ufs_umount, op_ufs_sync_dir, op_ufs_refresh, op_ufs_state, op_ufs_free."""

    default_block_size: int
    default_replicas: int

    if typing.TYPE_CHECKING:   # namespace.py's and files.py's, mixed into Namespace with these ops
        def _touch_dir(self, ino: int, now: int, nlink_delta: int = 0) -> None: ...
        def _add_entry(self, parent: int, name: str, ino: int) -> None: ...
        def _drop_link(self, row: InodeRow, now: int) -> list[int]: ...
        def _exists(self, ino: int) -> bool: ...

    # ------------------------------------------------------------------ lookups
    def ufs_dir(self, ino: int) -> UfsDirRow | None:
        """The UFS row of directory ino (None: not under a mount)."""
        r = self.conn.execute(f"SELECT {UFS_DIR_COLS} FROM ufs_dirs WHERE ino=?", (ino,)).fetchone()
        return UfsDirRow(*r) if r is not None else None

    def ufs_file(self, ino: int) -> UfsFileRow | None:
        r = self.conn.execute(f"SELECT {UFS_FILE_COLS} FROM ufs_files WHERE ino=?", (ino,)).fetchone()
        return UfsFileRow(*r) if r is not None else None

    def ufs_mount(self, mount_id: int) -> Row | None:
        return self.q1("SELECT * FROM ufs_mounts WHERE mount_id=?", (mount_id,))

    def ufs_mounts(self) -> list[Row]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM ufs_mounts ORDER BY path")]

    def ufs_pending(self, limit: int = 100) -> list[UfsFileRow]:
        """Files waiting for an upload, oldest change first."""
        return [UfsFileRow(*r) for r in self.conn.execute(
            f"SELECT {UFS_FILE_COLS} FROM ufs_files WHERE state = ? ORDER BY dirty_ns LIMIT ?", (PENDING, limit))]

    # ------------------------------------------------------------------ mount table
    @applies(UfsMount)
    def op_ufs_mount(self, rec: UfsMount) -> Result:
        """Make the (empty or new) directory rec.path the root of a UFS mount."""
        ino = rec.ino
        self.dir_inode(ino)
        if not self.is_empty_dir(ino):
            raise err(errno.ENOTEMPTY, f"{rec.path} is not empty: a UFS mount needs an empty directory")
        if self.ufs_dir(ino) is not None or self._under_mount(ino):
            raise err(errno.EBUSY, f"{rec.path} is already under a UFS mount")
        if self.q1("SELECT 1 AS x FROM ufs_mounts WHERE path LIKE ? ESCAPE '\\'",
                   (_like_prefix(rec.path),)):
            raise err(errno.EBUSY, f"{rec.path} contains a UFS mount")
        if ino == ROOT_INO:
            raise err(errno.EINVAL, "the root cannot be a UFS mount")
        mid = self.counter("next_mount")
        self.conn.execute(
            "INSERT INTO ufs_mounts(mount_id, path, ino, uri, options, write_mode, metadata_ttl_ms, ttl_ms,"
            " created_ns) VALUES (?,?,?,?,?,?,?,?,?)",
            (mid, rec.path, ino, rec.uri, json.dumps(dict(rec.options), sort_keys=True), rec.write_mode,
             rec.metadata_ttl_ms, rec.ttl_ms, rec.now_ns))
        self.conn.execute("INSERT INTO ufs_dirs(ino, mount_id, ukey, listed_ns) VALUES (?,?,?,0)", (ino, mid, ""))
        if rec.ttl_ms:   # --ttl: the cache policy's TTL on the mount point (cachepolicy.py), which
            # for a UFS file frees its cached blocks, counted from its last read or change
            self.conn.execute("INSERT OR REPLACE INTO xattrs(ino, name, value) VALUES (?,?,?)",
                              (ino, TTL, str(max(1, rec.ttl_ms // 1000)).encode()))
        return {"mount": self.ufs_mount(mid) or {}}   # (inserted above)

    def _under_mount(self, ino: int) -> bool:
        while ino != ROOT_INO:
            ino = self.parent_of_dir(ino)
            if self.ufs_dir(ino) is not None:
                return True
        return False

    @applies(UfsUmount)
    def op_ufs_umount(self, rec: UfsUmount) -> Result:
        """Drop a mount and everything cached under it; the UFS is never touched.  Files not
        yet uploaded are refused unless rec.force (they would be lost)."""
        m = self.q1("SELECT * FROM ufs_mounts WHERE path=?", (rec.path,))
        if m is None:
            raise err(errno.EINVAL, f"{rec.path} is not a UFS mount")
        pending = self.conn.execute("SELECT count(*) FROM ufs_files WHERE mount_id=? AND state != ?",
                                    (m["mount_id"], PERSISTED)).fetchone()[0]
        if pending and not rec.force:
            raise err(errno.EBUSY, f"{pending} files under {rec.path} are not in the UFS yet "
                                   "(wait for their upload, or umount with --force to drop them)")
        freed = self._clear_dir(m["ino"], rec.now_ns)
        self.conn.execute("DELETE FROM ufs_dirs WHERE ino=?", (m["ino"],))
        self.conn.execute("DELETE FROM ufs_mounts WHERE mount_id=?", (m["mount_id"],))
        return {"freed": freed, "mount": m}

    def _clear_dir(self, ino: int, now: int) -> list[int]:
        """Remove everything below directory ino (the directory itself stays)."""
        freed: list[int] = []
        for name, child in self.conn.execute("SELECT name, ino FROM dirents WHERE parent=?", (ino,)).fetchall():
            row = self.inode(child)
            if stat.S_ISDIR(row.mode):
                freed += self._clear_dir(child, now)
                self._touch_dir(ino, now, -1)
            self.conn.execute(DELETE_NAME, (ino, name))
            freed += self._drop_link(row, now)
        return freed

    # ------------------------------------------------------------------ what the UFS said
    @applies(UfsSyncDir)
    def op_ufs_sync_dir(self, rec: UfsSyncDir) -> Result:
        """Reconcile directory rec.ino with its UFS listing rec.entries: new names appear,
        changed objects get fresh blocks, names whose object is gone go (files with unsent
        data stay)."""
        ino, now = rec.ino, rec.now_ns
        d, u = self.dir_inode(ino), self.ufs_dir(ino)
        if u is None:
            return {"freed": []}
        seen: set[str] = set()
        freed: list[int] = []
        for e in rec.entries:
            seen.add(e.name)
            freed += self._sync_entry(d, u, e.name, e.is_dir, e.size, e.mtime_ns, e.etag, now)
        for name, child in self.conn.execute("SELECT name, ino FROM dirents WHERE parent=?", (ino,)).fetchall():
            if name not in seen:
                freed += self._vanished(ino, name, child, now)
        self.conn.execute("UPDATE ufs_dirs SET listed_ns=? WHERE ino=?", (now, ino))
        return {"freed": freed}

    def _sync_entry(self, d: InodeRow, u: UfsDirRow, name: str, is_dir: bool, size: int, mtime_ns: int, etag: str,
                    now: int) -> list[int]:
        row = self.child(d.ino, name)
        if row is None:
            self._adopt(d, u, name, is_dir, size, mtime_ns, etag, now)
            return []
        if not is_dir and stat.S_ISREG(row.mode):
            f = self.ufs_file(row.ino)
            if f is not None and f.state == PERSISTED and f.etag != etag and not row.lease_id:
                return self._replace_data(row, size, mtime_ns, etag, now)
            if f is not None:
                self.conn.execute("UPDATE ufs_files SET checked_ns=? WHERE ino=?", (now, row.ino))
        return []

    def _adopt(self, d: InodeRow, u: UfsDirRow, name: str, is_dir: bool, size: int, mtime_ns: int, etag: str,
               now: int) -> int:
        """A name the UFS has and the pool did not: a file with uncached blocks, or a directory."""
        ino = self.counter("next_ino")
        mode = DIR_MODE if is_dir else FILE_MODE
        bs = d.block_size or self.default_block_size
        mtime = mtime_ns or now
        self.conn.execute(
            "INSERT INTO inodes(ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns, block_size, replicas)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (ino, mode, d.uid, d.gid, DIR_SIZE if is_dir else size, 2 if is_dir else 1, mtime, mtime, now,
             bs, d.replicas or self.default_replicas))
        self._add_entry(d.ino, name, ino)
        key = child_key(u.ukey, name)
        if is_dir:
            self._touch_dir(d.ino, now, 1)
            self.conn.execute("INSERT INTO ufs_dirs(ino, mount_id, ukey, listed_ns) VALUES (?,?,?,0)",
                              (ino, u.mount_id, key))
        else:
            self._touch_dir(d.ino, now)
            self._cut_blocks(ino, size, bs)
            self.conn.execute(
                "INSERT INTO ufs_files(ino, mount_id, ukey, state, etag, ufs_size, ufs_mtime_ns, checked_ns)"
                " VALUES (?,?,?,?,?,?,?,?)", (ino, u.mount_id, key, PERSISTED, etag, size, mtime_ns, now))
        return ino

    def _cut_blocks(self, ino: int, size: int, bs: int) -> None:
        """Block slots for size bytes, each with a fresh id and no replica (checksum 0: unknown
        until a worker fetched it)."""
        count = (size + bs - 1) // bs
        if not count:
            return
        first = self.counter("next_block", count)
        self.conn.executemany("INSERT INTO blocks(ino, idx, block_id, length, checksum) VALUES (?,?,?,?,0)",
                              [(ino, i, first + i, min(bs, size - i * bs)) for i in range(count)])

    def _replace_data(self, row: InodeRow, size: int, mtime_ns: int, etag: str, now: int) -> list[int]:
        """The object changed behind our back: drop the cached blocks, cut new ones."""
        freed = [r[0] for r in self.conn.execute("SELECT block_id FROM blocks WHERE ino=?", (row.ino,))]
        self.conn.execute("DELETE FROM blocks WHERE ino=?", (row.ino,))
        self._cut_blocks(row.ino, size, row.block_size or self.default_block_size)
        self.conn.execute("UPDATE inodes SET size=?, mtime_ns=?, ctime_ns=?, generation=generation+1 WHERE ino=?",
                          (size, mtime_ns or now, now, row.ino))
        self.conn.execute("UPDATE ufs_files SET etag=?, ufs_size=?, ufs_mtime_ns=?, checked_ns=? WHERE ino=?",
                          (etag, size, mtime_ns, now, row.ino))
        return freed

    def _vanished(self, parent: int, name: str, ino: int, now: int) -> list[int]:
        """A name the pool has and the UFS listing does not: gone behind our back, unless it
        holds data the UFS never got (pending uploads, a directory made here)."""
        row = self.inode(ino)
        if stat.S_ISDIR(row.mode):
            if not self._all_persisted(ino):
                return []
            freed = self._clear_dir(ino, now)
            self._touch_dir(parent, now, -1)
        else:
            f = self.ufs_file(ino)
            if f is None or f.state != PERSISTED or row.lease_id:
                return []
            self._touch_dir(parent, now)
            freed = []
        self.conn.execute(DELETE_NAME, (parent, name))
        return freed + self._drop_link(row, now)

    def _all_persisted(self, ino: int) -> bool:
        """Does nothing below directory ino hold data or names the UFS lacks?"""
        for (child,) in self.conn.execute("SELECT ino FROM dirents WHERE parent=?", (ino,)).fetchall():
            row = self.inode(child)
            if stat.S_ISDIR(row.mode):
                if not self._all_persisted(child):
                    return False
            else:
                f = self.ufs_file(child)
                if f is None or f.state != PERSISTED:
                    return False
        return True

    @applies(UfsRefresh)
    def op_ufs_refresh(self, rec: UfsRefresh) -> Result:
        """An open found the file's object changed (rec.gone: deleted) after its TTL."""
        row = self.inode(rec.ino)
        f = self.ufs_file(rec.ino)
        if f is None or f.state != PERSISTED or row.lease_id:
            return {"freed": []}
        now = rec.now_ns
        if rec.gone:
            freed: list[int] = []
            for parent, name in self.conn.execute("SELECT parent, name FROM dirents WHERE ino=?",
                                                  (row.ino,)).fetchall():
                self.conn.execute(DELETE_NAME, (parent, name))
                self._touch_dir(parent, now)
                freed += self._drop_link(self.inode(row.ino), now) if self._exists(row.ino) else []
            return {"freed": freed, "gone": True}
        if f.etag == rec.etag:
            self.conn.execute("UPDATE ufs_files SET checked_ns=? WHERE ino=?", (now, row.ino))
            return {"freed": []}
        return {"freed": self._replace_data(row, rec.size, rec.mtime_ns, rec.etag, now)}

    # ------------------------------------------------------------------ uploads
    @applies(UfsState)
    def op_ufs_state(self, rec: UfsState) -> Result:
        """An upload of generation rec.generation to rec.key ended (rec.etag set) or failed
        (rec.message).  A file changed, renamed or removed meanwhile stays pending (its new
        state is uploaded next) and "stale" tells the uploader so."""
        f = self.ufs_file(rec.ino)
        if f is None or not self._exists(rec.ino):
            return {"stale": True}
        row = self.inode(rec.ino)
        if row.generation != rec.generation or f.ukey != rec.key or row.lease_id and not row.complete:
            return {"stale": True}
        if rec.etag is not None:
            self.conn.execute("UPDATE ufs_files SET state=?, etag=?, ufs_size=?, ufs_mtime_ns=?, checked_ns=?,"
                              " message='', attempts=0 WHERE ino=?",
                              (PERSISTED, rec.etag, row.size, rec.mtime_ns, rec.now_ns, rec.ino))
        else:
            self.conn.execute("UPDATE ufs_files SET state=?, message=?, attempts=attempts+1 WHERE ino=?",
                              (FAILED if rec.final else PENDING, rec.message[:500], rec.ino))
        return {"stale": False}

    def ufs_dirty(self, ino: int, now: int) -> None:
        """The file's bytes changed in the pool: the UFS copy is stale until uploaded."""
        self.conn.execute("UPDATE ufs_files SET state=?, dirty_ns=?, message='' WHERE ino=?", (PENDING, now, ino))

    def ufs_new_entry(self, parent: int, name: str, ino: int, mode: int, now: int) -> None:
        """A name made here under a UFS directory: files and directories only (the UFS has
        no symlinks, devices or sockets)."""
        u = self.ufs_dir(parent)
        if u is None:
            return
        key = child_key(u.ukey, name)
        if stat.S_ISDIR(mode):
            self.conn.execute("INSERT INTO ufs_dirs(ino, mount_id, ukey, listed_ns) VALUES (?,?,?,?)",
                              (ino, u.mount_id, key, now))
        elif stat.S_ISREG(mode):
            self.conn.execute("INSERT INTO ufs_files(ino, mount_id, ukey, state, dirty_ns) VALUES (?,?,?,?,?)",
                              (ino, u.mount_id, key, PENDING, now))
        else:
            raise err(errno.EOPNOTSUPP, "a UFS mount holds only regular files and directories")

    def ufs_renamed(self, src: InodeRow, sp: int, dp: int, dn: str) -> None:
        """Check a rename against the UFS mounts and move the file's key.  Within one mount
        a file moves; a directory (every object under it would move: S3 has no rename) and
        anything crossing a mount's edge is EXDEV, which mv answers by copying."""
        su, du = self.ufs_dir(sp), self.ufs_dir(dp)
        if su is None and du is None:
            return
        if su is None or du is None or su.mount_id != du.mount_id:
            raise err(errno.EXDEV, "rename across a UFS mount's edge")
        if stat.S_ISDIR(src.mode):
            raise err(errno.EXDEV, "directories under a UFS mount are not renamed (copy them)")
        self.conn.execute("UPDATE ufs_files SET ukey=? WHERE ino=?", (child_key(du.ukey, dn), src.ino))
        self._inherit_object(src.ino, self.child(dp, dn))

    def _inherit_object(self, ino: int, replaced: InodeRow | None) -> None:
        """A file not in the UFS yet (pending, no etag) moved onto one that is: the replaced
        file's object stays at the key until this file's upload replaces it, so this file
        now owns it (its etag): an unlink before that upload deletes it, where it would
        otherwise stay in the UFS and the name come back at the next listing."""
        if replaced is None or replaced.ino == ino or not stat.S_ISREG(replaced.mode):
            return
        old, f = self.ufs_file(replaced.ino), self.ufs_file(ino)
        if old is None or not old.etag or f is None or f.etag:
            return
        self.conn.execute("UPDATE ufs_files SET etag=?, ufs_size=?, ufs_mtime_ns=? WHERE ino=?",
                          (old.etag, old.ufs_size, old.ufs_mtime_ns, ino))

    def ufs_linked(self, ino: int, new_parent: int) -> None:
        if self.ufs_dir(new_parent) is not None or self.ufs_file(ino) is not None:
            raise err(errno.EXDEV, "hard links into or out of a UFS mount")

    # ------------------------------------------------------------------ cache
    def ufs_free_blocks(self, ino: int) -> list[int] | None:
        """Drop a persisted UFS file's cached blocks, keeping its name: every slot gets a
        fresh id with no replica (so a late delete order never hits a refetched copy).
        None when the file is not one (the caller removes it as any other)."""
        f = self.ufs_file(ino)
        if f is None:
            return None
        if f.state != PERSISTED:
            return []
        rows = self.conn.execute("SELECT idx, block_id, length FROM blocks WHERE ino=? ORDER BY idx",
                                 (ino,)).fetchall()
        if not rows:
            return []
        first = self.counter("next_block", len(rows))
        for i, (idx, _, _) in enumerate(rows):
            self.conn.execute("UPDATE blocks SET block_id=?, checksum=0 WHERE ino=? AND idx=?", (first + i, ino, idx))
        return [r[1] for r in rows]

    @applies(UfsFree)
    def op_ufs_free(self, rec: UfsFree) -> Result:
        """cv fs free: drop the cached blocks of rec.inos (persisted UFS files only)."""
        freed: list[int] = []
        files = skipped = nbytes = 0
        for ino in rec.inos:
            f = self.ufs_file(ino) if self._exists(ino) else None
            if f is None or f.state != PERSISTED:
                skipped += 1          # its only copy is in the pool: freeing it would lose it
                continue
            nbytes += self.inode(ino).size
            freed += self.ufs_free_blocks(ino) or []
            files += 1
        return {"freed": freed, "files": files, "skipped": skipped, "bytes": nbytes}

    def files_below(self, ino: int) -> list[int]:
        """Regular files at any depth below directory ino."""
        out: list[int] = []
        todo = [ino]
        while todo:
            for child, mode in self.conn.execute("SELECT d.ino, i.mode FROM dirents d JOIN inodes i ON i.ino = d.ino"
                                                 " WHERE d.parent=?", (todo.pop(),)).fetchall():
                if stat.S_ISDIR(mode):
                    todo.append(child)
                elif stat.S_ISREG(mode):
                    out.append(child)
        return out


def _like_prefix(path: str) -> str:
    """A LIKE pattern matching paths strictly below path."""
    esc = path.rstrip("/").replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return esc + "/%"
