"""Registration, block reports and heartbeats to the master.

The worker owns a stable ``storage_id`` (a uuid in ``<first data dir>/storage_id``) so
the master gives it back the same worker id after a restart and its blocks keep their
locations.  Registration is retried until a master answers (masters may start after
workers, or fail over).  After registering, the worker sends a full block report in
batches (the first batch has ``full=True`` and replaces what the master knew, the
following ones have ``full=False`` and add to it), then heartbeats every
``heartbeat_ms`` carrying dir usage and the blocks added/removed since the previous
heartbeat.  Changes a failed heartbeat could not deliver are put back and sent with the
next one.  Nothing here may crash the worker: a master that is down is logged and
retried.

Several masters (docs/ha.md): every call goes to the leader through ``masterlink.py``
(the next master at once when one does not answer or names the leader; the backoff only
after a whole round of the list).  A new leader does not know this worker yet: it
answers the first heartbeat with ``reregister``, and the worker registers again and
sends its full block report, as it does for a restarted master.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Callable, Iterable, Sequence

import grpc

from curvine_py.common.config import WorkerConfig, host_identity
from curvine_py.common.retry import Exponential
from curvine_py.common.tls import Tls
from curvine_py.pb import curvine_pb2
from curvine_py.worker.blockstore import BlockEntry, BlockStore
from curvine_py.worker.masterlink import MasterLink
from curvine_py.pb.methods import Master

log = logging.getLogger(__name__)

STORAGE_ID_FILE = "storage_id"
WORKER_ID_FILE = "worker_id"       # last id the master gave; used until it answers again
REPORT_BATCH = 50_000
RPC_TIMEOUT_S = 10.0
# The wait after a failed registration or heartbeat (after a whole round of failures, with
# several masters): 0.2 s doubling to 5 s (docs/worker.md).  The loop itself is no retry
# but a steady period: only this backoff comes from common/retry.
KICK_GAP_S = 0.02   # kick() beats this soon (one beat for a burst of refused blocks)
BACKOFF = Exponential(first_s=0.2, cap_s=5.0)


def _read_small(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _write_small(path: str, text: str) -> None:
    """Write a tiny file atomically (tmp + rename) so a crash never leaves it half-written."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_storage_id(data_dir: str) -> str:
    """This worker's persistent storage id, created on first start."""
    path = os.path.join(data_dir, STORAGE_ID_FILE)
    sid = _read_small(path)
    if sid is None:
        sid = str(uuid.uuid4())
        _write_small(path, sid)
    return sid


def load_worker_id(data_dir: str) -> int:
    """The worker id of the previous run (0 if unknown)."""
    text = _read_small(os.path.join(data_dir, WORKER_ID_FILE))
    return int(text) if text and text.isdigit() else 0


def save_worker_id(data_dir: str, worker_id: int) -> None:
    try:
        _write_small(os.path.join(data_dir, WORKER_ID_FILE), str(worker_id))
    except OSError as e:
        log.warning("cannot save worker id: %s", e)


def block_infos(entries: Iterable[BlockEntry]) -> list[curvine_pb2.BlockInfo]:
    return [curvine_pb2.BlockInfo(block_id=e.block_id, length=e.length, checksum=e.checksum)
            for e in entries]


def data_dirs(store: BlockStore) -> list[curvine_pb2.DataDir]:
    return [curvine_pb2.DataDir(path=p, tier=t, capacity=c, used=u) for p, t, c, u in store.dir_usage()]


