"""The master client: every metadata call, with the caller's identity and retries.

A call that could not reach the master (UNAVAILABLE, DEADLINE_EXCEEDED) is retried
with the same request id until ``client.retry_s`` runs out, so a master restart is a
pause, not an error, and a mutation that did land before the connection broke is not
applied twice (the master's retry cache answers the retry).  Any other failure is
raised at once as the CurvineError the master sent.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import time
import uuid
from typing import Any, Callable, TypeVar

import grpc
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from curvine_py.common.config import ClientConfig
from curvine_py.common.errors import RETRYABLE, CurvineError, from_rpc_error
from curvine_py.common.rpc import channel
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

# Calls that change nothing: no request id needed, safe to retry blindly.
READ_ONLY = frozenset({"Lookup", "GetAttr", "ResolvePath", "ReadDir", "Readlink", "GetXattr", "ListXattr",
                       "StatFs", "GetBlockLocations", "GetRing", "Report", "RenewLeases"})


class _Unreachable(Exception):
    def __init__(self, e: grpc.RpcError) -> None:
        super().__init__(str(e))
        self.rpc_error = e


def _is_unreachable(e: BaseException) -> bool:
    return isinstance(e, _Unreachable)


class Identity:
    """Who is calling: uid, gid and groups (the mount passes each request's own)."""

    __slots__ = ("uid", "gid", "groups")

    def __init__(self, uid: int, gid: int, groups: tuple[int, ...] = ()) -> None:
        self.uid, self.gid, self.groups = uid, gid, groups

    @classmethod
    def current(cls) -> "Identity":
        return cls(os.geteuid(), os.getegid(), tuple(os.getgroups()))


class MasterClient:
    """Thread-safe; one per process is enough (gRPC multiplexes calls on one channel)."""

    def __init__(self, address: str, cfg: ClientConfig, secret: str = "") -> None:
        self.address = address
        self.cfg = cfg
        self.client_id = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._channel = channel(address, secret)
        self.stub = pb_grpc.MasterServiceStub(self._channel)
        self.identity = Identity.current()
        # Told the directories each mutation changed, as they are after it (the VFS caches them).
        self.dirs_listener: Callable[[list[pb.Attr]], None] | None = None

    def close(self) -> None:
        self._channel.close()

    def saw_dirs(self, reply: Any) -> Any:
        if self.dirs_listener is not None and reply.dirs:
            self.dirs_listener(list(reply.dirs))
        return reply

    def caller(self, ident: Identity | None = None, mutation: bool = False) -> pb.Caller:
        ident = ident or self.identity
        return pb.Caller(uid=ident.uid, gid=ident.gid, groups=ident.groups, client_id=self.client_id,
                         request_id=uuid.uuid4().hex if mutation else "")

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """Invoke a MasterService method with retries; raises CurvineError."""
        fn: Callable[..., Any] = getattr(self.stub, method)
        timeout = timeout or self.cfg.rpc_timeout_s

        def attempt() -> Any:
            try:
                return fn(request, timeout=timeout)
            except grpc.RpcError as e:
                if e.code() in RETRYABLE and not _has_errno(e):
                    raise _Unreachable(e) from None
                raise from_rpc_error(e) from None

        retrying = Retrying(retry=retry_if_exception(_is_unreachable), stop=stop_after_delay(self.cfg.retry_s),
                            wait=wait_exponential(multiplier=0.05, max=2.0), reraise=True,
                            before_sleep=lambda rs: log.info("master %s unreachable; retrying %s", self.address,
                                                             method))
        try:
            return retrying(attempt)
        except _Unreachable as e:
            raise CurvineError(errno.EHOSTDOWN if e.rpc_error.code() == grpc.StatusCode.UNAVAILABLE
                               else errno.ETIMEDOUT,
                               f"master {self.address} unreachable: {e.rpc_error.details()}") from None

    # ------------------------------------------------------------------ conveniences
    def resolve(self, path: str, follow: bool = True, ident: Identity | None = None) -> pb.Attr:
        return self.call("ResolvePath", pb.PathRequest(caller=self.caller(ident), path=path,
                                                       follow_symlinks=follow)).attr

    def lookup(self, parent: int, name: str, ident: Identity | None = None) -> pb.Attr:
        return self.call("Lookup", pb.LookupRequest(caller=self.caller(ident), parent=parent, name=name)).attr

    def getattr(self, ino: int, ident: Identity | None = None) -> pb.Attr:
        return self.call("GetAttr", pb.InodeRequest(caller=self.caller(ident), ino=ino)).attr

    def mknod(self, parent: int, name: str, mode: int, umask: int = 0, rdev: int = 0, target: str = "",
              block_size: int = 0, ident: Identity | None = None) -> pb.Attr:
        req = pb.MknodRequest(caller=self.caller(ident, True), parent=parent, name=name, mode=mode, umask=umask,
                              rdev=rdev, symlink_target=target, block_size=block_size)
        return self.saw_dirs(self.call("Mknod", req)).attr

    def create(self, parent: int, name: str, mode: int, flags: int, umask: int = 0, exclusive: bool = False,
               block_size: int = 0, ident: Identity | None = None) -> pb.OpenReply:
        req = pb.MknodRequest(caller=self.caller(ident, True), parent=parent, name=name, mode=mode, umask=umask,
                              exclusive=exclusive, block_size=block_size, open_flags=flags)
        return self.saw_dirs(self.call("Create", req))

    def open(self, ino: int, flags: int, write: bool, ident: Identity | None = None) -> pb.OpenReply:
        req = pb.OpenRequest(caller=self.caller(ident, write), ino=ino, flags=flags, write=write)
        return self.call("Open", req)

    def allocate(self, ino: int, lease_id: int, count: int, exclude: list[int] | None = None,
                 ident: Identity | None = None) -> pb.AllocateBlocksReply:
        req = pb.AllocateBlocksRequest(caller=self.caller(ident, True), ino=ino, lease_id=lease_id, count=count,
                                       exclude_workers=exclude or [])
        return self.call("AllocateBlocks", req)

    def commit(self, ino: int, lease_id: int, size: int, blocks: list[pb.BlockInfo], release: bool,
               mtime_ns: int = 0, ident: Identity | None = None) -> pb.Attr:
        req = pb.CommitRequest(caller=self.caller(ident, True), ino=ino, lease_id=lease_id, size=size,
                               blocks=blocks, release=release, mtime_ns=mtime_ns)
        return self.call("Commit", req).attr

    def unlink(self, parent: int, name: str, ident: Identity | None = None) -> None:
        self.saw_dirs(self.call("Unlink", pb.UnlinkRequest(caller=self.caller(ident, True), parent=parent, name=name)))

    def rmdir(self, parent: int, name: str, ident: Identity | None = None) -> None:
        self.saw_dirs(self.call("Rmdir", pb.UnlinkRequest(caller=self.caller(ident, True), parent=parent, name=name)))

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int = 0,
               ident: Identity | None = None) -> None:
        self.saw_dirs(self.call("Rename", pb.RenameRequest(caller=self.caller(ident, True), parent=parent, name=name,
                                                       new_parent=new_parent, new_name=new_name, flags=flags)))

    def readdir(self, ino: int, offset: int = 0, limit: int = 1000, plus: bool = False,
                ident: Identity | None = None) -> pb.ReadDirReply:
        return self.call("ReadDir", pb.ReadDirRequest(caller=self.caller(ident), ino=ino, offset=offset,
                                                      limit=limit, plus=plus))

    def block_locations(self, ino: int, ident: Identity | None = None) -> pb.BlockLocationsReply:
        return self.call("GetBlockLocations", pb.BlockLocationsRequest(caller=self.caller(ident), ino=ino))

    def report_bad_block(self, block_id: int, worker_id: int, reason: str) -> None:
        """Tell the master a replica's bytes failed their checksum (it is then re-copied)."""
        self.call("ReportBadBlock", pb.BadBlockRequest(caller=self.caller(), block_id=block_id,
                                                       worker_id=worker_id, reason=reason[:200]))

    def renew(self, lease_ids: list[int]) -> list[int]:
        return list(self.call("RenewLeases", pb.LeaseRequest(caller=self.caller(), lease_ids=lease_ids)).expired)


def _has_errno(e: grpc.RpcError) -> bool:
    md = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    return any(k == "curvine-errno" for k, _ in (md or ()))


def now_ns() -> int:
    return time.time_ns()
