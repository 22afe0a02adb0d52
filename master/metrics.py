"""The master's Prometheus metrics (docs/metrics.md).

Counters and histograms are updated where things happen (the journal, the RPC wrapper,
the evictor); the sizes of things (files, blocks, workers, capacity) are read from the
master's state when Prometheus scrapes (``MasterCollector``), so they cost nothing in
between and are never stale.
"""
from __future__ import annotations

import logging
import typing

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from curvine_py.common.metrics import BATCH_BUCKETS, histogram

if typing.TYPE_CHECKING:
    from curvine_py.master.service import MasterService

log = logging.getLogger(__name__)

RPC_SECONDS = histogram("curvine_master_rpc_duration_seconds",
                        "Time the master spent answering one call, by method (gRPC and framed alike)", ["method"])
JOURNAL_COMMIT_SECONDS = histogram("curvine_master_journal_commit_duration_seconds",
                                   "One journal batch: its records applied and committed to SQLite")
JOURNAL_BATCH = Histogram("curvine_master_journal_batch_records",
                          "Records committed together in one journal transaction (group commit)",
                          buckets=BATCH_BUCKETS)
JOURNAL_RECORDS = Counter("curvine_master_journal_records",
                          "Op records applied by the journal, by op (create, commit, rename, evict...)", ["op"])
EVICTIONS = Counter("curvine_master_evictions",
                    "Files evicted, by reason: lru (capacity), ttl (user.curvine.ttl); pin_blocked counts "
                    "eviction passes that needed room but found only pinned or open files", ["reason"])
EVICTED_BYTES = Counter("curvine_master_evicted_bytes", "Logical bytes of the files evicted, by reason", ["reason"])
UFS_UPLOADS = Counter("curvine_master_ufs_uploads", "Uploads of UFS files (write-through and write-back), by outcome",
                      ["outcome"])
UFS_LISTINGS = Counter("curvine_master_ufs_listings", "UFS directory listings and object checks (HEAD), by outcome",
                       ["outcome"])
for _outcome in ("ok", "failed"):
    UFS_UPLOADS.labels(_outcome)
    UFS_LISTINGS.labels(_outcome)
for _reason in ("lru", "ttl", "pin_blocked"):   # every series exists from the start (rate() needs a 0)
    EVICTIONS.labels(_reason)
for _reason in ("lru", "ttl"):
    EVICTED_BYTES.labels(_reason)


class MasterCollector(Collector):
    """Gauges read from the master's namespace and worker registry at scrape time."""

    def __init__(self, service: "MasterService") -> None:
        self.service = service

    def describe(self) -> list[typing.Any]:
        return []   # nothing is known without collecting: the registry must not call collect() early

    def collect(self) -> typing.Iterator[GaugeMetricFamily]:
        svc = self.service
        yield from _raft_gauges(svc.group.status())
        try:
            files, blocks = svc.ns.counts()
            dirs = svc.ns.dir_count()
            # workers, replicas and capacity are the leader's soft state: a follower has none
            under = svc.under_replicated() if svc.group.ready() else None
        except Exception:   # a scrape must never fail the master; the next one tries again
            log.exception("metrics: reading the namespace failed")
            return
        yield _gauge("curvine_master_files", "Inodes in the namespace that are not directories", files - dirs)
        yield _gauge("curvine_master_dirs", "Directories in the namespace (the root included)", dirs)
        yield _gauge("curvine_master_blocks", "Committed blocks", blocks)
        if under is None:
            return
        yield _gauge("curvine_master_under_replicated_blocks",
                     "Committed blocks with fewer live replicas than their file asks for", under)
        workers = list(svc.registry.workers.values())
        g = GaugeMetricFamily("curvine_master_workers", "Registered workers, by state", labels=["state"])
        g.add_metric(["live"], sum(1 for w in workers if w.live))
        g.add_metric(["lost"], sum(1 for w in workers if not w.live))
        yield g
        yield from _tier_gauges(w for w in workers if w.live)
        pending = self.service.ns.conn.execute("SELECT count(*) FROM ufs_files WHERE state = 'pending'").fetchone()[0]
        yield _gauge("curvine_master_ufs_pending_uploads", "UFS files waiting for their write-back upload", pending)


def _raft_gauges(st: typing.Any) -> typing.Iterator[GaugeMetricFamily]:
    """This master's place in its group (docs/ha.md); a single master is its own leader."""
    yield _gauge("curvine_master_leader", "1 on the master that serves calls (the ready leader), else 0",
                 1 if st.role == "leader" and st.ready else 0)
    yield _gauge("curvine_master_raft_term", "The Raft term this master is in (0: a single master)", st.term)
    yield _gauge("curvine_master_raft_commit_index", "The last log index this master knows committed",
                 st.commit_index)
    yield _gauge("curvine_master_raft_applied_index", "The last log index this master applied to its store",
                 st.applied_index)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _tier_gauges(live: typing.Iterable[typing.Any]) -> typing.Iterator[GaugeMetricFamily]:
    """Capacity and used bytes of the live workers' data dirs, summed per tier."""
    cap: dict[str, int] = {}
    used: dict[str, int] = {}
    for w in live:
        for d in list(w.dirs):
            tier = (d.tier or "DISK").upper()
            cap[tier] = cap.get(tier, 0) + d.capacity
            used[tier] = used.get(tier, 0) + d.used
    c = GaugeMetricFamily("curvine_master_capacity_bytes", "Capacity of the live workers, by tier", labels=["tier"])
    u = GaugeMetricFamily("curvine_master_used_bytes", "Bytes used on the live workers, by tier", labels=["tier"])
    for tier in sorted(cap):
        c.add_metric([tier], cap[tier])
        u.add_metric([tier], used[tier])
    yield c
    yield u