class Heartbeat:
    """A thread that keeps this worker registered and reports its blocks."""

    def __init__(self, cfg: WorkerConfig, store: BlockStore, rpc_port: int, data_port: int,
                 on_registered: Callable[[int], None] | None = None, secret: str = "",
                 report_batch: int = REPORT_BATCH,
                 on_replicate: Callable[[curvine_pb2.ReplicateCommand], None] | None = None,
                 io_engine: str = "", metrics_port: int = 0, tls: Tls | None = None) -> None:
        self.cfg = cfg
        self.io_engine = io_engine   # sent at registration; `cv report` shows it
        self.metrics_port = metrics_port   # sent at registration: `cv stats` finds the worker's /metrics
        self.store = store
        self.rpc_port = rpc_port
        self.data_port = data_port
        self.on_registered = on_registered
        self.on_replicate = on_replicate
        self.report_batch = report_batch
        self.storage_id = load_storage_id(store.dirs[0].path)
        self.worker_id = 0
        self.interval_s = 1.0
        self.registered = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()     # kick(): beat now, not at the end of the interval
        # every call to the master, or to the leader of the masters: also the worker's other
        # calls (UfsMountGet), so one transport to the master(s) per worker process
        self.link = MasterLink(cfg.master, secret, BACKOFF, tls)
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._last_warning = 0.0

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=RPC_TIMEOUT_S + 1)
        self.link.close()

    # ------------------------------------------------------------ loop

    def _run(self) -> None:
        failures = 0   # in a row, since the last call that got through: waits link.wait(failures)
        while not self._stop.is_set():
            try:
                if not self.registered.is_set():
                    self.register()
                else:
                    self.beat()
                failures, wait = 0, self.interval_s
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    self._warn(f"master {self.link.tried} refused this worker: {e.details()}")
                else:
                    self._warn(f"master {self.link.tried} unavailable: {e.code()} {e.details()}")
                failures += 1
                wait = self.link.wait(failures)   # the next master at once, BACKOFF after a round
            except Exception:
                log.exception("heartbeat failed")
                failures += 1
                wait = BACKOFF(failures)
            self._wake.wait(wait)
            if self._wake.is_set() and not self._stop.is_set():
                self._stop.wait(KICK_GAP_S)   # kicks in a burst: one beat for them all
                self._wake.clear()

    def kick(self) -> None:
        """Beat now: this worker just refused a block for want of space, and until the
        master has its new figures it goes on placing blocks here (each writer retrying
        for seconds instead of evicting or failing at once)."""
        self._wake.set()

    def _warn(self, message: str) -> None:
        """Warn at most every 30 s; a master that stays down must not flood the log."""
        now = time.monotonic()
        if now - self._last_warning > 30:
            self._last_warning = now
            log.warning("%s (retrying)", message)
        else:
            log.debug("%s", message)

    # ------------------------------------------------------------ calls

    def register(self) -> None:
        """Register (or re-register) and send the full block report."""
        req = curvine_pb2.RegisterRequest(host=host_identity(self.cfg.host), ip=self.cfg.ip,
                                          rpc_port=self.rpc_port, data_port=self.data_port,
                                          dirs=data_dirs(self.store), storage_id=self.storage_id,
                                          io_engine=self.io_engine, metrics_port=self.metrics_port)
        reply = self.link.attempt(Master.RegisterWorker, req, RPC_TIMEOUT_S)
        self.worker_id = reply.worker_id
        if reply.heartbeat_ms:
            self.interval_s = reply.heartbeat_ms / 1000.0
        self.full_report()
        log.info("registered with master %s as worker %d", self.link.tried, self.worker_id)
        self.registered.set()
        if self.on_registered is not None:
            self.on_registered(self.worker_id)

    def full_report(self) -> None:
        """Every block, in batches; the first replaces what the master knew."""
        entries = self.store.snapshot()
        try:
            for i, batch in enumerate(_batches(entries, self.report_batch)):
                report = curvine_pb2.BlockReport(worker_id=self.worker_id, full=(i == 0),
                                                 added=block_infos(batch))
                self.link.attempt(Master.ReportBlocks, report, RPC_TIMEOUT_S * 3)
        except BaseException:
            self.store.requeue_changes(entries, [])  # the next attempt re-snapshots anyway
            raise

    def beat(self) -> None:
        """One heartbeat with the incremental report; obeys the reply."""
        added, removed = self.store.drain_changes()
        if len(added) > self.report_batch:
            self.store.requeue_changes(added[self.report_batch:], [])
            added = added[:self.report_batch]
        report = curvine_pb2.BlockReport(worker_id=self.worker_id, full=False,
                                         added=block_infos(added), removed=removed)
        req = curvine_pb2.HeartbeatRequest(worker_id=self.worker_id, dirs=data_dirs(self.store),
                                           report=report)
        try:
            reply = self.link.attempt(Master.Heartbeat, req, RPC_TIMEOUT_S)
        except BaseException:
            self.store.requeue_changes(added, removed)
            raise
        self._obey(reply)

    def _obey(self, reply: curvine_pb2.HeartbeatReply) -> None:
        deleted = sum(1 for bid in reply.delete_blocks if self.store.delete(bid))
        if deleted:
            log.info("deleted %d blocks at the master's request", deleted)
        if self.on_replicate is not None:
            for cmd in reply.replicate:
                self.on_replicate(cmd)
        if reply.reregister:
            log.warning("master asked worker %d to register again", self.worker_id)
            self.registered.clear()
            self.register()


def _batches(items: Sequence[BlockEntry], size: int) -> Iterable[Sequence[BlockEntry]]:
    """At least one (possibly empty) batch, so an empty worker still sends its full report."""
    yield items[:size]
    for i in range(size, len(items), size):
        yield items[i:i + size]
