"""Replica events: which hosts hold each file whole, as the leader's registry changes.

Block locations are the leader's memory (master/workers.py, rebuilt from the workers'
reports after every failover), not replicated state, so a replica event cannot be
derived while a record is applied, as the namespace events are.  Instead the leader
compares, once a second, what its registry says now against the feed's last word -- the
replicated ``event_hosts`` table (file, host) -- for the files whose blocks were touched
(a replica added or dropped, a worker lost or back: ``Registry.touched``) or that were
committed or renamed since the last look, and submits the differences as one
``ReplicaChanges`` record; applying it writes the events (master/events.py).  So every
master holds the same replica events at the same positions, and a new leader, whose
registry refills from full reports, announces only real differences: it waits one
``master.worker_timeout_s`` after taking over (the replicator's grace: until then a
missing report is not a lost replica) before it looks.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from curvine_py.master import events
from curvine_py.master.records import HostChange, ReplicaChanges

if TYPE_CHECKING:
    from curvine_py.master.service import MasterService

MAX_BLOCKS = 20_000     # touched blocks looked at per tick (the rest wait for the next)
MAX_CHANGES = 1_000     # changes per record
_CHUNK = 500


class ReplicaFeed:
    """Run by the leader's housekeeping (master/watch.py ``Watchers.housekeeping``)."""

    def __init__(self, service: MasterService) -> None:
        self.service = service
        self._after = -1    # the events looked at for commits and renames (-1: none yet this term)
        self._term = -1

    def tick(self) -> int:
        """Submit what changed; returns the number of changes."""
        svc = self.service
        conn = svc.ns.conn
        if svc.group.term != self._term:   # a new term: from its first look on
            self._term, self._after = svc.group.term, events.bounds(conn)[1]
        if time.monotonic() - svc.started < svc.cfg.master.worker_timeout_s:
            return 0   # the workers are still reporting to this leader
        inos = self._files_of(svc.registry.take_touched(MAX_BLOCKS)) | self._written()
        if not inos:
            return 0
        ordered = sorted(inos)
        now = svc.locator.holders(svc.ns, ordered)
        said = events.hosts_of(conn, ordered)
        changes: list[HostChange] = []
        for ino in ordered:
            held, before = now.get(ino, set()), said.get(ino, set())
            changes += [HostChange(ino, h, False) for h in sorted(before - held)]
            changes += [HostChange(ino, h, True) for h in sorted(held - before)]
        for k in range(0, len(changes), MAX_CHANGES):
            svc.submit(ReplicaChanges(changes=tuple(changes[k:k + MAX_CHANGES])))
        return len(changes)

    def _files_of(self, blocks: list[int]) -> set[int]:
        conn, out = self.service.ns.conn, set[int]()
        for k in range(0, len(blocks), _CHUNK):
            part = blocks[k:k + _CHUNK]
            out.update(r[0] for r in conn.execute(
                f"SELECT ino FROM blocks WHERE block_id IN ({','.join('?' * len(part))})", part))
        return out

    def _written(self) -> set[int]:
        """Files committed or renamed into place since the last look (their blocks were
        reported before they were the file's: no touch brings them here)."""
        conn = self.service.ns.conn
        head = events.bounds(conn)[1]
        rows = conn.execute("SELECT DISTINCT ino FROM events WHERE pos > ? AND pos <= ? AND kind = ?",
                            (self._after, head, events.CREATED)).fetchall()
        self._after = head
        return {int(r[0]) for r in rows}
