"""Journal ops of the masters themselves: a leader's announcement, the retry cache's pruning.

Mixed into ``Namespace`` like the other op mixins, so these records are applied (and
replayed, and snapshotted) like any mutation: every master of a Raft group holds the
same ``masters`` table and prunes its ``oplog`` at the same log position (docs/ha.md).
"""
from __future__ import annotations

from curvine_py.common.types import ROOT_INO
from curvine_py.master.handlers import applies
from curvine_py.master.records import LeaderAnnounce, PruneOplog
from curvine_py.master.store import Result, Store

# Rows are appended in time order, so the expired ones are a prefix in seq order: find
# the first row to keep by walking from the oldest (O(expired), not a scan of the log).
PRUNE = ("DELETE FROM oplog WHERE seq < COALESCE("
         "(SELECT seq FROM oplog WHERE ts_ms >= ? ORDER BY seq LIMIT 1),"
         " (SELECT COALESCE(MAX(seq), 0) + 1 FROM oplog))")


class GroupOps(Store):
    """op_leader_announce, op_prune_oplog."""

    @applies(LeaderAnnounce)
    def op_leader_announce(self, rec: LeaderAnnounce) -> Result:
        """Where the leader of rec.term answers clients.  The group's first announcement also
        gives the root directory its times (every master created it with 0, see
        schema.init_db, so that their tables agree)."""
        self.conn.execute("INSERT INTO masters(raft_id, address, frame_port, term) VALUES (?,?,?,?)"
                          " ON CONFLICT(raft_id) DO UPDATE SET address=excluded.address,"
                          " frame_port=excluded.frame_port, term=excluded.term",
                          (rec.raft_id, rec.address, rec.frame_port, rec.term))
        self.conn.execute("UPDATE inodes SET atime_ns=?, mtime_ns=?, ctime_ns=? WHERE ino=? AND ctime_ns=0",
                          (rec.now_ns, rec.now_ns, rec.now_ns, ROOT_INO))
        return {}

    @applies(PruneOplog)
    def op_prune_oplog(self, rec: PruneOplog) -> Result:
        """Delete the oplog rows written before rec.before_ms (they are in the tables)."""
        return {"pruned": self.conn.execute(PRUNE, (rec.before_ms,)).rowcount}

    def master_address(self, raft_id: str) -> str:
        """The client address the master raft_id announced when it last led ("" if never)."""
        r = self.conn.execute("SELECT address FROM masters WHERE raft_id=?", (raft_id,)).fetchone()
        return r[0] if r else ""
