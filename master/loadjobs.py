"""`cv load`: jobs that cache UFS files ahead of use, tracked by the master.

A job walks its path (listing UFS directories it has not seen, as a lookup would),
and for every block with no live replica asks the block's first placement target to
fetch it from the UFS and forward a copy to the others (``WorkerService.LoadBlocks``),
``ufs.load_threads`` batches at once.  Progress (files, bytes found, bytes cached) is
kept in memory: a job is a convenience, not state; a master restart forgets it, and
``cv load`` again finds what is cached and loads the rest.
"""
from __future__ import annotations

import errno
import itertools
import logging
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from curvine_py.common.errors import CurvineError, err
from curvine_py.master.namespace import Namespace
from curvine_py.master.posix import Cred
from curvine_py.master.ufsmounts import UfsMounts
from curvine_py.master.uploads import BlocksOf
from curvine_py.master.workerrpc import WorkerClients
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
BATCH = 4                 # blocks per LoadBlocks call
KEEP_JOBS = 100           # finished jobs remembered for --status


class LoadJobs:
    """One per master."""

    def __init__(self, ns: Callable[[], Namespace], mounts: UfsMounts, workers: WorkerClients,
                 blocks_of: BlocksOf, threads: int, timeout_s: float, note_read: Callable[[int], None]) -> None:
        self._ns = ns
        self.mounts = mounts
        self.workers = workers
        self.blocks_of = blocks_of
        self.threads = max(1, threads)
        self.timeout_s = timeout_s
        self.note_read = note_read
        self._jobs: dict[int, pb.LoadJob] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start(self, cred: Cred, path: str, recursive: bool) -> pb.LoadJob:
        """Check the path now (a bad one fails the call), then load in the background."""
        row = self._ns().resolve(cred, path)
        if stat.S_ISDIR(row.mode) and not recursive:
            raise err(errno.EISDIR, f"{path} is a directory (load it with -r)")
        job = pb.LoadJob(job_id=next(self._ids), path=path, state="running", started_ns=time.time_ns())
        with self._lock:
            self._jobs[job.job_id] = job
            self._trim()
        threading.Thread(target=self._run, args=(job, cred, row.ino), name=f"load-{job.job_id}",
                         daemon=True).start()
        return self.snapshot(job.job_id)

    def snapshot(self, job_id: int) -> pb.LoadJob:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise err(errno.ENOENT, f"no load job {job_id}")
            out = pb.LoadJob()
            out.CopyFrom(job)
            return out

    def status(self, job_id: int = 0) -> list[pb.LoadJob]:
        with self._lock:
            ids = [job_id] if job_id else sorted(self._jobs)
        return [self.snapshot(i) for i in ids]

    def _trim(self) -> None:
        done = [i for i, j in sorted(self._jobs.items()) if j.state != "running"]
        for i in done[:max(0, len(self._jobs) - KEEP_JOBS)]:
            del self._jobs[i]

    # ------------------------------------------------------------------ the job
    def _run(self, job: pb.LoadJob, cred: Cred, ino: int) -> None:
        try:
            with ThreadPoolExecutor(self.threads, thread_name_prefix=f"load-{job.job_id}") as pool:
                for fut in [pool.submit(self._load_file, job, f) for f in self._files(cred, ino)]:
                    fut.result()
            state = "done" if not job.failed_blocks else f"failed: {job.failed_blocks} blocks ({job.message})"
        except CurvineError as e:
            state = f"failed: {e.strerror or e}"
        except Exception as e:   # a job must end with a state, whatever broke
            log.exception("load job %d crashed", job.job_id)
            state = f"failed: {e}"
        with self._lock:
            job.state = state
            job.finished_ns = time.time_ns()
        log.info("load job %d (%s): %s, %d files, %d of %d bytes cached", job.job_id, job.path, state,
                 job.files, job.loaded_bytes, job.total_bytes)

    def _files(self, cred: Cred, ino: int) -> Iterator[int]:
        """Regular files at or below ino (UFS directories listed first when stale)."""
        ns = self._ns()
        row = ns.inode(ino)
        if not stat.S_ISDIR(row.mode):
            yield ino
            return
        todo = [ino]
        while todo:
            d = todo.pop()
            self.mounts.fresh_dir(d)
            offset = 0
            while True:
                rows = self._ns().readdir(cred, d, offset, 1000, False)
                for r in rows:
                    if stat.S_ISDIR(r.mode):
                        todo.append(r.ino)
                    elif stat.S_ISREG(r.mode):
                        yield r.ino
                if len(rows) < 1000:
                    break
                offset = rows[-1].seq

    def _load_file(self, job: pb.LoadJob, ino: int) -> None:
        row, blocks, addrs = self.blocks_of(ino)
        missing = [b for b in blocks if b.ufs.load]
        with self._lock:
            job.files += 1
            job.total_bytes += row.size
            job.loaded_bytes += sum(b.length for b in blocks if not b.ufs.load)
        self.note_read(ino)      # loaded = about to be used: recent in the LRU order
        by_target: dict[int, list[pb.BlockInfo]] = {}
        for b in missing:
            if b.workers:
                by_target.setdefault(b.workers[0], []).append(b)
            else:
                self._failed(job, [b.block_id], "no worker has room")
        for wid, bs in by_target.items():
            for i in range(0, len(bs), BATCH):
                self._load_batch(job, wid, bs[i:i + BATCH], addrs)

    def _load_batch(self, job: pb.LoadJob, wid: int, blocks: list[pb.BlockInfo],
                    addrs: list[pb.WorkerAddress]) -> None:
        length = {b.block_id: b.length for b in blocks}
        try:
            reply = self.workers.load(wid, blocks, addrs, self.timeout_s * 2 + 10)
        except CurvineError as e:
            self._failed(job, list(length), e.strerror or str(e))
            return
        with self._lock:
            job.loaded_bytes += sum(length.get(b, 0) for b in reply.loaded)
        if reply.failed:
            self._failed(job, list(reply.failed), reply.message)

    def _failed(self, job: pb.LoadJob, block_ids: list[int], message: str) -> None:
        with self._lock:
            job.failed_blocks += len(block_ids)
            job.message = message
        log.warning("load job %d: %d blocks not loaded: %s", job.job_id, len(block_ids), message)
