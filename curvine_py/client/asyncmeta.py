"""Master calls awaited on the mount's trio loop, with no thread hop.

The mount runs every request that needs the master in a worker thread
(``trio.to_thread``): on two busy cores that hop costs ~0.3 ms, three to four times a
framed ``Lookup``.  Lookups and attribute reads are the mount's most frequent requests
(LMCache stats every chunk of a prompt before reading any), so they are made here, on
the loop itself, over trio sockets speaking the same frames as the threads' client
(``common/metaframes.py``; the master cannot tell them apart).

A call can also be split (``send``, then ``Pending.reply``): the mount puts a new file's
first ``AllocateBlocks`` on the wire before it answers the write, and takes the answer
in the background.

One attempt only, never a retry: any transport trouble -- no frame port known yet, a
refused or dropped connection, the master's UNAVAILABLE, a timeout -- raises
``FastPathUnavailable`` and the caller takes the thread path, whose ``MasterClient``
retries with the full policy (same errors, same waits as before).  The master's own
answers (an errno, EACCES for a wrong secret) are final and raised as ``CurvineError``.
"""
from __future__ import annotations

import errno
import socket
import time
import typing

import trio

from curvine_py.client import metrics
from curvine_py.common import metaframes as mf
from curvine_py.common.errors import CurvineError

CONNECT_TIMEOUT_S = 2.0
MAX_IDLE = 8            # connections kept open between calls (concurrent calls open more)


class FastPathUnavailable(Exception):
    """This call could not be made on the loop; make it through the thread path."""


class _AsyncReader(mf.FrameReader):
    """FrameReader over a trio socket: the same buffer logic, awaited reads."""

    __slots__ = ()

    async def afill(self, n: int) -> memoryview:
        while self.short_of(n):
            self.received(await self.sock.recv_into(self.view[self.end:]), n)
        return self.view[self.start:self.start + n]


class _Conn:
    __slots__ = ("raw", "sock", "reader", "next_id")

    def __init__(self, raw: socket.socket) -> None:
        self.raw = raw                                  # for sends that need no wait
        self.sock = trio.socket.from_stdlib_socket(raw)   # the same socket, for trio's waits
        self.reader = _AsyncReader(self.sock)
        self.next_id = 1

    async def send(self, data: bytes) -> None:
        """The whole frame: at once when the socket takes it, with no trip through trio's
        scheduler (the wait for the reply is the call's checkpoint), else awaited."""
        try:
            sent = self.raw.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            await _send_all(self.sock, memoryview(data)[sent:])

    def call_id(self) -> int:
        cid = self.next_id
        self.next_id = cid + 1 if cid < 0xFFFFFFFF else 1
        return cid


