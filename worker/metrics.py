"""The worker's Prometheus metrics (docs/metrics.md).

Block reads and writes are counted by the data server per request (one observation per
block range, never per piece: ~2 us against milliseconds of I/O); space per data dir and
the I/O engine are read from the block store when Prometheus scrapes
(``WorkerCollector``).  Reads clients make from block files themselves (short-circuit)
never reach the worker and are counted by those clients.
"""
from __future__ import annotations

import logging
import typing

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from curvine_py.common.metrics import histogram

if typing.TYPE_CHECKING:
    from curvine_py.worker.blockstore import BlockStore

log = logging.getLogger(__name__)

BLOCK_READS = Counter("curvine_worker_block_reads", "Block reads served over the data channel")
READ_BYTES = Counter("curvine_worker_read_bytes", "Bytes of blocks sent to readers")
READ_SECONDS = histogram("curvine_worker_block_read_duration_seconds",
                         "One block read: from the request to its last byte on the socket")
BLOCK_WRITES = Counter("curvine_worker_block_writes", "Block writes committed here, by how the bytes came: "
                       "network (a client or a chain, over the data channel), local (a client on this host "
                       "wrote the block file itself)", ["via"])
WRITE_BYTES = Counter("curvine_worker_write_bytes", "Bytes of blocks committed here, by how they came", ["via"])
WRITE_SECONDS = histogram("curvine_worker_block_write_duration_seconds",
                          "One block write: from WRITE_OPEN to the reply after its commit (and the chain's)")
WRITE_FAILURES = Counter("curvine_worker_block_write_failures", "Block writes answered with an error")
CHECKSUM_FAILURES = Counter("curvine_worker_checksum_failures",
                            "Checksum mismatches: of a block being written (write), of a stored block read "
                            "back (read; the copy is dropped and re-replicated)", ["op"])
CHAIN_FORWARDS = Counter("curvine_worker_chain_forwards", "Block writes forwarded to the next replica of a chain")
CHAIN_FORWARD_BYTES = Counter("curvine_worker_chain_forward_bytes", "Bytes forwarded down write chains")
RPC_SECONDS = histogram("curvine_worker_rpc_duration_seconds",
                        "Time the worker spent answering one control call (gRPC), by method", ["method"])
COPIES = Counter("curvine_worker_replication_copies",
                 "Re-replication copies this worker pushed to another, by outcome", ["outcome"])
UFS_FETCHES = Counter("curvine_worker_ufs_fetches", "Blocks fetched from a UFS (one ranged read each), by outcome",
                      ["outcome"])
UFS_FETCH_BYTES = Counter("curvine_worker_ufs_fetch_bytes", "Bytes read from UFS mounts")
UFS_FETCH_SECONDS = histogram("curvine_worker_ufs_fetch_duration_seconds", "One block's ranged read from its UFS")
UFS_PERSISTS = Counter("curvine_worker_ufs_persists", "Files uploaded to a UFS for the master, by outcome",
                       ["outcome"])
UFS_PERSIST_BYTES = Counter("curvine_worker_ufs_persist_bytes", "Bytes uploaded to UFS mounts")
for _via in ("network", "local"):
    BLOCK_WRITES.labels(_via)
    WRITE_BYTES.labels(_via)
for _op in ("read", "write"):
    CHECKSUM_FAILURES.labels(_op)
for _outcome in ("ok", "failed"):
    COPIES.labels(_outcome)
    UFS_FETCHES.labels(_outcome)
    UFS_PERSISTS.labels(_outcome)


class WorkerCollector(Collector):
    """Space per data dir and the I/O engine, read from the worker's state at scrape time."""

    def __init__(self, store: "BlockStore", io_engine: str) -> None:
        self.store = store
        self.io_engine = io_engine

    def describe(self) -> list[typing.Any]:
        return []

    def collect(self) -> typing.Iterator[GaugeMetricFamily]:
        try:
            usage = self.store.dir_usage()
        except Exception:   # a scrape must never fail the worker
            log.exception("metrics: reading the data dirs failed")
            usage = []
        cap = GaugeMetricFamily("curvine_worker_capacity_bytes", "Capacity of a data dir (configured, or its "
                                "disk's room), by tier and dir", labels=["tier", "dir"])
        used = GaugeMetricFamily("curvine_worker_used_bytes", "Bytes of blocks in a data dir, by tier and dir",
                                 labels=["tier", "dir"])
        for path, tier, capacity, n in usage:
            cap.add_metric([tier, path], capacity)
            used.add_metric([tier, path], n)
        yield cap
        yield used
        engine = GaugeMetricFamily("curvine_worker_io_engine", "The disk I/O engine in use (1 for it)",
                                   labels=["engine"])
        engine.add_metric([self.io_engine or "unknown"], 1)
        yield engine
