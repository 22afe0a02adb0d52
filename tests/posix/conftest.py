"""Fixtures for tests through a real FUSE mount of a real local cluster.

``mounted`` (module scope) starts a 2-worker LocalCluster and mounts it on a temporary
directory with ``python -m curvine_py.fuse.main MOUNTPOINT --master ... --foreground``
in its own process.  ``second_mount`` mounts the same cluster a second time (another
"node") for close-to-open tests.  Teardown always unmounts, also after a failure:
SIGTERM to the daemon, then (if it hangs) abort the FUSE connection, SIGKILL and
``fusermount3 -u -z``, so no hung mount is ever left behind to block a later ``ls /tmp``.
The mount state is read from /proc/self/mountinfo, never by stat()ing the mountpoint
(a stat of a hung FUSE mount blocks).

``run_as`` runs a function in a forked child under another uid/gid (setgroups,
setresgid, setresuid) and returns its result, or the errno of the OSError it raised,
so permission tests can assert EACCES/EPERM exactly.
"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import pickle
import signal
import subprocess
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyfuse3_features import HAVE_PYFUSE3

from curvine_py.common.blockmeta import block_file
from curvine_py.common.mounttable import is_mounted
from curvine_py.cluster.local import LocalCluster, log_tail



def _root_conftest() -> typing.Any:
    """tests/conftest.py as a module of its own name (both conftests are "conftest")."""
    path = Path(__file__).resolve().parent.parent / "conftest.py"
    spec = importlib.util.spec_from_file_location("_curvine_tests_conftest", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_root = _root_conftest()
start_cluster = _root.start_cluster
dump_logs = _root.dump_logs

MOUNT_TIMEOUT_S = 30.0
UNMOUNT_TIMEOUT_S = 15.0
NOBODY = 65534
USER = 1000          # an unprivileged uid/gid that owns nothing
OTHER = 1001

# The daemon asks the kernel for SIGTERM when the pytest process dies (a killed test
# run leaves no mount served by a daemon whose cluster is gone), then runs main().
_BOOT = """\
import ctypes, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
import os
if os.getppid() != {parent}:
    sys.exit(0)
sys.argv[0] = "curvine-fuse"
from curvine_py.fuse.main import main
sys.exit(main(sys.argv[1:]))
"""


def mount_table_entry(mountpoint: str | Path) -> list[str] | None:
    """The /proc/self/mountinfo fields of the mount at mountpoint (None when not mounted)."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4 and parts[4].replace("\\040", " ") == target:
                return parts
    return None


def abort_fuse_connection(mountpoint: str | Path) -> None:
    """Make every pending and future request of a (hung) FUSE mount fail with ENOTCONN."""
    entry = mount_table_entry(mountpoint)
    if entry is None:
        return
    minor = entry[2].split(":")[1]
    with contextlib.suppress(OSError):
        Path(f"/sys/fs/fuse/connections/{minor}/abort").write_text("1")


def force_unmount(mountpoint: str | Path) -> None:
    if is_mounted(str(mountpoint)):
        for cmd in (["fusermount3", "-u", "-z", str(mountpoint)], ["umount", "-l", str(mountpoint)]):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(cmd, capture_output=True, timeout=10)
            if not is_mounted(str(mountpoint)):
                return


@dataclass
class Mount:
    """One running mount daemon."""
    path: Path
    cluster: LocalCluster
    proc: subprocess.Popen[bytes]
    log: Path
    run_dir: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines)

    def stop(self) -> None:
        """Unmount however it takes; never leaves a mount behind."""
        try:
            if self.alive():
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(UNMOUNT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    abort_fuse_connection(self.path)   # a daemon stuck in a request
                    try:
                        self.proc.wait(5)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait(5)
        finally:
            if is_mounted(str(self.path)):
                abort_fuse_connection(self.path)
            force_unmount(self.path)


def block_ids(mount: Mount, path: Path) -> list[int]:
    """The blocks of the file at path on the mount, as the master lists them."""
    from curvine_py.sdk import Client
    c = mount.cluster
    with Client(master=c.master_address, config=_root.client_config(c)) as client:
        return [b.block_id for b in client.block_locations("/" + str(path.relative_to(mount.path)))]


def wait_deleted(mount: Mount, ids: list[int]) -> None:
    """Until no worker holds a file of these blocks: deletions reach the workers with their
    heartbeats (~0.2-0.5 s here; tests used to sleep a fixed 4 s for it)."""
    dirs = [str(mount.cluster.dir / f"worker{i}" / "data") for i in range(len(mount.cluster.workers))]
    assert dirs and all(Path(x).is_dir() for x in dirs)
    _root.wait_until(f"the workers deleted blocks {ids}",
                     lambda: not any(os.path.exists(block_file(x, b)) for x in dirs for b in ids), timeout=30)


def deletions_delivered(mount: Mount, directory: Path) -> None:
    """A barrier: a closed file's blocks, freed now, are gone from the workers, so a
    deletion the master ordered before this one (wrongly, say of an open file's blocks)
    has reached them too."""
    probe = directory / f"probe-{os.urandom(3).hex()}"
    probe.write_bytes(os.urandom(1 << 20))
    ids = block_ids(mount, probe)
    assert ids
    os.unlink(probe)
    wait_deleted(mount, ids)


def start_mount(cluster: LocalCluster, mountpoint: Path, run_dir: Path, log: Path,
                extra: typing.Sequence[str] = ()) -> Mount:
    """Mount cluster on mountpoint with the fuse main in a --foreground subprocess."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURVINE_")}
    if cluster.secret:   # the mount talks to a cluster that checks its secret
        env["CURVINE_CLUSTER_SECRET"] = cluster.secret
    env["CURVINE_RUN_DIR"] = str(run_dir)
    env["PYTHONUNBUFFERED"] = "1"
    argv = [sys.executable, "-c", _BOOT.format(parent=os.getpid()), str(mountpoint),
            "--master", cluster.master_address, "--foreground", "--client-retry-s", "20", *extra]
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                cwd=str(run_dir), start_new_session=True)
    m = Mount(mountpoint, cluster, proc, log, run_dir)
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not is_mounted(str(mountpoint)):
        if not m.alive():
            raise RuntimeError(f"mount daemon exited with {proc.returncode}:\n{m.log_tail()}")
        if time.monotonic() > deadline:
            m.stop()
            raise RuntimeError(f"mount did not appear within {MOUNT_TIMEOUT_S} s:\n{m.log_tail()}")
        time.sleep(0.02)
    # the mount is in the table once init is done; the first request proves it serves
    os.stat(mountpoint)
    return m


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without any pyfuse3 (make install could not build even the stock one) nothing here
    can mount: skip, saying so.  Tests of what only the patched pyfuse3 brings carry their
    own markers (tests/pyfuse3_features.py)."""
    if HAVE_PYFUSE3:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="pyfuse3 is not installed: no FUSE mount here")
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(skip)


