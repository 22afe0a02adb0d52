"""Target: the block data channel (curvine_py/common/frames.py) and the worker that serves
it (worker/dataserver.py), which every client and peer worker reaches.

Each input is a byte stream: raw bytes, or (first byte odd) frames built from the input,
headers of every op with fuzzed fields and payloads of fuzzed length.  It is read twice:
by ``frames.recv_header`` alone over a socket pair, and by a real DataServer over a
temporary block store (no secret: writes and reads of any block id are served) through
a TCP connection, whose end the target then waits for.

Chain targets (the next workers a write is forwarded to) are all made this server itself
(or port 1, refused): an input that names any other address is parsed but not sent,
since the worker would connect there (another engineer's cluster on this machine, or a
host on the network).

Checks: the parser (and the short-circuit write socket's, recv_header_with_fd, which must
read the same headers) raises nothing but ChannelClosed and never hands out a header whose
payload is past MAX_PAYLOAD; the server's connection ends by itself within HANG_S once the
input ended, and its thread raised nothing unexpected (the listener's log would have
swallowed it: fuzz/findings.py)."""
from __future__ import annotations

import shutil
import socket
import tempfile
import typing

from curvine_py.common import frames
from curvine_py.pb import data_pb2
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.dataserver import DataServer
from curvine_py.worker.threadio import ThreadIO
from fuzz.draw import Draw, fill
from fuzz.findings import Crashes, watch
from fuzz.harness import HANG_S, MAX_INPUT, Finding, Lazy, run

Op = data_pb2.Op
OPS = [v.number for v in data_pb2.Op.DESCRIPTOR.values]
MAX_FRAMES = 8
LOOPBACK = "127.0.0.1"
REFUSED = 1   # a port nothing listens on


def _start() -> tuple[tuple[DataServer, Crashes], typing.Callable[[], None]]:
    root = tempfile.mkdtemp(prefix="fuzz-data-")
    engine = ThreadIO()
    store = BlockStore([root], engine, reserve=0)
    srv = DataServer(store, "127.0.0.1", 0, worker_id=1, idle_timeout_s=HANG_S, io_timeout_s=HANG_S).start()

    def stop() -> None:
        srv.close(grace_s=1.0)
        engine.close()
        shutil.rmtree(root, ignore_errors=True)
    return (srv, watch(srv, "data")), stop


SERVER: Lazy[tuple[DataServer, Crashes]] = Lazy(_start)
server = SERVER.get
close = SERVER.close


def stream_of(data: bytes) -> bytes:
    """The bytes sent: the input itself, or (first byte odd) frames built from it."""
    if not data or not data[0] & 1:
        return data
    draw = Draw(data[1:])
    out = bytearray()
    for _ in range(MAX_FRAMES):
        if draw.left() <= 0:
            break
        h = data_pb2.DataHeader()
        fill(h, draw)
        h.op = draw.choice(OPS)
        for target in h.chain:
            target.ip, target.port = LOOPBACK, draw.choice((server()[0].port, REFUSED))
        payload = draw.blob(255) * (draw.byte() % 8 + 1)
        if draw.byte() % 8:            # mostly the length the payload has
            h.payload_len = len(payload)
        out += frames.header_bytes(h) + payload
    return bytes(out)


def fuzz_one(data: bytes) -> None:
    stream = stream_of(data[:MAX_INPUT])[:MAX_INPUT]
    headers = parse_alone(stream)
    if all(_safe_chain(h) for h in headers):
        exchange(stream)


def _safe_chain(h: data_pb2.DataHeader) -> bool:
    return all(t.ip == LOOPBACK and t.port in (server()[0].port, REFUSED) for t in h.chain)


def parse_alone(stream: bytes) -> list[data_pb2.DataHeader]:
    """The headers frames.recv_header reads from stream (each payload skipped); the
    short-circuit write socket's reader, recv_header_with_fd, must read the same ones."""
    headers = _headers(stream, lambda sock: frames.recv_header(sock))
    with_fd = _headers(stream, lambda sock: frames.recv_header_with_fd(sock)[0])
    if with_fd != headers:
        raise Finding(f"recv_header_with_fd read {len(with_fd)} headers, recv_header {len(headers)}")
    return headers


def _headers(stream: bytes, read: typing.Callable[[socket.socket], data_pb2.DataHeader]) -> list[data_pb2.DataHeader]:
    headers = []
    a, b = socket.socketpair()
    with a, b:
        a.sendall(stream)
        a.shutdown(socket.SHUT_WR)
        try:
            while True:
                h = read(b)
                if h.payload_len > frames.MAX_PAYLOAD:
                    raise Finding(f"a header with a payload of {h.payload_len} bytes got through")
                headers.append(h)
                frames.recv_exact(b, h.payload_len)
        except frames.ChannelClosed:
            pass
    return headers


def exchange(stream: bytes) -> None:
    srv, crashes = server()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=HANG_S) as sock:
        try:
            sock.sendall(stream)
            sock.shutdown(socket.SHUT_WR)
        except OSError:    # the server closed first (a protocol error): its reply is read below
            pass
        _drain(sock)
    for what, e in crashes.take():
        raise Finding(f"the data server: {what}: {type(e).__name__}: {e}") from e


def _drain(sock: socket.socket) -> None:
    """Read until the server closes the connection (its thread is done)."""
    try:
        while sock.recv(1 << 16):
            pass
    except TimeoutError:
        raise Finding(f"the data server did not end the connection within {HANG_S} s of the input's end") from None
    except ConnectionResetError:
        pass


def main() -> None:
    server()
    run(fuzz_one)


if __name__ == "__main__":
    main()
