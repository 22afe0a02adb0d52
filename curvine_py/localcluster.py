"""A whole cluster on one machine: 1 master, N workers (and later a mount) as processes.

Used by ``cv cluster start|stop|status`` and by the test suite.  Each daemon is a
separate process in its own session, so a Ctrl-C aimed at the launcher reaches only the
launcher, which then stops the daemons in order (mount, then workers and master).
Daemons are started by importing their ``main`` in a fresh interpreter rather than
being imported here: this module must never load master or worker code into the
caller's process (one process, one role).

Layout of a cluster directory D (all paths absolute once started)::

    D/curvine.toml        shared settings, written once; every daemon reads it (--config)
    D/cluster.json        what is running: role, pid, address, log of each process
    D/logs/<name>.log     stdout+stderr of master, worker0.., fuse (appended across runs)
    D/master/             the master's metadata directory
    D/worker<i>/data      worker i's block directory

Process bookkeeping (records, liveness, stopping, ports) is in ``processes.py``.

Ports: the master listens on P (default 8995); worker i uses rpc port B+2i and data
port B+2i+1, where B defaults to P+2 (so 8997/8998, 8999/9000, ...).  The Prometheus
/metrics ports follow the workers': M = B+2N for the master, M+1+i for worker i, M+1+N
for the mount (9001, 9002/9003, 9004 with two workers; docs/metrics.md).  Each worker gets
its own host identity ``<hostname>-w<i>`` so that two replicas can land on two workers
of one machine.  Clients using D/curvine.toml (the mount, ``cv --config``) are on worker
0's host: everything here runs on one machine, as on an inference node that is also a
storage node, so they read and write worker 0's replicas without the network
(short-circuit reads and writes).
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import grpc

from curvine_py.common import config as cfgmod
from curvine_py.common.mounttable import detach, is_mounted
from curvine_py.common.security import with_secret
from curvine_py.processes import (  # noqa: F401  (re-exported: the CLI and tests use them from here)
    LOCAL_IP, STOP_TIMEOUT_S, ProcessRecord, _start_ticks, free_ports, log_tail, pid_alive,
    port_in_use, terminate, wait_dead,
)
from curvine_py.pb import curvine_pb2, curvine_pb2_grpc

DEFAULT_MASTER_PORT = 8995
DEFAULT_WORKERS = 2
STATE_FILE = "cluster.json"
CONFIG_FILE = "curvine.toml"
START_TIMEOUT_S = 30.0

# role -> module whose main() runs that role.  Adding a daemon is one line here plus
# its argument list in LocalCluster._command().
ROLE_MODULES = {
    "master": "curvine_py.master.main",
    "worker": "curvine_py.worker.main",
    "fuse": "curvine_py.fuse.main",
}

# The interpreter started for each daemon runs this: it optionally asks the kernel to
# SIGTERM the daemon when the launcher dies (so tests and `--foreground` never leave
# orphans), drops the cwd from sys.path (the cluster dir holds folders named master/
# and worker0/), then runs the role's main() with the flags in sys.argv.
_BOOTSTRAP = """\
import os, sys
sys.argv[0] = {prog!r}
sys.path[:] = [p for p in sys.path if p not in ('', '.')]
if {die_with_parent!r}:
    import ctypes, signal
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    if os.getppid() != {parent}:
        sys.exit(0)
from {module} import main
sys.exit(main())
"""


class ClusterError(Exception):
    """A local cluster could not be started or managed.

    str() is one line for the user; ``detail`` holds supporting text (a log tail).
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


# ---------------------------------------------------------------- processes


def read_state(directory: str | Path) -> dict[str, typing.Any] | None:
    """The parsed D/cluster.json, or None when no cluster was started there."""
    path = Path(directory) / STATE_FILE
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ClusterError(f"{path}: unreadable cluster state: {e}") from None
    state["processes"] = [ProcessRecord.from_json(p) for p in state.get("processes", [])]
    return state


