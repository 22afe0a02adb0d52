"""The accept loop never dies (issue 42, item 5; curvine_py/common/listener.py).

A server process with 64 descriptors is flooded with 200 idle connections (it runs out
of descriptors: EMFILE at accept), then with threads that cannot start; afterwards it
serves again, and its log holds a few lines, not one traceback per failed accept.  Once
a worker out of descriptors logged 303,107 tracebacks in ~20 s, and a thread that could
not start killed its accept thread for good.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = r"""
import logging, resource, socket, sys, threading
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from curvine_py.common import listener

class Echo(listener.ConnectionServer):
    def serve(self, sock, addr):
        while data := sock.recv(64):
            sock.sendall(data)

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
server = Echo(lsock, "echo").start()
print(lsock.getsockname()[1], flush=True)
for line in sys.stdin:                # "fail N": the next N connection threads cannot start
    failing[0] = int(line.split()[1])
    print("ok", flush=True)
"""


def echo(port: int, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"ping")
        return s.recv(64)


@pytest.mark.timeout(120)
def test_accept_survives_running_out_of_descriptors_and_threads(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        assert echo(port) == b"ping"
        flood = []
        for _ in range(200):   # idle connections: the server's 64 descriptors run out
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.5)        # the accept loop meets EMFILE, again and again, backing off
        for s in flood:
            s.close()
        deadline = time.monotonic() + 30
        while True:            # the backlog drains; then it serves again
            try:
                if echo(port, timeout=2) == b"ping":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server stopped accepting after running out of descriptors"
            time.sleep(0.2)
        proc.stdin.write("fail 5\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ok"
        for _ in range(5):     # each refused: its connection closed, the loop goes on
            try:
                echo(port, timeout=2)
            except OSError:
                pass
        assert echo(port) == b"ping", "a thread that could not start killed the accept loop"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)
    text = log.read_text()
    assert "Traceback" not in text
    assert len(text.splitlines()) < 20, text[-2000:]
    assert "accept failed" in text and "could not be served" in text
