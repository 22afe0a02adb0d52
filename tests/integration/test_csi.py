"""The CSI driver as kubelet and the external-provisioner drive it, for real.

``cv csi node`` and ``cv csi controller`` run as processes on Unix sockets in a temp dir
against a real local cluster, and are called with the stubs generated from
proto/csi.proto: real FUSE mount daemons, real bind mounts at two "pods'" target paths,
the driver SIGKILLed and restarted with volumes published.  Every test unmounts whatever
is left under its temp dir and kills every daemon it caused, also when it failed.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import grpc
import pytest
from pyfuse3_features import HAVE_PYFUSE3

from curvine_py.csi import DRIVER_NAME
from curvine_py.csi.controller import CAPACITY_XATTR
from curvine_py.common.mounttable import MountEntry, read_mounts
from curvine_py.csi.mounts import FUSE_TYPE
from curvine_py.cluster.local import LocalCluster, log_tail
from curvine_py.pb import csi_pb2 as csi
from curvine_py.pb import csi_pb2_grpc

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not HAVE_PYFUSE3, reason="pyfuse3 is not installed: no FUSE mount here"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse: no FUSE mount here"),
    pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root"),
]

CV = [sys.executable, "-m", "curvine_py.cli.main"]
RPC_TIMEOUT_S = 90.0
START_TIMEOUT_S = 30.0
MiB = 1 << 20
Code = grpc.StatusCode


def mount_capability(mode: int = csi.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER) -> csi.VolumeCapability:
    return csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(),
                                access_mode=csi.VolumeCapability.AccessMode(mode=mode))


def block_capability() -> csi.VolumeCapability:
    return csi.VolumeCapability(block=csi.VolumeCapability.BlockVolume(),
                                access_mode=csi.VolumeCapability.AccessMode(mode=1))


def mounts_under(root: Path) -> list[MountEntry]:
    prefix = str(root) + "/"
    return [m for m in read_mounts() if m.point.startswith(prefix)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_for(what: str, check: typing.Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


class Driver:
    """One `cv csi node|controller` process on a Unix socket under tmp, restartable."""

    def __init__(self, role: str, cluster: LocalCluster, tmp: Path) -> None:
        self.role = role
        self.cluster = cluster
        self.tmp = tmp
        self.socket = tmp / f"{role}.sock"
        self.state = tmp / "state"
        self.log = tmp / f"{role}.log"
        self.env = dict(os.environ, CURVINE_FUSE_METRICS_PORT="0")   # leave 9002 to the other tests
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> "Driver":
        cmd = [*CV, "csi", self.role, "--endpoint", f"unix://{self.socket}", "--master", self.cluster.master_address]
        if self.role == "node":
            cmd += ["--node-id", "test-node", "--state-dir", str(self.state)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                csi_pb2_grpc.IdentityStub(self.channel).Probe(csi.ProbeRequest(), timeout=2)
                return self
            except grpc.RpcError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"cv csi {self.role} did not start:\n{log_tail(self.log, 30)}") from None
                time.sleep(0.2)

    @property
    def identity(self) -> csi_pb2_grpc.IdentityStub:
        return csi_pb2_grpc.IdentityStub(self.channel)

    @property
    def node(self) -> csi_pb2_grpc.NodeStub:
        return csi_pb2_grpc.NodeStub(self.channel)

    @property
    def controller(self) -> csi_pb2_grpc.ControllerStub:
        return csi_pb2_grpc.ControllerStub(self.channel)

    def kill(self) -> None:
        """SIGKILL: no chance to clean anything up (a crashed or OOM-killed driver)."""
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def daemon_pids(self) -> list[int]:
        pids = []
        for f in (self.state / "run").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pids.append(int(f.read_text().split()[0]))
        return [p for p in pids if pid_alive(p)]

    def publish(self, volume: str, target: Path, readonly: bool = False,
                cap: csi.VolumeCapability | None = None) -> None:
        self.node.NodePublishVolume(csi.NodePublishVolumeRequest(
            volume_id=volume, target_path=str(target), readonly=readonly,
            volume_capability=cap or mount_capability()), timeout=RPC_TIMEOUT_S)

    def unpublish(self, volume: str, target: Path) -> None:
        self.node.NodeUnpublishVolume(csi.NodeUnpublishVolumeRequest(volume_id=volume, target_path=str(target)),
                                      timeout=RPC_TIMEOUT_S)


def cleanup(tmp: Path, drivers: list[Driver]) -> None:
    """Whatever a test left: binds first, then staging mounts (detached, connection aborted
    if hung), then the daemons killed.  Never raises."""
    pids = [p for d in drivers for p in d.daemon_pids()]
    for d in drivers:
        with contextlib.suppress(Exception):
            d.kill()
    for m in mounts_under(tmp):   # a hung daemon would block the unmounts: fail its requests
        if m.fstype == FUSE_TYPE:
            with contextlib.suppress(OSError):
                Path(f"/sys/fs/fuse/connections/{m.dev.split(':')[1]}/abort").write_text("1")
    for m in sorted(mounts_under(tmp), key=lambda m: m.mount_id, reverse=True):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["umount", "-l", m.point], capture_output=True, timeout=10)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def drivers(shared_cluster: LocalCluster, tmp_path: Path) -> typing.Iterator[typing.Callable[[str], Driver]]:
    """Start drivers: ``drivers("node")``, ``drivers("controller")``; all cleaned up after."""
    started: list[Driver] = []

    def make(role: str) -> Driver:
        d = Driver(role, shared_cluster, tmp_path)
        started.append(d)
        return d.start()

    try:
        yield make
    finally:
        failed = False
        for d in started:
            if d.proc is not None and d.proc.poll() is not None and d.proc.returncode not in (0, -9):
                failed = True
        cleanup(tmp_path, started)
        assert mounts_under(tmp_path) == [], "mounts left behind"
        assert not failed, "a driver exited with an error:\n" + "\n".join(log_tail(d.log, 30) for d in started)


@pytest.fixture
def volume(client: "Client", request: pytest.FixtureRequest) -> str:
    name = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:60]
    path = f"/csi-test/{name}-{os.urandom(3).hex()}"
    client.mkdir(path, parents=True)
    return path


def status_of(call: typing.Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code()  # type: ignore[no-any-return]


# ---------------------------------------------------------------- node

def test_identity_and_node_info(drivers: typing.Callable[[str], Driver]) -> None:
    d = drivers("node")
    info = d.identity.GetPluginInfo(csi.GetPluginInfoRequest(), timeout=10)
    assert info.name == DRIVER_NAME and info.vendor_version
    assert d.identity.Probe(csi.ProbeRequest(), timeout=10).ready.value
    caps = d.identity.GetPluginCapabilities(csi.GetPluginCapabilitiesRequest(), timeout=10).capabilities
    assert [c.service.type for c in caps] == [csi.PluginCapability.Service.CONTROLLER_SERVICE]
    assert d.node.NodeGetInfo(csi.NodeGetInfoRequest(), timeout=10).node_id == "test-node"
    ncaps = d.node.NodeGetCapabilities(csi.NodeGetCapabilitiesRequest(), timeout=10).capabilities
    assert [c.rpc.type for c in ncaps] == [csi.NodeServiceCapability.RPC.GET_VOLUME_STATS]
    # A service this server does not serve answers UNIMPLEMENTED (the spec's "not offered").
    assert status_of(lambda: d.controller.ControllerGetCapabilities(
        csi.ControllerGetCapabilitiesRequest(), timeout=10)) == Code.UNIMPLEMENTED


def test_cli_errors_are_one_line(drivers: typing.Callable[[str], Driver], tmp_path: Path) -> None:
    d = drivers("node")

    def cv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CV, "csi", *args], env=d.env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    bad = cv("node", "--endpoint", "localhost:1234")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--endpoint" in bad.stderr, bad.stderr
    taken = cv("node", "--endpoint", f"unix://{d.socket}", "--state-dir", str(tmp_path / "state2"))
    assert taken.returncode == 1 and taken.stderr.strip().endswith("another server is listening on it"), taken.stderr
    assert taken.stderr.count("\n") == 1, taken.stderr
    assert d.identity.Probe(csi.ProbeRequest(), timeout=10).ready.value   # the first one still serves


def test_two_pods_share_one_daemon(drivers: typing.Callable[[str], Driver], client: "Client", volume: str,
                                   tmp_path: Path) -> None:
    d = drivers("node")
    client.put_bytes(f"{volume}/before", b"in the pool first")
    pod_a, pod_b = tmp_path / "pods/a/vol", tmp_path / "pods/b/vol"
    pod_a.parent.mkdir(parents=True)
    pod_b.parent.mkdir(parents=True)
    d.publish(volume, pod_a)
    d.publish(volume, pod_b)
    # One daemon, its staging mount, two binds of it: one device number.
    [daemon] = d.daemon_pids()
    ours = mounts_under(tmp_path)
    assert len(ours) == 3 and len({m.dev for m in ours}) == 1 and {m.fstype for m in ours} == {FUSE_TYPE}
    # The volume's directory is the mount's root, in both pods.
    assert (pod_a / "before").read_bytes() == b"in the pool first"
    payload = os.urandom(3 * MiB + 17)
    (pod_a / "kv.data").write_bytes(payload)
    assert (pod_b / "kv.data").read_bytes() == payload
    assert client.get_bytes(f"{volume}/kv.data") == payload
    assert sorted(os.listdir(pod_b)) == ["before", "kv.data"]
    # Idempotent: the same publish again is OK; the same target read-only is ALREADY_EXISTS.
    d.publish(volume, pod_a)
    assert status_of(lambda: d.publish(volume, pod_a, readonly=True)) == Code.ALREADY_EXISTS
    assert len(mounts_under(tmp_path)) == 3
    stats = d.node.NodeGetVolumeStats(csi.NodeGetVolumeStatsRequest(volume_id=volume, volume_path=str(pod_a)),
                                      timeout=30)
    units = {u.unit: u for u in stats.usage}
    assert units[csi.VolumeUsage.BYTES].total > 0 and not stats.volume_condition.abnormal
    # The first pod leaves: its target goes, the daemon stays for the second.
    d.unpublish(volume, pod_a)
    assert not pod_a.exists() and pid_alive(daemon)
    assert (pod_b / "kv.data").read_bytes() == payload
    # The last one leaves: the daemon is unmounted (flushed) and exits.
    d.unpublish(volume, pod_b)
    assert not pod_b.exists()
    wait_for("the mount daemon to exit", lambda: not pid_alive(daemon))
    assert mounts_under(tmp_path) == []
    assert list((tmp_path / "state/mounts").iterdir()) == []
    # Unpublishing what is not mounted (a retry, or never published) is OK.
    d.unpublish(volume, pod_b)
    d.unpublish(volume, tmp_path / "pods/never")


def test_concurrent_publishes_share_one_daemon(drivers: typing.Callable[[str], Driver], volume: str,
                                               tmp_path: Path) -> None:
    """kubelet publishes for several pods at once: one daemon is started, not one per pod."""
    from concurrent.futures import ThreadPoolExecutor
    d = drivers("node")
    targets = [tmp_path / f"pod{i}" for i in range(4)]
    with ThreadPoolExecutor(len(targets)) as pool:
        list(pool.map(lambda t: d.publish(volume, t), targets))
    [daemon] = d.daemon_pids()
    assert len(mounts_under(tmp_path)) == 1 + len(targets)
    with ThreadPoolExecutor(len(targets)) as pool:
        list(pool.map(lambda t: d.unpublish(volume, t), targets))
    wait_for("the mount daemon to exit", lambda: not pid_alive(daemon))
    assert mounts_under(tmp_path) == [] and not any(t.exists() for t in targets)


def test_readonly_publish(drivers: typing.Callable[[str], Driver], client: "Client", volume: str,
                          tmp_path: Path) -> None:
    d = drivers("node")
    client.put_bytes(f"{volume}/model.bin", b"weights")
    ro, rox, rw = tmp_path / "ro", tmp_path / "rox", tmp_path / "rw"
    d.publish(volume, ro, readonly=True)
    d.publish(volume, rox, cap=mount_capability(csi.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY))
    d.publish(volume, rw)
    for target in (ro, rox):
        assert (target / "model.bin").read_bytes() == b"weights"
        with pytest.raises(OSError) as e:
            (target / "new").write_bytes(b"x")
        assert e.value.errno == 30   # EROFS: the bind is read-only
    (rw / "new").write_bytes(b"x")   # the same daemon, writable through the read-write bind
    assert (ro / "new").read_bytes() == b"x"
    for target in (ro, rox, rw):
        d.unpublish(volume, target)
    assert mounts_under(tmp_path) == []


def test_target_below_a_symlink(drivers: typing.Callable[[str], Driver], volume: str, tmp_path: Path) -> None:
    """kubelet's dir reached through a symlink: the mount table shows the real path."""
    d = drivers("node")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    target = tmp_path / "link/pod"
    d.publish(volume, target)
    d.publish(volume, target)   # found again: idempotent
    assert [m.point for m in mounts_under(tmp_path / "real")] == [str(tmp_path / "real/pod")]
    d.unpublish(volume, target)
    assert not (tmp_path / "real/pod").exists() and mounts_under(tmp_path) == []