def _module_failed(request: pytest.FixtureRequest) -> bool:
    return request.session.testsfailed > getattr(request.module, "_failed_before", 0)


@pytest.fixture(scope="module")
def posix_cluster(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> typing.Iterator[LocalCluster]:
    """A 2-worker cluster (fast heartbeats) for one test module's mounts."""
    request.module._failed_before = request.session.testsfailed
    c = start_cluster(tmp_path_factory.mktemp("posix") / "cluster")
    try:
        yield c
    finally:
        if _module_failed(request):
            dump_logs(c)
        c.stop()


def _mount_fixture(cluster: LocalCluster, base: Path, name: str,
                   request: pytest.FixtureRequest) -> typing.Iterator[Mount]:
    m = start_mount(cluster, base / name, base / "run", base / f"{name}.log",
                    getattr(request.module, "MOUNT_FLAGS", ()))
    try:
        yield m
    finally:
        try:
            m.stop()
        finally:
            if _module_failed(request):
                print(f"---- {name} daemon log {m.log}\n{m.log_tail()}")


@pytest.fixture(scope="module")
def mounted(posix_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> typing.Iterator[Mount]:
    """The cluster mounted on a temporary directory (module MOUNT_FLAGS add daemon flags)."""
    base = tmp_path_factory.mktemp("mnt")
    os.chmod(base, 0o755)
    yield from _mount_fixture(posix_cluster, base, "a", request)


@pytest.fixture(scope="module")
def second_mount(mounted: Mount, tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> typing.Iterator[Mount]:
    """A second mount of the same cluster: another node's view of the pool."""
    base = tmp_path_factory.mktemp("mnt2")
    os.chmod(base, 0o755)
    yield from _mount_fixture(mounted.cluster, base, "b", request)


@pytest.fixture
def d(mounted: Mount, request: pytest.FixtureRequest) -> Path:
    """A fresh directory on the mount, named after the test, mode 0777 (others may work in it)."""
    name = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:80]
    p = mounted.path / f"{name}-{os.urandom(3).hex()}"
    p.mkdir()
    os.chmod(p, 0o777)
    return p


# ---------------------------------------------------------------- another user


class ChildError(Exception):
    """The child raised something that is not an OSError."""


def run_as_user(fn: typing.Callable[..., typing.Any], *args: typing.Any, uid: int = USER,
                gid: int | None = None, groups: typing.Sequence[int] = (), umask: int = 0o022,
                cwd: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> typing.Any:
    """Run fn(*args) in a forked child as uid/gid with groups; return its result.

    cwd is entered before the privileges are dropped, so relative paths work below a
    directory whose ancestors the user could not traverse (pytest's tmp dirs are 0700).

    An OSError in the child comes back as ``("errno", e.errno)``; anything else raises
    ChildError here with the child's traceback text.
    """
    gid = uid if gid is None else gid
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: no threads, no pytest; only os calls and a pickle
        code = 0
        try:
            os.close(r)
            try:
                if cwd is not None:
                    os.chdir(cwd)
                os.setgroups(list(groups))
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                os.umask(umask)
                out: typing.Any = ("ok", fn(*args))
            except OSError as e:
                out = ("errno", e.errno)
            except BaseException:
                import traceback
                out = ("exc", traceback.format_exc())
            data = pickle.dumps(out)
            while data:
                n = os.write(w, data)
                data = data[n:]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            import select
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise TimeoutError(f"child as uid {uid} did not finish in {timeout} s")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "exc":
        raise ChildError(value)
    if kind == "errno":
        return ("errno", value)
    return value


def errno_of(result: typing.Any) -> int | None:
    """The errno a run_as_user result carries (None when the call succeeded)."""
    if isinstance(result, tuple) and len(result) == 2 and result[0] == "errno":
        return typing.cast(int, result[1])
    return None


@pytest.fixture
def as_user() -> typing.Callable[..., typing.Any]:
    return run_as_user


def raises_errno(code: int, fn: typing.Callable[..., typing.Any], *args: typing.Any) -> None:
    with pytest.raises(OSError) as info:
        fn(*args)
    assert info.value.errno == code, (
        f"expected {errno.errorcode[code]}, got {errno.errorcode.get(info.value.errno, info.value.errno)}: "
        f"{info.value}")
