"""The worker's gRPC calls to its master, or to the leader of its masters (docs/ha.md).

``worker.master`` may name several masters, comma-separated; only the leader answers,
a follower says UNAVAILABLE with the leader in the ``curvine-leader`` trailing metadata
(``errors.leader_of``).  Every worker->master call (registration, block reports,
heartbeats, ``UfsMountGet``) goes through one ``MasterLink``: to the master
``common/leader.py`` names, moving on to the leader named, or to the next master when a
call gets no answer.  One gRPC channel per master address, made at its first call (a
master never called costs nothing) and all closed by ``close()``.

Two ways to call:
- ``attempt``: one try; a failure that means "ask another master" moves the link before
  it is raised.  The heartbeat loop uses it and does its own waiting (``wait``): the
  next master at once, a backoff after a whole round (a registration that failed half
  way is started over on the new master, so its report is never split between two);
- ``call``: tries at once until a master answers or a whole round failed (UfsMountGet:
  a READ waits on it, there is no loop around it).

With one master (the default) both are a single try, and ``wait`` is the old backoff.
"""
from __future__ import annotations

import logging
import threading

import grpc

from curvine_py.common import rpc
from curvine_py.common.errors import ERRNO_KEY, RETRYABLE, leader_of
from curvine_py.common.leader import Backoff, Leader
from curvine_py.common.tls import Tls
from curvine_py.pb import curvine_pb2_grpc
from curvine_py.pb.methods import Method, Rep, Req

log = logging.getLogger(__name__)


class MasterLink:
    """Calls to the leader of the worker's masters; thread-safe (the heartbeat thread and
    the UFS readers share it)."""

    def __init__(self, masters: str, secret: str, backoff: Backoff, tls: Tls | None = None) -> None:
        self.masters = Leader(masters, backoff)
        self._tls = tls
        self.tried = self.masters.current()   # the master of the latest try (for log lines)
        self._secret = secret
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, curvine_pb2_grpc.MasterServiceStub]] = {}

    def attempt(self, method: Method[Req, Rep], request: Req, timeout: float) -> Rep:
        """One try of MasterService.<method> on the current master; its grpc.RpcError
        raised as it is, after moving to the master to try next when it says so."""
        at = self.tried = self.masters.current()
        try:
            reply: Rep = getattr(self._stub(at), method.name)(request, timeout=timeout)
            return reply
        except grpc.RpcError as e:
            self._failed(at, e)
            raise

    def call(self, method: Method[Req, Rep], request: Req, timeout: float) -> Rep:
        """Tries at once, following the leader, until a master answers or a whole round
        of the list failed (then the last grpc.RpcError).  Each try waits at most timeout."""
        failures = 0
        while True:
            at = self.masters.current()
            try:
                return self.attempt(method, request, timeout)
            except grpc.RpcError:
                failures += 1
                if self.masters.current() == at or self.masters.round_over(failures):
                    raise

    def wait(self, failures: int) -> float:
        """Seconds before the next try after `failures` failed tries in a row: 0 while a
        round of the list is not over, the backoff after it."""
        return self.masters.wait(failures)

    def close(self) -> None:
        """Close every master's channel (the worker is stopping)."""
        with self._lock:
            stubs, self._stubs = list(self._stubs.values()), {}
        for chan, _ in stubs:
            chan.close()

    def __str__(self) -> str:
        return f"master {self.masters}" if len(self.masters.addresses) == 1 else f"masters {self.masters}"

    def _stub(self, at: str) -> curvine_pb2_grpc.MasterServiceStub:
        """Master at's stub; its channel (sending the cluster secret on every call,
        reconnecting to a restarted master within a second) made on first use."""
        made = self._stubs.get(at)
        if made is None:
            with self._lock:
                made = self._stubs.get(at)
                if made is None:
                    chan = rpc.channel(at, self._secret, self._tls)
                    made = self._stubs[at] = (chan, curvine_pb2_grpc.MasterServiceStub(chan))
        return made[1]

    def _failed(self, at: str, e: grpc.RpcError) -> None:
        """A call to `at` failed: a follower's NotLeader, no answer (UNAVAILABLE without
        an errno, DEADLINE_EXCEEDED) moves on; the master's own answers (an errno, a
        refused secret) do not."""
        trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
        if e.code() not in RETRYABLE or any(k == ERRNO_KEY for k, _ in trailing or ()):
            return
        leader = leader_of(e)
        now = self.masters.unreachable(at) if leader is None else self.masters.not_leader(at, leader)
        if now != at:
            log.info("master %s %s; calling %s", at, "does not answer" if leader is None else "is not the leader", now)
