"""Mutual TLS (issue 40): every channel of a `tls=True` cluster is encrypted and takes
only peers with a certificate of the cluster's CA, of the right role; the secret never
crosses loopback in clear; certificates rotate by restarting one process at a time."""
from __future__ import annotations

import os
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import grpc
import pytest

from curvine_py.client.framedclient import connect
from curvine_py.cluster.local import LocalCluster
from curvine_py.common import frames
from curvine_py.common import tls as tlsmod
from curvine_py.common.config import load as load_config
from curvine_py.common.rpc import channel
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc
from curvine_py.sdk import Client
from tests.conftest import client_config

CV = str(Path(sys.executable).parent / "cv")
MiB = 1 << 20


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[LocalCluster]:
    from tests.conftest import start_cluster
    c = start_cluster(tmp_path_factory.mktemp("tls") / "cluster", tls=True, tls_data=True)
    try:
        yield c
    finally:
        c.stop()


def cv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CV, *args], capture_output=True, text=True, timeout=timeout)


def config_with(cluster: LocalCluster, tmp: Path, **tls: str) -> Path:
    """The cluster's config file with some [tls] keys changed."""
    lines = []
    for line in cluster.config_path.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if key in tls and not line.startswith(("secret", "name")):
            line = f"{key} = {tls[key]}"
        lines.append(line)
    out = tmp / "curvine.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_every_process_gets_a_certificate_of_its_role_and_keys_stay_private(tls_cluster: LocalCluster) -> None:
    d = tls_cluster.tls_dir
    assert tlsmod.role_of_cert(d / "master.pem") == "master"
    assert tlsmod.role_of_cert(d / "worker0.pem") == "worker"
    assert tlsmod.role_of_cert(d / "client.pem") == "client"
    for key in d.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_data_and_metadata_work_over_tls(tls_cluster: LocalCluster, tmp_path: Path) -> None:
    cfg = client_config(tls_cluster)
    assert cfg.tls.data                                   # the block bytes too
    cfg.client.short_circuit = cfg.client.short_circuit_writes = False   # over TCP, not local files
    data = os.urandom(9 * MiB + 123)
    with Client(master=tls_cluster.master_address, config=cfg) as c:
        c.mkdir("/tls-data", exist_ok=True)
        c.put_bytes("/tls-data/f", data)
        assert c.get_bytes("/tls-data/f") == data
        assert c.stat("/tls-data/f").size == len(data)
    r = cv("--config", str(tls_cluster.config_path), "fs", "ls", "/tls-data")
    assert r.returncode == 0 and "f" in r.stdout, r.stderr


def test_a_plain_client_is_told_the_cluster_speaks_tls(tls_cluster: LocalCluster, tmp_path: Path) -> None:
    conf = config_with(tls_cluster, tmp_path, enabled="false")
    t0 = time.monotonic()
    r = cv("--config", str(conf), "fs", "ls", "/")
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "speaks TLS" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 15, "said at once, not after the retries"


def test_a_certificate_of_another_ca_is_refused_with_one_line(tls_cluster: LocalCluster, tmp_path: Path) -> None:
    other = tmp_path / "other"
    tlsmod.create_ca(other / "ca.pem")
    tlsmod.issue(other / "ca.pem", "mallory", "client", other / "m.pem", other / "m.key")
    conf = config_with(tls_cluster, tmp_path, cert=f'"{other / "m.pem"}"', key=f'"{other / "m.key"}"')
    r = cv("--config", str(conf), "fs", "ls", "/")
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "refused this certificate" in r.stderr, r.stderr
    # the framed channel and the data channel refuse it at their handshakes as well
    mine = load_config(path=str(tls_cluster.config_path)).tls
    evil = tlsmod.Tls(tlsmod.Material(Path(mine.ca), other / "m.pem", other / "m.key"), "client")
    host, port = tls_cluster.master_address.rsplit(":", 1)
    from curvine_py.client.framedclient import connect
    from curvine_py.common.errors import CurvineError
    frame_port = _frame_port(tls_cluster)
    with pytest.raises(CurvineError, match="refused this certificate|TLS"):
        connect(host, frame_port, tls_cluster.secret, 5.0, evil)
    data_host, data_port = tls_cluster.workers[0].data_address.rsplit(":", 1)
    worker_tls = tlsmod.load(mine, "client")
    assert worker_tls is not None
    data_tls = tlsmod.Tls(worker_tls.material, "client", data=True)
    _data_handshake(data_host, int(data_port), data_tls)            # ours: accepted
    with pytest.raises(OSError):
        _data_handshake(data_host, int(data_port), evil)              # theirs: cut


