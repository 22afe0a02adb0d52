"""Which masters serve, and how a mutation becomes durable: alone, or in a Raft group.

The service asks its group three things and nothing else about Raft: may I serve
(``ready``; else ``NotLeader`` names the leader), make this record durable
(``submit``), and describe yourself (``status``, the ``MasterStatus`` call).  A master
alone (the default: ``master.raft_peers`` empty) is its own leader and its journal
applies records in the callers' threads, exactly as before Raft existed; a master of a
group (``master/raft.py``) hands records to Raft.  docs/ha.md.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Protocol

from curvine_py.common.config import MasterConfig
from curvine_py.common.tls import Tls
from curvine_py.master.journal import Journal
from curvine_py.master.records import Record
from curvine_py.master.store import Result
from curvine_py.pb import curvine_pb2 as pb


class Group(Protocol):
    """What the service needs from its place among the masters."""

    @property
    def term(self) -> int:
        """The current Raft term (0 for a master alone)."""
        ...

    def ready(self) -> bool:
        """Serve calls now: the leader, with everything committed before its term applied."""
        ...

    def leader_address(self) -> str:
        """The leader's client address for a NotLeader ("" when none is known)."""
        ...

    def submit(self, rec: Record) -> Result:
        """Make rec durable and applied; its result (the op's CurvineError raised)."""
        ...

    def status(self) -> pb.MasterStatusReply:
        ...

    def stop(self) -> None:
        ...


class SoleMaster:
    """One master, no Raft: always ready, term 0; records go to the journal directly."""

    term = 0

    def __init__(self, journal: Journal, address: str, frame_port: Callable[[], int]) -> None:
        self.journal = journal
        self.address = address
        self._frame_port = frame_port

    def ready(self) -> bool:
        return True

    def leader_address(self) -> str:
        return self.address

    def submit(self, rec: Record) -> Result:
        return self.journal.submit(rec)

    def status(self) -> pb.MasterStatusReply:
        return pb.MasterStatusReply(address=self.address, role="leader", leader=self.address, pid=os.getpid(),
                                    frame_port=self._frame_port(), ready=True,
                                    applied_index=self.journal.applied, commit_index=self.journal.applied,
                                    last_log_index=self.journal.applied)

    def stop(self) -> None:
        self.journal.stop()


def client_address(cfg: MasterConfig) -> str:
    """Where clients reach this master: master.ip and the gRPC port."""
    return f"{cfg.ip}:{cfg.port}"


def open_group(cfg: MasterConfig, secret: str, journal: Journal, db_path: str, address: str,
               frame_port: Callable[[], int], tls: Tls | None = None) -> Group:
    """The group this master belongs to: alone without master.raft_peers, else Raft.
    address: where clients reach this master (a group's: client_address)."""
    if not cfg.raft_peers.strip():
        return SoleMaster(journal, address, frame_port)
    from curvine_py.master.raft import RaftGroup   # pysyncobj only where a group is configured
    return RaftGroup(cfg, secret, journal, db_path, frame_port, tls)


OPEN_CALLS = frozenset({"MasterStatus"})
"""The calls every master answers, leader or not."""


class LeaderOnly:
    """The service as both transports see it (master/main.py): each call but OPEN_CALLS
    first passes ``service.serving()``, which raises NotLeader on a follower.  One gate
    in front of every handler, instead of a line in each of them.  And after it:
    ``service.answered(ok)``, so that a mutation whose reply was to carry its caller's
    own cache invalidation, and failed after its commit, still delivers it (by a push)."""

    def __init__(self, service: Any) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._service, name)
        if name in OPEN_CALLS:
            return fn
        serving, answered = self._service.serving, self._service.answered

        def call(request: Any) -> Any:
            serving()
            try:
                reply = fn(request)
            except BaseException:
                answered(False)
                raise
            answered(True)
            return reply
        call.__name__ = name
        return call
