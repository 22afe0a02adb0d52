"""The mount's master client: every call awaited on its trio loop, with no thread hop.

The mount's requests that need the master (lookups and attribute reads most of all:
LMCache stats every chunk of a prompt before reading any) are made here, on the loop
itself, over trio sockets speaking the same frames as the threads' client
(``common/metaframes.py``; the master cannot tell them apart).  A thread hop
(``trio.to_thread``) costs ~0.3 ms on two busy cores, three to four times a framed
``Lookup``; the only one left is learning the frame port (``GetRing`` over gRPC, by
``MasterClient.learn_route``), once at the start and again after the master moved.

The retry policy is the threads' client's (``metaclient.py``): an attempt that did not
reach the master -- a refused or dropped connection, the master's UNAVAILABLE, a
timeout -- is made again with the same request (its request id: the master's retry
cache answers a repeat) after 0.05 s doubling to 2 s, until ``client.retry_s``; the
waits are awaited (``Retry.acall``), so the loop serves other requests meanwhile.  The
master's own answers (an errno, EACCES for a wrong secret) are final, ``CurvineError``.

Three masters (docs/ha.md): a follower's NOT_LEADER reply is handed to the threads'
client (``MasterClient.route_not_leader``, which never blocks), whose route is then the
leader's (or the next master's), learned by ``learn_route`` in a thread; the call is
made again at once, and waits only after a whole round of the group failed
(``Leader.wait``), as the threads' client does.

A call can also be split (``send``, then ``Pending.reply``): the mount puts a new file's
first ``AllocateBlocks`` on the wire before it answers the write, and takes the answer
in the background.  ``send`` is one attempt (``Unreached``); the caller then makes the
whole call with ``call``.
"""
from __future__ import annotations

import errno
import logging
import socket
import ssl
import time
import typing

import trio

from curvine_py.client import metrics
from curvine_py.client.metaclient import MasterClient, attempt_timeout
from curvine_py.common import metaframes as mf
from curvine_py.common.errors import Broken, CurvineError, NoServer, Unreached
from curvine_py.common.retry import Failed, Retry
from curvine_py.common.tls import Tls, refusal, role_name
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master, Method, Rep, Req

CONNECT_TIMEOUT_S = 2.0
MAX_IDLE = 8            # connections kept open between calls (concurrent calls open more)


log = logging.getLogger(__name__)
Route = tuple[str, int, str]   # (host, frame port, secret)


class _AsyncReader(mf.FrameReader):
    """FrameReader over a trio socket: the same buffer logic, awaited reads.

    raw: the plain connection's socket (None once TLS wraps it), read directly: a recv
    that finds the bytes there costs no trip through trio's scheduler (trio's socket
    methods end with a checkpoint even then), and one that finds none waits for them
    with wait_readable, as trio's would (a close by _Deadlines ends that wait)."""

    __slots__ = ("raw",)

    def __init__(self, sock: typing.Any, raw: socket.socket | None = None) -> None:
        super().__init__(sock)
        self.raw = raw

    async def afill(self, n: int) -> memoryview:
        raw = self.raw
        while self.short_of(n):
            if raw is None:
                self.received(await self.sock.recv_into(self.view[self.end:]), n)
                continue
            try:
                got = raw.recv_into(self.view[self.end:])
            except BlockingIOError:
                await trio.lowlevel.wait_readable(raw)
                continue
            self.received(got, n)
        return self.view[self.start:self.start + n]


class _TlsSock:
    """TLS over the connection's trio socket with the calls _Conn makes of that socket
    (recv_into, send, close), on an ``ssl.SSLObject`` and two memory BIOs: the loop does
    the socket I/O, OpenSSL only transforms bytes.  trio's SSLStream does the same with
    a scheduling checkpoint and conflict checks at each step, which cost the mount ~90 us
    of CPU per framed call here; this costs ~15.  Failures are OSErrors as the socket's
    are (the ssl.SSLError itself when TLS is why: tls.refusal reads it)."""

    __slots__ = ("tcp", "raw", "incoming", "outgoing", "obj")

    def __init__(self, tcp: typing.Any, raw: socket.socket, tls: Tls, peer: str) -> None:
        self.tcp, self.raw = tcp, raw
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = tls.client_context().wrap_bio(self.incoming, self.outgoing, server_hostname=role_name(peer))

    async def handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._pull():
                    raise ConnectionResetError("closed during the TLS handshake") from None

    async def recv_into(self, view: memoryview) -> int:
        while True:
            try:
                # typeshed says bytearray; SSLObject.read fills any writable buffer, returns its count
                return typing.cast(int, self.obj.read(len(view), view))  # type: ignore[arg-type]
            except ssl.SSLWantReadError:
                if not await self._pull():
                    return 0
            except ssl.SSLZeroReturnError:
                return 0

    async def send(self, view: bytes | memoryview) -> int:
        self.obj.write(view)
        await self._flush()
        return len(view)

    async def _pull(self) -> int:
        """Bytes from the socket into OpenSSL (0 at the peer's end)."""
        data = await self.tcp.recv(256 * 1024)
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()
        return len(data)

    async def _flush(self) -> None:
        """OpenSSL's output onto the socket: at once when it takes it, else awaited."""
        data = self.outgoing.read()
        if data:
            await _send_now(self.raw, self.tcp, data)

    def close(self) -> None:
        self.tcp.close()   # abrupt, as the plain socket's: the master sees the connection end


