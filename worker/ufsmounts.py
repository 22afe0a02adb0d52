"""The worker's UFS mounts: mount id -> an opened provider (``curvine_py.ufs.Ufs``).

A READ, a LoadBlocks or a Persist names a mount by its id only; the worker asks the
master for the record (``UfsMountGet``: the URI and the options, credentials included:
they stay on the cluster side) the first time an id is used and keeps the opened
provider for the life of the process.  Mount ids are never reused, so an entry never
goes stale and nothing is ever evicted (a mount removed meanwhile is simply no longer
named by anyone).  An id the master does not know is ENOENT, and is asked again next
time: a failed lookup is not remembered.

The lookup is injectable (``Resolver``): the worker process passes ``master_resolver``
over the heartbeat's link to the master (``masterlink.py``: one transport to the master
per process, calls go to the leader of several masters); tests pass a function
returning the ``UfsMount`` record they want.
"""
from __future__ import annotations

import errno
import logging
import threading
from typing import Callable, Protocol

import grpc

from curvine_py.common.errors import CurvineError, from_rpc_error
from curvine_py.pb import curvine_pb2
from curvine_py.ufs.base import Ufs
from curvine_py.pb.methods import Master, Method, Rep, Req

log = logging.getLogger(__name__)

Resolver = Callable[[int], curvine_pb2.UfsMount]


class Opener(Protocol):
    def __call__(self, uri: str, options: dict[str, str], timeout_s: float) -> Ufs: ...


class _Master(Protocol):
    """The part of worker/masterlink.py MasterLink the resolver needs."""

    def call(self, method: Method[Req, Rep], request: Req, timeout: float) -> Rep: ...


def default_opener(uri: str, options: dict[str, str], timeout_s: float) -> Ufs:
    """curvine_py.ufs.open_ufs, imported at first use (a worker that never sees a UFS
    read never loads a provider's client library)."""
    from curvine_py.ufs import open_ufs
    return open_ufs(uri, options, timeout_s)


def master_resolver(master: _Master, timeout_s: float) -> Resolver:
    """The production lookup: UfsMountGet on the master (the leader of several), each try
    bounded by timeout_s; a gRPC failure becomes the CurvineError the master sent (ENOENT
    for an unknown id)."""
    def resolve(mount_id: int) -> curvine_pb2.UfsMount:
        try:
            return master.call(Master.UfsMountGet, curvine_pb2.UfsMountIdRequest(mount_id=mount_id), timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
    return resolve


def no_master(mount_id: int) -> curvine_pb2.UfsMount:
    """The lookup of a standalone worker: no master, so no mount is known."""
    raise CurvineError(errno.ENOENT, f"UFS mount {mount_id} unknown (standalone worker: no master)")


class UfsMounts:
    """Thread-safe cache of opened providers by mount id; one lookup per id at a time."""

    def __init__(self, resolve: Resolver, timeout_s: float, opener: Opener = default_opener) -> None:
        self._resolve = resolve
        self._open = opener
        self.timeout_s = timeout_s
        self._mounts: dict[int, Ufs] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, mount_id: int) -> Ufs:
        """The opened provider of mount_id (looked up and opened on first use).  Raises
        ENOENT for an unknown id, the provider's UfsError for a mount it cannot open, and
        ETIMEDOUT when another thread's lookup of the same id takes too long."""
        ufs = self._mounts.get(mount_id)
        if ufs is not None:
            return ufs
        with self._lock:
            id_lock = self._locks.setdefault(mount_id, threading.Lock())
        if not id_lock.acquire(timeout=self.timeout_s * 2):   # a lookup, then an open: each bounded
            raise CurvineError(errno.ETIMEDOUT, f"UFS mount {mount_id}: lookup still running after "
                                                f"{self.timeout_s * 2:g}s")
        try:
            ufs = self._mounts.get(mount_id)
            if ufs is None:
                ufs = self._load(mount_id)
                self._mounts[mount_id] = ufs
            return ufs
        finally:
            id_lock.release()

    def _load(self, mount_id: int) -> Ufs:
        record = self._resolve(mount_id)
        if record.mount_id != mount_id or not record.uri:
            raise CurvineError(errno.ENOENT, f"UFS mount {mount_id} unknown to the master")
        ufs = self._open(record.uri, dict(record.options), self.timeout_s)
        log.info("UFS mount %d: %s (%s)", mount_id, record.uri, record.path or "?")
        return ufs

    def close(self) -> None:
        """Release every provider's connections (the worker is stopping)."""
        with self._lock:
            mounts, self._mounts = list(self._mounts.values()), {}
        for ufs in mounts:
            try:
                ufs.close()
            except Exception as e:   # stopping: a provider's close must not stop the rest
                log.warning("closing UFS %s: %s", getattr(ufs, "uri", "?"), e)