def test_driver_killed_and_restarted(drivers: typing.Callable[[str], Driver], client: "Client", volume: str,
                                     tmp_path: Path) -> None:
    d = drivers("node")
    pod_a, pod_b = tmp_path / "a", tmp_path / "b"
    d.publish(volume, pod_a)
    d.publish(volume, pod_b)
    (pod_a / "x").write_bytes(b"written before the crash")
    [daemon] = d.daemon_pids()
    before = {(m.point, m.dev) for m in mounts_under(tmp_path)}
    d.kill()
    # Pods keep their volumes with no driver at all: the daemon was never its child.
    assert pid_alive(daemon)
    assert (pod_b / "x").read_bytes() == b"written before the crash"
    (pod_b / "y").write_bytes(b"written while no driver ran")
    d.start()   # finds the mounts in the mount table and leaves them alone
    assert {(m.point, m.dev) for m in mounts_under(tmp_path)} == before and pid_alive(daemon)
    d.publish(volume, pod_a)   # kubelet retrying a publish it lost track of: OK, nothing new
    assert d.daemon_pids() == [daemon] and len(mounts_under(tmp_path)) == 3
    d.unpublish(volume, pod_a)
    assert pid_alive(daemon) and (pod_b / "y").read_bytes() == b"written while no driver ran"
    d.unpublish(volume, pod_b)
    wait_for("the mount daemon to exit", lambda: not pid_alive(daemon))
    assert mounts_under(tmp_path) == []
    assert client.get_bytes(f"{volume}/y") == b"written while no driver ran"


