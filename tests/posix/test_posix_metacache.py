"""The mount's metadata cache (fuse.metadata_cache, issue 39): names and attributes kept
in the mount under the master's leases, invalidated by its pushes before the change's
caller gets its answer.

Both mounts run with the kernel's own caches off (entry and attribute timeouts 0), so
every stat reaches the mount and is answered by its cache or by the master: whatever
one mount (or an SDK client) changes must show in the other at once, not within a
timeout.  The last test restarts the master under a mount that caches a name.
"""
from __future__ import annotations

import os
import posixpath
import re
import stat
import urllib.request
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from curvine_py.cluster.local import LocalCluster
from curvine_py.sdk import Client
from tests.conftest import client_config, start_cluster, wait_until
from tests.posix.conftest import Mount, errno_of, run_as_user, start_mount

MOUNT_FLAGS = ("--fuse-attr-timeout-s", "0", "--fuse-entry-timeout-s", "0")


def cache_counts(m: Mount) -> dict[str, float]:
    """The mount's curvine_client_metadata_cache_total by result, and its sessions."""
    address = os.getxattr(m.path, "user.curvine.metrics").decode()
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out = {k: float(v) for k, v in re.findall(r'curvine_client_metadata_cache_total\{result="(\w+)"\} (\S+)', text)}
    sessions = re.search(r"^curvine_client_metadata_cache_sessions (\S+)$", text, re.M)
    out["sessions"] = float(sessions.group(1)) if sessions else 0.0
    return out


@pytest.fixture(scope="module")
def sdk(posix_cluster: LocalCluster) -> Client:
    with Client(master=posix_cluster.master_address, config=client_config(posix_cluster)) as c:
        yield c


def test_what_a_mount_caches_changes_there_before_the_change_returns(mounted: Mount, second_mount: Mount,
                                                                     sdk: Client) -> None:
    a, b = mounted.path / "shared", second_mount.path / "shared"
    a.mkdir()
    wait_until("the session of b", lambda: cache_counts(second_mount)["sessions"] >= 1, timeout=10)
    (a / "x").write_bytes(b"1")
    assert (b / "x").stat().st_size == 1          # b asks the master, and may keep the answer
    before = cache_counts(second_mount)
    for _ in range(20):
        assert (b / "x").stat().st_size == 1
    assert cache_counts(second_mount)["hit"] >= before.get("hit", 0) + 20, "b's stats did not come from its cache"

    os.chmod(a / "x", 0o600)
    assert stat.S_IMODE((b / "x").stat().st_mode) == 0o600
    (a / "x").write_bytes(b"22")
    assert (b / "x").stat().st_size == 2
    os.rename(a / "x", a / "y")
    assert not (b / "x").exists() and (b / "y").stat().st_size == 2
    assert not (b / "z").exists() and not (b / "z").exists()   # a negative entry, from the cache the second time
    (a / "z").write_bytes(b"")
    assert (b / "z").exists()
    sdk.remove("/shared/y")                        # a writer without a session
    assert not (b / "y").exists()
    (b / "w").write_bytes(b"333")                  # b's own change, cached by b on its create
    assert (b / "w").stat().st_size == 3 and (a / "w").stat().st_size == 3
    os.unlink(b / "w")
    assert not (b / "w").exists() and not (a / "w").exists()


def test_a_cached_lookup_still_checks_the_callers_permission(mounted: Mount, second_mount: Mount) -> None:
    a, b = mounted.path / "private", second_mount.path / "private"
    a.mkdir(mode=0o700)
    (a / "f").write_bytes(b"secret")
    assert (b / "f").exists() and (b / "f").exists()   # root: granted, then from the cache
    size = run_as_user(lambda p: os.stat(p).st_size, "private/f", cwd=second_mount.path)
    assert errno_of(size) == 13   # EACCES: the directory is 0700 root's
    os.chmod(a, 0o755)
    assert run_as_user(lambda p: os.stat(p).st_size, "private/f", cwd=second_mount.path) == 6