def _frame_port(cluster: LocalCluster) -> int:
    with Client(master=cluster.master_address, config=client_config(cluster)) as c:
        return c.meta.learn_route(5.0)[1]


def _data_handshake(host: str, port: int, tls: tlsmod.Tls) -> None:
    """A handshake on the data port, then a READ without a token: the worker's answer (a
    refusal of the token) means the connection was accepted; a refused certificate ends it
    instead (TLS 1.3 tells the client after its handshake, at its first read)."""
    with socket.create_connection((host, port), timeout=5) as raw:
        s = tls.connect(raw, "worker")
        s.settimeout(5)
        frames.send_frame(s, frames.DataHeader(op=frames.Op.READ, block_id=12345, offset=0, length=1))
        h = frames.recv_header(s)
        assert h.op == frames.Op.REPLY and h.errno, h


def test_roles_are_enforced(tls_cluster: LocalCluster, tmp_path: Path) -> None:
    client_tls = tlsmod.load(load_config(path=str(tls_cluster.config_path)).tls, "client")
    stub = pb_grpc.MasterServiceStub(channel(tls_cluster.master_address, tls_cluster.secret, client_tls))
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterWorker(pb.RegisterRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "client certificate" in (e.value.details() or "")
    assert stub.Report(pb.Empty(), timeout=10).workers                # what a client may call, it may
    # a worker started with a client certificate refuses to start, with one line
    conf = config_with(tls_cluster, tmp_path, cert=f'"{tls_cluster.tls_dir / "client.pem"}"',
                       key=f'"{tls_cluster.tls_dir / "client.key"}"')
    r = subprocess.run([sys.executable, "-m", "curvine_py.worker.main", "--config", str(conf),
                        "--worker-dirs", str(tmp_path / "w"), "--worker-rpc-port", "0", "--worker-data-port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "a worker needs a worker certificate" in r.stderr, r.stderr


def _capture_lo(stop: threading.Event, out: bytearray) -> None:
    """Every frame on the loopback interface until stop (AF_PACKET: we are root)."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    s.bind(("lo", 0))
    s.settimeout(0.2)
    with s:
        while not stop.is_set():
            try:
                out += s.recv(65536)
            except TimeoutError:
                pass


def captured_during(action: typing.Callable[[], None]) -> bytes:
    stop, out = threading.Event(), bytearray()
    t = threading.Thread(target=_capture_lo, args=(stop, out), daemon=True)
    t.start()
    time.sleep(0.2)
    try:
        action()
        time.sleep(2.5)            # heartbeats (every second here) are in the capture too
    finally:
        stop.set()
        t.join()
    return bytes(out)


@pytest.mark.skipif(os.geteuid() != 0, reason="capturing loopback traffic needs root")
def test_the_secret_never_crosses_loopback_in_clear(tls_cluster: LocalCluster, cluster_factory: typing.Any) -> None:
    def traffic(cluster: LocalCluster) -> typing.Callable[[], None]:
        def act() -> None:
            r = cv("--config", str(cluster.config_path), "fs", "ls", "/")
            assert r.returncode == 0, r.stderr
            cfg = client_config(cluster)
            cfg.client.short_circuit = cfg.client.short_circuit_writes = False
            with Client(master=cluster.master_address, config=cfg) as c:
                c.put_bytes("/cap", b"x" * MiB)
                assert c.get_bytes("/cap") == b"x" * MiB
        return act
    assert tls_cluster.secret.encode() not in captured_during(traffic(tls_cluster))
    # the check can fail: without TLS the secret is in the capture (gRPC metadata); this
    # cluster runs only now, as its heartbeats would carry the same secret (the tests')
    plain = cluster_factory()
    assert plain.secret.encode() in captured_during(traffic(plain))


def test_certificates_and_the_ca_rotate_one_process_at_a_time_without_a_failed_call(
        cluster_factory: typing.Any) -> None:
    """docs/security.md "Rotation": a new CA from `cv cert ca`, trusted beside the old one
    (each process restarted in turn), every certificate issued from it (again in turn),
    then the old CA dropped (in turn); a client that writes and reads throughout, a new
    client process each time (as `cv` is), never fails; the old CA's certificates are
    refused at the end."""
    c = cluster_factory(tls=True, tls_data=True)
    failures: list[BaseException] = []
    done = threading.Event()
    calls = 0

    def load() -> None:
        nonlocal calls
        i = 0
        while not done.is_set():
            cfg = client_config(c)   # the files as they are now, as a new process reads them
            cfg.client.short_circuit = cfg.client.short_circuit_writes = False
            data = os.urandom(64 * 1024) + i.to_bytes(4, "big")
            try:
                with Client(master=c.master_address, config=cfg) as cl:
                    cl.put_bytes(f"/rot{i % 8}", data)
                    assert cl.get_bytes(f"/rot{i % 8}") == data
                calls += 1
            except BaseException as e:   # noqa: BLE001  (any failure is the finding)
                failures.append(e)
            i += 1

    d = c.tls_dir
    old_client = tlsmod.Tls(tlsmod.Material(d / "ca.pem", d / "client.pem", d / "client.key"), "client")
    processes = [("worker0", "worker", lambda: c.restart_worker(0)), ("worker1", "worker", lambda: c.restart_worker(1)),
                 ("master", "master", lambda: c.restart_master(0))]
    t = threading.Thread(target=load, daemon=True)
    t.start()
    r = cv("cert", "ca", str(d / "ca-new.pem"))
    assert r.returncode == 0, r.stderr
    old_ca = (d / "ca.pem").read_bytes()
    (d / "ca.pem").write_bytes(old_ca + (d / "ca-new.pem").read_bytes())      # 1. trust both
    for _, _, restart in processes:
        restart()
    for name, role, restart in processes + [("client", "client", lambda: None)]:   # 2. new certificates
        r = cv("cert", "issue", name, "--role", role, "--ca", str(d / "ca-new.pem"), "--out", str(d), "--force")
        assert r.returncode == 0, r.stderr
        restart()
    settled = calls + 2   # the client that began with the old certificate has finished (a new one per call)
    deadline = time.monotonic() + 30
    while calls < settled and time.monotonic() < deadline:
        time.sleep(0.05)
    (d / "ca-new.pem").replace(d / "ca.pem")                                  # 3. trust the new one alone
    (d / "ca-new.key").replace(d / "ca.key")                                  # (and issue from it)
    for _, _, restart in processes:
        restart()
    time.sleep(1.0)
    done.set()
    t.join(timeout=60)
    assert not failures, failures[:3]
    assert calls > 10
    host, port = c.master_address.rsplit(":", 1)
    with pytest.raises(OSError):            # the old CA's client certificate: refused now
        connect(host, _frame_port(c), c.secret, 5.0, old_client)


def test_cv_cert_issue_makes_a_working_client_certificate(tls_cluster: LocalCluster, tmp_path: Path) -> None:
    r = cv("--config", str(tls_cluster.config_path), "cert", "issue", "alice", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "alice.key").stat().st_mode) == 0o600
    assert tlsmod.role_of_cert(tmp_path / "alice.pem") == "client"
    conf = config_with(tls_cluster, tmp_path, cert=f'"{tmp_path / "alice.pem"}"', key=f'"{tmp_path / "alice.key"}"')
    r = cv("--config", str(conf), "fs", "ls", "/")
    assert r.returncode == 0, r.stderr
    again = cv("--config", str(tls_cluster.config_path), "cert", "issue", "alice", "--out", str(tmp_path))
    assert again.returncode != 0 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    bad = cv("cert", "issue", "bob", "--ca", str(tmp_path / "nope.pem"), "--out", str(tmp_path))
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "not found" in bad.stderr, bad.stderr


def test_three_masters_over_tls_survive_the_leaders_loss(cluster_factory: typing.Any) -> None:
    """Clients and workers follow a new leader over TLS, and Raft's port itself speaks TLS
    and takes only masters' certificates (master/rafttls.py)."""
    c = cluster_factory(masters=3, tls=True)
    with Client(master=",".join(c.master_addresses), config=client_config(c)) as cl:
        cl.put_bytes("/ha-before", b"a" * 1000)
        leader = c.leader_index()
        raft = c.master_ports((leader + 1) % 3).raft
        _raft_port_takes_only_masters(c, c.master_ip(0), raft)
        c.kill_master(leader)
        cl.put_bytes("/ha-after", b"b" * 1000)
        assert cl.get_bytes("/ha-before") == b"a" * 1000 and cl.get_bytes("/ha-after") == b"b" * 1000
        assert [m for m in cl.masters() if m.role == "leader"]
    logs = "".join((c.dir / "logs" / f"master{i}.log").read_text() for i in range(3))
    assert logs.count("TLS on its port") >= 3
    assert "certificate is not a master's: refused" in logs


def _raft_port_takes_only_masters(c: LocalCluster, host: str, port: int) -> None:
    """A plain connection gets no Raft; a client certificate is cut after its handshake
    (TLS 1.3 tells the client at its first read); a master certificate is kept."""
    mine = load_config(path=str(c.config_path)).tls
    with socket.create_connection((host, port), timeout=5) as raw:
        raw.sendall(b"\x10\x00\x00\x00" + os.urandom(16))      # a PySyncObj frame, not TLS
        raw.settimeout(5)
        answer = raw.recv(100)
        assert answer == b"" or answer.startswith(b"\x15")  # the end (after a TLS alert, if any)
    for name, role, kept in [("client", "client", False), ("master0", "master", True)]:
        who = tlsmod.Tls(tlsmod.Material(Path(mine.ca), c.tls_dir / f"{name}.pem", c.tls_dir / f"{name}.key"), role)
        with socket.create_connection((host, port), timeout=5) as raw:
            s = who.connect(raw, "master")
            s.settimeout(1.0)
            if kept:
                with pytest.raises(TimeoutError):
                    s.recv(1)                                # waits for our first message
            else:
                with pytest.raises((ssl.SSLError, ConnectionError)):
                    assert s.recv(1) == b""
                    raise ConnectionError("closed")


def test_a_follower_far_behind_catches_up_by_snapshot_over_tls(cluster_factory: typing.Any) -> None:
    """A stopped follower misses more than a compacted log holds: the leader ships it the
    snapshot (pieces of 1 MiB, more than a socket takes at once) over the Raft port's TLS."""
    c = cluster_factory(masters=3, tls=True, extra_master_flags=["--master-snapshot-entries", "40"])
    with Client(master=",".join(c.master_addresses), config=client_config(c)) as cl:
        follower = (c.leader_index() + 1) % 3
        c.kill_master(follower)
        cl.mkdir("/snap", exist_ok=True)
        for i in range(300):
            cl.put_bytes(f"/snap/f{i:03d}", os.urandom(64))
        leader = c.leader_index()
        c.restart_master(follower)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ahead, behind = c.master_status(leader), c.master_status(follower)
            if ahead and behind and behind.applied_index >= ahead.commit_index > 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"follower at {behind} never caught up with {ahead}")
    log = (c.dir / "logs" / f"master{follower}.log").read_text()
    assert "installed the raft snapshot" in log, log[-2000:]
