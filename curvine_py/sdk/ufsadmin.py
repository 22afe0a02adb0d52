"""The SDK's side of UFS mounts (docs/ufs.md): mount, list, unmount, stat, load, free.

Paths in, typed records out (dataclasses, never protobuf messages), errors as
``CurvineError`` with the path in the message.  Reached as ``Client.ufs``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from curvine_py.client.metaclient import MasterClient
from curvine_py.common.config import UfsConfig
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master, Method, Rep, Req


@dataclass(frozen=True)
class UfsMountInfo:
    mount_id: int
    path: str
    uri: str
    options: dict[str, str]      # secrets shown as ***
    write_mode: str              # "through" | "back"
    metadata_ttl_s: float
    ttl_s: float                 # 0 = cached data never expires
    created: float               # seconds since the epoch

    @classmethod
    def of(cls, m: pb.UfsMount) -> "UfsMountInfo":
        return cls(m.mount_id, m.path, m.uri, dict(m.options), m.write_mode, m.metadata_ttl_ms / 1000,
                   m.ttl_ms / 1000, m.created_ns / 1e9)


@dataclass(frozen=True)
class UfsFileStatus:
    """A file's UFS state, as `cv fs stat` shows it (uri "" = not under a UFS mount)."""

    path: str
    size: int
    uri: str = ""
    state: str = ""              # "persisted" | "pending upload" | "uploading" | "failed: reason"
    cached_bytes: int = 0
    etag: str = ""


@dataclass(frozen=True)
class LoadJobStatus:
    job_id: int
    path: str
    state: str                   # "running" | "done" | "failed: reason"
    files: int
    total_bytes: int
    loaded_bytes: int
    failed_blocks: int
    started: float
    finished: float              # 0 while running
    message: str = ""

    @classmethod
    def of(cls, j: pb.LoadJob) -> "LoadJobStatus":
        return cls(j.job_id, j.path, j.state, j.files, j.total_bytes, j.loaded_bytes, j.failed_blocks,
                   j.started_ns / 1e9, j.finished_ns / 1e9, j.message)

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class FreeResult:
    files: int                   # files whose cached blocks were dropped
    bytes: int                   # their size
    skipped: int                 # files not (yet) in the UFS: their only copy is the pool's, kept


@dataclass
class UfsAdmin:
    """UFS calls of one Client, over its master client (the SDK's Client needs nothing
    else of it, so the two modules do not import each other)."""

    meta: MasterClient
    defaults: UfsConfig          # the [ufs] section: metadata_ttl_s of a mount that names none
    poll_s: float = field(default=0.2)

    def mount(self, uri: str, path: str, options: dict[str, str] | None = None, write_mode: str = "through",
              metadata_ttl_s: float | None = None, ttl_s: float = 0) -> UfsMountInfo:
        """Mount uri at path (made if missing; an existing one must be an empty directory)."""
        ttl = self.defaults.metadata_ttl_s if metadata_ttl_s is None else metadata_ttl_s
        m = pb.UfsMount(path=path, uri=uri, options=options or {}, write_mode=write_mode,
                        metadata_ttl_ms=int(ttl * 1000), ttl_ms=int(ttl_s * 1000))
        req = pb.UfsMountRequest(caller=self.meta.caller(mutation=True), mount=m)
        return UfsMountInfo.of(self._call(path, Master.UfsMountAdd, req))

    def umount(self, path: str, force: bool = False) -> None:
        """Drop the mount and its cache; the UFS is not touched."""
        req = pb.UfsPathRequest(caller=self.meta.caller(mutation=True), path=path, force=force)
        self._call(path, Master.UfsMountRemove, req)

    def mounts(self) -> list[UfsMountInfo]:
        return [UfsMountInfo.of(m) for m in self.meta.call(Master.UfsMountList, pb.Empty()).mounts]

    def stat(self, path: str) -> UfsFileStatus:
        req = pb.PathRequest(caller=self.meta.caller(), path=path, follow_symlinks=True)
        r = self._call(path, Master.UfsStat, req)
        return UfsFileStatus(path, r.attr.size, r.ufs.uri, r.ufs.state, r.ufs.cached_bytes, r.ufs.etag)

    def load(self, path: str, recursive: bool = False) -> LoadJobStatus:
        """Start caching path (a tree with recursive); returns the job at its start."""
        req = pb.LoadRequest(caller=self.meta.caller(), path=path, recursive=recursive)
        return LoadJobStatus.of(self._call(path, Master.Load, req))

    def jobs(self, job_id: int = 0) -> list[LoadJobStatus]:
        reply = self.meta.call(Master.LoadStatus, pb.LoadJobRequest(job_id=job_id))
        return [LoadJobStatus.of(j) for j in reply.jobs]

    def wait(self, job_id: int, timeout_s: float | None = None) -> LoadJobStatus:
        """Poll a job until it ends (or timeout_s passes: the job as it is then)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.jobs(job_id)[0]
            if not job.running or (deadline is not None and time.monotonic() > deadline):
                return job
            time.sleep(self.poll_s)

    def free(self, path: str, recursive: bool = False) -> FreeResult:
        """Drop the cached blocks of UFS files at path; they stay readable (from the UFS)."""
        req = pb.FreeRequest(caller=self.meta.caller(mutation=True), path=path, recursive=recursive)
        r = self._call(path, Master.Free, req)
        return FreeResult(r.files, r.bytes, r.skipped)

    def _call(self, path: str, method: Method[Req, Rep], request: Req) -> Rep:
        try:
            return self.meta.call(method, request)
        except CurvineError as e:
            raise e.with_path(path) from None