def test_a_listing_a_mount_holds_learns_every_name_made_elsewhere(mounted: Mount, second_mount: Mount,
                                                                   sdk: Client) -> None:
    """A directory made through b is listed whole in b's cache (it was empty): b answers a
    missing name there itself, keeps the listing through its own creates and renames, and
    loses it to anyone else's change, before that change returns."""
    from tests.posix.test_posix_namespace import RENAME_EXCHANGE, renameat2
    b = second_mount.path / "complete"
    b.mkdir()
    (b / "own").write_bytes(b"1")
    before = cache_counts(second_mount)
    assert not (b / "n1").exists()
    assert cache_counts(second_mount)["hit"] > before["hit"], "a missing name in b's own directory cost a call"
    (mounted.path / "complete" / "n1").write_bytes(b"22")
    assert (b / "n1").stat().st_size == 2
    os.rename(b / "own", b / "own2")
    assert not (b / "own").exists() and (b / "own2").stat().st_size == 1
    sdk.rename("/complete/n1", "/complete/n2")
    assert not (b / "n1").exists() and (b / "n2").stat().st_size == 2
    renameat2(b / "own2", b / "n2", RENAME_EXCHANGE)   # two names change at once
    assert (b / "own2").stat().st_size == 2 and (b / "n2").stat().st_size == 1
    os.unlink(b / "own2")
    assert not (b / "own2").exists() and (b / "n2").exists()
    (b / "sub").mkdir()                                  # a directory in a listed one
    assert not (b / "sub" / "x").exists() and not (mounted.path / "complete" / "sub" / "x").exists()
    (mounted.path / "complete" / "sub" / "x").write_bytes(b"")
    assert (b / "sub" / "x").exists()