class AsyncMeta:
    """Framed calls to the master from one trio loop (not thread-safe: the loop's only)."""

    def __init__(self, route: typing.Callable[[], tuple[str, int, str] | None]) -> None:
        """route() -> (host, frame port, secret) of the master's frame server, or None
        while the threads' client has not learned one (or uses gRPC)."""
        self._route = route
        self._where: tuple[str, int, str] | None = None
        self._idle: list[_Conn] = []

    async def call(self, method: str, request: typing.Any, timeout: float) -> typing.Any:
        """The reply to one call; FastPathUnavailable or the master's CurvineError.
        Sent and answered under one timeout (a trio cancel scope costs ~10% of a lookup)."""
        m = mf.BY_NAME[method]
        payload = request.SerializeToString()
        start = time.perf_counter() if metrics.on else 0.0
        try:
            return await self._answer(await self._take(timeout), m, timeout, payload)
        except FastPathUnavailable:
            start = 0.0   # not answered: the thread path that makes the call again times it
            raise
        finally:
            if start:
                metrics.meta_seconds(method).observe(time.perf_counter() - start)

    async def send(self, method: str, request: typing.Any, timeout: float) -> "Pending":
        """Put one call's request frame on the wire now; its reply is awaited later
        (Pending.reply), so a caller can answer the kernel in between."""
        m = mf.BY_NAME[method]
        payload = request.SerializeToString()
        conn = await self._take(timeout)
        cid = conn.call_id()
        try:
            with trio.fail_after(timeout):
                await conn.send(mf.request_frame(cid, m.id, payload))
        except (OSError, trio.TooSlowError) as e:
            conn.sock.close()
            raise FastPathUnavailable(f"{method}: {e}") from None
        return Pending(self, conn, m, cid, timeout)

    def _give_back(self, conn: _Conn, reusable: bool) -> None:
        if reusable and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.sock.close()

    def close(self) -> None:
        """Close the idle connections (on the loop: trio sockets belong to it)."""
        for conn in self._idle:
            conn.sock.close()
        self._idle.clear()

    # ------------------------------------------------------------------ connections
    async def _take(self, timeout: float) -> _Conn:
        where = self._route()
        if where is None:
            raise FastPathUnavailable("no frame route to the master (yet)")
        if where != self._where:          # the master moved (restart on a new port): start over
            self.close()
            self._where = where
        if self._idle:
            return self._idle.pop()
        return await self._connect(where, min(timeout, CONNECT_TIMEOUT_S))

    async def _connect(self, where: tuple[str, int, str], timeout: float) -> _Conn:
        host, port, secret = where
        raw = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        raw.setblocking(False)
        conn = _Conn(raw)
        sock = conn.sock
        try:
            with trio.fail_after(timeout):
                await sock.connect((host, port))
                sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
                magic, version, nonce = mf.HELLO.unpack(await conn.reader.afill(mf.HELLO.size))
                if magic != mf.MAGIC or version != mf.VERSION:
                    raise mf.Closed(f"{host}:{port} is not a curvine frame server")
                conn.reader.consume(mf.HELLO.size)
                await _send_all(sock, mf.mac(secret, bytes(nonce)))
        except (OSError, mf.Closed, trio.TooSlowError) as e:
            sock.close()
            raise FastPathUnavailable(f"cannot connect to {host}:{port}: {e}") from None
        return conn

    # ------------------------------------------------------------------ one exchange
    async def _answer(self, conn: _Conn, m: mf.Method, timeout: float, payload: bytes | None = None,
                      cid: int = 0) -> typing.Any:
        """Send payload (None: it went as call cid already) and receive its reply; the
        connection goes back to the idle ones when the exchange completed."""
        reusable = False   # the exchange completed: the connection is in a clean state
        try:
            with trio.move_on_after(timeout):
                if payload is not None:
                    cid = conn.call_id()
                    await conn.send(mf.request_frame(cid, m.id, payload))
                reply = await self._receive(conn, m, cid)
                reusable = True
                return reply
            raise FastPathUnavailable(f"{m.name} took longer than {timeout:g} s")
        except CurvineError as e:
            reusable = e.errno != errno.EACCES   # an answer; a refused secret closes the connection
            raise
        except (OSError, mf.Closed, mf.Unavailable) as e:
            raise FastPathUnavailable(f"{m.name}: {e}") from None
        finally:
            self._give_back(conn, reusable)

    @staticmethod
    async def _receive(conn: _Conn, m: mf.Method, cid: int) -> typing.Any:
        length, got_id, status = mf.REPLY.unpack(await conn.reader.afill(mf.REPLY.size))
        if not mf.REPLY_REST <= length <= mf.MAX_FRAME:
            raise mf.Closed(f"bad reply frame length {length}")
        body = (await conn.reader.afill(mf.LENGTH.size + length))[mf.REPLY.size:]
        try:
            return mf.reply_of(m, cid, got_id, status, body)   # UNAVAILABLE: the thread path retries
        finally:
            conn.reader.consume(mf.LENGTH.size + length)


class Pending:
    """A call whose request is on the wire: reply() awaits its answer, once."""

    __slots__ = ("_meta", "_conn", "_m", "_cid", "_timeout", "_start")

    def __init__(self, meta: AsyncMeta, conn: _Conn, m: mf.Method, cid: int, timeout: float) -> None:
        self._meta, self._conn, self._m, self._cid, self._timeout = meta, conn, m, cid, timeout
        self._start = time.perf_counter()   # the request went out just now: its latency runs from here

    async def reply(self) -> typing.Any:
        """The reply; FastPathUnavailable or the master's CurvineError."""
        try:
            reply = await self._meta._answer(self._conn, self._m, self._timeout, cid=self._cid)
        except CurvineError:
            if metrics.on:
                metrics.meta_seconds(self._m.name).observe(time.perf_counter() - self._start)
            raise
        if metrics.on:
            metrics.meta_seconds(self._m.name).observe(time.perf_counter() - self._start)
        return reply


async def _send_all(sock: typing.Any, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        sent = await sock.send(view)
        view = view[sent:]