class _Conn:
    __slots__ = ("raw", "sock", "reader", "next_id", "where", "tls", "due", "expired")

    def __init__(self, raw: socket.socket, where: Route) -> None:
        self.raw = raw                                  # for sends that need no wait
        self.where = where                              # the route it was made to
        self.sock: typing.Any = trio.socket.from_stdlib_socket(raw)   # the same socket, for trio's waits
        self.reader = _AsyncReader(self.sock, raw)
        self.next_id = 1
        self.tls = False
        self.due = 0.0          # trio.current_time() by which its exchange must end (_Deadlines)
        self.expired = False    # closed by _Deadlines: its exchange took too long

    async def secure(self, tls: Tls) -> None:
        """The client side of a mutual TLS handshake: then every byte goes through it."""
        secured = _TlsSock(self.sock, self.raw, tls, "master")
        await secured.handshake()
        self.sock = self.reader.sock = secured
        self.reader.raw = None   # (every byte through the TLS object now)
        self.tls = True

    async def send(self, data: bytes) -> None:
        """The whole frame: at once when the socket takes it, with no trip through trio's
        scheduler (the wait for the reply is the call's checkpoint), else awaited."""
        if self.tls:
            await self.sock.send(data)
        else:
            await _send_now(self.raw, self.sock, data)

    def call_id(self) -> int:
        cid = self.next_id
        self.next_id = cid + 1 if cid < 0xFFFFFFFF else 1
        return cid


class _Deadlines:
    """Each exchange's time bound, without a trio cancel scope per call.

    A cancel scope (``trio.move_on_after``) costs ~8% of the mount's CPU per lookup sent
    to the master (its deadline registered and unregistered with the runner, its cancel
    status made and closed).  Here an exchange only notes its deadline on its connection;
    one task on the loop looks every TICK_S at the connections in an exchange and closes
    the ones past theirs: the exchange's wait then ends (trio's close wakes a task waiting
    on the socket with ClosedResourceError), and it is answered as a timeout.  A bound is
    thus kept to within TICK_S, and attempts are bounded by >= MIN_ATTEMPT_S (1 s).

    The task parks after IDLE_TICKS ticks with no exchange (an idle mount does not wake
    10 times a second) and the next exchange wakes it.  It belongs to one trio run: an
    exchange in another (tests reuse a client across ``trio.run`` calls) starts its own."""

    TICK_S = 0.1
    IDLE_TICKS = 50

    def __init__(self) -> None:
        self.busy: set[_Conn] = set()
        self._run_of: trio.lowlevel.TrioToken | None = None   # the run whose task watches
        self._parked: trio.Event | None = None

    def watch(self, conn: _Conn, timeout: float) -> None:
        """conn's exchange begins: it must end within timeout seconds."""
        conn.due = trio.current_time() + timeout
        self.busy.add(conn)
        run = trio.lowlevel.current_trio_token()
        if run is not self._run_of:
            self._run_of, self._parked = run, None
            trio.lowlevel.spawn_system_task(self._run, name="asyncmeta deadlines")
        elif self._parked is not None:
            self._parked.set()
            self._parked = None

    def done(self, conn: _Conn) -> None:
        self.busy.discard(conn)

    async def _run(self) -> None:
        try:
            idle = 0
            while True:
                await trio.sleep(self.TICK_S)
                if not self.busy:
                    idle += 1
                    if idle >= self.IDLE_TICKS:
                        self._parked = trio.Event()
                        await self._parked.wait()
                        idle = 0
                    continue
                idle = 0
                self._expire(trio.current_time())
        finally:   # the run ends (system tasks are cancelled): the next run starts its own
            self._parked = None

    def _expire(self, now: float) -> None:
        for conn in [c for c in self.busy if c.due <= now]:
            conn.expired = True
            self.busy.discard(conn)
            try:
                conn.sock.close()
            except Exception:   # (never end the loop for a close)
                log.exception("closing a master connection past its deadline")


class Hardening(typing.Protocol):
    """A new file's writer waiting for its first block ids (client/writer.py FileWriter)."""

    ino: int

    def hardened(self, reply: typing.Any, error: BaseException | None) -> None: ...


