"""EventService.Watch: a directory's events streamed to a watcher (the event feed's server).

A watch is a cursor over the replicated events table (master/events.py), not a queue
the master fills: each stream reads its directory's next events from the store after
each commit that wrote some, sends them in batches of at most BATCH, and remembers the
position it has sent through.  So a watcher that falls behind costs the master nothing
but its thread, and its backlog is the table itself, bounded by the retention window.
What is bounded explicitly:

- **Slow watchers are cut off.**  A stream holds at most one batch beyond gRPC's
  flow-control window.  One whose batch has not been taken for ``master.watch_stall_s``
  (the watcher stopped reading, or reads slower than events come) is cancelled by the
  monitor, which frees its thread; the client sees CANCELLED it did not ask for
  (``WatchCutOff`` in the SDK) and resumes from its last position when it is ready.
- **Watchers at once** (``master.watchers``): each holds a thread of the gRPC pool, which
  the workers' heartbeats also need; the next one is refused with RESOURCE_EXHAUSTED.
- **Too old**: a position below the pruned floor is refused with OUT_OF_RANGE and the
  floor in the ``curvine-events-floor`` trailing metadata: events were lost to it.

Only the leader serves watches (the hosts in events are its registry's); a master that
stops leading ends its streams with UNAVAILABLE naming the leader, where the watcher
resumes.  The leader's ``housekeeping`` also runs the replica events' look
(master/replicafeed.py) and prunes the table (by ``PruneEvents`` records).
"""
from __future__ import annotations

import errno
import logging
import stat
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import grpc

from curvine_py.common.config import MasterConfig
from curvine_py.common.errors import CurvineError, NotLeader, Unavailable, abort, err, to_grpc
from curvine_py.master import events, posix
from curvine_py.master.events import Event, EventLog
from curvine_py.master.posix import R, X
from curvine_py.master.records import PruneEvents
from curvine_py.master.replicafeed import ReplicaFeed
from curvine_py.pb import curvine_pb2 as pb

if TYPE_CHECKING:
    from curvine_py.master.service import MasterService

log = logging.getLogger(__name__)
BATCH = 256                # events per WatchReply at most
WAKE_S = 1.0               # a stream looks at its call and the leadership at least this often
KEEPALIVE_S = 5.0          # an empty reply (with `through`) when nothing was sent for this long
PRUNE_EVERY_S = 10.0
FLOOR_KEY = "curvine-events-floor"


@dataclass(eq=False)
class _Stream:
    """One watch, as the monitor sees it."""
    context: grpc.ServicerContext
    path: str
    sending_since: float = 0.0     # monotonic time a batch was handed to gRPC and not yet taken; 0 = none
    cut: bool = False


