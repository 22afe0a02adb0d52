"""Uploads of UFS files: write-through at close, write-back from the durable queue.

The queue is the ``ufs_files`` rows in state ``pending`` (journaled, so a master restart
loses nothing queued).  A file is uploaded by a worker holding its blocks
(``WorkerService.Persist``): the master only chooses the worker and journals the
outcome (``ufs_state``).  One upload per file at a time: a write-through close and the
background loop asking for the same file share it.

* ``through`` mounts: the client's closing commit waits for ``persist``; a failure fails
  the close (EIO with the cause) and leaves the file ``failed: reason`` in the pool.
* ``back`` mounts: ``close`` returns once the pool holds the data; the loop uploads each
  pending file ``ufs.upload_delay_s`` after its last change (so the LMCache ``.tmp``
  then rename is uploaded once, under its final name) and retries failures with
  exponential backoff up to ``ufs.upload_retry_max_s`` while the UFS is down.  A pending
  file is never evicted (ufsops.ufs_free_blocks).
"""
from __future__ import annotations

import errno
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import grpc

from curvine_py.common.config import UfsConfig
from curvine_py.common.errors import CurvineError, err, from_rpc_error
from curvine_py.master import metrics
from curvine_py.master.namespace import Namespace
from curvine_py.master.records import Submit, UfsState
from curvine_py.master.store import InodeRow
from curvine_py.master.ufsmounts import UfsMounts
from curvine_py.master.ufsops import PENDING, PERSISTED
from curvine_py.master.workerrpc import WorkerClients
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
SCAN_S = 0.5
MIN_RATE = 20 << 20       # bytes/s an upload is allowed at least, for its deadline

# (row, blocks with READ tokens, their workers' addresses) of a file
BlocksOf = Callable[[int], tuple[InodeRow, list[pb.BlockInfo], list[pb.WorkerAddress]]]


