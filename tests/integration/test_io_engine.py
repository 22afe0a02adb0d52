"""The worker's disk I/O engine as a process sees it: liburing imported safely by many
processes at once, an io_uring that crashes its probe (a real native crash: a stand-in
``liburing`` package on PYTHONPATH that dies with SIGILL or SIGSEGV when imported, as the
2026.3.30 wheel does on a CPU without AVX-512; one whose ring setup fails with EPERM, as
under docker's seccomp profile; one that hangs) never takes a worker down, ``uring`` then
refuses to start with one line, ``auto`` and ``threads`` run, and ``cv report`` names
each worker's engine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.local import LocalCluster
from curvine_py.worker import ioengine
from tests.conftest import CV, FORCED_IO_ENGINE, IO_ENGINE_ENV, skip_without_uring, uring_probe

START_TIMEOUT_S = 60.0
CRASHES = {
    # what the stand-in liburing's __init__ does: the native crashes of a bad binding
    "SIGILL": "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n",
    "SIGSEGV": "import ctypes\nctypes.string_at(0)\n",
    "hang": "import time\ntime.sleep(60)\n",
    # the 2024 API, with a kernel that refuses the ring (docker's seccomp profile)
    "EPERM": textwrap.dedent("""\
        import errno, os
        class io_uring: pass
        class io_uring_cqe: pass
        class iovec:
            def __init__(self, buffers): pass
        def io_uring_queue_init(entries, ring, flags=0):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        def _unused(*args): raise AssertionError("never reached")
        io_uring_queue_exit = io_uring_register_eventfd = io_uring_get_sqe = _unused
        io_uring_prep_readv = io_uring_prep_writev = io_uring_prep_fsync = _unused
        io_uring_sqe_set_data64 = io_uring_sqe_set_flags = io_uring_submit = _unused
        io_uring_peek_cqe = io_uring_cqe_get_data64 = io_uring_cqe_seen = _unused
        """),
}
REASONS = {"SIGILL": "killed by SIGILL", "SIGSEGV": "killed by SIGSEGV",
           "EPERM": "PermissionError: [Errno 1] Operation not permitted"}


def fake_liburing(root: Path, how: str) -> str:
    """A directory whose liburing package misbehaves as CRASHES[how] says."""
    pkg = root / f"fake-{how}" / "liburing"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(CRASHES[how])
    return str(pkg.parent)


def crashing_liburing(root: Path, how: str) -> dict[str, str]:
    """An environment whose `import liburing` (or its first ring) fails as `how` says."""
    env = dict(os.environ)
    env.pop(IO_ENGINE_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([fake_liburing(root, how), *filter(None, [env.get("PYTHONPATH")])])
    return env


def worker_cmd(data_dir: Path, engine: str) -> list[str]:
    return [sys.executable, "-m", "curvine_py.worker.main", "--worker-master", "",
            "--worker-dirs", str(data_dir), "--worker-reserve", "0", "--worker-data-port", "0",
            "--worker-rpc-port", "0", "--worker-local-writes", "false", "--worker-io-engine", engine]


def run_worker_until_ready(cmd: list[str], env: dict[str, str]) -> tuple[str, str]:
    """Start a standalone worker, wait for its ready line, stop it: (ready line, log)."""
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        ready = p.stdout.readline()
        p.send_signal(signal.SIGTERM)
        _, log = p.communicate(timeout=START_TIMEOUT_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert ready.startswith("worker "), f"no ready line; exit {p.returncode}; log:\n{log}"
    assert p.returncode == 0, log
    return ready, log


def engine_lines(log: str) -> list[str]:
    return [ln.split(": ", 1)[1] for ln in log.splitlines() if ": io engine: " in ln]


# ---------------------------------------------------------------- importing liburing

def test_eight_processes_import_liburing_at_once(uring_ok: object) -> None:
    """dynamic_import rewrites liburing's cache file on every import; under the worker's
    lock eight simultaneous importers all succeed, round after round."""
    code = "from curvine_py.worker.uring import load_liburing; load_liburing().io_uring()"
    for round_ in range(6):
        procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
                 for _ in range(8)]
        errors = [p.communicate(timeout=60)[1] for p in procs]
        bad = [err for p, err in zip(procs, errors) if p.returncode != 0]
        assert not bad, f"round {round_}: {len(bad)} of 8 failed:\n{bad[0]}"


def test_importing_the_worker_does_not_import_liburing(tmp_path: Path) -> None:
    env = crashing_liburing(tmp_path, "SIGSEGV")
    code = ("import sys, curvine_py.worker.main, curvine_py.worker.blockstore, curvine_py.worker.uring; "
            "assert 'liburing' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


# ---------------------------------------------------------------- a probe that crashes

@pytest.mark.parametrize("how", sorted(REASONS))
def test_uring_with_a_failing_probe_fails_the_start_with_one_line(tmp_path: Path, how: str) -> None:
    proc = subprocess.run(worker_cmd(tmp_path / "data", "uring"), env=crashing_liburing(tmp_path, how),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"curvine-worker: worker.io_engine = uring, but io_uring does not work here: {REASONS[how]}"]


def test_a_hanging_probe_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from curvine_py.worker.uringprobe import probe_uring
    monkeypatch.setenv("PYTHONPATH", fake_liburing(tmp_path, "hang"))
    assert probe_uring(str(tmp_path), timeout=1.0) == \
        ioengine.ProbeResult(False, "the probe did not finish in 1 s")


def test_auto_runs_on_threads_and_says_why_in_one_line(tmp_path: Path) -> None:
    _, log = run_worker_until_ready(worker_cmd(tmp_path / "data", "auto"), crashing_liburing(tmp_path, "SIGILL"))
    lines = engine_lines(log)
    assert len(lines) == 1 and lines[0].startswith("io engine: threads ("), log
    if ioengine.AUTO_PREFERS == "uring":   # else auto does not even probe io_uring
        assert lines[0] == "io engine: threads (io_uring probe failed: killed by SIGILL)"
    assert "Traceback" not in log


def test_threads_never_touches_liburing(tmp_path: Path) -> None:
    _, log = run_worker_until_ready(worker_cmd(tmp_path / "data", "threads"),
                                    crashing_liburing(tmp_path, "SIGSEGV"))
    assert engine_lines(log) == ["io engine: threads (worker.io_engine = threads)"]


def test_uring_where_it_works(tmp_path: Path, uring_ok: object) -> None:
    env = dict(os.environ)
    env.pop(IO_ENGINE_ENV, None)
    _, log = run_worker_until_ready(worker_cmd(tmp_path / "data", "uring"), env)
    [line] = engine_lines(log)
    assert line.startswith("io engine: uring (io_uring probe passed: readv+writev of 4 KiB"), log


# ---------------------------------------------------------------- the report

def cv_report(cluster: LocalCluster, *args: str) -> str:
    env = dict(os.environ, CURVINE_MASTER=cluster.master_address)
    proc = subprocess.run([CV, "report", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("engine", ["threads", "uring"])
def test_cv_report_shows_each_workers_engine(cluster_factory: typing.Callable[..., LocalCluster],
                                             engine: str) -> None:
    if engine == "uring":
        skip_without_uring()
    if FORCED_IO_ENGINE and FORCED_IO_ENGINE != engine:
        pytest.skip(f"{IO_ENGINE_ENV}={FORCED_IO_ENGINE}: {engine} is not tested in this run")
    cluster = cluster_factory(workers=1, extra_worker_flags=("--worker-io-engine", engine))
    rep = json.loads(cv_report(cluster, "--json"))
    assert [w["io_engine"] for w in rep["workers"]] == [engine]
    lines = cv_report(cluster).splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("ID "))
    column = lines[at].index(" IO ") + 1   # a left-aligned column: its values start here
    assert [row[column:].split()[0] for row in lines[at + 1:] if row.strip()] == [engine]


def test_clusters_run_on_the_engine_a_test_run_asks_for(cluster_factory: typing.Callable[..., LocalCluster]
                                                        ) -> None:
    """CURVINE_WORKER_IO_ENGINE survives conftest's clean environment (else auto's pick)."""
    want = FORCED_IO_ENGINE if FORCED_IO_ENGINE in ("uring", "threads") else ioengine.AUTO_PREFERS
    if want == "uring" and FORCED_IO_ENGINE == "uring":
        skip_without_uring()
    elif want == "uring" and not uring_probe().ok:
        want = "threads"   # auto's fallback
    cluster = cluster_factory(workers=1)
    rep = json.loads(cv_report(cluster, "--json"))
    assert [w["io_engine"] for w in rep["workers"]] == [want]
