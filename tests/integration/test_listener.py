"""The accept loop never dies, and a flood takes no port (issue 42, item 5;
curvine_py/common/listener.py).

A server process with 64 descriptors (a connection budget of 32) and a framed echo
protocol: 200 idle connections do not lock a client out (the oldest that never sent a
request make room for it); with every descriptor taken it meets EMFILE at accept, logs it
once and serves again once descriptors are back; threads that cannot start are survived;
idle, silent-first and half-open peers are closed after their timeouts.  Its log holds a
few lines, not one traceback per failed accept: once a worker out of descriptors logged
303,107 tracebacks in ~20 s, and a thread that could not start killed its accept thread.
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = r"""
import logging, os, resource, socket, struct, sys, threading
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from curvine_py.common import listener

class Echo(listener.ConnectionServer):
    # frames: 4-byte length + body, echoed back; tells the listener each phase
    def serve(self, sock, addr):
        conn = self.conn_of(sock)
        try:
            while True:
                conn.waiting()
                if not sock.recv(1, socket.MSG_PEEK):
                    return
                conn.reading()
                head = self.exact(sock, 4)
                body = self.exact(sock, struct.unpack(">I", head)[0])
                conn.working()
                sock.sendall(head + body)
        except OSError:
            pass

    @staticmethod
    def exact(sock, n):
        data = b""
        while len(data) < n:
            got = sock.recv(n - len(data))
            if not got:
                raise ConnectionError("closed")
            data += got
        return data

resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
real_start, failing = threading.Thread.start, [0]
def start(self):                      # "can't start new thread", as under a PID limit
    if failing[0] > 0 and self.name.startswith("echo-conn"):
        failing[0] -= 1
        raise RuntimeError("can't start new thread")
    return real_start(self)
threading.Thread.start = start
lsock = socket.socket()
lsock.bind(("127.0.0.1", 0))
lsock.listen(1024)
server = Echo(lsock, "echo", first_request_s=3.0, partial_s=1.5, idle_s=3.0).start()
print(lsock.getsockname()[1], flush=True)
hog = []
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == "fail":                 # the next N connection threads cannot start
        failing[0] = int(arg)
    elif cmd == "hog":                # take every free descriptor (1) or give them back (0)
        if int(arg):
            try:
                while True:
                    hog.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
        else:
            for fd in hog:
                os.close(fd)
            hog.clear()
    print("ok", server.connections, flush=True)
"""


def echo(port: int, timeout: float = 5.0, payload: bytes = b"ping") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        return exchange(s, payload)


def exchange(s: socket.socket, payload: bytes = b"ping") -> bytes:
    s.sendall(struct.pack(">I", len(payload)) + payload)
    got = b""
    while len(got) < 4 + len(payload):
        chunk = s.recv(64)
        if not chunk:
            break
        got += chunk
    return got[4:]


def closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(64) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


class Server:
    def __init__(self, log: Path) -> None:
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.port = int(self.stdout.readline())

    def command(self, line: str) -> int:
        """Send a command; the server's count of connections after it."""
        self.stdin.write(line + "\n")
        self.stdin.flush()
        ok, conns = self.stdout.readline().split()
        assert ok == "ok"
        return int(conns)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def wait_served(port: int, what: str, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while True:
        try:
            if echo(port, timeout=2) == b"ping":
                return time.monotonic() - t0
        except OSError:
            pass
        assert time.monotonic() - t0 < timeout, what
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_a_flood_takes_no_port_and_accept_survives_descriptors_and_threads(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = Server(log)
    flood: list[socket.socket] = []
    try:
        port = server.port
        assert echo(port) == b"ping"
        # 200 idle connections against a budget of 32: the oldest that never sent a request
        # make room, so a client is served while the whole flood is still connected.
        for _ in range(200):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        took = wait_served(port, "a client was locked out by 200 idle connections")
        assert took < 1.0, f"a client waited {took:.2f} s behind 200 idle connections"
        assert server.fds() < 64
        assert server.command("fail 0") <= 33
        # A client that is between requests keeps its connection while flood connections
        # that never sent one are there to make room.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as kept:
            assert exchange(kept) == b"ping"
            for _ in range(100):
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            wait_served(port, "no room after a second wave")
            assert exchange(kept) == b"ping", "an idle client connection was evicted before flood ones"
        for s in flood:
            s.close()
        flood.clear()

        # Every descriptor taken: accept meets EMFILE with nothing to evict, backs off,
        # logs once; descriptors back, the connection waiting in the backlog is served.
        wait_until_conns(server, 0)
        server.command("hog 1")
        with pytest.raises(OSError):
            echo(port, timeout=1.5)
        server.command("hog 0")
        wait_served(port, "the server stopped accepting after running out of descriptors")

        # Threads that cannot start: each connection is closed, the loop goes on.
        server.command("fail 5")
        for _ in range(5):
            try:
                echo(port, timeout=2)
            except OSError:
                pass
        assert echo(port) == b"ping", "a thread that could not start killed the accept loop"

        # Timeouts (this server: first request 3 s, half-open 1.5 s, idle 3 s).
        t0 = time.monotonic()
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        half = socket.create_connection(("127.0.0.1", port), timeout=5)
        half.sendall(b"\0\0")                      # half a length prefix, then nothing
        idle = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert exchange(idle) == b"ping"
        assert closed_by_server(half, 5), "a half-open peer was not dropped"
        assert time.monotonic() - t0 < 3.5        # by the half-open timeout, not the idle one
        assert closed_by_server(silent, 5) and closed_by_server(idle, 5)
        for s in (silent, half, idle):
            s.close()
        assert server.proc.poll() is None
    finally:
        for s in flood:
            s.close()
        server.stop()
    text = log.read_text()
    assert "Traceback" not in text
    assert len(text.splitlines()) < 20, text[-2000:]
    for what in ("made room", "accept failed", "could not be served", "silent in the middle of a request"):
        assert what in text, (what, text[-2000:])


def wait_until_conns(server: Server, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.command("fail 0") > n:
        assert time.monotonic() < deadline, f"connections did not drop to {n}"
        time.sleep(0.1)