class Watchers:
    """The EventService servicer (master/main.py adds it to the master's gRPC server)."""

    def __init__(self, service: MasterService, cfg: MasterConfig, log_: EventLog) -> None:
        self.service = service
        self.cfg = cfg
        self.events = log_
        self._streams: set[_Stream] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_prune = 0.0
        self.replicas = ReplicaFeed(service)
        self._monitor = threading.Thread(target=self._watch_stalls, name="watch-monitor", daemon=True)
        self._monitor.start()

    def stop(self) -> None:
        """End every stream within WAKE_S, normally: its watcher opens it again on the
        master that serves next (a cancel would read as a cut-off)."""
        self._stop.set()
        with self.events.changed:
            self.events.changed.notify_all()

    # ------------------------------------------------------------------ the RPC
    def Watch(self, request: pb.WatchRequest, context: grpc.ServicerContext) -> Iterator[pb.WatchReply]:
        try:
            self.service.serving()
            ino = self._directory(request)
        except (CurvineError, Unavailable) as e:
            to_grpc(context, e)
        stream = self._admit(context, request.path)
        yield from self._serve(stream, ino, request)

    def _directory(self, request: pb.WatchRequest) -> int:
        """The watched directory's inode; the caller must be able to list it."""
        path = request.path
        if not path.startswith("/"):
            raise err(errno.EINVAL, f"watch: {path!r} is not an absolute path")
        c = request.caller
        cred = posix.Cred(c.uid, c.gid, frozenset(c.groups) | {c.gid})
        svc = self.service
        row = svc.ns.resolve(cred, path, True, svc.ufs.fresh_dir)
        if not stat.S_ISDIR(row.mode):
            raise err(errno.ENOTDIR, f"watch: {path} is not a directory")
        posix.require(row, cred, R | X)
        return int(row.ino)

    def _admit(self, context: grpc.ServicerContext, path: str) -> _Stream:
        stream = _Stream(context, path)
        with self._lock:
            if len(self._streams) >= self.cfg.watchers:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"this master serves {self.cfg.watchers} watches at once (master.watchers); "
                              "try again later")
            self._streams.add(stream)
        context.add_callback(lambda: self._gone(stream))   # however the call ends: a cancelled
        return stream                                        # stream's generator is never resumed

    def _gone(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def _serve(self, stream: _Stream, ino: int, request: pb.WatchRequest) -> Iterator[pb.WatchReply]:
        conn = self.service.ns.conn   # this thread's read connection, for the stream's life
        floor, head = events.bounds(conn)
        pos = request.since if request.resume else head
        self._check(stream.context, pos, floor, head)
        yield pb.WatchReply(through=pos)   # the stream is open: the watcher knows where it starts
        quiet_since = time.monotonic()
        while stream.context.is_active() and not self._stop.is_set():
            if not self.service.group.ready():
                to_grpc(stream.context, NotLeader(self.service.group.leader_address()))
            seen = self.events.generation
            floor, head = events.bounds(conn)
            if pos < floor:   # pruned under a watcher that was too slow for the window
                self._check(stream.context, pos, floor, head)
            found = events.read_after(conn, ino, pos, head, BATCH)
            pos = found[-1].position if len(found) == BATCH else head
            if found or time.monotonic() - quiet_since >= KEEPALIVE_S:
                reply = pb.WatchReply(events=self._with_hosts(found), through=pos)
                stream.sending_since = time.monotonic()
                yield reply
                stream.sending_since = 0.0
                quiet_since = time.monotonic()
                if len(found) == BATCH:
                    continue   # more are waiting
            if pos == head:
                self.events.wait(seen, WAKE_S)

    def _check(self, context: grpc.ServicerContext, pos: int, floor: int, head: int) -> None:
        if pos < floor:
            context.set_trailing_metadata(((FLOOR_KEY, str(floor)),))
            context.abort(grpc.StatusCode.OUT_OF_RANGE,
                          f"position {pos} is older than the events kept (they start after {floor}; "
                          f"master.events_retention_s = {self.cfg.events_retention_s:g}): resume from "
                          f"{floor} and rescan the directory")
        if pos > head:
            abort(context, CurvineError(errno.EINVAL, f"position {pos} is past the newest event, {head}"))

    def _with_hosts(self, found: list[Event]) -> list[pb.WatchEvent]:
        """The events as sent: each created one with the hosts holding its whole file now."""
        inos = [e.ino for e in found if e.kind == events.CREATED]
        holders: dict[int, set[str]] = {}
        if inos:
            svc = self.service
            holders = svc.locator.holders(svc.ns, inos)
        return [pb.WatchEvent(position=e.position, kind=e.kind, name=e.name, from_name=e.from_name, ino=e.ino,  # type: ignore[arg-type]
                              size=e.size, time_ms=e.time_ms, hosts=sorted(holders.get(e.ino, ())), host=e.host)
                for e in found]

    # ------------------------------------------------------------------ bounds
    def _watch_stalls(self) -> None:
        """Cancel the streams whose batch waited past master.watch_stall_s."""
        while not self._stop.wait(min(0.5, self.cfg.watch_stall_s / 2)):
            now = time.monotonic()
            with self._lock:
                stalled = [s for s in self._streams
                           if s.sending_since and now - s.sending_since > self.cfg.watch_stall_s and not s.cut]
            for s in stalled:
                s.cut = True
                log.warning("watch of %s cut off: its watcher took no events for %.0f s (master.watch_stall_s)",
                            s.path, now - s.sending_since)
                s.context.cancel()

    def housekeeping(self) -> None:
        """On the leader, every tick: the replica events (master/replicafeed.py); every
        PRUNE_EVERY_S (a quarter of a shorter window): forget events past the window."""
        if not self.service.leading():
            return
        self.replicas.tick()
        every = min(PRUNE_EVERY_S, self.cfg.events_retention_s / 4)
        if time.monotonic() - self._last_prune < every:
            return
        self._last_prune = time.monotonic()
        before_ms = time.time_ns() // 1_000_000 - int(self.cfg.events_retention_s * 1000)
        self.service.submit(PruneEvents(before_ms=before_ms, keep=self.cfg.events_max))