async def _hardened(w: Hardening, answer: typing.Callable[[], typing.Awaitable[typing.Any]]) -> None:
    """A system task: whatever happens, the writer hears of it, and nothing but trio's own
    cancellation escapes (an exception here would end the mount's loop)."""
    reply, error = None, None
    try:
        reply = await answer()
    except BaseException as e:   # cancelled too (the mount stopping): nobody may wait for it
        error = e
    try:
        w.hardened(reply, error)
    except Exception:
        log.exception("the first block ids of inode %d", w.ino)
    if error is not None and not isinstance(error, Exception):
        raise error


class AsyncMeta:
    """Framed calls to the master from one trio loop (not thread-safe: the loop's only)."""

    def __init__(self, meta: MasterClient, route: typing.Callable[[], Route | None] | None = None) -> None:
        """meta: the threads' client, whose frame route and retry settings this follows;
        route: where to connect instead (tests), None while not learned yet."""
        self._meta = meta
        self._route = route or meta.frame_route
        self._where: Route | None = None
        self._idle: list[_Conn] = []
        self._deadlines = _Deadlines()
        # Called before each wait between attempts; what it raises ends the call at once (the
        # mount's watchdog: a request it gave up stops retrying, fuse/ops.py).
        self.before_wait: typing.Callable[[], None] | None = None
        self._retry = Retry(transient=lambda e: isinstance(e, Unreached), wait=meta.masters.wait,
                            deadline_s=lambda: meta.cfg.retry_s, before_sleep=self._retrying,
                            async_sleep=trio.sleep)

    async def call(self, method: Method[Req, Rep], request: Req, timeout: float | None = None) -> Rep:
        """The reply to one call, retried as the module says; the master's CurvineError,
        or EHOSTDOWN/ETIMEDOUT once client.retry_s ran out.  Each attempt is sent and
        answered under one timeout (_Deadlines: no trio cancel scope per call)."""
        payload = request.SerializeToString()
        timeout = timeout or attempt_timeout(self._meta.cfg)
        start = time.perf_counter() if metrics.on else 0.0
        try:
            reply = typing.cast(Rep, await self._retry.acall(self._once, method, timeout, payload))
        except Unreached as e:
            raise self._meta.unreachable_error(e) from None
        finally:
            if start:
                metrics.meta_seconds(method.name).observe(time.perf_counter() - start)
        self._meta.settle(request, reply)
        return reply

    async def _once(self, m: Method[Req, Rep], timeout: float, payload: bytes) -> Rep:
        return await self._answer(await self._take(timeout), m, timeout, payload)

    def _retrying(self, failed: Failed) -> None:
        if self.before_wait is not None:
            self.before_wait()
        log.info("master %s unreachable; retrying %s: %s", self._meta.address, failed.args[0].name, failed.error)

    async def send(self, method: Method[Req, Rep], request: Req, timeout: float) -> "Pending[Rep]":
        """Put one call's request frame on the wire now; its reply is awaited later
        (Pending.reply), so a caller can answer the kernel in between."""
        payload = request.SerializeToString()
        conn = await self._take(timeout)
        cid = conn.call_id()
        try:
            with trio.fail_after(timeout):
                await conn.send(mf.request_frame(cid, method.id, payload))
        except (OSError, trio.TooSlowError) as e:
            conn.sock.close()
            raise Broken(f"{method.name}: {e}") from None
        return Pending(self, conn, method, cid, timeout)

    async def send_soon(self, method: Method[Req, Rep], request: Req) -> typing.Callable[[], typing.Awaitable[Rep]]:
        """A call whose request is on its way when this returns; the async function
        returned gives its reply (a send or reply that did not get through: the whole
        call, retried, with the same request id)."""
        try:
            pending = await self.send(method, request, attempt_timeout(self._meta.cfg))
        except Unreached:
            done = await self.call(method, request)

            async def answered() -> Rep:
                return done
            return answered

        async def reply() -> Rep:
            try:
                answer = await pending.reply()
            except Unreached:
                return await self.call(method, request)
            self._meta.settle(request, answer)
            return answer
        return reply

    async def harden(self, w: Hardening, request: pb.AllocateBlocksRequest) -> None:
        """Send the AllocateBlocks that binds a new file's lease before the mount answers
        its first write (so no other writer's later open can precede it at the master),
        and take the answer in the background: the write does not wait ~1 ms for it.  A
        send that does not get through makes the call whole first, as any."""
        try:
            answer = await self.send_soon(Master.AllocateBlocks, request)
        except BaseException as e:
            w.hardened(None, e)
            raise
        trio.lowlevel.spawn_system_task(_hardened, w, answer, name="harden")

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
        if where is None:   # not learned yet, or the master moved: GetRing over gRPC, in a thread
            where = await trio.to_thread.run_sync(self._meta.learn_route, timeout)
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
        conn = _Conn(raw, where)
        sock = conn.sock
        try:
            with trio.fail_after(timeout):
                await sock.connect((host, port))
                sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
                if self._meta.tls is not None:
                    await conn.secure(self._meta.tls)
                answer = mf.answer_hello(await conn.reader.afill(mf.HELLO.size), secret, f"{host}:{port}")
                conn.reader.consume(mf.HELLO.size)
                await conn.send(answer)
        except (OSError, mf.Closed, trio.TooSlowError) as e:
            conn.sock.close()
            if why := refusal(e, f"the master at {host}:{port}"):
                raise CurvineError(errno.EACCES, why) from None
            self._meta.route_failed(port)   # the next attempt asks the master for its port again
            raise NoServer(f"cannot connect to {host}:{port}: {e}",
                           errno.ETIMEDOUT if isinstance(e, trio.TooSlowError) else errno.EHOSTDOWN) from None
        return conn

    # ------------------------------------------------------------------ one exchange
    async def _answer(self, conn: _Conn, m: Method[Req, Rep], timeout: float, payload: bytes | None = None,
                      cid: int = 0) -> Rep:
        """Send payload (None: it went as call cid already) and receive its reply; the
        connection goes back to the idle ones when the exchange completed."""
        reusable = False   # the exchange completed: the connection is in a clean state
        deadlines = self._deadlines
        deadlines.watch(conn, timeout)   # (bounded by closing conn, not by a cancel scope)
        try:
            if payload is not None:
                cid = conn.call_id()
                await conn.send(mf.request_frame(cid, m.id, payload))
            reply = await self._receive(conn, m, cid)
            reusable = not conn.expired
            return reply
        except CurvineError as e:   # (an answer, even one _Deadlines was about to cut off)
            reusable = e.errno != errno.EACCES and not conn.expired   # a refused secret closes the connection
            raise
        except Broken:
            raise
        except Unreached as e:   # UNAVAILABLE or NOT_LEADER, an answer too (the connection is kept
            reusable = not conn.expired   # while the route stays this master's); a follower's: to the leader
            if e.leader is not None:
                self._meta.route_not_leader(conn.where[0], conn.where[1], e.leader)
            raise Unreached(f"{m.name} at {conn.where[0]}:{conn.where[1]}: {e}") from None
        except (OSError, mf.Closed, trio.ClosedResourceError, trio.BrokenResourceError) as e:
            if conn.expired:   # _Deadlines closed it
                raise Broken(f"{m.name} took longer than {timeout:g} s", errno.ETIMEDOUT) from None
            raise Broken(f"{m.name}: {e}") from None
        finally:
            deadlines.done(conn)
            self._give_back(conn, reusable)

    @staticmethod
    async def _receive(conn: _Conn, m: Method[Req, Rep], cid: int) -> Rep:
        length, got_id, status = mf.REPLY.unpack(await conn.reader.afill(mf.REPLY.size))
        if not mf.REPLY_REST <= length <= mf.MAX_FRAME:
            raise mf.Closed(f"bad reply frame length {length}")
        body = (await conn.reader.afill(mf.LENGTH.size + length))[mf.REPLY.size:]
        try:
            return mf.reply_of(m, cid, got_id, status, body)   # UNAVAILABLE: Unreached, retried
        finally:
            conn.reader.consume(mf.LENGTH.size + length)


