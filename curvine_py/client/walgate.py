"""SQLite WAL indexes (``<db>-shm``) shared by mounts on several hosts: one mount's at a time.

Two hosts cannot share a WAL index (memory every connection maps), so a mount takes the
index's gate (client/locks.py ``gate``: a lock of its own on the file) before its
processes' first lock of the file and gives it up after their last; another mount's
F_GETLK meets the gate as a write lock and its lock calls are refused (SQLite: SQLITE_BUSY,
retried by its busy timeout).  With the index's gate the mount takes the database's
(PENDING_BYTE: another host's connection waits at its database lock, not only ~10 s at the
index), and around them moves the data: taking the gate reloads what this mount cached of
the database and its WAL (another mount's past), giving it up commits this mount's writes
of them first (the next mount's recovery reads them).  SQLite never locks the WAL and holds
its database lock all along in WAL mode, so NFS's rule at a lock (VFS.setlk) alone would not.

Kept here, not in the mount's adapter (fuse/ops.py), as JuiceFS keeps pkg/fuse thin over
pkg/vfs: each call is a VFS operation (client/vfs.py ``Op``) the adapter drives; what it
keeps is one lock call at a time on each index (its event loop's locks) and the kernel's
page cache, dropped through ``invalidate`` (given by the mount).  docs/posix.md, SQLite.
"""
from __future__ import annotations

import errno
import logging
from typing import Callable

from curvine_py.client.locks import PENDING_BYTE, SHARED_INDEX_SUFFIX, LockAsk, gate, is_shared_index
from curvine_py.client.vfs import ROOT, VFS, Blocking, Op
from curvine_py.common.errors import CurvineError
from curvine_py.common.lockranges import UNLCK, WRLCK, Range

log = logging.getLogger(__name__)


class WalGates:
    """The WAL indexes this mount knows (by inode, learned by name) and the gates it holds."""

    def __init__(self, vfs: VFS, invalidate: Callable[[int], None] | None = None) -> None:
        """invalidate(ino): drop the kernel's cached pages of ino (run as a Blocking step),
        when the mount has a kernel cache to drop."""
        self.vfs = vfs
        self.invalidate = invalidate
        self._indexes: dict[int, tuple[int, str]] = {}   # index -> (directory, the database's name)
        self._db_gates: dict[int, int] = {}   # index -> its database, whose gate this mount holds too

    def named(self, parent: int, name: str, ino: int) -> None:
        """The kernel learns ino by name (a lookup, create or readdir): a WAL index's locks
        are gated."""
        if is_shared_index(name):
            self._indexes[ino] = (parent, name[:-len(SHARED_INDEX_SUFFIX)])

    def knows(self, ino: int) -> bool:
        """ino is a WAL index: its lock calls go through here, one at a time."""
        return ino in self._indexes

    def getlk(self, fh: int, a: LockAsk) -> Op[Range | None]:
        """F_GETLK on fh's file: another mount's gate answers as a write lock over the range
        asked about (SQLite's open of the index: SQLITE_BUSY)."""
        ino = self.vfs.handle(fh).ino
        if self.knows(ino) and not (yield from self._open(ino)):
            return Range(WRLCK, a.start, a.end, 0)
        return (yield from self.vfs.getlk(fh, a))

    def setlk(self, fh: int, a: LockAsk, waiting: bool = False) -> Op[bool]:
        """One try at a lock through fh (VFS.setlk); on a WAL index its gate first (refused:
        another mount uses the database), then the lock; the gate goes once none of this
        mount's locks on the file is left (an unlock, a lock refused)."""
        ino = self.vfs.handle(fh).ino
        if a.flock or not self.knows(ino):
            return (yield from self.vfs.setlk(fh, a, waiting))
        locks = self.vfs.locks
        if a.type != UNLCK and not locks.gated(ino):
            if not (yield from gate(locks, self.vfs.meta.caller(), ino, WRLCK)):
                return False
            log.debug("WAL index inode %d: this mount's now (its database is loaded again)", ino)
            yield from self._reload_database(ino)
        try:
            granted = yield from self.vfs.setlk(fh, a, waiting)
        except Exception:   # (not GeneratorExit: a drive cancelled goes without the gate's calls)
            yield from self.give_up(ino)
            raise
        yield from self.give_up(ino)
        return granted

    def give_up(self, ino: int) -> Op[None]:
        """Give ino's gate (and its database's) up if this mount holds no other lock on it."""
        locks = self.vfs.locks
        if not (self.knows(ino) and locks.gated(ino) and not locks.others_on(ino)):
            return
        yield from self._commit_database(ino)
        yield from gate(locks, self.vfs.meta.caller(), ino, UNLCK)
        db = self._db_gates.pop(ino, 0)
        if db:
            yield from gate(locks, self.vfs.meta.caller(), db, UNLCK, byte=PENDING_BYTE)
        log.debug("WAL index inode %d: given up (no lock of this mount's left on it)", ino)

    def _open(self, ino: int) -> Op[bool]:
        """No other mount holds ino's gate (this one may, or none)."""
        if self.vfs.locks.gated(ino):
            return True
        return (yield from gate(self.vfs.locks, self.vfs.meta.caller(), ino, WRLCK, test=True))

    def _database_files(self, ino: int) -> Op[dict[str, int]]:
        """The inodes of WAL index ino's database ("db") and WAL file ("wal"), as named now."""
        parent, db = self._indexes[ino]
        found = {}
        for kind, name in (("db", db), ("wal", db + "-wal")):
            try:
                found[kind] = (yield from self.vfs.lookup(parent, name, ROOT)).ino
            except CurvineError as e:
                if e.errno != errno.ENOENT:
                    raise
        return found

    def _reload_database(self, ino: int) -> Op[None]:
        """This mount takes WAL index ino's gate: what it cached of the database and its
        WAL is another mount's past (that mount committed them at its gate's end), so its
        readers load them again and its writers of them end, as a lock of each would
        (NFS's rule, VFS.reload_at_lock), and the kernel drops its pages.  The database's
        gate too: another host's connection waits at its database lock (client/locks.py)."""
        files = yield from self._database_files(ino)
        db = files.get("db", 0)
        if db and (yield from gate(self.vfs.locks, self.vfs.meta.caller(), db, WRLCK, byte=PENDING_BYTE)):
            self._db_gates[ino] = db
        for f in files.values():
            yield from self.vfs.reload_at_lock(f, "at a WAL index's gate")
            if self.invalidate is not None:
                yield Blocking(self.invalidate, f)

    def _commit_database(self, ino: int) -> Op[None]:
        """Before this mount gives WAL index ino's gate up: its writes of the database and
        its WAL reach the master, for the next mount's recovery to read (SQLite syncs the
        WAL at each commit only with synchronous=FULL, and does not close it before its
        locks of the index are gone)."""
        for f in (yield from self._database_files(ino)).values():
            yield from self.vfs.commit_writer(f, "before a WAL index's gate is given up")