def test_restart_stops_an_unused_daemon(drivers: typing.Callable[[str], Driver], volume: str,
                                        tmp_path: Path) -> None:
    """A driver killed between a target's unmount and its daemon's (or a bind removed by
    hand): the next start finds a staging mount with no bind and stops its daemon."""
    d = drivers("node")
    target = tmp_path / "t"
    d.publish(volume, target)
    [daemon] = d.daemon_pids()
    d.kill()
    subprocess.run(["umount", str(target)], check=True, timeout=30)
    d.start()
    wait_for("the unused daemon to exit", lambda: not pid_alive(daemon))
    assert mounts_under(tmp_path) == []
    d.unpublish(volume, target)   # kubelet's retry: the target is not mounted, its dir goes
    assert not target.exists()


def test_bad_node_requests(drivers: typing.Callable[[str], Driver], volume: str, tmp_path: Path) -> None:
    d = drivers("node")
    target = tmp_path / "t"
    assert status_of(lambda: d.publish("", target)) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.publish("models/kv", target)) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.node.NodePublishVolume(csi.NodePublishVolumeRequest(
        volume_id=volume, target_path="relative/target", volume_capability=mount_capability()),
        timeout=RPC_TIMEOUT_S)) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.node.NodePublishVolume(csi.NodePublishVolumeRequest(
        volume_id=volume, target_path=str(target)), timeout=RPC_TIMEOUT_S)) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.publish(volume, target, cap=block_capability())) == Code.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        d.publish(f"{volume}/missing", target)
    assert e.value.code() == Code.NOT_FOUND and f"{volume}/missing" in (e.value.details() or "")
    assert status_of(lambda: d.unpublish("", target)) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.node.NodeUnpublishVolume(csi.NodeUnpublishVolumeRequest(
        volume_id=volume, target_path="relative"), timeout=RPC_TIMEOUT_S)) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.node.NodeGetVolumeStats(csi.NodeGetVolumeStatsRequest(
        volume_id=volume, volume_path=str(target)), timeout=30)) == Code.NOT_FOUND
    assert mounts_under(tmp_path) == [] and not target.exists()


