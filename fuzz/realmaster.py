"""One real master per fuzzing process, in-process over a temporary directory: its service,
its gRPC port and its framed metadata port, as master/main.py's build_server starts them.

Every call a fuzzer sends reaches the real handlers, but one: UfsMountAdd.  A fuzzed
mount of a local directory (``file:///``) would let the fuzzed unlinks and renames that
follow change real files of this machine, so it is refused before its handler runs.

Eviction is off (``master.evict``): fuzzed workers report full disks, and an allocation
then waits seconds by design for evicted space (Evictor.hold_back, make_room), which
would leave the fuzzer idle; a full pool answers ENOSPC at once instead.  And workers
"heartbeat" every HEARTBEAT_MS: an allocation while blocks freed by fuzzed unlinks are not
yet confirmed gone still waits for them (Evictor.make_room, 4 heartbeats + 2 s), by
design, and fuzzed workers never confirm (it made 24-s inputs of four allocations).
So the master starts with two roomy workers registered (1 PiB free each, on hosts of
their own, never lost: ``master.worker_timeout_s`` is a day), where most allocations
find room at once; no process serves them, and nothing here dials a worker.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
import typing

from curvine_py.common.config import Config
from curvine_py.common.errors import CurvineError
from curvine_py.master.group import LeaderOnly
from curvine_py.master.main import Servers, build_server
from curvine_py.pb import curvine_pb2 as pb
from fuzz.harness import Lazy

NOT_FUZZED = frozenset({"UfsMountAdd"})
CACHE_LEASE_S = 0.1   # a mutation waits at most this for a cache session a fuzzed input left broken
HEARTBEAT_MS = 10
ROOMY = 1 << 50



def _start() -> tuple[Servers, typing.Callable[[], None]]:
    root = tempfile.mkdtemp(prefix="fuzz-master-")
    cfg = Config()
    cfg.master.meta_dir = os.path.join(root, "master")
    cfg.master.bind = "127.0.0.1"
    cfg.master.port = 0
    cfg.master.frame_port = 0
    cfg.master.metrics_port = 0
    cfg.master.cache_lease_s = CACHE_LEASE_S
    cfg.master.evict = False
    cfg.master.heartbeat_ms = HEARTBEAT_MS
    cfg.master.worker_timeout_s = 86400.0
    servers = build_server(cfg)
    for i in (1, 2):
        servers.service.RegisterWorker(pb.RegisterRequest(
            host=f"roomy-{i}", ip="127.0.0.1", data_port=1, storage_id=f"fuzz-roomy-{i}",
            dirs=[pb.DataDir(path="/roomy", tier="SSD", capacity=ROOMY)]))

    def stop() -> None:
        servers.stop(grace=0.5)
        shutil.rmtree(root, ignore_errors=True)
    return servers, stop


MASTER: Lazy[Servers] = Lazy(_start)
master = MASTER.get


class Gated:
    """The service as a transport serves it (LeaderOnly), less NOT_FUZZED: those answer EPERM."""

    def __init__(self, servers: Servers) -> None:
        self._service = LeaderOnly(servers.service)

    def __getattr__(self, name: str) -> typing.Any:
        if name in NOT_FUZZED:
            def refused(request: typing.Any) -> typing.NoReturn:
                raise CurvineError(errno.EPERM, f"{name} is not fuzzed (it could touch this machine's files)")
            return refused
        return getattr(self._service, name)


def is_internal(e: CurvineError) -> bool:
    """A handler's own bug, which errors.handler turned into EIO (and logged)."""
    return e.errno == errno.EIO and (e.strerror or "").startswith("internal error in ")