def _write_json_atomic(path: Path, obj: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def fuse_available() -> bool:
    """Whether the mount daemon's module is installed (found without importing it)."""
    try:
        spec = importlib.util.find_spec("curvine_py.fuse")
    except (ImportError, ValueError):
        return False
    locations = spec.submodule_search_locations if spec else None
    return any(Path(loc, "main.py").exists() for loc in (locations or ()))


def _channel(address: str, secret: str = "") -> grpc.Channel:
    """A channel that retries a not-yet-listening master every 100-500 ms, not gRPC's
    default back-off of up to two minutes (start-up polling must notice it promptly)."""
    return with_secret(grpc.insecure_channel(address, options=[
        ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500)]), secret)


def query_report(address: str, timeout: float = 1.0, secret: str = "") -> curvine_pb2.ReportReply | None:
    """One Report call to the master at address; None when it does not answer."""
    with _channel(address, secret) as channel:
        try:
            return curvine_pb2_grpc.MasterServiceStub(channel).Report(curvine_pb2.Empty(),
                                                                        timeout=timeout)
        except grpc.RpcError:
            return None


# ---------------------------------------------------------------- the cluster


def daemon_secret(config_path: str | Path) -> str:
    """The cluster secret the daemons started with config_path use: the file, then the
    environment (CURVINE_CLUSTER_SECRET wins), as they load it."""
    return cfgmod.load(path=str(config_path)).cluster.secret