# ---------------------------------------------------------------- controller

def create(d: Driver, name: str, capacity: int = 0, **params: str) -> csi.CreateVolumeResponse:
    return d.controller.CreateVolume(csi.CreateVolumeRequest(
        name=name, capacity_range=csi.CapacityRange(required_bytes=capacity), parameters=params,
        volume_capabilities=[mount_capability()]), timeout=RPC_TIMEOUT_S)


def test_controller_create_delete_idempotent(drivers: typing.Callable[[str], Driver], client: "Client") -> None:
    d = drivers("controller")
    caps = d.controller.ControllerGetCapabilities(csi.ControllerGetCapabilitiesRequest(), timeout=10).capabilities
    assert [c.rpc.type for c in caps] == [csi.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME]
    base = f"/csi-test/ctl-{os.urandom(3).hex()}"
    name = "pvc-0a1b2c"
    v = create(d, name, 1 << 30, baseDir=base, blockSize="16MiB").volume
    assert v.volume_id == f"{base}/{name}" and v.capacity_bytes == 1 << 30
    st = client.stat(v.volume_id)
    assert st.is_dir and st.block_size == 16 * MiB
    assert client.getxattr(v.volume_id, CAPACITY_XATTR) == str(1 << 30).encode()
    client.mkdir(f"{v.volume_id}/sub")
    client.put_bytes(f"{v.volume_id}/sub/chunk", b"kv")
    # The same name and parameters: the same volume, untouched.
    again = create(d, name, 1 << 30, baseDir=base, blockSize="16MiB").volume
    assert (again.volume_id, again.capacity_bytes) == (v.volume_id, v.capacity_bytes)
    assert client.get_bytes(f"{v.volume_id}/sub/chunk") == b"kv"
    # Incompatible: a larger capacity, another block size.
    assert status_of(lambda: create(d, name, 2 << 30, baseDir=base)) == Code.ALREADY_EXISTS
    assert status_of(lambda: create(d, name, 1 << 30, baseDir=base, blockSize="4MiB")) == Code.ALREADY_EXISTS
    # ValidateVolumeCapabilities: a filesystem is confirmed, a block device is not.
    ok = d.controller.ValidateVolumeCapabilities(csi.ValidateVolumeCapabilitiesRequest(
        volume_id=v.volume_id, volume_capabilities=[mount_capability()]), timeout=30)
    assert len(ok.confirmed.volume_capabilities) == 1
    no = d.controller.ValidateVolumeCapabilities(csi.ValidateVolumeCapabilitiesRequest(
        volume_id=v.volume_id, volume_capabilities=[block_capability()]), timeout=30)
    assert not no.HasField("confirmed") and "block" in no.message
    # DeleteVolume removes the tree; again (a retry) is OK.
    d.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id=v.volume_id), timeout=RPC_TIMEOUT_S)
    assert not client.exists(v.volume_id)
    d.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id=v.volume_id), timeout=RPC_TIMEOUT_S)
    assert status_of(lambda: d.controller.ValidateVolumeCapabilities(csi.ValidateVolumeCapabilitiesRequest(
        volume_id=v.volume_id, volume_capabilities=[mount_capability()]), timeout=30)) == Code.NOT_FOUND


