"""``Client.watch``: a directory's events as an iterator that survives master failover.

The master streams the events of one directory by position (master/watch.py); this
iterator yields them, remembers the position it has seen through (``position``: the
last event's, or a quiet stream's keepalive), and when the stream breaks -- the master
restarted, another master leads now (a follower's UNAVAILABLE names the leader) --
opens it again on the leader from that position, for up to ``client.retry_s``.  Positions
are the replicated events table's, so nothing is lost or repeated across the switch.

Two ends are the caller's to handle, each a distinct exception:
``PositionTooOld`` (the position fell out of the retention window: rescan the
directory, then watch from ``floor``) and ``WatchCutOff`` (the master cut this watcher
off for not taking its events: resume from ``position`` when ready).
"""
from __future__ import annotations

import errno
import logging
import time
import typing
from dataclasses import dataclass
from typing import Iterator

import grpc

from curvine_py.client.metaclient import MasterClient
from curvine_py.common.errors import RETRYABLE, CurvineError, from_rpc_error, leader_of
from curvine_py.common.rpc import channel
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
KINDS = {pb.EVENT_CREATED: "created", pb.EVENT_REMOVED: "removed", pb.EVENT_EVICTED: "evicted",
         pb.EVENT_REPLICA_ADDED: "replica_added", pb.EVENT_REPLICA_LOST: "replica_lost"}
FLOOR_KEY = "curvine-events-floor"   # master/watch.py


@dataclass(frozen=True)
class WatchEvent:
    """One event of the watched directory."""
    position: int
    kind: str            # created | removed | evicted | replica_added | replica_lost (KINDS)
    path: str            # the directory's path joined with name
    name: str
    from_name: str       # a rename within the directory: the old name ("" otherwise)
    ino: int
    size: int
    time_ms: int
    hosts: tuple[str, ...]   # created: hosts holding every block of the file as the master sent it
    host: str = ""           # replica_added / replica_lost: the host that came to hold, or lost, it whole


class PositionTooOld(CurvineError):
    """The position asked for is older than the events the master keeps."""

    def __new__(cls, message: str, floor: int) -> "PositionTooOld":
        return typing.cast(PositionTooOld, super().__new__(cls, errno.ERANGE, message))

    def __init__(self, message: str, floor: int) -> None:
        super().__init__(errno.ERANGE, message)
        self.floor = floor


class WatchCutOff(CurvineError):
    """The master cut this watcher off: it took no events for master.watch_stall_s."""

    def __new__(cls, message: str, position: int) -> "WatchCutOff":
        return typing.cast(WatchCutOff, super().__new__(cls, errno.ECONNRESET, message))

    def __init__(self, message: str, position: int) -> None:
        super().__init__(errno.ECONNRESET, message)
        self.position = position


class Watch:
    """Iterate for events; ``close()`` (or leaving a ``with``) ends the stream."""

    def __init__(self, meta: MasterClient, secret: str, path: str, since: int | None, retry_s: float,
                 kinds: typing.Collection[str] | None = None) -> None:
        unknown = set(kinds or ()) - set(KINDS.values())
        if unknown:
            raise CurvineError(errno.EINVAL, f"watch: unknown event kinds {', '.join(sorted(unknown))} "
                                             f"(known: {', '.join(KINDS.values())})")
        self._kinds = {k for k, name in KINDS.items() if name in kinds} if kinds else None
        self._meta = meta
        self._secret = secret
        self.path = path.rstrip("/") or "/"
        self.position = since if since is not None else -1   # -1: from now on (not known until opened)
        self._retry_s = retry_s
        self._chan: grpc.Channel | None = None
        self._call: Iterator[pb.WatchReply] | None = None
        self._replies: Iterator[pb.WatchReply] | None = None   # the open stream, its first reply read
        self._closed = False

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._drop()

    def open(self) -> "Watch":
        """Open the stream (Client.watch does): from here on no event is missed, and
        ``position`` is where it starts."""
        if self._replies is None:
            self._replies = self._connect()
        return self

    def __iter__(self) -> Iterator[WatchEvent]:
        replies = self._replies or self.open()._replies
        while replies is not None and not self._closed:
            try:
                for reply in replies:
                    for e in reply.events:
                        self.position = e.position
                        if self._kinds is None or e.kind in self._kinds:
                            yield self._event(e)
                    self.position = reply.through
                log.info("watch %s: the master ended the stream (stopping); resuming from %d", self.path,
                         self.position)
            except grpc.RpcError as e:
                if self._closed:
                    return
                self._failed(e, time.monotonic())
            self._drop()
            if not self._closed:
                replies = self._replies = self._connect()

    def _connect(self) -> Iterator[pb.WatchReply] | None:
        """A stream on the leader, its first reply read (the position it starts from);
        tries the masters in turn for up to client.retry_s.  None once closed."""
        first_failure = 0.0
        while not self._closed:
            at = self._meta.masters.current()
            self._chan = channel(at, self._secret, self._meta.tls)
            request = pb.WatchRequest(caller=self._meta.caller(), path=self.path, resume=self.position >= 0,
                                      since=max(self.position, 0))
            call = self._call = pb_grpc.EventServiceStub(self._chan).Watch(request)
            try:
                self.position = next(call).through
                return call
            except grpc.RpcError as e:
                self._drop()
                if self._closed:
                    return None
                first_failure = first_failure or time.monotonic()
                self._failed(e, first_failure)
                leader = leader_of(e)
                now = self._meta.masters.not_leader(at, leader) if leader is not None \
                    else self._meta.masters.unreachable(at)
                log.info("watch %s: master %s: %s; resuming from %d on %s", self.path, at, e.details(),
                         self.position, now)
                time.sleep(0.2 if now == at else 0.05)
        return None

    def _failed(self, e: grpc.RpcError, since: float) -> None:
        """Raise what ends the watch; return when the stream may be opened again."""
        code = e.code()
        if code == grpc.StatusCode.OUT_OF_RANGE:
            raise PositionTooOld(e.details() or "position too old", _floor(e)) from None
        if code == grpc.StatusCode.CANCELLED:
            raise WatchCutOff(f"the master cut this watch of {self.path} off: it took no events for "
                              f"master.watch_stall_s; resume from position {self.position}", self.position) from None
        if code not in RETRYABLE:
            raise from_rpc_error(e).with_path(self.path) from None
        if time.monotonic() - since > self._retry_s:
            why = f"no master served it for {self._retry_s:g} s (client.retry_s): {e.details()}"
            raise CurvineError(errno.EHOSTDOWN, f"watch {self.path}: {why}") from None

    def _drop(self) -> None:
        call, chan = self._call, self._chan
        self._call = self._chan = None
        if call is not None:
            call.cancel()   # type: ignore[attr-defined]  # a grpc stream call is also a grpc.Future
        if chan is not None:
            chan.close()

    def _event(self, e: pb.WatchEvent) -> WatchEvent:
        return WatchEvent(position=e.position, kind=KINDS.get(e.kind, str(e.kind)),
                          path=f"{self.path.rstrip('/')}/{e.name}", name=e.name, from_name=e.from_name, ino=e.ino,
                          size=e.size, time_ms=e.time_ms, hosts=tuple(e.hosts), host=e.host)


def _floor(e: grpc.RpcError) -> int:
    for key, value in e.trailing_metadata() or ():
        if key == FLOOR_KEY:
            return int(value)
    return 0