def ensure_secret(path: Path) -> None:
    """Write a new random cluster secret into the config file at path if it has none.

    Only the secret line is touched: users may have edited the rest of the file."""
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, path)
    if cfg.cluster.secret:
        return
    secret = secrets.token_hex(16)
    text = path.read_text()
    line = f'secret = "{secret}"'
    if re.search(r'^secret\s*=\s*""\s*$', text, re.M):
        text = re.sub(r'^secret\s*=\s*""\s*$', line, text, count=1, flags=re.M)
    elif re.search(r"^\[cluster\]\s*$", text, re.M):
        text = re.sub(r"^\[cluster\]\s*$", "[cluster]\n" + line, text, count=1, flags=re.M)
    else:
        text += f"\n[cluster]\n{line}\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class LocalCluster:
    """Start, watch and stop one master, N workers and an optional mount on this machine.

    ``master_port=None`` picks free ports for everything (what tests want); the CLI passes
    8995.  ``die_with_parent`` makes the daemons exit when the creating thread's process
    dies, which keeps a killed test run or a killed ``--foreground`` launcher from
    leaving orphans.
    """

    def __init__(self, dir: str | Path, workers: int = DEFAULT_WORKERS,
                 master_port: int | None = None, capacity: int | str | None = None,
                 extra_master_flags: typing.Sequence[str] = (),
                 extra_worker_flags: typing.Sequence[str] = (),
                 *, base_port: int | None = None, bind: str = LOCAL_IP, mount: str | None = None,
                 die_with_parent: bool = False, env: typing.Mapping[str, str] | None = None) -> None:
        if workers < 1:
            raise ClusterError("a cluster needs at least one worker")
        self.dir = Path(dir).absolute()
        self.config_path = self.dir / CONFIG_FILE
        self.state_path = self.dir / STATE_FILE
        self.n_workers = workers
        self.capacity = cfgmod.parse_size(capacity) if capacity is not None else None
        self.extra_master_flags = list(extra_master_flags)
        self.extra_worker_flags = list(extra_worker_flags)
        self.bind = bind
        self.ip = LOCAL_IP if bind in ("0.0.0.0", "") else bind
        self.mount = str(Path(mount).absolute()) if mount else None
        self.die_with_parent = die_with_parent
        self.env = dict(env or {})
        # Explicit ports follow the documented scheme; master_port=None means "any free
        # ports" for every daemon (tests run many clusters side by side).
        self._ports: list[int] | None = None
        self._metrics_ports: list[int] | None = None
        picked: list[int] = []
        if master_port is None:
            # The frame port is picked in the same batch: left to the master's own
            # ephemeral bind, it could land on a port picked here for a worker that
            # has not bound it yet (seen in CI as EADDRINUSE in a worker).
            picked = free_ports(2 + 2 * workers + workers + 2, self.bind)
            master_port = picked[0]
            if base_port is None:
                self._ports = picked[2:2 + 2 * workers]
                self._metrics_ports = picked[2 + 2 * workers:]
        self.master_port = master_port
        self.base_port = base_port if base_port is not None else master_port + 2
        # The framed metadata port: master port + 1 in the documented scheme; the picked
        # one when ports are picked; an ephemeral one (clients learn it from the master)
        # when the scheme's would collide with the workers'.
        self.frame_port = picked[1] if picked else master_port + 1
        if not picked and self.base_port <= self.frame_port < self.base_port + 2 * workers:
            self.frame_port = 0
        self.processes: list[ProcessRecord] = []
        self.launcher_pid: int | None = None  # set by a --foreground launcher
        self._channel: grpc.Channel | None = None
        self._stub: curvine_pb2_grpc.MasterServiceStub | None = None
        self.hostname = cfgmod.host_identity("")
        self.secret = ""  # the cluster secret, read (or created) by prepare()

    # ------------------------------------------------------------ layout

    @property
    def master_address(self) -> str:
        return f"{self.ip}:{self.master_port}"

    @property
    def master(self) -> ProcessRecord:
        return next(p for p in self.processes if p.role == "master")

    @property
    def workers(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == "worker"]

    def worker_ports(self, i: int) -> tuple[int, int]:
        """(rpc, data) ports of worker i."""
        if self._ports is not None:
            return self._ports[2 * i], self._ports[2 * i + 1]
        return self.base_port + 2 * i, self.base_port + 2 * i + 1

    def metrics_port(self, role: str, i: int = 0) -> int:
        """The /metrics port of a daemon (role master, worker i, or fuse)."""
        slot = 0 if role == "master" else 1 + i if role == "worker" else 1 + self.n_workers
        if self._metrics_ports is not None:
            return self._metrics_ports[slot]
        return self.base_port + 2 * self.n_workers + slot

    def worker_host(self, i: int) -> str:
        return f"{self.hostname}-w{i}"

    def worker_dir_spec(self, i: int) -> str:
        tier = f"SSD:{self.capacity}" if self.capacity else "SSD"
        return f"[{tier}]{self.dir / f'worker{i}' / 'data'}"

    def effective_config(self) -> cfgmod.Config:
        """The settings written to D/curvine.toml; per-worker values show worker0's."""
        cfg = cfgmod.Config()
        cfg.master.bind = self.bind
        cfg.master.port = self.master_port
        cfg.master.frame_port = self.frame_port
        cfg.master.meta_dir = str(self.dir / "master")
        cfg.worker.master = self.master_address
        cfg.worker.bind = self.bind
        cfg.worker.ip = self.ip
        cfg.worker.rpc_port, cfg.worker.data_port = self.worker_ports(0)
        cfg.worker.dirs = [self.worker_dir_spec(0)]
        cfg.client.master = self.master_address
        cfg.client.host = self.worker_host(0)   # this machine; see the module docstring
        return cfg

    def _command(self, role: str, i: int) -> list[str]:
        """argv of a daemon: the bootstrap interpreter plus the role's flags."""
        module = ROLE_MODULES[role]
        boot = _BOOTSTRAP.format(prog=f"curvine-{role}", die_with_parent=self.die_with_parent,
                                 parent=os.getpid(), module=module)
        argv = [sys.executable, "-c", boot]
        if role == "master":
            return argv + ["--config", str(self.config_path),
                           "--master-port", str(self.master_port), "--master-bind", self.bind,
                           "--master-frame-port", str(self.frame_port),
                           "--master-meta-dir", str(self.dir / "master"),
                           "--master-metrics-port", str(self.metrics_port("master")), *self.extra_master_flags]
        if role == "worker":
            rpc, data = self.worker_ports(i)
            return argv + ["--config", str(self.config_path),
                           "--worker-master", self.master_address, "--worker-bind", self.bind,
                           "--worker-ip", self.ip, "--worker-host", self.worker_host(i),
                           "--worker-rpc-port", str(rpc), "--worker-data-port", str(data),
                           "--worker-dirs", self.worker_dir_spec(i),
                           "--worker-metrics-port", str(self.metrics_port("worker", i)), *self.extra_worker_flags]
        if role == "fuse":
            assert self.mount is not None
            return argv + [self.mount, "--master", self.master_address, "--config", str(self.config_path),
                           "--fuse-metrics-port", str(self.metrics_port("fuse")), "--foreground"]
        raise ValueError(role)

    def _record(self, role: str, i: int) -> ProcessRecord:
        metrics = f"{self.ip}:{self.metrics_port(role, i)}"
        if role == "master":
            return ProcessRecord(role, "master", 0, self.master_address,
                                 str(self.dir / "logs" / "master.log"), metrics=metrics)
        if role == "worker":
            rpc, data = self.worker_ports(i)
            return ProcessRecord(role, f"worker{i}", i, f"{self.ip}:{rpc}",
                                 str(self.dir / "logs" / f"worker{i}.log"),
                                 data_address=f"{self.ip}:{data}", host=self.worker_host(i), metrics=metrics)
        return ProcessRecord(role, "fuse", 0, self.mount or "", str(self.dir / "logs" / "fuse.log"), metrics=metrics)

    def prepare(self) -> None:
        """Create the directory tree and D/curvine.toml (only when absent: users may edit it)."""
        for sub in ("logs", "master", *(f"worker{i}/data" for i in range(self.n_workers))):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if self.mount:
            Path(self.mount).mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            header = ("# Written by `cv cluster start`; edit freely, it is not overwritten.\n"
                      "# Every daemon of this cluster reads it (--config).  Per-worker values\n"
                      "# (host, ports, data dir) are passed to each worker as flags; the\n"
                      "# [worker] section shows worker0's.  Worker i: rpc port = rpc_port + 2i,\n"
                      "# data port = rpc_port + 2i + 1, host = <hostname>-w<i>.\n\n")
            tmp = self.config_path.with_suffix(".tmp")
            tmp.write_text(header + cfgmod.to_toml(self.effective_config()))
            os.replace(tmp, self.config_path)
        ensure_secret(self.config_path)
        self.secret = daemon_secret(self.config_path)

    # ------------------------------------------------------------ spawning

    def _spawn(self, rec: ProcessRecord, role: str) -> ProcessRecord:
        rec.cmd = self._command(role, rec.index)
        env = dict(os.environ)
        env.pop("CURVINE_CONF", None)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        with open(rec.log, "ab") as log:
            log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {rec.name}\n".encode())
            log.flush()
            rec.popen = subprocess.Popen(rec.cmd, cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, close_fds=True)
        rec.pid = rec.popen.pid
        rec.start_ticks = _start_ticks(rec.pid)
        return rec

    def _check_ports(self) -> None:
        wanted = [(self.master_port, "master")]
        if self.frame_port:
            wanted.append((self.frame_port, "master frames"))
        for i in range(self.n_workers):
            rpc, data = self.worker_ports(i)
            wanted += [(rpc, f"worker{i} rpc"), (data, f"worker{i} data"),
                       (self.metrics_port("worker", i), f"worker{i} metrics")]
        wanted.append((self.metrics_port("master"), "master metrics"))
        for port, what in wanted:
            if port_in_use(self.bind, port):
                raise ClusterError(f"port {port} ({what}) on {self.bind} is already in use; "
                                   "choose other ports (--master-port / --base-port)")

    def start(self, timeout: float = START_TIMEOUT_S) -> "LocalCluster":
        """Start every daemon and wait until the master reports all workers live.

        On any failure (including Ctrl-C) whatever was started is stopped again.
        """
        self.prepare()
        with self._lock():
            state = read_state(self.dir)
            if state is not None:
                alive = [p for p in state["processes"] if p.is_alive()]
                if alive:
                    pids = ", ".join(f"{p.name} pid {p.pid}" for p in alive)
                    raise ClusterError(f"a cluster is already running in {self.dir} ({pids}); "
                                       f"stop it first: cv cluster stop --dir {self.dir}")
            self._check_ports()
            try:
                self._start_all(timeout)
            except BaseException:
                self.stop()
                raise
        return self

    def _start_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        master = self._spawn(self._record("master", 0), "master")
        self.processes = [master]
        self._wait(lambda r: r is not None, "the master to answer", deadline, [master])
        spawned_ms = int(time.time() * 1000)
        for i in range(self.n_workers):
            self.processes.append(self._spawn(self._record("worker", i), "worker"))
        self.write_state()
        self._wait_workers(self.workers, spawned_ms, deadline)
        if self.mount and fuse_available():
            fuse = self._spawn(self._record("fuse", 0), "fuse")
            self.processes.append(fuse)
            self.write_state()
            self._wait(lambda r: is_mounted(fuse.address), f"the mount at {fuse.address}",
                       deadline, [fuse])
        self.write_state()

    @contextlib.contextmanager
    def _lock(self) -> typing.Iterator[None]:
        """Serialise concurrent starts on one directory."""
        with open(self.dir / ".lock", "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ClusterError(f"another cluster start is in progress in {self.dir}") from None
            yield

    def write_state(self) -> None:
        """Record what runs in D/cluster.json (atomically: status readers never see half)."""
        _write_json_atomic(self.state_path, {
            "version": 1,
            "dir": str(self.dir),
            "config": str(self.config_path),
            "master": self.master_address,
            "mount": self.mount,
            "launcher_pid": self.launcher_pid,
            "launcher_start_ticks": _start_ticks(self.launcher_pid) if self.launcher_pid else None,
            "processes": [p.to_json() for p in self.processes],
        })

    # ------------------------------------------------------------ readiness

    def report(self, timeout: float = 1.0) -> curvine_pb2.ReportReply | None:
        """The master's Report, or None when it does not answer within timeout."""
        if self._stub is None:
            self._channel = _channel(self.master_address, self.secret)
            self._stub = curvine_pb2_grpc.MasterServiceStub(self._channel)
        try:
            return self._stub.Report(curvine_pb2.Empty(), timeout=timeout)
        except grpc.RpcError:
            return None

    def _wait(self, ready: typing.Callable[[curvine_pb2.ReportReply | None], bool], what: str,
              deadline: float, watch: typing.Sequence[ProcessRecord],
              culprit: typing.Callable[[], ProcessRecord] | None = None) -> None:
        """Poll until ready(report); fail fast when a watched process dies.  On timeout
        the log shown is culprit()'s (the process that kept us waiting), else watch[0]'s."""
        while True:
            for p in watch:
                if not p.is_alive():
                    code = p.exit_code()
                    how = f"exited with code {code}" if code is not None and code >= 0 else (
                        f"was killed by signal {-code}" if code is not None else "exited")
                    raise ClusterError(f"{p.name} (pid {p.pid}) {how} while waiting for {what}; "
                                       f"last lines of {p.log}:", log_tail(p.log))
            if ready(self.report(timeout=1.0)):
                return
            if time.monotonic() >= deadline:
                p = culprit() if culprit else watch[0]
                raise ClusterError(f"timed out waiting for {what} ({p.name} is not ready); "
                                   f"last lines of {p.log}:", log_tail(p.log))
            time.sleep(0.1)

    def _wait_workers(self, workers: typing.Sequence[ProcessRecord], since_ms: int,
                      deadline: float) -> None:
        """Wait until the master reports these workers live (heard from after since_ms)."""
        def missing() -> list[ProcessRecord]:
            rep = self.report()
            live = _live_hosts(rep, since_ms) if rep is not None else set()
            return [w for w in workers if w.host not in live] or [self.master]

        self._wait(lambda rep: rep is not None and {w.host for w in workers} <= _live_hosts(rep, since_ms),
                   f"{len(workers)} worker(s) to register with the master at {self.master_address}",
                   deadline, [self.master, *workers], culprit=lambda: missing()[0])

    def wait_ready(self, timeout: float = START_TIMEOUT_S, since_ms: int = 0) -> None:
        """Wait until the master answers and every running worker is live in its report."""
        deadline = time.monotonic() + timeout
        self._wait(lambda r: r is not None, "the master to answer", deadline, [self.master])
        self._wait_workers([w for w in self.workers if w.is_alive()], since_ms, deadline)

    # ------------------------------------------------------------ faults (for tests)

    def kill_worker(self, i: int, sig: int = signal.SIGKILL, wait: bool | None = None) -> None:
        """Send sig to worker i; wait for it to exit when sig terminates (not SIGSTOP)."""
        self._signal(self.workers[i], sig, wait)

    def kill_master(self, sig: int = signal.SIGKILL, wait: bool | None = None) -> None:
        self._signal(self.master, sig, wait)

    def _signal(self, p: ProcessRecord, sig: int, wait: bool | None) -> None:
        p.signal(sig)
        if wait if wait is not None else sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            if wait_dead([p], STOP_TIMEOUT_S):
                raise ClusterError(f"{p.name} (pid {p.pid}) did not exit after signal {sig}")
            if p.popen is not None:
                p.popen.wait()

    def restart_worker(self, i: int, timeout: float = START_TIMEOUT_S) -> ProcessRecord:
        """Stop worker i if it runs, start it again (same ports and data), wait until live."""
        since, new = self._respawn(self.workers[i], "worker")
        self._wait_workers([new], since, time.monotonic() + timeout)
        return new

    def restart_master(self, timeout: float = START_TIMEOUT_S) -> ProcessRecord:
        """Stop the master if it runs, start it again on its port and metadata, wait until
        every running worker has re-registered with it."""
        since, new = self._respawn(self.master, "master")
        self.wait_ready(timeout, since_ms=since)
        return new

    def _respawn(self, old: ProcessRecord, role: str) -> tuple[int, ProcessRecord]:
        terminate([old])
        since = int(time.time() * 1000)
        new = self._spawn(self._record(role, old.index), role)
        self.processes[self.processes.index(old)] = new
        self.write_state()
        return since, new

    # ------------------------------------------------------------ stopping

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> list[ProcessRecord]:
        """Stop everything (mount first, so it can flush to live workers); idempotent.

        Returns the processes that were still running.
        """
        running = [p for p in self.processes if p.is_alive()]
        _stop_ordered(self.processes, timeout)
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()
        return running

    def __enter__(self) -> "LocalCluster":
        if not self.processes:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _live_hosts(rep: curvine_pb2.ReportReply, since_ms: int) -> set[str]:
    """Hosts of live workers; with since_ms, only those heard from at or after it.

    The master reports last_heartbeat_ms as an age (ms since the last heartbeat), so a
    restarted worker counts only once its new process has been heard from.
    """
    now_ms = int(time.time() * 1000)
    return {w.address.host for w in rep.workers
            if w.state.lower() == "live" and (not since_ms or now_ms - w.last_heartbeat_ms >= since_ms)}


def _stop_ordered(procs: typing.Sequence[ProcessRecord], timeout: float) -> None:
    fuse = [p for p in procs if p.role == "fuse"]
    terminate(fuse, timeout)
    for p in fuse:
        detach(p.address)
    terminate([p for p in procs if p.role != "fuse"], timeout)


def stop_dir(directory: str | Path, timeout: float = STOP_TIMEOUT_S) -> list[ProcessRecord] | None:
    """Stop the cluster recorded in D/cluster.json (from any process); idempotent.

    Returns the processes that were running, or None when nothing was recorded.
    A ``--foreground`` launcher is asked to stop its own cluster first (it stops the
    daemons in order and removes cluster.json); anything left is then stopped here.
    """
    state = read_state(directory)
    if state is None:
        return None
    procs: list[ProcessRecord] = state["processes"]
    running = [p for p in procs if p.is_alive()]
    launcher = state.get("launcher_pid")
    if launcher and launcher != os.getpid() and pid_alive(launcher, state.get("launcher_start_ticks")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(launcher, signal.SIGTERM)
        deadline = time.monotonic() + 2 * timeout + 5
        while pid_alive(launcher, state.get("launcher_start_ticks")) and time.monotonic() < deadline:
            time.sleep(0.05)
    _stop_ordered(procs, timeout)
    with contextlib.suppress(FileNotFoundError):
        (Path(directory) / STATE_FILE).unlink()
    return running