def test_controller_bad_requests(drivers: typing.Callable[[str], Driver], client: "Client", volume: str,
                                 shared_cluster: LocalCluster) -> None:
    d = drivers("controller")
    assert status_of(lambda: create(d, "")) == Code.INVALID_ARGUMENT
    assert status_of(lambda: create(d, "a/b")) == Code.INVALID_ARGUMENT
    assert status_of(lambda: create(d, "pvc-x", unknownKey="1")) == Code.INVALID_ARGUMENT
    assert status_of(lambda: create(d, "pvc-x", blockSize="lots")) == Code.INVALID_ARGUMENT
    assert status_of(lambda: create(d, "pvc-x", baseDir="relative")) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.controller.CreateVolume(csi.CreateVolumeRequest(name="pvc-x"),
                                                       timeout=30)) == Code.INVALID_ARGUMENT
    assert status_of(lambda: d.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id=""),
                                                       timeout=30)) == Code.INVALID_ARGUMENT
    # A directory CreateVolume did not make (a static volume's data) is never deleted.
    client.put_bytes(f"{volume}/keep", b"data")
    assert status_of(lambda: d.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id=volume),
                                                       timeout=30)) == Code.FAILED_PRECONDITION
    assert client.get_bytes(f"{volume}/keep") == b"data"
    # The request's secrets name the cluster: a wrong secret is refused by the master.
    wrong = csi.CreateVolumeRequest(name="pvc-y", volume_capabilities=[mount_capability()],
                                    secrets={"master": shared_cluster.master_address, "secret": "wrong"})
    assert status_of(lambda: d.controller.CreateVolume(wrong, timeout=60)) == Code.PERMISSION_DENIED


