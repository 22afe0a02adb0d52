"""The worker's gRPC control service: Info, StatBlock, LoadBlocks and Persist.

StatBlock is the short-circuit read path: a client on the same host asks where a
block's file is and reads it directly (verifying it against ``<path>.meta``, whose
format docs/worker.md describes) instead of streaming it over TCP.

LoadBlocks and Persist are the master's UFS calls (worker/ufsfetch.py, ufspersist.py):
blocking, bounded by ``ufs.timeout_s`` per UFS call; the master calls them with a
deadline of its own.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Callable

import grpc

from curvine_py.common.config import host_identity
from curvine_py.common.errors import CurvineError, handler
from curvine_py.common.version import package_version
from curvine_py.common.rpc import grpc_servicer
from curvine_py.pb import curvine_pb2, curvine_pb2_grpc
from curvine_py.worker import metrics
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.heartbeat import data_dirs
from curvine_py.worker.ufsfetch import UfsFetcher, load_blocks
from curvine_py.worker.ufspersist import Persister

# With TLS, what only the master's certificate may ask of a worker: fetch from the UFS
# and upload to it (clients read blocks with tokens the master minted, on the data port).
MASTER_ONLY = {m: frozenset({"master"}) for m in ("LoadBlocks", "Persist")}


@dataclass(frozen=True)
class UfsParts:
    """What the UFS calls need: the shared fetcher (single-flight with READs), the
    uploader, and how many blocks one LoadBlocks fetches at once (ufs.load_threads)."""
    fetcher: UfsFetcher
    persister: Persister
    load_threads: int = 4


class WorkerService:
    """Answers control calls from clients and tools about this worker."""

    rpc_seconds = metrics.RPC_SECONDS   # every handler call is timed there (common/errors.py)

    def __init__(self, store: BlockStore, worker_id: Callable[[], int], host: str = "",
                 ufs: UfsParts | None = None) -> None:
        self.store = store
        self.ufs = ufs
        self.worker_id = worker_id
        self.host = host_identity(host)
        self.version = package_version()

    @handler
    def Info(self, request: curvine_pb2.Empty) -> curvine_pb2.WorkerInfoReply:
        return curvine_pb2.WorkerInfoReply(worker_id=self.worker_id(), host=self.host,
                                           dirs=data_dirs(self.store), blocks=len(self.store),
                                           version=self.version)

    @handler
    def StatBlock(self, request: curvine_pb2.BlockRequest) -> curvine_pb2.BlockStatReply:
        entry = self.store.get(request.block_id)
        if entry is None:
            return curvine_pb2.BlockStatReply(exists=False)
        return curvine_pb2.BlockStatReply(exists=True, length=entry.length, checksum=entry.checksum,
                                          path=entry.path, tier=entry.dir.tier)

    @handler
    def LoadBlocks(self, request: curvine_pb2.LoadBlocksRequest) -> curvine_pb2.LoadBlocksReply:
        ufs = self._ufs()
        return load_blocks(ufs.fetcher, request.blocks, request.workers, self.worker_id(), ufs.load_threads)

    @handler
    def Persist(self, request: curvine_pb2.PersistRequest) -> curvine_pb2.PersistReply:
        return self._ufs().persister.persist(request)

    def _ufs(self) -> UfsParts:
        if self.ufs is None:
            raise CurvineError(errno.ENOSYS, "this worker serves no UFS calls")
        return self.ufs


def add_to_server(service: WorkerService, server: grpc.Server) -> None:
    curvine_pb2_grpc.add_WorkerServiceServicer_to_server(grpc_servicer(service, "WorkerService", MASTER_ONLY), server)
