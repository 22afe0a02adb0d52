"""The SDK's typed results: plain frozen records built from the wire's messages in one
place each (``of`` / ``from_pb``), so callers never see a ``pb.*Reply``.  Kept apart from
sdk.py, which is the behaviour (paths over the VFS); the CLI formats these records.
"""
from __future__ import annotations

import posixpath
import stat
from dataclasses import dataclass

from curvine_py.client.metagroup import MasterInfo   # the client core's record, one of the SDK's results
from curvine_py.pb import curvine_pb2 as pb


@dataclass(frozen=True)
class FileStatus:
    path: str
    name: str
    ino: int
    mode: int
    size: int
    nlink: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    block_size: int
    replicas: int
    complete: bool

    @classmethod
    def of(cls, path: str, a: pb.Attr) -> "FileStatus":
        return cls(path, posixpath.basename(path) or "/", a.ino, a.mode, a.size, a.nlink, a.uid, a.gid,
                   a.atime_ns, a.mtime_ns, a.ctime_ns, a.block_size, a.replicas, a.complete)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.mode)

    @property
    def mtime(self) -> float:
        return self.mtime_ns / 1e9


@dataclass(frozen=True)
class StatFs:
    """The pool's capacity and usage (statfs)."""
    capacity: int
    used: int
    available: int
    files: int
    block_size: int


@dataclass(frozen=True)
class WorkerRef:
    """A worker's identity and ports (the wire's WorkerAddress): host is its host identity,
    ip the address its rpc and data ports listen on."""
    worker_id: int
    host: str
    ip: str
    rpc_port: int
    data_port: int

    @classmethod
    def of(cls, a: pb.WorkerAddress) -> "WorkerRef":
        return cls(a.worker_id, a.host, a.ip, a.rpc_port, a.data_port)


@dataclass(frozen=True)
class BlockLocation:
    block_id: int
    offset: int
    length: int
    checksum: int
    workers: list[WorkerRef]


@dataclass(frozen=True)
class DataDir:
    """One data directory of a worker: its tier (MEM, SSD, HDD, DISK) and bytes."""
    path: str
    tier: str
    capacity: int
    used: int


@dataclass(frozen=True)
class WorkerReport:
    """One worker as the master sees it.  state: "live" or "lost"; last_heartbeat_ms is an
    age (ms since its last heartbeat); io_engine "uring" or "threads" ("" = the worker did
    not say); metrics_port its /metrics port on address.ip (0 = off)."""
    address: WorkerRef
    state: str
    capacity: int
    used: int
    dirs: tuple[DataDir, ...]
    blocks: int
    last_heartbeat_ms: int
    io_engine: str
    metrics_port: int


@dataclass(frozen=True)
class Report:
    """The cluster as the master sees it (`cv report`): its workers, the ring epoch, the
    pool's bytes, files and blocks, blocks missing a replica, and the files removed by
    eviction and TTL sweeps since the master started.  metrics_port: the master's (0 = off).
    masters: every master of the client's list as it reports itself (one for a single
    master; asked of each master, not of the leader: ``Client.masters``)."""
    workers: tuple[WorkerReport, ...]
    ring_epoch: int
    capacity: int
    used: int
    files: int
    blocks: int
    under_replicated: int
    master_address: str
    version: str
    evicted_files: int
    evicted_bytes: int
    expired_files: int
    metrics_port: int
    masters: tuple[MasterInfo, ...] = ()

    @classmethod
    def from_pb(cls, r: pb.ReportReply, masters: tuple[MasterInfo, ...] = ()) -> "Report":
        """The Report RPC's reply as plain records, with the masters' own statuses."""
        workers = tuple(WorkerReport(
            WorkerRef.of(w.address), w.state, w.capacity, w.used,
            tuple(DataDir(d.path, d.tier, d.capacity, d.used) for d in w.dirs),
            w.blocks, w.last_heartbeat_ms, w.io_engine, w.metrics_port) for w in r.workers)
        return cls(workers, r.ring_epoch, r.capacity, r.used, r.files, r.blocks, r.under_replicated,
                   r.master_address, r.version, r.evicted_files, r.evicted_bytes, r.expired_files,
                   r.metrics_port, masters)


@dataclass(frozen=True)
class CachePolicy:
    """A path's effective cache policy (docs/eviction.md) and where each part is set."""
    pinned: bool
    pinned_by: str
    ttl_s: int | None
    ttl_from: str
    tier: str
    tier_from: str
    kv: bool = False     # files made below are KV chunks (docs/kvcache.md): one block, read the KV way
    kv_from: str = ""    # the top of the run of KV directories it was copied down from



@dataclass(frozen=True)
class Location:
    """Where one path's file lives (``Client.locate``): its status, or the errno of its
    absence; the hosts holding a live replica of every one of its blocks (a reader there
    reads it from its own disk); its tier (the tier policy, else its holders' one tier)."""
    path: str
    errno: int
    status: FileStatus | None
    hosts: tuple[str, ...]
    tier: str

    @property
    def found(self) -> bool:
        return self.errno == 0

    @classmethod
    def from_pb(cls, path: str, m: pb.Located) -> "Location":
        status = FileStatus.of(path, m.attr) if m.errno == 0 else None
        return cls(path, m.errno, status, tuple(m.hosts), m.tier)
