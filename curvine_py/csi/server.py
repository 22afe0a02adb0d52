"""The driver's gRPC servers: `cv csi node` (Identity + Node), `cv csi controller` (Identity + Controller).

Served on the endpoint the CO gives (``unix:///csi/csi.sock``, what node-driver-registrar
and the external-provisioner sidecars dial; ``tcp://host:port`` for tests by hand) until
SIGTERM or SIGINT.  A stopped node server leaves every mount as it is: the mount daemons
serve pods' volumes whether a driver runs or not.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import threading
import time
import typing
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from curvine_py.csi.common import Clients
from curvine_py.csi.controller import Controller
from curvine_py.csi.identity import Identity
from curvine_py.csi.node import Node
from curvine_py.csi.staging import StagingMounts, fuse_ready
from curvine_py.pb import csi_pb2_grpc

if typing.TYPE_CHECKING:
    from curvine_py.common.config import Config

log = logging.getLogger("curvine.csi")
RPC_THREADS = 8
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Endpoint:
    """Where to listen: a Unix socket path, or a TCP host:port."""
    address: str                 # as grpc binds it
    socket_path: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Endpoint":
        """unix:///abs/path (or unix:/abs/path), tcp://host:port; ValueError with the reason."""
        if text.startswith("unix:"):
            path = "/" + text[len("unix:"):].lstrip("/")
            if path == "/":
                raise ValueError(f"no socket path in endpoint {text!r}")
            return cls(f"unix://{path}", path)
        if text.startswith("tcp://"):
            host, sep, port = text[len("tcp://"):].rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"not tcp://host:port: {text!r}")
            return cls(f"{host}:{port}")
        raise ValueError(f"endpoint {text!r} must be unix:///path/to/csi.sock or tcp://host:port")


def _listen(server: grpc.Server, endpoint: Endpoint) -> None:
    """Bind, replacing the socket a killed driver left behind (never another kind of file)."""
    if endpoint.socket_path is not None:
        path = Path(endpoint.socket_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise OSError(f"{path}: exists and is not a socket")
            if _answers(str(path)):
                raise OSError(f"{path}: another server is listening on it")
            path.unlink()
    try:
        server.add_insecure_port(endpoint.address)
    except RuntimeError as e:
        raise OSError(f"cannot listen on {endpoint.address}: {e}") from None


def _answers(path: str) -> bool:
    """Does something accept connections on this Unix socket (a driver still running)?"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def _serve(endpoint: Endpoint, add: typing.Callable[[grpc.Server], None], what: str,
           prepare: typing.Callable[[], None] = lambda: None) -> None:
    """Serve until SIGTERM/SIGINT (the signal only sets an event: the stop runs here).
    prepare runs once the endpoint is ours (a second driver stops before touching a mount)
    and before the first request is served."""
    # The handlers go in before the socket is bound: a SIGTERM that arrives once a
    # supervisor can see the socket answer must stop the server, not kill the process.
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=RPC_THREADS))
    try:
        add(server)
        _listen(server, endpoint)
        prepare()
        server.start()
    except BaseException:
        for s, h in previous.items():
            signal.signal(s, h)
        raise
    log.info("%s serving on %s", what, endpoint.address)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        log.info("%s stopping", what)
        server.stop(STOP_GRACE_S).wait()
        for s, h in previous.items():
            signal.signal(s, h)
        if endpoint.socket_path is not None:
            try:
                os.unlink(endpoint.socket_path)
            except FileNotFoundError:
                pass


def run_node(config: "Config", endpoint: Endpoint, node_id: str, state_dir: str, config_path: str | None) -> None:
    """The node plugin: first the mounts already there are found (restart recovery)."""
    staging = StagingMounts(state_dir, config_path)
    clients = Clients(config)
    if os.getpid() == 1:   # a container's init: the daemons become our children
        threading.Thread(target=_reap_forever, args=(staging,), name="reaper", daemon=True).start()

    def add(server: grpc.Server) -> None:
        csi_pb2_grpc.add_IdentityServicer_to_server(Identity(ready=fuse_ready), server)
        csi_pb2_grpc.add_NodeServicer_to_server(Node(config, clients, staging, node_id), server)
    try:
        _serve(endpoint, add, f"CSI node {node_id}", prepare=staging.recover)
    finally:
        clients.close()


def _reap_forever(staging: StagingMounts) -> None:
    while True:
        staging.reap()
        time.sleep(1.0)


def run_controller(config: "Config", endpoint: Endpoint) -> None:
    clients = Clients(config)

    def add(server: grpc.Server) -> None:
        csi_pb2_grpc.add_IdentityServicer_to_server(Identity(), server)
        csi_pb2_grpc.add_ControllerServicer_to_server(Controller(config, clients), server)
    try:
        _serve(endpoint, add, "CSI controller")
    finally:
        clients.close()
