"""Journal ops of the bounded cache: record last reads, evict or expire whole files.

The evictor (``eviction.py``) decides off the journal thread; these ops re-check, at
apply time and from the tables alone, that each victim may still go (same generation,
complete, no write lease, not pinned), so replaying the log gives the same namespace
and a file rewritten or pinned since the decision survives.
"""
from __future__ import annotations

import stat

from curvine_py.master.cachepolicy import Policies
from curvine_py.master.handlers import applies
from curvine_py.master.records import Evict, RecordReads
from curvine_py.master.store import Result, Store


class CacheOps(Store):
    """op_record_reads, op_evict (mixed into ``Namespace``)."""

    def ufs_free_blocks(self, ino: int) -> list[int] | None:
        """A UFS file's blocks dropped, its name kept (ufsops.py overrides); None: not one."""
        return None

    @applies(RecordReads)
    def op_record_reads(self, rec: RecordReads) -> Result:
        """Remember when files were last opened for reading (LRU order across restarts), in
        the inode's row (ms: 6 bytes, not a row of a table of its own); a file gone since
        has no row to update."""
        self.conn.executemany("UPDATE inodes SET last_read_ms=? WHERE ino=? AND last_read_ms < ?",
                              [(ms, r.ino, ms) for r in rec.reads for ms in (r.last_read_ns // 1_000_000,)])
        return {}

    @applies(Evict)
    def op_evict(self, rec: Evict) -> Result:
        """Remove the victims (at the generation the evictor saw) with all their names;
        returns freed blocks."""
        policies = Policies(self.conn)
        freed: list[int] = []
        evicted: list[int] = []
        nbytes = 0
        now = rec.now_ns
        for ino, generation in ((v.ino, v.generation) for v in rec.victims):
            row = self.conn.execute("SELECT mode, size, generation, complete, lease_id FROM inodes WHERE ino=?",
                                    (ino,)).fetchone()
            if row is None:
                continue
            mode, size, gen, complete, lease_id = row
            if not stat.S_ISREG(mode) or gen != generation or not complete or lease_id or policies.pinned(ino):
                continue
            kept = self.ufs_free_blocks(ino)
            if kept is not None:   # a UFS file keeps its name: the next read fetches it again
                if kept:
                    freed += kept
                    evicted.append(ino)
                    nbytes += size
                continue
            parents = [r[0] for r in self.conn.execute("SELECT parent FROM dirents WHERE ino=?", (ino,))]
            self.conn.execute("DELETE FROM dirents WHERE ino=?", (ino,))
            for p in set(parents):
                self.conn.execute("UPDATE inodes SET mtime_ns=?, ctime_ns=? WHERE ino=?", (now, now, p))
            freed += self._delete_inode(ino)
            evicted.append(ino)
            nbytes += size
        return {"freed": freed, "evicted": evicted, "bytes": nbytes}
