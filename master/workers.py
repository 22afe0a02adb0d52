"""The worker registry: addresses, heartbeats, liveness, usage, and who holds which block.

This is soft state, rebuilt after a master restart from registrations and block
reports (as HDFS and Curvine do): only the storage_id -> worker_id mapping is
durable (in the namespace store, through the journal).
"""
from __future__ import annotations

import logging
import threading
import time
import typing
from dataclasses import dataclass, field

from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
"""How often the master's housekeeping calls check_liveness."""
PAUSED_AFTER_S = 3 * CHECK_EVERY_S
"""A longer gap between two checks means the master itself was paused (SIGSTOP, a frozen
VM), not slow: a replicator tick or GIL contention stretches one by a second at most.  Not
tied to worker_timeout_s: with a 2 s timeout every ordinary 1 s gap looked like a pause and
no worker was ever lost."""


@dataclass
class Worker:
    worker_id: int
    host: str
    ip: str
    rpc_port: int
    data_port: int
    dirs: list[pb.DataDir] = field(default_factory=list)
    last_heartbeat: float = 0.0
    live: bool = True
    unreachable_since: float = 0.0   # a client's connection was refused then (offered again after a heartbeat)
    blocks: set[int] = field(default_factory=set)
    pending_deletes: set[int] = field(default_factory=set)
    deletes_sent: float = 0.0     # when the last delete orders left (its usage shows them after its next heartbeat)
    io_engine: str = ""           # its disk I/O engine ("uring", "threads"), from its registration
    metrics_port: int = 0         # its Prometheus /metrics port on ip, from its registration (0 = off)

    @property
    def capacity(self) -> int:
        return sum(d.capacity for d in self.dirs)

    @property
    def used(self) -> int:
        return sum(d.used for d in self.dirs)

    @property
    def available(self) -> int:
        return max(0, self.capacity - self.used)

    def address(self) -> pb.WorkerAddress:
        return pb.WorkerAddress(worker_id=self.worker_id, host=self.host, ip=self.ip,
                                rpc_port=self.rpc_port, data_port=self.data_port)


