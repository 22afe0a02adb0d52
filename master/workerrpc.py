"""The master's calls to workers (UFS loads and uploads): one gRPC channel per worker.

Everything else the master tells workers rides on heartbeat replies; these two calls
are answers someone waits for (``cv load --wait``, a write-through close), so they are
direct calls with a deadline.
"""
from __future__ import annotations

import errno
import threading

import grpc

from curvine_py.common.errors import err, from_rpc_error
from curvine_py.common.rpc import channel
from curvine_py.common.tls import Tls
from curvine_py.master.workers import Registry
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc


class WorkerClients:
    """Stubs by worker id, over channels kept per address."""

    def __init__(self, registry: Registry, secret: str, tls: Tls | None = None) -> None:
        self.registry = registry
        self.secret = secret
        self.tls = tls
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def stub(self, worker_id: int) -> pb_grpc.WorkerServiceStub:
        w = self.registry.get(worker_id)
        if w is None or not w.live:
            raise err(errno.EIO, f"worker {worker_id} is not live")
        a = w.address()
        target = f"{a.ip}:{a.rpc_port}"
        with self._lock:
            ch = self._channels.get(target)
            if ch is None:
                ch = self._channels[target] = channel(target, self.secret, self.tls, peer="worker")
        return pb_grpc.WorkerServiceStub(ch)

    def load(self, worker_id: int, blocks: list[pb.BlockInfo], addrs: list[pb.WorkerAddress],
             timeout_s: float) -> pb.LoadBlocksReply:
        """Have worker_id fetch blocks (their first target) from the UFS and forward copies.
        The blocks it reports loaded are its replicas from now on (its next block report
        says the same), so a reader or an upload right after sees them."""
        try:
            reply = self.stub(worker_id).LoadBlocks(pb.LoadBlocksRequest(blocks=blocks, workers=addrs),
                                                    timeout=timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        for bid in reply.loaded:
            self.registry.add_replica(bid, worker_id)
        return reply

    def close(self) -> None:
        with self._lock:
            chans, self._channels = list(self._channels.values()), {}
        for ch in chans:
            ch.close()