def test_created_volume_publishes(drivers: typing.Callable[[str], Driver], client: "Client",
                                  tmp_path: Path) -> None:
    """What CreateVolume returns is what NodePublishVolume takes (dynamic provisioning)."""
    ctl = drivers("controller")
    v = create(ctl, f"pvc-{os.urandom(3).hex()}", 64 * MiB, baseDir="/csi-test/dyn").volume
    node = drivers("node")
    target = tmp_path / "pod"
    node.publish(v.volume_id, target)
    (target / "f").write_bytes(b"dynamic")
    node.unpublish(v.volume_id, target)
    assert client.get_bytes(f"{v.volume_id}/f") == b"dynamic"
    ctl.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id=v.volume_id), timeout=RPC_TIMEOUT_S)


# ---------------------------------------------------------------- cv mount --subdir

def test_mount_subdir(shared_cluster: LocalCluster, client: "Client", volume: str, tmp_path: Path) -> None:
    env = dict(os.environ, CURVINE_RUN_DIR=str(tmp_path / "run"), CURVINE_FUSE_METRICS_PORT="0")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    client.mkdir(f"{volume}/a")
    client.put_bytes(f"{volume}/a/file", b"below the subdir")
    client.put_bytes(f"{os.path.dirname(volume)}/outside-{os.urandom(2).hex()}", b"not visible")

    def cv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CV, *args, "--master", shared_cluster.master_address], env=env,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    missing = cv("mount", str(mnt), "--subdir", f"{volume}/missing")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr
    assert f"--subdir {volume}/missing" in missing.stderr and "No such file" in missing.stderr
    afile = cv("mount", str(mnt), "--subdir", f"{volume}/a/file")
    assert afile.returncode == 1 and "Not a directory" in afile.stderr, afile.stderr
    assert not mounts_under(tmp_path)
    try:
        r = cv("mount", str(mnt), "--subdir", volume)
        assert r.returncode == 0, r.stderr
        assert sorted(os.listdir(mnt)) == ["a"]
        assert (mnt / "a/file").read_bytes() == b"below the subdir"
        (mnt / "b").mkdir()
        (mnt / "b/new").write_bytes(b"made at the root")
        os.rename(mnt / "b/new", mnt / "moved")
        os.chmod(mnt, 0o750)
        assert client.get_bytes(f"{volume}/moved") == b"made at the root"
        assert client.stat(volume).mode & 0o777 == 0o750
        assert sorted(os.listdir(mnt)) == ["a", "b", "moved"]
        os.unlink(mnt / "moved")
        os.rmdir(mnt / "b")
        assert sorted(client.listdir(volume)) == ["a"]
    finally:
        r = cv("umount", str(mnt))
        if mounts_under(tmp_path):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)
    assert r.returncode == 0, r.stderr