class Uploader:
    """One per master: the write-back loop plus write-through uploads on request."""

    def __init__(self, cfg: UfsConfig, ns: Callable[[], Namespace], submit: Submit,
                 mounts: UfsMounts, workers: WorkerClients, blocks_of: BlocksOf,
                 leading: Callable[[], bool] = lambda: True) -> None:
        self.cfg = cfg
        self.leading = leading   # write-back uploads run on a group's leader only (docs/ha.md)
        self._ns = ns
        self.submit = submit
        self.mounts = mounts
        self.workers = workers
        self.blocks_of = blocks_of
        self._pool = ThreadPoolExecutor(max(1, cfg.upload_threads), thread_name_prefix="ufs-upload")
        self._flights: dict[int, Future[None]] = {}
        self._next_try: dict[int, float] = {}
        self._queued: set[int] = set()   # handed to the pool, not finished (the scan skips them)
        self._lock = threading.Lock()
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.uploaded = self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ufs-uploader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def kick(self) -> None:
        self._kick.set()

    def uploading(self, ino: int) -> bool:
        with self._lock:
            return ino in self._flights

    # ------------------------------------------------------------------ one file
    def persist(self, ino: int, final: bool) -> None:
        """Upload ino now (or join the upload running); raises its CurvineError.
        final: a failure is journaled as ``failed`` (write-through), not retried."""
        fut = self._flight(ino, final)
        fut.result()

    def _flight(self, ino: int, final: bool) -> Future[None]:
        with self._lock:
            fut = self._flights.get(ino)
            if fut is None:
                fut = Future()
                self._flights[ino] = fut
                mine = True
            else:
                mine = False
        if mine:
            try:
                self._upload(ino, final)
                fut.set_result(None)
            except BaseException as e:   # the caller (and anyone joined) gets it
                fut.set_exception(e)
            finally:
                with self._lock:
                    self._flights.pop(ino, None)
        return fut

    def _upload(self, ino: int, final: bool) -> None:
        ns = self._ns()
        f = ns.ufs_file(ino)
        if f is None or f.state == PERSISTED or (f.state != PENDING and not final):
            return   # uploaded already (a retried close), or failed for good
        row, blocks, addrs = self.blocks_of(ino)
        key, generation = f.ukey, row.generation
        m = self.mounts.get(f.mount_id)
        try:
            if any(b.ufs.load for b in blocks):   # slots not rewritten and not cached: the old object's
                self._load(blocks, addrs)
                row, blocks, addrs = self.blocks_of(ino)
            reply = self._send(m.mount_id, key, row.size, blocks, addrs)
        except CurvineError as e:
            self.failures += 1
            metrics.UFS_UPLOADS.labels("failed").inc()
            msg = f"upload to {m.object_uri(key)}: {e.strerror or e}"
            self.submit(UfsState(ino=ino, generation=generation, key=key, message=msg, final=final))
            raise CurvineError(e.errno or errno.EIO, msg) from None
        result = self.submit(UfsState(ino=ino, generation=generation, key=key, etag=reply.etag,
                                      mtime_ns=reply.mtime_ns))
        self.uploaded += 1
        metrics.UFS_UPLOADS.labels("ok").inc()
        if result.get("stale"):
            self._drop_stray(m.mount_id, key)
            self.kick()

    def _load(self, blocks: list[pb.BlockInfo], addrs: list[pb.WorkerAddress]) -> None:
        """Fetch a file's uncached slots from its current object before it is replaced."""
        by_target: dict[int, list[pb.BlockInfo]] = {}
        for b in blocks:
            if b.ufs.load and b.workers:
                by_target.setdefault(b.workers[0], []).append(b)
        for wid, bs in by_target.items():
            reply = self.workers.load(wid, bs, addrs, self.cfg.timeout_s * 2 + 10)
            if reply.failed:
                raise err(errno.EIO, f"{len(reply.failed)} unchanged blocks not readable from the UFS: "
                                     f"{reply.message}")

    def _send(self, mount_id: int, key: str, size: int, blocks: list[pb.BlockInfo],
              addrs: list[pb.WorkerAddress]) -> pb.PersistReply:
        """Have a worker holding the first block upload the file."""
        live = {a.worker_id for a in addrs}
        for b in blocks:   # a slot not rewritten since the last upload may be read from the UFS
            if not any(w in live for w in b.workers):
                raise err(errno.EIO, f"block {b.block_id} has no live replica to upload from")
        holder = next((w for w in blocks[0].workers if w in live), 0) if blocks else self._any_worker()
        req = pb.PersistRequest(mount_id=mount_id, key=key, size=size, blocks=blocks, workers=addrs)
        timeout = self.cfg.timeout_s + size / MIN_RATE
        try:
            return self.workers.stub(holder).Persist(req, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _any_worker(self) -> int:
        live = self.workers.registry.live_workers()
        if not live:
            raise err(errno.EIO, "no live worker to upload with")
        return live[0].worker_id

    def _drop_stray(self, mount_id: int, key: str) -> None:
        """The file moved or went while its bytes were uploaded: the object at the old key
        belongs to nobody unless another file has that key now."""
        taken = self._ns().q1("SELECT 1 AS x FROM ufs_files WHERE mount_id=? AND ukey=?", (mount_id, key))
        if taken is None:
            try:
                self.mounts.store(mount_id).delete(key)
            except CurvineError as e:
                log.warning("could not delete stray upload %s: %s", key, e)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(SCAN_S)
            self._kick.clear()
            if not self.leading():
                continue
            try:
                self._scan()
            except Exception:
                log.exception("write-back scan failed")

    def _scan(self) -> None:
        now_ns, now = time.time_ns(), time.monotonic()
        delay_ns = int(self.cfg.upload_delay_s * 1e9)
        ns = self._ns()
        for f in ns.ufs_pending():
            ino = f.ino
            if f.dirty_ns + delay_ns > now_ns or self._next_try.get(ino, 0.0) > now or self.uploading(ino) \
                    or ino in self._queued:
                continue
            row = ns.conn.execute("SELECT lease_id, complete FROM inodes WHERE ino=?", (ino,)).fetchone()
            if row is None or (row[0] and not row[1]):
                continue   # being written: its close queues it again
            self._queued.add(ino)
            self._pool.submit(self._background, ino, f.attempts)

    def _background(self, ino: int, attempts: int) -> None:
        """One write-back attempt (on the upload pool); a failure waits its backoff."""
        try:
            self.persist(ino, final=False)
            self._next_try.pop(ino, None)
        except CurvineError as e:
            wait = min(self.cfg.upload_retry_max_s, 0.5 * 2 ** min(attempts, 16))
            self._next_try[ino] = time.monotonic() + wait
            log.warning("write-back of inode %d failed (%s); retrying in %.1f s", ino, e.strerror or e, wait)
        finally:
            self._queued.discard(ino)
