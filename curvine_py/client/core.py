"""The client core: one per process, shared by the SDK and the mount.

Holds the master client, the data-channel connections, the buffer pool, the I/O
threads, the directory of worker addresses and the lease keeper that renews the
write leases of every file this process has open for writing.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from curvine_py.common.buffers import Budget, BufferPool
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.config import Config, host_identity
from curvine_py.common.memory import tune_malloc
from curvine_py.common.tls import load as load_tls
from curvine_py.client.blockio import BlockIO, WorkerDirectory
from curvine_py.client.blockpaths import BlockPaths
from curvine_py.client.metaclient import MasterClient
from curvine_py.client.localwrite import LocalWrites
from curvine_py.client.shortcircuit import ShortCircuit
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master

log = logging.getLogger(__name__)
TRASH_ALIVE_FIRST_S = 1.0   # until a reply names the lock lease (a third of it is the pace)
FLOOR_PART = 4   # a pool may make max_buffers // FLOOR_PART past the shared budget (ClientCore._new_pool)


class LeaseKeeper:
    """Renews the leases of open writers a few times per lease period, and while this
    process keeps files in the trash (unlinked while open, common/trash.py) tells the
    master it lives: a lock-lease renewal every third of the lock lease, so the leader
    does not take it for a dead mount and remove them (master/trashsweep.py)."""

    def __init__(self, meta: MasterClient, period_s: float) -> None:
        self.meta = meta
        self.period_s = period_s
        self.alive_s = TRASH_ALIVE_FIRST_S   # then a third of the lock lease the master names
        self._leases: dict[int, int] = {}   # lease_id -> open count
        self._keeps_trash: Callable[[], bool] = lambda: False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()   # a new keeper of trash: say it lives at once
        self._thread: threading.Thread | None = None

    def add(self, lease_id: int) -> None:
        with self._lock:
            self._leases[lease_id] = self._leases.get(lease_id, 0) + 1
            self._start()

    def watch_trash(self, keeps: Callable[[], bool]) -> None:
        """keeps: does this process keep files in the trash now (asked at each round)?"""
        with self._lock:
            self._keeps_trash = keeps
            self._start()
        self._wake.set()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self._thread.start()

    def __contains__(self, lease_id: int) -> bool:
        """Is lease_id still renewed (a writer holding it is open)?"""
        with self._lock:
            return lease_id in self._leases

    def remove(self, lease_id: int) -> None:
        with self._lock:
            n = self._leases.get(lease_id, 0) - 1
            if n <= 0:
                self._leases.pop(lease_id, None)
            else:
                self._leases[lease_id] = n

    def _run(self) -> None:
        due = time.monotonic() + self.period_s   # the next renewal of the writers' leases
        pause = self.period_s
        while True:
            self._wake.wait(pause)
            self._wake.clear()
            if self._stop.is_set():
                return
            # (asked once a round: it looks at every open file under the VFS's lock, so the
            # rounds come at the lock lease's pace only while something is kept)
            keeps = self._keeps_trash()
            if keeps:
                self._alive()
            if time.monotonic() >= due:
                due = time.monotonic() + self.period_s
                self._renew()
            pause = max(0.0, due - time.monotonic())
            if keeps:
                pause = min(pause, self.alive_s)

    def _renew(self) -> None:
        with self._lock:
            leases = list(self._leases)
        if not leases:
            return
        try:
            expired = self.meta.renew(leases)
            if expired:
                log.warning("write leases expired: %s", expired)
        except Exception as e:  # the master may be restarting; the next round retries
            log.warning("lease renewal failed: %s", e)

    def _alive(self) -> None:
        try:
            reply = self.meta.call(Master.RenewLocks, pb.LockRenew(caller=self.meta.caller()))
            self.alive_s = max(reply.lease_ms / 3000, 0.1)
        except Exception as e:  # as above; a master silent past master.trash_grace_s may remove them
            log.warning("telling the master this client keeps files in the trash failed: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()


class ClientCore:
    """Everything a client process shares across its open files."""

    def __init__(self, cfg: Config, master: str | None = None) -> None:
        if cfg.client.tune_malloc:
            tune_malloc()
        self.cfg = cfg
        tls = load_tls(cfg.tls, "client")
        self.meta = MasterClient(master or cfg.client.master, cfg.client, cfg.cluster.secret, tls)
        self.host = host_identity(cfg.client.host)
        self.pool = ConnectionPool(max_idle_per_peer=8, io_timeout_s=cfg.client.data_timeout_s,
                                   congestion=cfg.cluster.data_congestion, tls=tls if tls and tls.data else None)
        self.io = BlockIO(self.pool, read_timeout_s=cfg.client.read_timeout_s)
        # one budget for every block size's pool: client.buffer_pool_bytes in total, not per size
        self.budget = Budget(cfg.client.buffer_pool_bytes)
        self.buffers = self._new_pool(cfg.master.block_size)
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="blockio")
        self.workers = WorkerDirectory()
        self._pools: dict[int, BufferPool] = {}   # other block sizes than the master's default
        self._pools_lock = threading.Lock()
        self.leases = LeaseKeeper(self.meta, max(1.0, cfg.master.lease_s / 4))
        shortcircuit = ShortCircuit(self.host, cfg.cluster.secret, report_bad=self._report_bad, tls=tls) \
            if cfg.client.short_circuit else None
        localwrites = LocalWrites(self.host, cfg.client.cache_local_writes) if cfg.client.short_circuit_writes else None
        if localwrites is not None:   # a replica here is one written without the network
            self.meta.prefer_host = self.host
        self.paths = BlockPaths(self.host, self.workers, self.io, self.pool, shortcircuit, localwrites)

    def _report_bad(self, block_id: int, worker_id: int, reason: str) -> None:
        """Tell the master of a corrupt replica, in the background (the read goes on elsewhere)."""
        def report() -> None:
            try:
                self.meta.report_bad_block(block_id, worker_id, reason)
            except Exception as e:   # best effort: the worker finds the bad copy on its next read too
                log.warning("could not report bad block %d on worker %d: %s", block_id, worker_id, e)
        self.executor.submit(report)

    def unreachable_workers(self) -> list[pb.UnreachableWorker]:
        """Workers whose data port refused or reset this client since the last allocation
        (BlockIO.take_refused), with how long ago: told to the master with the next one."""
        refused = self.io.take_refused()
        if not refused:
            return []
        now = time.monotonic()
        return [pb.UnreachableWorker(worker_id=a.worker_id, age_s=now - refused[(a.ip, a.data_port)])
                for a in self.workers.all() if (a.ip, a.data_port) in refused]

    def buffer_pool(self, block_size: int) -> BufferPool:
        """The shared pool when sizes match; files with other block sizes get their own, all
        within one budget (common/buffers.Budget)."""
        if block_size == self.buffers.size:
            return self.buffers
        with self._pools_lock:
            pool = self._pools.get(block_size)
            if pool is None:
                pool = self._pools[block_size] = self._new_pool(block_size)
            return pool

    def _new_pool(self, block_size: int) -> BufferPool:
        """A pool in the shared budget that may still make a quarter of its buffers past
        it: 16 MiB blocks all in use by 128 readers with no replica left their 4 MiB
        windows the budget's floor of 2, and the reads by ranges instead cost 0.84x
        (bench/kv_concurrency, 9 pairs); the total stays under 1.25x the key per size."""
        n = self._pool_buffers(block_size)
        return BufferPool(block_size, n, self.budget, floor=n // FLOOR_PART)

    def _pool_buffers(self, block_size: int) -> int:
        """client.buffer_pool_bytes worth of blocks, at least 2 (one being filled, one shipped)."""
        return max(2, self.cfg.client.buffer_pool_bytes // max(1, block_size))

    def pools(self) -> list[BufferPool]:
        """Every block pool of this client (for the mount's watchdog and describe)."""
        with self._pools_lock:
            return [self.buffers, *self._pools.values()]

    def close(self) -> None:
        self.leases.stop()
        self.paths.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
        self.meta.close()


