"""The master client: every metadata call, with the caller's identity and retries.

A call that could not reach the master (UNAVAILABLE, DEADLINE_EXCEEDED, a broken or
timed-out socket) is retried with the same request id until ``client.retry_s`` runs
out, so a master restart is a pause, not an error, and a mutation that did land before
the connection broke is not applied twice (the master's retry cache answers the retry).
Any other failure is raised at once as the CurvineError the master sent.

Transport: the framed metadata channel (``framedclient.py``, ~10x cheaper per call than
Python gRPC), the one clients use.  The configured address is the master's gRPC port:
the first call asks it for the frame port (``GetRing``, the client's only gRPC call),
and the port is asked again whenever connecting to it fails (a master restarted on a
new ephemeral port).  A frame port that does not answer is an unreachable master,
retried like one; the final error names the port and ``master.frame_port``.

Three masters (docs/ha.md): the address may be a comma-separated list.  Calls go to the
master last found to be the leader (``common/leader.py``); a follower's NotLeader (on
frames, or on GetRing's gRPC with ``curvine-leader``) or a master that does not answer
moves the client to the leader named, else to the next master, at once; the frame route
learned from the old master is forgotten and the new one's is asked with GetRing.  Only
after a whole round of the list failed does the client wait (0.05 s doubling to 2 s).
The request id stays the same through all of it.  With one address nothing of this
happens: the master is retried exactly as it always was.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, TypeVar

import grpc

from curvine_py.client import metrics
from curvine_py.client.framedclient import FramedClient
from curvine_py.client.metacache import MetaCache
from curvine_py.common.config import ClientConfig
from curvine_py.common.errors import (RETRYABLE, ConfigError, CurvineError, NoServer, Unreached, from_rpc_error,
                                     leader_of)
from curvine_py.common.leader import Leader
from curvine_py.common.retry import Exponential, Failed, Retry
from curvine_py.common.rpc import channel
from curvine_py.common.tls import Tls, diagnose
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc
from curvine_py.pb.methods import Master, Method, Rep, Req

log = logging.getLogger(__name__)
# The replies that carry the directories a mutation changed (MasterClient.saw_dirs).
WithDirs = TypeVar("WithDirs", pb.AttrReply, pb.DirsReply, pb.OpenReply)
# A master (or a whole round of a group's masters) that did not answer: the same request
# again after 0.05 s, doubling to 2 s (the threads' client and the mount loop's,
# client/asyncmeta.py, wait alike).
MASTER_WAIT = Exponential(0.05, 2.0)
T = TypeVar("T")
MIN_ATTEMPT_S = 1.0


def attempt_timeout(cfg: ClientConfig) -> float:
    """One attempt's bound: client.rpc_timeout_s, but never past client.retry_s (and at
    least MIN_ATTEMPT_S): a caller who allows 5 s of retries must not wait 30 s for one
    attempt on a master that accepted the connection and went silent (SIGSTOP, a frozen VM)."""
    return min(cfg.rpc_timeout_s, max(cfg.retry_s, MIN_ATTEMPT_S))


@dataclass(frozen=True)
class _PortFailure:
    """The frame port that could not be connected to, and why (for the final error)."""
    master: str
    port: int
    error: str


def _is_unreachable(e: BaseException) -> bool:
    return isinstance(e, Unreached)


class Identity:
    """Who is calling: uid, gid and groups (the mount passes each request's own)."""

    __slots__ = ("uid", "gid", "groups")

    def __init__(self, uid: int, gid: int, groups: tuple[int, ...] = ()) -> None:
        self.uid, self.gid, self.groups = uid, gid, groups

    @classmethod
    def current(cls) -> "Identity":
        return cls(os.geteuid(), os.getegid(), tuple(os.getgroups()))


class MasterClient:
    """Thread-safe; one per process is enough (a frame connection per calling thread, and
    gRPC multiplexes calls on one channel)."""

    def __init__(self, address: str, cfg: ClientConfig, secret: str = "", tls: Tls | None = None) -> None:
        """address: the master's gRPC "host:port", or a group's, comma-separated; tls: this
        client's identity when the cluster runs mutual TLS (common/tls.py)."""
        self.tls = tls
        self.address = address
        try:
            self.masters = Leader(address, MASTER_WAIT)   # which master to call: the leader as last found
        except ValueError:
            raise ConfigError("client.master is empty: give the master's gRPC address host:port") from None
        self.cfg = cfg
        self.client_id = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._secret = secret
        # GetRing only (learns the frame port): one channel per master, made at its first GetRing
        self._bootstraps: dict[str, tuple[grpc.Channel, pb_grpc.MasterServiceStub]] = {}
        self._frames: FramedClient | None = None   # the current master's route; replaced whole, reads need no lock
        self._port_lock = threading.Lock()
        self.identity = Identity.current()
        self.prefer_host = ""   # sent with AllocateBlocks: the host whose worker gets the first replica
        # Told the directories each mutation changed, as they are after it (the VFS caches them).
        self.dirs_listener: Callable[[list[pb.Attr]], None] | None = None
        # The mount's cache of names and attributes under the master's leases (its session
        # goes with each request; a mutation's reply waits for its push there): None = none.
        self.cache: MetaCache | None = None
        # until client.retry_s (read at each call: the mount lowers it while mounting); the
        # next master of a group at once, MASTER_WAIT after each whole round (Leader.wait)
        self._retry = Retry(transient=_is_unreachable, wait=self.masters.wait,
                            deadline_s=lambda: self.cfg.retry_s, before_sleep=self._retrying,
                            before_retry=self._tls_verdict)

    def close(self) -> None:
        frames = self._frames
        if frames is not None:
            frames.close()
        bootstraps, self._bootstraps = list(self._bootstraps.values()), {}   # no lock: never wait for a GetRing
        for chan, _ in bootstraps:
            chan.close()

    def saw_dirs(self, reply: WithDirs) -> WithDirs:
        if self.dirs_listener is not None and reply.dirs:
            self.dirs_listener(list(reply.dirs))
        return reply

    def caller(self, ident: Identity | None = None, mutation: bool = False) -> pb.Caller:
        ident = ident or self.identity
        return pb.Caller(uid=ident.uid, gid=ident.gid, groups=ident.groups, client_id=self.client_id,
                         request_id=uuid.uuid4().hex if mutation else "",
                         session=self.cache.session if self.cache is not None else 0)

    def settle(self, request: object, reply: object) -> None:
        """A mutation's reply: its own invalidation of this client's cache, handled before
        the call returns (client/metacache.py)."""
        cache = self.cache
        seq = getattr(reply, "wait_seq", 0)
        if cache is not None and seq:
            caller = getattr(request, "caller", None)
            cache.own_change(caller.session if caller is not None else 0, seq, getattr(reply, "invalidated", ()))

    def call(self, method: Method[Req, Rep], request: Req, timeout: float | None = None) -> Rep:
        """Invoke a MasterService method with retries; raises CurvineError.  Its latency,
        retries included, goes to curvine_client_meta_rpc_duration_seconds."""
        if not metrics.on:
            return self._call(method, request, timeout)
        start = time.perf_counter()
        try:
            return self._call(method, request, timeout)
        finally:
            metrics.meta_seconds(method.name).observe(time.perf_counter() - start)

    def _call(self, method: Method[Req, Rep], request: Req, timeout: float | None) -> Rep:
        """call() without the clock.  The first attempt runs without tenacity (Retry.call):
        building its Retrying costs ~15 us, a quarter of a framed call, and is only needed
        once the master did not answer."""
        timeout = timeout or attempt_timeout(self.cfg)
        try:
            reply = self._retry.call(self._attempt, method, request, timeout)
        except Unreached as e:
            raise self.unreachable_error(e) from None
        if self.cache is not None:
            self.settle(request, reply)
        return reply

    def unreachable_error(self, e: Unreached) -> CurvineError:
        """The one-line error of a call no master answered until client.retry_s ran out:
        it names the master, or every master of the group and the last one tried."""
        if len(self.masters.addresses) == 1:
            return CurvineError(e.code, f"master {self.address} unreachable: {e}")
        last = f" (last {e.at}: {e})" if e.at else f": {e}"
        return CurvineError(e.code, f"no master of {self.masters} answered{last}")

    def _tls_verdict(self, failed: Failed) -> None:
        """After a first gRPC call that the master closed at once: when TLS is why (a plain
        client at a TLS port, a refused certificate), say so now; no retry changes it."""
        error = failed.error
        if failed.attempt != 1 or "Socket closed" not in str(error):
            return
        at = error.at if isinstance(error, Unreached) and error.at else self.masters.current()
        if why := diagnose(at, self.tls, "master"):
            raise CurvineError(errno.EACCES, why)

    def _retrying(self, failed: Failed) -> None:
        error = failed.error
        at = error.at if isinstance(error, Unreached) and error.at else self.address
        log.info("master %s: %s; retrying %s on %s", at, error, failed.args[0].name, self.masters.current())

    def frame_route(self) -> tuple[str, int, str] | None:
        """(host, frame port, secret) once the frame port is known, else None: the mount's
        loop-side client (client/asyncmeta.py) follows this client's route."""
        frames = self._frames
        return (frames.host, frames.port, self._secret) if frames is not None else None

    def learn_route(self, timeout: float) -> tuple[str, int, str]:
        """frame_route(), asking the master for its frame port first if it is not known
        (GetRing: blocks; the mount's loop calls this in a thread, and retries it): one
        attempt, Unreached when the master could not be reached."""
        frames = self._frames or self._learn_port(timeout)
        return frames.host, frames.port, self._secret

    def route_failed(self, port: int) -> None:
        """The mount's loop could not connect to this frame port: the next call, of either
        client, asks the master for its port again (it may have moved).  Never blocks (the
        loop calls it)."""
        frames = self._frames
        if frames is not None and frames.port == port:
            self._drop(frames)

    def route_not_leader(self, host: str, port: int, leader: str) -> None:
        """The mount's loop got NOT_LEADER on the route (host, port), naming leader ("" =
        unknown): the next route, of either client, is the leader's (or the next
        master's), asked with GetRing by learn_route in a thread.  Never blocks (the loop
        calls it)."""
        frames = self._frames
        if frames is not None and (frames.host, frames.port) == (host, port):
            self._switch(frames.master, leader)

    # ------------------------------------------------------------------ transport
    def _attempt(self, method: Method[Req, Rep], request: Req, timeout: float) -> Rep:
        """One try; Unreached if the master was not reached, or was not the leader
        (the next try then goes to the master self.masters names)."""
        for _ in range(2):   # at most: a stale port, then the port the master names now
            frames = self._frames or self._learn_port(timeout)
            try:
                return frames.call(method, request, timeout)
            except NoServer as e:
                failed = self._forget(frames, e)
            except Unreached as e:
                self._switch(frames.master, e.leader)
                raise e.on(frames.master) from None
        self._switch(failed.master, None)
        raise Unreached(f"its metadata port {failed.port} (master.frame_port) does not answer: {failed.error}",
                        at=failed.master)

    def _learn_port(self, timeout: float) -> FramedClient:
        """Ask the current master for its frame port: the one call made over gRPC
        (GetRing), since the configured addresses are the masters' gRPC ports.  A follower
        answers UNAVAILABLE naming the leader (curvine-leader), which the next try asks."""
        with self._port_lock:
            if self._frames is not None:
                return self._frames   # another thread learned it meanwhile
            at = self.masters.current()
            try:
                ring = self._bootstrap(at).GetRing(pb.Empty(), timeout=timeout)
            except grpc.RpcError as e:
                if e.code() in RETRYABLE and not _has_errno(e):
                    self._switch(at, leader_of(e))
                    code = errno.EHOSTDOWN if e.code() == grpc.StatusCode.UNAVAILABLE else errno.ETIMEDOUT
                    raise Unreached(e.details() or str(e.code()), code, at=at) from None
                raise from_rpc_error(e) from None
            if ring.frame_port == 0:
                raise CurvineError(errno.EPROTO, f"master {at} serves no framed metadata port, which "
                                                 "clients need (master.frame_port = -1 on an older master)")
            self._frames = FramedClient(_host_of(at), ring.frame_port, self._secret, at, self.tls)
            return self._frames

    def _bootstrap(self, at: str) -> pb_grpc.MasterServiceStub:
        """The GetRing stub of master `at`, its channel made on first use (under _port_lock)."""
        made = self._bootstraps.get(at)
        if made is None:
            chan = channel(at, self._secret, self.tls)
            made = self._bootstraps[at] = (chan, pb_grpc.MasterServiceStub(chan))
        return made[1]

    def _switch(self, at: str, leader: str | None) -> None:
        """A try on master `at` failed: without an answer (leader None), or a follower's
        NotLeader naming leader ("" = unknown).  The next try goes where self.masters
        says; if that is another master, the frame route learned from `at` is forgotten
        (one master: nothing changes, its route is kept for its restart)."""
        now = self.masters.unreachable(at) if leader is None else self.masters.not_leader(at, leader)
        if now == at:
            return
        log.info("master %s %s; calling %s", at, "does not answer" if leader is None else "is not the leader", now)
        frames = self._frames
        if frames is not None and frames.master == at:
            self._drop(frames)

    def _forget(self, frames: FramedClient, e: NoServer) -> "_PortFailure":
        """Connecting to the frame port failed: the next attempt asks the master for its
        port again (a master restarted on a new ephemeral port names the new one)."""
        if self._frames is frames and frames.verified:
            log.info("frame port of master %s: %s; asking the master again", frames.master, e)
        self._drop(frames)
        return _PortFailure(frames.master, frames.port, str(e))

    def _drop(self, frames: FramedClient) -> None:
        """Forget this frame route if it is still the one, and close its connections.  No
        lock: the mount's loop calls this too and must never wait for a thread's GetRing
        (which holds _port_lock).  A route is only set while none is known, so the worst
        a race can do is forget a route just learned, which is then learned again."""
        if self._frames is frames:
            self._frames = None
        frames.close()

    # ------------------------------------------------------------------ requests
    # The conveniences below send these; the VFS's operations (client/vfs.py) send
    # the same requests over its own connections.  Mutations carry a fresh request id.
    def lookup_request(self, parent: int, name: str, ident: Identity | None = None) -> pb.LookupRequest:
        return pb.LookupRequest(caller=self.caller(ident), parent=parent, name=name)

    def getattr_request(self, ino: int, ident: Identity | None = None) -> pb.InodeRequest:
        return pb.InodeRequest(caller=self.caller(ident), ino=ino)

    def mknod_request(self, parent: int, name: str, mode: int, umask: int = 0, rdev: int = 0, target: str = "",
                      block_size: int = 0, ident: Identity | None = None) -> pb.MknodRequest:
        return pb.MknodRequest(caller=self.caller(ident, True), parent=parent, name=name, mode=mode, umask=umask,
                               rdev=rdev, symlink_target=target, block_size=block_size)

    def create_request(self, parent: int, name: str, mode: int, flags: int, umask: int = 0, exclusive: bool = False,
                       block_size: int = 0, ident: Identity | None = None) -> pb.MknodRequest:
        return pb.MknodRequest(caller=self.caller(ident, True), parent=parent, name=name, mode=mode, umask=umask,
                               exclusive=exclusive, block_size=block_size, open_flags=flags)

    def unlink_request(self, parent: int, name: str, ident: Identity | None = None) -> pb.UnlinkRequest:
        return pb.UnlinkRequest(caller=self.caller(ident, True), parent=parent, name=name)

    def rename_request(self, parent: int, name: str, new_parent: int, new_name: str, flags: int = 0,
                       ident: Identity | None = None) -> pb.RenameRequest:
        return pb.RenameRequest(caller=self.caller(ident, True), parent=parent, name=name, new_parent=new_parent,
                                new_name=new_name, flags=flags)

    # ------------------------------------------------------------------ conveniences
    def resolve(self, path: str, follow: bool = True, ident: Identity | None = None) -> pb.Attr:
        return self.call(Master.ResolvePath, pb.PathRequest(caller=self.caller(ident), path=path,
                                                       follow_symlinks=follow)).attr

    def lookup(self, parent: int, name: str, ident: Identity | None = None) -> pb.Attr:
        return self.call(Master.Lookup, self.lookup_request(parent, name, ident)).attr

    def getattr(self, ino: int, ident: Identity | None = None) -> pb.Attr:
        return self.call(Master.GetAttr, self.getattr_request(ino, ident)).attr

    def mknod(self, parent: int, name: str, mode: int, umask: int = 0, rdev: int = 0, target: str = "",
              block_size: int = 0, ident: Identity | None = None) -> pb.Attr:
        req = self.mknod_request(parent, name, mode, umask, rdev, target, block_size, ident)
        return self.saw_dirs(self.call(Master.Mknod, req)).attr

    def create(self, parent: int, name: str, mode: int, flags: int, umask: int = 0, exclusive: bool = False,
               block_size: int = 0, ident: Identity | None = None) -> pb.OpenReply:
        req = self.create_request(parent, name, mode, flags, umask, exclusive, block_size, ident)
        return self.saw_dirs(self.call(Master.Create, req))

    def open(self, ino: int, flags: int, write: bool, ident: Identity | None = None) -> pb.OpenReply:
        return self.call(Master.Open, self.open_request(ino, flags, write, ident))

    def open_request(self, ino: int, flags: int, write: bool, ident: Identity | None = None) -> pb.OpenRequest:
        return pb.OpenRequest(caller=self.caller(ident, write), ino=ino, flags=flags, write=write)

    def allocate_request(self, ino: int, lease_id: int, count: int, exclude: list[int] | None = None,
                         ident: Identity | None = None, unreachable: list[pb.UnreachableWorker] | None = None
                         ) -> pb.AllocateBlocksRequest:
        """unreachable: workers whose data port refused or reset this client, and when (the
        master offers them to nobody until they heartbeat again)."""
        return pb.AllocateBlocksRequest(caller=self.caller(ident, True), ino=ino, lease_id=lease_id, count=count,
                                        exclude_workers=exclude or [], prefer_host=self.prefer_host,
                                        unreachable=unreachable or [])

    def commit(self, ino: int, lease_id: int, size: int, blocks: list[pb.BlockInfo], release: bool,
               mtime_ns: int = 0, ident: Identity | None = None) -> pb.Attr:
        return self.call(Master.Commit, self.commit_request(ino, lease_id, size, blocks, release, mtime_ns, ident)).attr

    def commit_request(self, ino: int, lease_id: int, size: int, blocks: list[pb.BlockInfo], release: bool,
                       mtime_ns: int = 0, ident: Identity | None = None) -> pb.CommitRequest:
        return pb.CommitRequest(caller=self.caller(ident, True), ino=ino, lease_id=lease_id, size=size,
                                blocks=blocks, release=release, mtime_ns=mtime_ns)

    def unlink(self, parent: int, name: str, ident: Identity | None = None) -> None:
        self.saw_dirs(self.call(Master.Unlink, self.unlink_request(parent, name, ident)))

    def rmdir(self, parent: int, name: str, ident: Identity | None = None) -> None:
        self.saw_dirs(self.call(Master.Rmdir, self.unlink_request(parent, name, ident)))

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int = 0,
               ident: Identity | None = None) -> None:
        self.saw_dirs(self.call(Master.Rename, self.rename_request(parent, name, new_parent, new_name, flags, ident)))

    def readdir(self, ino: int, offset: int = 0, limit: int = 1000, plus: bool = False,
                ident: Identity | None = None) -> pb.ReadDirReply:
        return self.call(Master.ReadDir, pb.ReadDirRequest(caller=self.caller(ident), ino=ino, offset=offset,
                                                      limit=limit, plus=plus))

    def block_locations(self, ino: int, ident: Identity | None = None, lease_id: int = 0,
                        pending: list[int] | None = None) -> pb.BlockLocationsReply:
        """ino's blocks with fresh read tokens; with lease_id, fresh write tokens too for
        those of `pending` (blocks shipped and not committed) the lease holds."""
        return self.call(Master.GetBlockLocations, pb.BlockLocationsRequest(
            caller=self.caller(ident), ino=ino, lease_id=lease_id, pending=pending or []))

    def report_bad_block(self, block_id: int, worker_id: int, reason: str) -> None:
        """Tell the master a replica's bytes failed their checksum (it is then re-copied)."""
        self.call(Master.ReportBadBlock, pb.BadBlockRequest(caller=self.caller(), block_id=block_id,
                                                       worker_id=worker_id, reason=reason[:200]))

    def renew(self, lease_ids: list[int]) -> list[int]:
        return list(self.call(Master.RenewLeases, pb.LeaseRequest(caller=self.caller(), lease_ids=lease_ids)).expired)


def _host_of(address: str) -> str:
    """The host part of "host:port" or "[v6]:port"."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def _has_errno(e: grpc.RpcError) -> bool:
    md = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    return any(k == "curvine-errno" for k, _ in (md or ()))


def now_ns() -> int:
    return time.time_ns()
