"""The Raft port's TLS socket (master/rafttls.py) as PySyncObj's TcpConnection drives it:
non-blocking sends of its whole buffer, EAGAIN when the socket is full, reads until
EAGAIN; over a socket pair with small buffers, so sends are cut short and ciphertext
waits in the TLS socket (the case that must not lose or repeat a byte)."""
from __future__ import annotations

import os
import select
import socket
from pathlib import Path

import pytest

from curvine_py.common import tls as tlsmod
from curvine_py.master.rafttls import TlsSocket


def identity(tmp: Path, name: str, role: str) -> tlsmod.Tls:
    ca = tmp / "ca.pem"
    if not ca.exists():
        tlsmod.create_ca(ca)
    tlsmod.issue(ca, name, role, tmp / f"{name}.pem", tmp / f"{name}.key")
    return tlsmod.Tls(tlsmod.Material(ca, tmp / f"{name}.pem", tmp / f"{name}.key"), role)


def pair(tmp: Path, client_role: str = "master") -> tuple[TlsSocket, TlsSocket]:
    a, b = socket.socketpair()
    for s in (a, b):
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    server, client = identity(tmp, "m0", "master"), identity(tmp, "peer", client_role)
    return (TlsSocket(a, client.client_context(), False, {}),
            TlsSocket(b, server.server_context(), True, {}))


def pump(sender: TlsSocket, receiver: TlsSocket, data: bytes, limit: int = 200_000) -> bytes:
    """TcpConnection's loops on both ends until every byte arrived."""
    buf, got = data, bytearray()
    for _ in range(limit):
        try:
            while buf:
                buf = buf[sender.send(buf):]
        except BlockingIOError:
            pass
        try:
            while chunk := receiver.recv(65536):
                got += chunk
        except BlockingIOError:
            pass
        try:                       # the sender's read events: how its handshake goes on
            extra = sender.recv(65536)
            raise AssertionError(f"the sender read {extra[:20]!r}, which nobody sent")
        except BlockingIOError:
            pass
        if not buf and len(got) >= len(data):
            return bytes(got)
        select.select([receiver.raw, sender.raw], [sender.raw] if buf else [], [], 0.01)
    raise AssertionError(f"stuck: {len(data) - len(buf)} taken, {len(got)} of {len(data)} arrived")


def test_bytes_cut_short_by_a_full_socket_arrive_once_and_in_order(tmp_path: Path) -> None:
    client, server = pair(tmp_path)
    data = os.urandom(3 * 1024 * 1024 + 17)     # a snapshot's pieces: far more than the socket holds
    assert pump(client, server, data) == data
    back = os.urandom(200_000)
    assert pump(server, client, back) == back   # and the other way on the same connection


def test_a_certificate_of_another_role_is_refused(tmp_path: Path) -> None:
    client, server = pair(tmp_path, client_role="client")
    with pytest.raises(PermissionError, match="not a master"):
        pump(client, server, b"x" * 100, limit=2000)