class Registry:
    """Thread-safe map of workers and block locations."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # When check_liveness last ran, and since when this master has run without a pause
        # (SIGSTOP, a frozen VM): a silence is counted only while the master could hear.
        self._checked = self._awake = time.monotonic()
        self.lock = threading.RLock()
        self.workers: dict[int, Worker] = {}
        self.locations: dict[int, set[int]] = {}
        self.membership_version = 0   # bumped when the set of live workers changes
        # blocks whose live holders may have changed since the event feed last looked
        # (master/replicafeed.py takes them): replicas added or dropped, workers lost or back
        self.touched: set[int] = set()

    def clear(self) -> None:
        """Forget every worker and block location: a master that becomes the leader (again)
        rebuilds them from the registrations and block reports sent to it (docs/ha.md)."""
        with self.lock:
            self.workers.clear()
            self.locations.clear()
            self.touched.clear()
            self.membership_version += 1
            self._checked = self._awake = time.monotonic()

    def register(self, wid: int, req: pb.RegisterRequest) -> None:
        with self.lock:
            old = self.workers.get(wid)
            if old is not None:
                self._forget_blocks(old)
            self.workers[wid] = Worker(wid, req.host, req.ip, req.rpc_port, req.data_port, list(req.dirs),
                                       time.monotonic(), io_engine=req.io_engine,
                                       metrics_port=req.metrics_port)
            self.membership_version += 1
        log.info("worker %d registered: host %s data %s:%d io engine %s", wid, req.host, req.ip, req.data_port,
                 req.io_engine or "?")

    def heartbeat(self, wid: int, dirs: list[pb.DataDir]) -> tuple[Worker | None, bool]:
        """(the worker, None if unknown; whether it was lost until this heartbeat)."""
        with self.lock:
            w = self.workers.get(wid)
            if w is None:
                return None, False
            w.dirs = list(dirs) or w.dirs
            w.last_heartbeat = time.monotonic()
            revived = not w.live
            if revived:
                w.live = True
                self.touched.update(w.blocks)
                self.membership_version += 1
                log.info("worker %d is live again", wid)
            return w, revived

    def check_liveness(self) -> list[int]:
        """Mark workers silent past the timeout as lost; returns their ids.  Called every
        second: a gap past PAUSED_AFTER_S means this master was paused, and the heartbeats sent
        meanwhile still wait in its sockets, so every worker gets a whole timeout from the
        resume (else all of them were lost at once and writes failed "no live workers")."""
        now = time.monotonic()
        if now - self._checked > PAUSED_AFTER_S:
            log.warning("the master did not run for %.1f s (paused?): workers get %.0f s from now to be heard",
                        now - self._checked, self.timeout_s)
            self._awake = now
        self._checked = now
        lost = []
        with self.lock:
            for w in self.workers.values():
                if w.live and now - max(w.last_heartbeat, self._awake) > self.timeout_s:
                    w.live = False
                    self.touched.update(w.blocks)
                    lost.append(w.worker_id)
            if lost:
                self.membership_version += 1
        for wid in lost:
            log.warning("worker %d lost (no heartbeat for %.0f s)", wid, self.timeout_s)
        return lost

    def live_workers(self) -> list[Worker]:
        with self.lock:
            return [w for w in self.workers.values() if w.live]

    def report_unreachable(self, reports: typing.Iterable[pb.UnreachableWorker]) -> None:
        """A client's connection to a worker's data port was refused or reset (a killed
        worker) age_s ago: new blocks go elsewhere until the worker heartbeats after that
        moment, instead of until the worker timeout declares it lost (30 s of failing
        writes).  A worker heard from since (restarted) is not affected."""
        now = time.monotonic()
        with self.lock:
            for r in reports:
                w = self.workers.get(r.worker_id)
                since = now - max(0.0, r.age_s)
                if w is not None and w.last_heartbeat < since and w.unreachable_since < since:
                    w.unreachable_since = since
                    log.info("worker %d refused a client's connection: no new blocks until it heartbeats",
                             r.worker_id)

    def unreachable(self) -> frozenset[int]:
        """Workers reported unreachable and not heard from since."""
        with self.lock:
            return frozenset(w.worker_id for w in self.workers.values()
                             if w.unreachable_since > w.last_heartbeat)

    def get(self, wid: int) -> Worker | None:
        with self.lock:
            return self.workers.get(wid)

    # ------------------------------------------------------------------ block locations
    def add_replica(self, block_id: int, wid: int) -> None:
        with self.lock:
            w = self.workers.get(wid)
            if w is None:
                return
            w.blocks.add(block_id)
            self.locations.setdefault(block_id, set()).add(wid)
            self.touched.add(block_id)

    def remove_replica(self, block_id: int, wid: int) -> None:
        with self.lock:
            self.touched.add(block_id)
            w = self.workers.get(wid)
            if w is not None:
                w.blocks.discard(block_id)
            holders = self.locations.get(block_id)
            if holders is not None:
                holders.discard(wid)
                if not holders:
                    del self.locations[block_id]

    def replicas(self, block_id: int, live_only: bool = True) -> list[int]:
        with self.lock:
            holders = self.locations.get(block_id, ())
            return [w for w in holders if not live_only or (w in self.workers and self.workers[w].live)]

    def free_blocks(self, block_ids: list[int]) -> None:
        """Blocks no file needs any more: tell every holder to delete them."""
        with self.lock:
            for b in block_ids:
                for wid in self.locations.pop(b, ()):
                    w = self.workers.get(wid)
                    if w is not None:
                        w.blocks.discard(b)
                        w.pending_deletes.add(b)

    def delete_on(self, wid: int, block_ids: list[int]) -> None:
        with self.lock:
            w = self.workers.get(wid)
            if w is not None:
                w.pending_deletes.update(block_ids)
                for b in block_ids:
                    self.remove_replica(b, wid)

    def take_deletes(self, wid: int, limit: int = 10000) -> list[int]:
        with self.lock:
            w = self.workers.get(wid)
            if w is None or not w.pending_deletes:
                return []
            out: list[int] = []
            while w.pending_deletes and len(out) < limit:
                out.append(w.pending_deletes.pop())
            w.deletes_sent = time.monotonic()
            return out

    def deletes_in_flight(self) -> bool:
        """Are freed blocks still counted in some live worker's usage: delete orders not
        yet sent, or sent and no heartbeat since (the one after them reports the room)?"""
        with self.lock:
            return any(w.pending_deletes or w.last_heartbeat <= w.deletes_sent
                       for w in self.workers.values() if w.live)

    def take_touched(self, limit: int) -> list[int]:
        """Up to limit blocks touched since the last call (the rest stay for the next)."""
        with self.lock:
            out: list[int] = []
            while self.touched and len(out) < limit:
                out.append(self.touched.pop())
            return out

    def _forget_blocks(self, w: Worker) -> None:
        self.touched.update(w.blocks)
        for b in w.blocks:
            holders = self.locations.get(b)
            if holders is not None:
                holders.discard(w.worker_id)
                if not holders:
                    del self.locations[b]
        w.blocks.clear()

    def reset_blocks(self, wid: int) -> None:
        """A full report replaces what we knew of this worker."""
        with self.lock:
            w = self.workers.get(wid)
            if w is not None:
                self._forget_blocks(w)
