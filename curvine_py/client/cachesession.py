"""The mount's cache session: a frame connection of its own to the leading master, on
which the master pushes invalidations of what the mount caches (client/metacache.py,
master/sessions.py, docs/wire.md "Cache sessions").

One thread owns the connection: it opens the session, sends a ``Beat`` every third of
the lease (the renewal, which also acknowledges the pushes handled so far), and handles
each push as it arrives, acknowledging a run of them with one beat at once.  The cache
trusts its contents until the last answered beat's send time plus the lease, by this
host's clock; the master counts the lease from when the beat arrived, so it never
believes the mount's lease over before the mount does.

Whatever goes wrong (the connection breaks, the master answers a beat with ESTALE or
NOT_LEADER, a beat goes unanswered for a lease) ends the session: the cache drops
everything at once, and a new session is opened, to the leader, after a short pause.
A master with cache sessions off (``master.cache_lease_s = 0``, or one older than them)
refuses OpenSession: logged once, and the mount runs without the cache.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Callable

from curvine_py.client.framedclient import connect
from curvine_py.client.metacache import MetaCache
from curvine_py.client.metaclient import MasterClient
from curvine_py.common import metaframes as mf
from curvine_py.common.errors import CurvineError, Unreached
from curvine_py.common.tls import cut
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master

log = logging.getLogger(__name__)
RETRY_S = 0.5          # between a session's end and the next attempt
CONNECT_TIMEOUT_S = 5.0


class Refused(Exception):
    """The master offers no cache sessions."""


class Ended(Exception):
    """The session is over; a new one may be opened."""


class CacheSession:
    """Keeps one session open while the mount runs (start, stop)."""

    def __init__(self, meta: MasterClient, cache: MetaCache,
                 on_push: Callable[[pb.Invalidation], None] | None = None) -> None:
        """on_push: called with each push once the cache forgot its keys, before it is
        acknowledged (the mount's: the kernel forgets them too, fuse/notify.py)."""
        self.meta, self.cache, self.on_push = meta, cache, on_push
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread = threading.Thread(target=self._run, name="cache-session", daemon=True)

    def start(self) -> "CacheSession":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            cut(sock)
        self._thread.join(timeout=5)
        self.cache.end()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._session()
                failures = 0
            except Refused as e:
                log.warning("metadata cache off: %s", e)
                return
            except (Ended, Unreached, CurvineError, OSError, mf.Closed) as e:
                failures += 1
                if failures == 1 or failures % 60 == 0:
                    log.info("cache session ended (%s); the mount asks the master until a new one opens", e)
            finally:
                self.cache.end()
                self._sock = None
            self._stop.wait(RETRY_S)

    def _session(self) -> None:
        host, port, secret = self.meta.learn_route(CONNECT_TIMEOUT_S)
        sock, reader = connect(host, port, secret, CONNECT_TIMEOUT_S, self.meta.tls)
        self._sock = sock
        try:
            sent = time.monotonic()
            request = pb.SessionRequest(caller=self.meta.caller())
            sock.sendall(mf.request_frame(1, Master.OpenSession.id, request.SerializeToString()))
            status, body = _reply(reader, 1)
            if status == errno.EOPNOTSUPP:
                raise Refused(bytes(body).decode("utf-8", "replace"))
            reply = mf.reply_of(Master.OpenSession, 1, 1, status, body)
            reader.consume(len(body) + mf.REPLY.size)
            lease = reply.lease_ms / 1000
            self.cache.begin(reply.session, sent + lease)
            log.info("cache session %d open with %s:%d (lease %.1f s)", reply.session, host, port, lease)
            self._stream(sock, reader, reply.session, lease)
        except Unreached as e:
            if e.leader is not None:
                self.meta.route_not_leader(host, port, e.leader)
            raise
        finally:
            sock.close()

    def _stream(self, sock: socket.socket, reader: mf.FrameReader, session: int, lease: float) -> None:
        """Beats and pushes until the session ends (Ended, OSError) or the mount stops."""
        every = lease / 3
        beats: dict[int, float] = {}   # call id -> when sent
        cid, next_beat, ack = 1, time.monotonic() + every, False
        while not self._stop.is_set():
            now = time.monotonic()
            if (ack and reader.end == reader.start) or now >= next_beat:   # (a run of pushes: one beat)
                cid += 1
                beat = pb.SessionBeat(session=session, acked=self.cache.handled, forgotten=self.cache.forgotten())
                sock.sendall(mf.request_frame(cid, Master.Beat.id, beat.SerializeToString()))
                beats[cid], next_beat, ack = now, now + every, False
            if beats and now - min(beats.values()) > lease:
                raise Ended(f"the master did not answer a beat for {lease:g} s")
            sock.settimeout(max(0.005, next_beat - now))   # (a push still buffered: fill returns at once)
            try:
                head = reader.fill(mf.REPLY.size)
                length, got, status = mf.REPLY.unpack(head)
                if not mf.REPLY_REST <= length <= mf.MAX_FRAME:
                    raise mf.Closed(f"bad frame length {length}")
                body = reader.fill(mf.LENGTH.size + length)[mf.REPLY.size:]
            except TimeoutError:
                continue   # (a part of a frame stays in reader for the next fill)
            try:
                if got == mf.PUSH_CALL_ID:
                    push = pb.Invalidation.FromString(body)
                    self.cache.invalidate(push)
                    if self.on_push is not None:
                        self.on_push(push)
                    ack = True
                else:
                    self._answered(beats.pop(got, None), status, body, lease)
            finally:
                reader.consume(mf.LENGTH.size + length)

    def _answered(self, sent: float | None, status: int, body: memoryview, lease: float) -> None:
        if status == mf.OK and sent is not None:
            self.cache.renewed(sent + lease)
            return
        if status == mf.NOT_LEADER:
            raise Unreached.not_leader(bytes(body).decode("utf-8", "replace"))
        if status != mf.OK:
            raise Ended(f"beat refused: {bytes(body).decode('utf-8', 'replace')} (status {status})")


def _reply(reader: mf.FrameReader, cid: int) -> tuple[int, memoryview]:
    """The status and payload of the reply to call cid (the first frame on the stream)."""
    length, got, status = mf.REPLY.unpack(reader.fill(mf.REPLY.size))
    if got != cid or not mf.REPLY_REST <= length <= mf.MAX_FRAME:
        raise mf.Closed(f"unexpected frame (call {got}, length {length})")
    return status, reader.fill(mf.LENGTH.size + length)[mf.REPLY.size:]