def _machine(a: Mount, b: Mount, sdk: Client) -> None:
    """Random namespace ops through two mounts and an SDK client against a model
    (path -> size, None for a directory).  With the kernel's caches off, every mount
    must show every change as soon as it returned, whoever made it."""
    names = st.sampled_from(["p", "q", "r"])

    class Namespace(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.root = f"model-{os.urandom(4).hex()}"
            (a.path / self.root).mkdir()
            self.model: dict[str, int | None] = {self.root: None}

        def dirs(self) -> list[str]:
            return sorted(p for p, v in self.model.items() if v is None)

        def where(self, data: st.DataObject, name: str) -> str:
            return posixpath.join(data.draw(st.sampled_from(self.dirs())), name)

        def via(self, data: st.DataObject) -> Path:
            return data.draw(st.sampled_from([a.path, b.path]))

        @rule(data=st.data(), name=names, size=st.sampled_from([0, 3, 5000]))
        def write(self, data: st.DataObject, name: str, size: int) -> None:
            path = self.where(data, name)
            if self.model.get(path, 0) is None:
                return
            if data.draw(st.booleans()):
                (self.via(data) / path).write_bytes(b"x" * size)
            else:
                sdk.put_bytes("/" + path, b"x" * size)
            self.model[path] = size

        @rule(data=st.data(), name=names)
        def mkdir(self, data: st.DataObject, name: str) -> None:
            path = self.where(data, name)
            if path in self.model:
                return
            (self.via(data) / path).mkdir()
            self.model[path] = None

        @precondition(lambda self: len(self.model) > 1)
        @rule(data=st.data())
        def remove(self, data: st.DataObject) -> None:
            path = data.draw(st.sampled_from(sorted(self.model)[1:]))
            if self.model[path] is not None:
                os.unlink(self.via(data) / path)
            elif any(p.startswith(path + "/") for p in self.model):
                return
            else:
                os.rmdir(self.via(data) / path)
            del self.model[path]

        @precondition(lambda self: len(self.model) > 1)
        @rule(data=st.data(), name=names)
        def rename(self, data: st.DataObject, name: str) -> None:
            src = data.draw(st.sampled_from(sorted(self.model)[1:]))
            dst = self.where(data, name)
            if src == dst or dst.startswith(src + "/") or dst in self.model:
                return
            if data.draw(st.booleans()):
                mount = self.via(data)
                os.rename(mount / src, mount / dst)
            else:
                sdk.rename("/" + src, "/" + dst)
            moved = {p: v for p, v in self.model.items() if p == src or p.startswith(src + "/")}
            for p in moved:
                del self.model[p]
            for p, v in moved.items():
                self.model[dst + p[len(src):]] = v

        @invariant()
        def both_mounts_agree_with_the_model(self) -> None:
            candidates = {posixpath.join(d, n) for d in self.dirs() for n in ("p", "q", "r")}
            for mount in (a.path, b.path):
                for path in sorted(candidates | set(self.model)):
                    want = self.model.get(path, -1)
                    try:
                        st_ = os.lstat(mount / path)
                    except FileNotFoundError:
                        assert want == -1, f"{path} missing through {mount}"
                        continue
                    assert want != -1, f"{path} still there through {mount}"
                    assert (want is None) == stat.S_ISDIR(st_.st_mode), path
                    assert want is None or st_.st_size == want, (path, st_.st_size, want)
                for d in self.dirs():   # (a listing looks ".." up: never from the cache)
                    names = sorted(posixpath.basename(p) for p in self.model if posixpath.dirname(p) == d)
                    assert sorted(os.listdir(mount / d)) == names, d

    Namespace.TestCase.settings = settings(max_examples=8, stateful_step_count=25, deadline=None,
                                           suppress_health_check=list(HealthCheck))
    Namespace.TestCase().runTest()


def test_random_changes_through_two_mounts_and_a_client_show_everywhere_at_once(
        mounted: Mount, second_mount: Mount, sdk: Client) -> None:
    _machine(mounted, second_mount, sdk)


def test_a_restarted_master_leaves_no_stale_name_in_a_mount(posix_cluster: LocalCluster, mounted: Mount,
                                                            second_mount: Mount) -> None:
    """b caches a name; the master is killed and started again, and the name is removed
    through a fresh SDK client: b's stream broke with the master, so it drops its cache,
    and the restarted master answers no mutation before the old leases ran out."""
    b = second_mount.path / "restart"
    (mounted.path / "restart").mkdir()
    (mounted.path / "restart" / "x").write_bytes(b"1")
    assert (b / "x").exists() and (b / "x").exists()
    sessions = cache_counts(second_mount)["sessions"]
    posix_cluster.kill_master()
    posix_cluster.restart_master()
    with Client(master=posix_cluster.master_address, config=client_config(posix_cluster)) as c:
        c.remove("/restart/x")
    assert not (b / "x").exists()
    wait_until("b's new session", lambda: cache_counts(second_mount)["sessions"] > sessions, timeout=20)
    (mounted.path / "restart" / "y").write_bytes(b"")
    assert (b / "y").exists()
    Path(mounted.path / "restart" / "y").unlink()
    assert not (b / "y").exists()


def test_a_leader_change_ends_every_session_and_the_mount_opens_one_with_the_new_leader(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Three masters: the leader is killed under a mount that caches a name; the name is
    removed through the new leader, which answers no mutation before the old leases ran
    out; the mount drops its cache and opens a session with the new leader."""
    base = tmp_path_factory.mktemp("trio")
    c = start_cluster(base / "cluster", masters=3)
    try:
        m = start_mount(c, base / "mnt", base / "run", base / "mnt.log", MOUNT_FLAGS)
        try:
            (m.path / "x").write_bytes(b"1")
            assert (m.path / "x").exists() and (m.path / "x").exists()
            sessions = cache_counts(m)["sessions"]
            c.kill_master(c.leader_index())
            c.leader_index(timeout=15)
            with Client(master=c.master_address, config=client_config(c)) as sdk_client:
                sdk_client.remove("/x")
                assert not (m.path / "x").exists()
                wait_until("a session with the new leader", lambda: cache_counts(m)["sessions"] > sessions, 20)
                sdk_client.put_bytes("/y", b"22")
                assert (m.path / "y").stat().st_size == 2
        finally:
            m.stop()
    finally:
        c.stop()


def master_calls(cluster: LocalCluster, method: str) -> float:
    """How many calls of method the master has answered (its /metrics)."""
    address = cluster.masters[0].metrics
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    found = re.search(rf'curvine_master_rpc_duration_seconds_count\{{method="{method}"[^}}]*\}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


# A valid VFS_CAP_REVISION_2 value (cap_net_bind_service permitted): the kernel checks the form
CAP_NET_BIND = bytes.fromhex("01000002" "00040000" "00000000" "00000000" "00000000")


def _write_as_user(path: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, b"y")
    finally:
        os.close(fd)


def test_a_capability_is_asked_once_per_inode_and_a_write_still_drops_it(posix_cluster: LocalCluster,
                                                                          mounted: Mount, sdk: Client) -> None:
    """The kernel asks for security.capability before every write(2): the mount asks the
    master once while the file is open here.  A capability set by another client is seen
    at the next open (close-to-open, as the bytes), so an unprivileged writer's write
    finds it and drops it (the kernel's killpriv)."""
    d = mounted.path / "caps"
    d.mkdir()
    f = d / "tool"
    f.write_bytes(b"")
    os.chmod(f, 0o666)
    before = master_calls(posix_cluster, "GetXattr")
    fd = os.open(f, os.O_WRONLY)
    try:
        for _ in range(50):
            os.write(fd, b"x" * 4096)
    finally:
        os.close(fd)
    assert master_calls(posix_cluster, "GetXattr") - before <= 2, "the capability was asked per write"
    sdk.setxattr("/caps/tool", "security.capability", CAP_NET_BIND)
    assert os.getxattr(f, "security.capability") == CAP_NET_BIND
    assert run_as_user(_write_as_user, "caps/tool", cwd=mounted.path) is None
    assert errno_of(run_as_user(os.getxattr, "caps/tool", "security.capability", cwd=mounted.path)) == 61  # ENODATA
    assert f.stat().st_size == 50 * 4096
