"""LocalCluster with real daemons: start-up, records, faults, restarts and clean stops."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import typing
from pathlib import Path

import pytest

from curvine_py.common import config as cfgmod
from curvine_py.cluster.local import ClusterError, LocalCluster, pid_alive, read_state, stop_dir

pytestmark = pytest.mark.timeout(120)
FAST_MASTER_FLAGS = ("--master-heartbeat-ms", "200")
Factory = typing.Callable[..., LocalCluster]


def client_config(cluster: LocalCluster) -> cfgmod.Config:
    cfg = cfgmod.Config()
    cfg.cluster.secret = cluster.secret
    cfg.client.master = cluster.master_address
    cfg.client.retry_s = 30.0
    return cfg


def live_workers(cluster: LocalCluster) -> dict[str, int]:
    """host -> worker id of the workers the master reports live."""
    rep = cluster.report(timeout=5)
    assert rep is not None, "master does not answer"
    return {w.address.host: w.address.worker_id for w in rep.workers if w.state == "live"}


def all_dead(pids: list[tuple[int, int | None]], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(pid, ticks) for pid, ticks in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def running(shared_cluster: LocalCluster) -> LocalCluster:
    """One cluster for the tests that leave it running and whole (their restarts included),
    started once: a start and stop cost ~5 s here, five of them did."""
    return shared_cluster


def test_start_records_every_process(running: LocalCluster) -> None:
    cluster = running
    hosts = live_workers(cluster)
    assert set(hosts) == {w.host for w in cluster.workers} and len(hosts) == 2
    assert [w.host.rsplit("-", 1)[1] for w in cluster.workers] == ["w0", "w1"]
    state = read_state(cluster.dir)
    assert state is not None and state["master"] == cluster.master_address
    assert [p.name for p in state["processes"]] == ["master", "worker0", "worker1"]
    for p in state["processes"]:
        assert p.is_alive() and os.getsid(p.pid) == p.pid  # own session: Ctrl-C does not reach it
        assert Path(p.log).exists()
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, cluster.config_path)
    assert cfg.client.master == cluster.master_address
    assert (cluster.dir / "worker0" / "data").is_dir() and (cluster.dir / "master").is_dir()


def test_stop_is_complete_and_idempotent(cluster_factory: Factory) -> None:
    c = cluster_factory()
    pids = [(p.pid, p.start_ticks) for p in c.processes]
    try:
        assert [p.name for p in c.stop()] == ["master", "worker0", "worker1"]
    finally:
        c.stop()
    assert all_dead(pids, timeout=1)
    assert not (c.dir / "cluster.json").exists()
    assert c.stop() == []


def test_a_second_start_on_a_running_dir_is_refused(running: LocalCluster) -> None:
    cluster = running
    other = LocalCluster(cluster.dir, workers=1)
    with pytest.raises(ClusterError, match="already running"):
        other.start()
    assert all(p.is_alive() for p in cluster.processes)


def test_kill_and_restart_a_worker(running: LocalCluster) -> None:
    cluster = running
    before = live_workers(cluster)
    old = cluster.workers[0]
    cluster.kill_worker(0, signal.SIGKILL)
    assert not old.is_alive()
    new = cluster.restart_worker(0)
    assert new.pid != old.pid and new.is_alive() and cluster.workers[0] is new
    assert live_workers(cluster) == before  # same host identity, same worker id
    assert read_state(cluster.dir)["processes"][1].pid == new.pid  # type: ignore[index]


def test_restart_of_a_running_worker(running: LocalCluster) -> None:
    cluster = running
    old_pid = cluster.workers[1].pid
    cluster.restart_worker(1)
    assert cluster.workers[1].pid != old_pid and len(live_workers(cluster)) == 2


def test_kill_and_restart_the_master_keeps_the_namespace(running: LocalCluster) -> None:
    cluster = running
    from curvine_py.sdk import Client
    with Client(master=cluster.master_address, config=client_config(cluster)) as c:
        c.put_bytes("/kept", b"survives a master restart")
    cluster.kill_master(signal.SIGKILL)
    assert not cluster.master.is_alive()
    cluster.restart_master()
    assert len(live_workers(cluster)) == 2
    with Client(master=cluster.master_address, config=client_config(cluster)) as c:
        assert c.get_bytes("/kept") == b"survives a master restart"


def test_stop_handles_a_stopped_process(cluster: LocalCluster) -> None:
    w = cluster.workers[1]
    cluster.kill_worker(1, signal.SIGSTOP)  # does not wait: a stopped process is alive
    assert w.is_alive()
    cluster.stop(timeout=5)
    assert not w.is_alive()


def test_a_failing_worker_is_reported_with_its_log(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path / "c", workers=2, extra_master_flags=FAST_MASTER_FLAGS,
                     extra_worker_flags=["--no-such-flag"], die_with_parent=True)
    with pytest.raises(ClusterError) as e:
        c.start(timeout=30)
    assert "worker" in str(e.value) and "exited with code" in str(e.value)
    assert "--no-such-flag" in e.value.detail  # the tail of the worker's log
    assert c.processes and not any(p.is_alive() for p in c.processes)
    assert not (c.dir / "cluster.json").exists()


def test_stop_dir_stops_a_cluster_started_elsewhere(cluster_factory: Factory) -> None:
    c = cluster_factory()
    pids = [(p.pid, p.start_ticks) for p in c.processes]
    try:
        stopped = stop_dir(c.dir, timeout=5)
        assert stopped is not None and len(stopped) == 3
        assert all_dead(pids, timeout=1)
        assert stop_dir(c.dir) is None
    finally:
        c.stop()


def test_daemons_die_with_their_launcher(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import json, sys, time
        from curvine_py.cluster.local import LocalCluster
        c = LocalCluster({str(tmp_path / 'c')!r}, workers=1, extra_master_flags={list(FAST_MASTER_FLAGS)!r},
                         die_with_parent=True)
        c.start(timeout=60)
        print(json.dumps([[p.pid, p.start_ticks] for p in c.processes]), flush=True)
        time.sleep(600)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        assert line, launcher.stderr.read() if launcher.stderr else b""
        pids = [tuple(p) for p in json.loads(line)]
        assert all(pid_alive(pid, ticks) for pid, ticks in pids)
    finally:
        launcher.kill()  # SIGKILL: the launcher cannot clean up; the kernel must
        launcher.wait()
    try:
        assert all_dead(pids)
    finally:
        stop_dir(tmp_path / "c", timeout=2)


def test_context_manager(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", workers=1, extra_master_flags=FAST_MASTER_FLAGS,
                      die_with_parent=True) as c:
        pids = [(p.pid, p.start_ticks) for p in c.processes]
        assert len(pids) == 2 and c.report() is not None
    assert all_dead(pids, timeout=1)
