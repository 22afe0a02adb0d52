"""Target: the framed metadata channel (curvine_py/common/metaframes.py) as the master's
FrameServer (master/framed.py) reads it, in front of a real master (fuzz/realmaster.py).

Each input is what a client sends after a correct handshake: raw bytes, or (first byte
odd) request frames built from the input, each a method id (sometimes past the last) and
a well-formed request of that method's type with fuzzed fields or raw payload bytes,
its length sometimes wrong.  The client's side, ``FrameReader`` and ``reply_of``, reads
every reply the server sent back.

Checks: the connection ends by itself within HANG_S once the input ended; the server's
thread raised nothing unexpected (fuzz/findings.py); no handler failed inside (an EIO
"internal error" reply); every reply frame parses and answers a call id that was sent."""
from __future__ import annotations

import socket
import struct
import typing

from curvine_py.common import metaframes as mf
from curvine_py.common.errors import CurvineError, Unreached
from curvine_py.master.framed import FrameServer
from fuzz.draw import Draw, message
from fuzz.findings import Crashes, watch
from fuzz.harness import HANG_S, MAX_INPUT, Finding, Lazy, run
from fuzz.realmaster import MASTER, Gated, master

MAX_FRAMES = 8
SECRET = ""   # the fuzz master's (no secret); the handshake's MAC is still checked
INTERNAL = b"internal error in "


def _start() -> tuple[tuple[FrameServer, Crashes], typing.Callable[[], None]]:
    servers = master()
    srv = FrameServer(Gated(servers), SECRET, "127.0.0.1", 0, thread_done=servers.service.close_thread_reader,
                      sessions=servers.service).start()
    return (srv, watch(srv, "frames")), srv.stop


SERVER: Lazy[tuple[FrameServer, Crashes]] = Lazy(_start)
server = SERVER.get


def close() -> None:
    SERVER.close()
    MASTER.close()


def stream_of(data: bytes) -> tuple[bytes, set[int] | None]:
    """The bytes sent after the handshake, and the call ids a reply may answer (the frames
    built, and the pushes of a cache session); None when unknown (raw bytes, a lying length)."""
    if not data or not data[0] & 1:
        return data, None
    draw = Draw(data[1:])
    out, ids, known = bytearray(), set(), True
    for _ in range(MAX_FRAMES):
        if draw.left() <= 0:
            break
        method_id = draw.byte() % (len(mf.METHODS) + 2)
        if method_id < len(mf.METHODS) and draw.byte() % 4:
            payload = message(mf.METHODS[method_id].request, draw).SerializeToString()
        else:
            payload = draw.blob(255)
        call_id = draw.uint(4)
        ids.add(call_id)
        frame = bytearray(mf.request_frame(call_id, method_id, payload))
        if not draw.byte() % 16:      # a length that lies: what follows is read out of step
            struct.pack_into(">I", frame, 0, draw.uint(4))
            known = False
        out += frame
    return bytes(out), (ids | {mf.PUSH_CALL_ID} if known else None)


def fuzz_one(data: bytes) -> None:
    stream, ids = stream_of(data[:MAX_INPUT])
    srv, crashes = server()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=HANG_S) as sock:
        reader = mf.FrameReader(sock)
        _handshake(sock, reader)
        try:
            sock.sendall(stream[:MAX_INPUT])
            sock.shutdown(socket.SHUT_WR)
        except OSError:   # the server closed first (a frame it cannot parse): its replies are read below
            pass
        _read_replies(reader, ids)
    for what, e in crashes.take():
        raise Finding(f"the frame server: {what}: {type(e).__name__}: {e}") from e


def _handshake(sock: socket.socket, reader: mf.FrameReader) -> None:
    hello = bytes(reader.fill(mf.HELLO.size))
    reader.consume(mf.HELLO.size)
    sock.sendall(mf.answer_hello(hello, SECRET, "the fuzz master"))


def _read_replies(reader: mf.FrameReader, ids: set[int] | None) -> None:
    """Every reply until the server closes; ids: the call ids sent (None: not known)."""
    while True:
        try:
            head = reader.fill(mf.REPLY.size)
        except mf.Closed:
            return
        except TimeoutError:
            raise Finding(f"the frame server did not end the connection within {HANG_S} s") from None
        except ConnectionResetError:
            return
        length, call_id, status = mf.REPLY.unpack(head)
        if length < mf.REPLY_REST:
            raise Finding(f"a reply frame of length {length}, shorter than its header")
        body = bytes(reader.fill(mf.LENGTH.size + length)[mf.REPLY.size:])
        reader.consume(mf.LENGTH.size + length)
        if body.startswith(INTERNAL):
            raise Finding(f"a handler failed inside: {body.decode('utf-8', 'replace')}")
        if ids is not None and call_id not in ids:
            raise Finding(f"a reply to call {call_id}, which was never sent")
        _decode(call_id, status, body)


def _decode(call_id: int, status: int, body: bytes) -> None:
    """The client's reading of a reply (reply_of) raises only what it documents."""
    method = mf.METHODS[1]   # GetAttr: any method's reply parses the same way
    try:
        mf.reply_of(method, call_id, call_id, status, memoryview(body))
    except (CurvineError, Unreached, mf.Closed):
        pass


def main() -> None:
    server()
    run(fuzz_one)


if __name__ == "__main__":
    main()
