"""A group of masters as tools see it: each one's MasterStatus, and a call made on
whichever of them is the leader.

For ``cv report``, ``cv cluster status``, the SDK's ``Client.masters`` and the local
cluster's readiness waits: they ask every master of a list (one for a single master)
directly over gRPC, with a short deadline, instead of going through the client core's
retrying metadata client, because a master that does not answer is something to show
(``unreachable``), not to wait out.  The client core follows the leader on its own
(docs/ha.md); nothing here is on the data path.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass

import grpc

from curvine_py.common.errors import leader_of
from curvine_py.common.leader import Leader
from curvine_py.common.rpc import channel
from curvine_py.common.tls import Tls
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc
from curvine_py.pb.methods import Method, Rep, Req

STATUS_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class MasterInfo:
    """One master of the group as it reports itself (MasterStatus, docs/ha.md), at the
    address the client knows it by.  role: "leader", "follower", "candidate", or
    "unreachable" (it did not answer: every number 0).  lag: the leader's commit index
    minus this master's applied index, how far its namespace is behind; None when no
    leader answered or this master did not.  A single master is its own leader."""
    address: str
    role: str
    term: int
    commit_index: int
    applied_index: int
    last_log_index: int
    leader: str          # the leader's client address as this master knows it ("" = none)
    raft_address: str    # "" = a single master without Raft
    pid: int
    ready: bool          # a leader that serves calls
    lag: int | None

    @classmethod
    def unreachable(cls, address: str) -> "MasterInfo":
        return cls(address, "unreachable", 0, 0, 0, 0, "", "", 0, False, None)

    @classmethod
    def of(cls, address: str, r: pb.MasterStatusReply | None, leader_commit: int | None) -> "MasterInfo":
        """A master's reply (None: it did not answer) and the leader's commit index."""
        if r is None:
            return cls.unreachable(address)
        lag = max(0, leader_commit - r.applied_index) if leader_commit is not None else None
        return cls(address, r.role, r.term, r.commit_index, r.applied_index, r.last_log_index,
                   r.leader, r.raft_address, r.pid, r.ready, lag)

    @classmethod
    def group(cls, addresses: typing.Sequence[str],
              replies: typing.Sequence[pb.MasterStatusReply | None]) -> tuple[MasterInfo, ...]:
        """Every master of a group, its lag measured against the leader's commit index
        (the leader of the highest term, when an old one has not yet heard of the new)."""
        leaders = [r for r in replies if r is not None and r.role == "leader"]
        commit = max(leaders, key=lambda r: r.term).commit_index if leaders else None
        return tuple(cls.of(a, r, commit) for a, r in zip(addresses, replies))


class MasterGroup:
    """Channels to every master of a list, opened once (start-up polls call many times).

    ``call`` makes a call on the leader: the master that answered last first, then the
    one a follower names (NotLeader's ``curvine-leader``), then the rest in list order
    (``common/leader.py``, the one place that decides which master to call).
    """

    def __init__(self, addresses: typing.Sequence[str], secret: str = "", tls: Tls | None = None) -> None:
        self.addresses = tuple(addresses)
        self._channels = [channel(a, secret, tls) for a in self.addresses]
        self._stubs = [pb_grpc.MasterServiceStub(c) for c in self._channels]
        self.masters = Leader(self.addresses, lambda _round: 0.0)   # which one leads, as last found

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> "MasterGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self, i: int, timeout: float = STATUS_TIMEOUT_S) -> pb.MasterStatusReply | None:
        """Master i's MasterStatus, or None when it does not answer within timeout."""
        try:
            return self._stubs[i].MasterStatus(pb.Empty(), timeout=timeout)
        except grpc.RpcError:
            return None

    def statuses(self, timeout: float = STATUS_TIMEOUT_S) -> list[pb.MasterStatusReply | None]:
        """Every master's MasterStatus, asked of all at once (one deadline for the lot)."""
        futures = [s.MasterStatus.future(pb.Empty(), timeout=timeout) for s in self._stubs]
        out: list[pb.MasterStatusReply | None] = []
        for f in futures:
            try:
                out.append(f.result())
            except grpc.RpcError:
                out.append(None)
        return out

    def infos(self, timeout: float = STATUS_TIMEOUT_S) -> tuple[MasterInfo, ...]:
        """Every master as a MasterInfo (role "unreachable" for one that did not answer)."""
        return MasterInfo.group(self.addresses, self.statuses(timeout))

    def leader(self, timeout: float = STATUS_TIMEOUT_S) -> int | None:
        """Index of the ready leader (of the highest term, should an old one still think
        it leads), or None when no master answers as one."""
        replies = self.statuses(timeout)
        ready = [(r.term, i) for i, r in enumerate(replies) if r is not None and r.role == "leader" and r.ready]
        return max(ready)[1] if ready else None

    def call(self, method: Method[Req, Rep], request: Req, timeout: float = STATUS_TIMEOUT_S) -> Rep | None:
        """method(request) answered by the leader, or None when no master answered it
        within one round of the group (no leader yet, every master down, or the leader
        not ready).  Which master to try is common/leader.py's ``Leader``, as for the
        client and the workers: the one that answered last, a follower's hint, the next."""
        tried: set[str] = set()
        for _ in range(2 * len(self.addresses)):   # a hint outside the list costs a turn, no call
            at = self.masters.current()
            if at in tried:
                break   # each master asked once: a round without an answer
            if at not in self.addresses:   # tools call only the listed masters
                self.masters.unreachable(at)
                continue
            tried.add(at)
            try:
                reply: Rep = getattr(self._stubs[self.addresses.index(at)], method.name)(request, timeout=timeout)
                return reply
            except grpc.RpcError as e:
                named = leader_of(e)
                if named is None:
                    self.masters.unreachable(at)
                else:
                    self.masters.not_leader(at, named)
        return None
