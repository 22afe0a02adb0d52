"""The mount daemon's own entry points: ``curvine_py.fuse.main`` main() and umount().

(``cv mount``/``cv umount`` are the CLI's tests.)  Every daemon started here runs with
CURVINE_RUN_DIR in a temporary directory, and every mountpoint is detached at the end
of its test whatever happened.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import pytest

from curvine_py.common.mounttable import is_mounted
from curvine_py.cluster.local import LocalCluster

pytestmark = pytest.mark.timeout(120)

PY = sys.executable
UMOUNT = "import sys; from curvine_py.fuse.main import umount; sys.exit(umount(sys.argv[1]))"


def stat_in_thread(path: Path) -> tuple[threading.Thread, list[BaseException | None]]:
    """A thread (not started) that stats path, a new name no cache can answer (the daemon
    asks the master), and the list its outcome lands in: None, or the OSError."""
    outcome: list[BaseException | None] = []

    def stat_it() -> None:
        try:
            os.stat(path)
            outcome.append(None)
        except OSError as e:
            outcome.append(e)
    return threading.Thread(target=stat_it, daemon=True), outcome


class Daemons:
    """Mounts started by a test; all unmounted (and their daemons killed) at teardown."""

    def __init__(self, cluster: LocalCluster, tmp: Path) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.run_dir = tmp / "run"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CURVINE_")}
        self.env["CURVINE_RUN_DIR"] = str(self.run_dir)
        # and they run in tmp: from the checkout, a ./.curvine/curvine.toml that `make run`
        # left (its cluster's TLS and secret) would be their default config
        if cluster.secret:   # the daemons talk to a cluster that checks its secret
            self.env["CURVINE_CLUSTER_SECRET"] = cluster.secret
        self.mountpoints: list[Path] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def mountpoint(self, name: str = "mnt") -> Path:
        p = self.tmp / name
        p.mkdir()
        self.mountpoints.append(p)
        return p

    def run_main(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """python -m curvine_py.fuse.main ARGS (daemonizing unless --foreground)."""
        return subprocess.run([PY, "-m", "curvine_py.fuse.main", *args], env=self.env, cwd=self.tmp,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def mount(self, mnt: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.run_main(str(mnt), "--master", self.cluster.master_address, *extra)

    def foreground(self, mnt: Path, *extra: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{mnt.name}.fg.log", "ab")
        p = subprocess.Popen([PY, "-m", "curvine_py.fuse.main", str(mnt), "--master", self.cluster.master_address,
                              "--foreground", *extra], env=self.env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        self.procs.append(p)
        deadline = time.monotonic() + 30
        while not is_mounted(str(mnt)):
            assert p.poll() is None, f"foreground mount exited {p.returncode}"
            assert time.monotonic() < deadline, "foreground mount did not appear"
            time.sleep(0.02)
        return p

    def umount(self, mnt: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-c", UMOUNT, str(mnt)], env=self.env, cwd=self.tmp, capture_output=True, text=True,
                              timeout=timeout)

    def paths(self, mnt: Path) -> tuple[Path, Path]:
        """(pid file, log file) the daemon uses for mnt."""
        key = os.path.realpath(mnt).strip("/").replace("/", "_")
        return self.run_dir / f"mount-{key}.pid", self.run_dir / f"mount-{key}.log"

    def pid(self, mnt: Path) -> int:
        return int(self.paths(mnt)[0].read_text().split()[0])

    def cleanup(self) -> None:
        for mnt in self.mountpoints:
            pid_file = self.paths(mnt)[0]
            try:
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for mnt in self.mountpoints:
            if is_mounted(str(mnt)):
                subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=10)


@pytest.fixture
def daemons(posix_cluster: LocalCluster, tmp_path: Path) -> typing.Iterator[Daemons]:
    ds = Daemons(posix_cluster, tmp_path)
    try:
        yield ds
    finally:
        ds.cleanup()


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(cond: typing.Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_daemonize_writes_pid_and_log_and_umount_unmounts(daemons: Daemons) -> None:
    mnt = daemons.mountpoint()
    r = daemons.mount(mnt)
    assert r.returncode == 0, r.stderr
    assert str(mnt) in r.stdout and "mounted" in r.stdout
    assert is_mounted(str(mnt)), "main() returned 0 before the mount was up"
    pid_file, log_file = daemons.paths(mnt)
    assert pid_file.exists() and log_file.exists()
    pid = daemons.pid(mnt)
    assert pid_alive(pid) and pid != os.getpid()
    assert pid_file.read_text().split()[1] == os.path.realpath(mnt)
    with open(f"/proc/{pid}/stat") as f:     # detached: its own session, no controlling terminal
        fields = f.read().rsplit(")", 1)[1].split()
    assert int(fields[3]) == pid or int(fields[3]) != os.getsid(0)
    (mnt / "hello").write_bytes(b"through the daemon")
    assert (mnt / "hello").read_bytes() == b"through the daemon"
    assert "mounted" in log_file.read_text()

    u = daemons.umount(mnt)
    assert u.returncode == 0, u.stderr
    assert not is_mounted(str(mnt))
    assert wait_until(lambda: not pid_alive(pid), 10), "daemon still running after umount()"
    assert not pid_file.exists()
    assert os.listdir(mnt) == []                 # the bare directory again


def test_umount_flushes_files_still_open(daemons: Daemons) -> None:
    mnt = daemons.mountpoint()
    assert daemons.mount(mnt).returncode == 0
    data = os.urandom(5 << 20)
    fd = os.open(mnt / "open", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        u = daemons.umount(mnt)
        assert u.returncode == 0, u.stderr
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    assert not is_mounted(str(mnt))
    mnt2 = daemons.mountpoint("again")
    assert daemons.mount(mnt2).returncode == 0
    assert (mnt2 / "open").read_bytes() == data
    assert daemons.umount(mnt2).returncode == 0


def test_umount_detects_and_cleans_a_dead_daemon(daemons: Daemons) -> None:
    mnt = daemons.mountpoint()
    assert daemons.mount(mnt).returncode == 0
    pid = daemons.pid(mnt)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), 10)
    with pytest.raises(OSError):                 # ENOTCONN: the stale mount
        os.listdir(mnt)
    assert is_mounted(str(mnt))
    u = daemons.umount(mnt)
    assert u.returncode == 0, u.stderr
    assert "gone" in u.stderr or "died" in u.stderr or "dead" in u.stderr, u.stderr
    assert len(u.stderr.strip().splitlines()) == 1
    assert not is_mounted(str(mnt))
    assert not daemons.paths(mnt)[0].exists()
    assert os.listdir(mnt) == []


def test_umount_of_something_not_mounted_fails(daemons: Daemons) -> None:
    mnt = daemons.mountpoint()
    u = daemons.umount(mnt)
    assert u.returncode == 1
    assert "not mounted" in u.stderr


@pytest.mark.parametrize("what", ["file", "missing"])
def test_mount_on_a_non_directory_is_a_one_line_error_and_exit_2(daemons: Daemons, what: str) -> None:
    target = daemons.tmp / "target"
    if what == "file":
        target.write_text("not a dir")
    r = daemons.run_main(str(target), "--master", daemons.cluster.master_address)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not is_mounted(str(target))


def test_mount_twice_on_the_same_directory_is_refused(daemons: Daemons) -> None:
    mnt = daemons.mountpoint()
    assert daemons.mount(mnt).returncode == 0
    r = daemons.mount(mnt)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert daemons.umount(mnt).returncode == 0


def test_unreachable_master_fails_the_mount_with_a_message(daemons: Daemons) -> None:
    mnt = daemons.mountpoint()
    r = daemons.run_main(str(mnt), "--master", "127.0.0.1:1", "--client-retry-s", "1")
    assert r.returncode == 1
    assert "master" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not is_mounted(str(mnt))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(daemons: Daemons, sig: signal.Signals) -> None:
    mnt = daemons.mountpoint()
    p = daemons.foreground(mnt)
    (mnt / "f").write_bytes(b"x")
    pid_file = daemons.paths(mnt)[0]
    assert pid_file.exists()
    p.send_signal(sig)
    assert p.wait(30) == 0
    assert not is_mounted(str(mnt))
    assert not pid_file.exists()


def test_foreground_mount_flushes_open_files_on_sigterm(daemons: Daemons) -> None:
    mnt = daemons.mountpoint()
    p = daemons.foreground(mnt)
    data = os.urandom(3 << 20)
    fd = os.open(mnt / "pending", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    mnt2 = daemons.mountpoint("check")
    daemons.foreground(mnt2)
    assert (mnt2 / "pending").read_bytes() == data


def test_a_second_signal_while_unmounting_does_not_kill_the_daemon(daemons: Daemons) -> None:
    """Ctrl-C twice, or a service manager signalling the whole group: the daemon still
    unmounts and flushes instead of dying half-way (which leaves a dead ENOTCONN mount)."""
    mnt = daemons.mountpoint()
    p = daemons.foreground(mnt)
    data = os.urandom(2 << 20)
    fd = os.open(mnt / "pending-2sig", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, data)
        p.send_signal(signal.SIGTERM)
        p.send_signal(signal.SIGTERM)
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0, "the daemon was killed by a repeated signal"
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    assert not is_mounted(str(mnt))
    mnt2 = daemons.mountpoint("check")
    daemons.foreground(mnt2)
    got = (mnt2 / "pending-2sig").read_bytes()
    first_diff = next((k for k in range(min(len(got), len(data))) if got[k] != data[k]), None)
    assert len(got) == len(data) and got == data, (len(got), len(data), first_diff)


def test_a_mount_whose_cluster_died_still_unmounts_at_once_on_sigterm(daemons: Daemons) -> None:
    """The flush at unmount may wait for an unreachable master; the mount itself must go
    first, so nothing that touches it meanwhile hangs: neither a request the daemon is
    still serving at the signal (a lookup waiting on the master: it is cut off after the
    stop grace) nor one that comes later.  And the bytes of a first write answered before
    its block ids came (the master stopped in between) still reach the file."""
    mnt = daemons.mountpoint()
    p = daemons.foreground(mnt, "--client-retry-s", "15")
    fd = os.open(mnt / "died-new", os.O_CREAT | os.O_WRONLY, 0o644)
    asker, lookup = stat_in_thread(mnt / "not-there")
    try:
        daemons.cluster.kill_master(signal.SIGSTOP)      # unreachable: calls time out
        try:
            os.write(fd, b"x" * 1000)   # a new file: answered once its AllocateBlocks is sent
            asker.start()
            time.sleep(0.3)
            p.send_signal(signal.SIGTERM)
            assert wait_until(lambda: not is_mounted(str(mnt)), 3), "still mounted 3 s after SIGTERM"
            asker.join(3)
            assert lookup and isinstance(lookup[0], OSError), f"the lookup in flight: {lookup or 'still waiting'}"
        finally:
            daemons.cluster.kill_master(signal.SIGCONT)
        assert p.wait(60) == 0
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    mnt2 = daemons.mountpoint("check")
    daemons.foreground(mnt2)
    assert (mnt2 / "died-new").read_bytes() == b"x" * 1000


def test_a_kernel_invalidation_waiting_on_a_cut_off_lookup_never_holds_the_stop(daemons: Daemons) -> None:
    """The hang that kept fuse.kernel_invalidation off (issue 39 §2), made deterministic: a
    lookup in the root waits on a stopped master; the cache session ends (the master
    answers no beat for a lease), so the notifier asks the kernel to forget what the
    session held in the root, and that invalidation waits for the root's lock, which the
    lookup holds.  At SIGTERM the stop cuts the lookup off after its grace.  Before, the
    cut-off lookup stayed unanswered until the connection's end, which the notifier's
    write to /dev/fuse prevented: both processes stayed in D state for good (fusectl not
    mounted).  Now the stop answers it EIO, the kernel drops the lock, the invalidation
    returns, and the daemon unmounts and exits with no abort needed.  The mount's root holds
    more names than a lookup brings as a listing (metacache.LISTING_MAX): with a listing the
    mount would answer the missing name itself, and nothing would wait on the master."""
    from curvine_py.client.metacache import LISTING_MAX
    from curvine_py.fuse.watchdog import MountCheck, ensure_fusectl
    from curvine_py.sdk import Client
    from tests.conftest import client_config
    mnt = daemons.mountpoint()
    sub = f"/unlisted-{os.urandom(3).hex()}"
    with Client(config=client_config(daemons.cluster)) as sdk:
        sdk.mkdir(sub)
        for i in range(LISTING_MAX + 1):
            sdk.put_bytes(f"{sub}/f{i}", b"")
    p = daemons.foreground(mnt, "--client-retry-s", "30", "--fuse-kernel-invalidation", "true", "--subdir", sub)
    conn = MountCheck.find(str(mnt))
    assert conn is not None
    log = daemons.tmp / f"{mnt.name}.fg.log"
    (mnt / "held").write_bytes(b"x")       # names and attributes in the root the session holds
    os.stat(mnt / "held")
    assert wait_until(lambda: " open with " in log.read_text(), 10), "no cache session opened"
    asker, lookup = stat_in_thread(mnt / "not-there")
    stuck = False
    daemons.cluster.kill_master(signal.SIGSTOP)
    try:
        asker.start()
        assert wait_until(lambda: "cache session ended" in log.read_text(), 15), "the session did not end"
        time.sleep(1.0)   # the session's end handed to the notifier: its invalidation waits on the lookup
        assert lookup == [], "the lookup did not wait on the stopped master"
        p.send_signal(signal.SIGTERM)
        # (no is_mounted before the exit: its realpath stats the mount point, a request that
        # would wait in the kernel for good if the deadlock came back)
        stuck = not wait_until(lambda: p.poll() is not None, 15)
        assert not stuck, "the daemon did not exit 15 s after SIGTERM (the old deadlock)"
        assert p.returncode == 0
        assert not is_mounted(str(mnt))
        asker.join(5)
        assert lookup and isinstance(lookup[0], OSError) and lookup[0].errno == errno.EIO, \
            f"the cut-off lookup: {lookup or 'still waiting'} (EIO: the daemon answered it)"
        assert "still waits in the kernel" not in log.read_text()
    finally:
        if stuck:   # free the processes the old deadlock left in D state, so teardown can end
            ensure_fusectl()
            with contextlib.suppress(OSError):
                Path(f"/sys/fs/fuse/connections/{conn.dev.split(':')[1]}/abort").write_text("1")
        daemons.cluster.kill_master(signal.SIGCONT)


def test_the_daemon_mounts_fusectl_where_nothing_is(tmp_path: Path) -> None:
    """The abort a stuck stop falls back on needs fusectl (many VMs and containers do not
    mount it): the daemon mounts it when it runs as root, once (never stacked)."""
    from curvine_py.fuse.watchdog import ensure_fusectl
    root = Path(os.path.realpath(tmp_path)) / "connections"
    root.mkdir()
    try:
        assert ensure_fusectl(root) and os.path.ismount(root)
        assert ensure_fusectl(root)
        with open("/proc/self/mountinfo") as f:
            assert [line.split()[4] for line in f].count(str(root)) == 1
    finally:
        subprocess.run(["umount", str(root)], capture_output=True, timeout=10)


def test_client_block_size_applies_to_files_the_mount_creates(daemons: Daemons) -> None:
    """`client.block_size` is the block size of files this client creates: the mount's
    creates and mknods carry it, as the SDK's do (it was once the SDK's alone)."""
    from curvine_py.sdk import Client
    from tests.conftest import client_config
    mnt = daemons.mountpoint()
    assert daemons.mount(mnt, "--client-block-size", str(1 << 20)).returncode == 0
    data = os.urandom(5 * (1 << 20) + 7)
    tag = os.urandom(3).hex()
    (mnt / f"created-{tag}").write_bytes(data)
    os.mknod(mnt / f"made-{tag}", 0o644)
    with Client(config=client_config(daemons.cluster)) as sdk:
        assert sdk.stat(f"/created-{tag}").block_size == 1 << 20
        assert sdk.stat(f"/made-{tag}").block_size == 1 << 20
        assert sdk.get_bytes(f"/created-{tag}") == data
        sdk.remove(f"/created-{tag}")
        sdk.remove(f"/made-{tag}")
    assert daemons.umount(mnt).returncode == 0


def test_cv_mount_daemon_logs_to_its_log_file(daemons: Daemons) -> None:
    """`cv mount` runs the daemon from the CLI's own process, whose logging was set up
    already: the daemon's must replace it, or its --log-file stays empty."""
    mnt = daemons.mountpoint("cvmnt")
    log = daemons.tmp / "cv-mount.log"
    cv = str(Path(PY).parent / "cv")
    r = subprocess.run([cv, "mount", str(mnt), "--master", daemons.cluster.master_address, "--log-file", str(log)],
                       env=daemons.env, cwd=daemons.tmp, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    try:
        assert wait_until(lambda: log.exists() and "mounted" in log.read_text(), 10), log.read_text()
    finally:
        assert daemons.umount(mnt).returncode == 0