class Pending(typing.Generic[Rep]):
    """A call whose request is on the wire: reply() awaits its answer, once."""

    __slots__ = ("_meta", "_conn", "_m", "_cid", "_timeout", "_start")

    def __init__(self, meta: AsyncMeta, conn: _Conn, m: Method[typing.Any, Rep], cid: int, timeout: float) -> None:
        self._meta, self._conn, self._m, self._cid, self._timeout = meta, conn, m, cid, timeout
        self._start = time.perf_counter()   # the request went out just now: its latency runs from here

    async def reply(self) -> Rep:
        """The reply; Unreached (the caller makes the whole call again) or the master's CurvineError."""
        try:
            reply = await self._meta._answer(self._conn, self._m, self._timeout, cid=self._cid)
        except CurvineError:
            if metrics.on:
                metrics.meta_seconds(self._m.name).observe(time.perf_counter() - self._start)
            raise
        if metrics.on:
            metrics.meta_seconds(self._m.name).observe(time.perf_counter() - self._start)
        return reply


async def _send_now(raw: socket.socket, sock: typing.Any, data: bytes) -> None:
    """data onto raw: at once when it takes it all, with no trip through trio's scheduler,
    else the rest awaited on sock (the same socket, trio's)."""
    try:
        sent = raw.send(data)
    except BlockingIOError:
        sent = 0
    if sent < len(data):
        await _send_all(sock, memoryview(data)[sent:])


async def _send_all(sock: typing.Any, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        sent = await sock.send(view)
        view = view[sent:]
