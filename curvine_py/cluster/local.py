"""A whole cluster on one machine: 1 master (or 3, 5 with Raft), N workers and an optional
mount, as processes.

Used by ``cv cluster start|stop|status`` and by the test suite.  Each daemon is a
separate process in its own session, so a Ctrl-C aimed at the launcher reaches only the
launcher, which then stops the daemons in order (mount, then workers and masters).
Daemons are started by importing their ``main`` in a fresh interpreter rather than
being imported here: this module must never load master or worker code into the
caller's process (one process, one role).

Layout of a cluster directory D (all paths absolute once started)::

    D/curvine.toml        shared settings, written once; every daemon reads it (--config)
    D/cluster.json        what is running: role, pid, address, log of each process
    D/logs/<name>.log     stdout+stderr of master (master0..), worker0.., fuse (appended across runs)
    D/master/             the single master's metadata directory
    D/master<i>/          master i's, with several masters (each its own SQLite and Raft journal)
    D/worker<i>/data      worker i's block directory

Process bookkeeping (records, liveness, stopping, ports) is in ``processes.py``; which
port each daemon gets is ``clusterports.py``.

Ports, from the first master's port P (default 8995) for K masters and N workers: master
i listens on P+2i (gRPC) and P+2i+1 (frames); worker i uses rpc port B+2i and data port
B+2i+1, where B defaults to P+2K (so 8997/8998, 8999/9000, ... with one master).  The
Prometheus /metrics ports follow the workers': M = B+2N, master i M+i, worker i M+K+i,
the mount M+K+N (9001, 9002/9003, 9004 with one master and two workers;
docs/metrics.md).  Several masters also get Raft ports R+i, R = M+K+N+1, and each is
started with ``--master-ip``, ``--master-raft-port`` and ``--master-raft-peers`` (every
master's ip:raft_port): three masters and two workers from 8995 take 8995-9000
(masters), 9001-9004 (workers), 9005-9010 (metrics), 9011-9013 (Raft).  Workers, the
mount and clients are given every master's gRPC address, comma-separated (docs/ha.md).

Each worker gets its own host identity ``<hostname>-w<i>`` so that two replicas can land
on two workers of one machine.  Clients using D/curvine.toml (the mount, ``cv --config``)
are on worker 0's host: everything here runs on one machine, as on an inference node that
is also a storage node, so they read and write worker 0's replicas without the network
(short-circuit reads and writes).

Readiness waits ask whichever master is the leader (``metagroup.MasterGroup``: a
follower answers NotLeader and names the leader); with one master that is the master.
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

from curvine_py.cluster import ports as clusterports
from curvine_py.cluster.ports import MasterPorts, PortPlan
from curvine_py.common import config as cfgmod
from curvine_py.common import tls as tlsmod
from curvine_py.common.mounttable import detach, is_mounted
from curvine_py.common.tls import Tls
from curvine_py.common.tls import load as load_tls
from curvine_py.client.metagroup import MasterGroup
from curvine_py.cluster.processes import (  # noqa: F401  (re-exported: the CLI and tests use them from here)
    LOCAL_IP, STOP_TIMEOUT_S, ProcessRecord, _start_ticks, free_ports, log_tail, pid_alive,
    port_in_use, terminate, wait_dead, wait_stopped,
)
from curvine_py.pb import curvine_pb2
from curvine_py.pb.methods import Master

DEFAULT_MASTER_PORT = 8995
DEFAULT_WORKERS = 2
DEFAULT_TLS = True    # `cv cluster start` of a new DIR: mutual TLS on metadata and control (docs/security.md)
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


def query_report(address: str, timeout: float = 1.0, secret: str = "",
                 tls: Tls | None = None) -> curvine_pb2.ReportReply | None:
    """The leader's Report (address: one master, or every master comma-separated); None
    when no master answers it within timeout."""
    with MasterGroup(cfgmod.addresses(address), secret, tls) as group:
        return group.call(Master.Report, curvine_pb2.Empty(), timeout)


# ---------------------------------------------------------------- the cluster


def daemon_secret(config_path: str | Path) -> str:
    """The cluster secret the daemons started with config_path use: the file, then the
    environment (CURVINE_CLUSTER_SECRET wins), as they load it."""
    return cfgmod.load(path=str(config_path)).cluster.secret


def daemon_tls(config_path: str | Path) -> Tls | None:
    """A client's TLS for the cluster whose daemons use config_path (None: TLS off)."""
    return load_tls(cfgmod.load(path=str(config_path)).tls, "client")


def ensure_tls(path: Path, tls_dir: Path, data: bool = False) -> None:
    """Turn TLS on in the config file at path, with the CA and the client certificate in
    tls_dir, if the file says nothing of TLS yet (the [tls] section as to_toml wrote it:
    every key at its default).  Users who set [tls] themselves keep their settings.
    data: the block-data channel too (off by default: it costs more than half the KV write
    and the remote reads, measured in docs/security.md)."""
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, path)
    if cfg.tls != cfgmod.TlsConfig():
        return
    text = path.read_text()
    section = (f'[tls]\nenabled = true\nca = "{tls_dir / "ca.pem"}"\ncert = "{tls_dir / "client.pem"}"\n'
               f'key = "{tls_dir / "client.key"}"\ndata = {"true" if data else "false"}\n')
    old = re.search(r"^\[tls\]\s*$(?:\n(?!\[).*)*", text, re.M)
    text = text[:old.start()] + section + text[old.end():] if old else text + "\n" + section
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


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
    """Start, watch and stop one master (or 3, 5), N workers and an optional mount on
    this machine.

    ``master_port=None`` picks free ports for everything (what tests want); the CLI passes
    8995.  ``masters`` > 1 (odd) starts that many masters replicating by Raft (docs/ha.md).
    ``die_with_parent`` makes the daemons exit when the creating thread's process dies,
    which keeps a killed test run or a killed ``--foreground`` launcher from leaving
    orphans.
    """

    def __init__(self, dir: str | Path, workers: int = DEFAULT_WORKERS,
                 master_port: int | None = None, capacity: int | str | None = None,
                 extra_master_flags: typing.Sequence[str] = (),
                 extra_worker_flags: typing.Sequence[str] = (),
                 *, masters: int = 1, base_port: int | None = None, bind: str = LOCAL_IP,
                 mount: str | None = None, die_with_parent: bool = False,
                 env: typing.Mapping[str, str] | None = None, tls: bool = False, tls_data: bool = False) -> None:
        """tls: turn mutual TLS on in a config that says nothing of it (a new cluster):
        a CA and every process's certificate under D/tls (common/tls.py); tls_data: on
        the block-data channel too."""
        if workers < 1:
            raise ClusterError("a cluster needs at least one worker")
        if masters < 1 or masters % 2 == 0:
            raise ClusterError(f"the number of masters must be odd (1, 3 or 5), not {masters}: "
                               "Raft needs a majority")
        self.dir = Path(dir).absolute()
        self.config_path = self.dir / CONFIG_FILE
        self.state_path = self.dir / STATE_FILE
        self.n_workers = workers
        self.n_masters = masters
        self.capacity = cfgmod.parse_size(capacity) if capacity is not None else None
        self.extra_master_flags = list(extra_master_flags)
        self.extra_worker_flags = list(extra_worker_flags)
        self.bind = bind
        self.ip = LOCAL_IP if bind in ("0.0.0.0", "") else bind
        self.mount = str(Path(mount).absolute()) if mount else None
        self.die_with_parent = die_with_parent
        self.env = dict(env or {})
        self.ports = self._plan_ports(master_port, base_port)
        self.processes: list[ProcessRecord] = []
        self.launcher_pid: int | None = None  # set by a --foreground launcher
        self._group: MasterGroup | None = None
        self.hostname = cfgmod.host_identity("")
        self.secret = ""  # the cluster secret, read (or created) by prepare()
        self.want_tls, self.want_tls_data = tls, tls_data
        self.tls_dir = self.dir / "tls"
        self.tls: Tls | None = None   # the client identity of this cluster's tools, read by prepare()

    def _plan_ports(self, master_port: int | None, base_port: int | None) -> PortPlan:
        """Explicit ports follow the documented scheme; master_port=None means "any free
        ports" for every master (and every worker, unless base_port is given)."""
        if master_port is None:
            return clusterports.picked(self.n_masters, self.n_workers, self.bind, base_port)
        return clusterports.documented(self.n_masters, self.n_workers, master_port, base_port)

    # ------------------------------------------------------------ layout

    @property
    def master_port(self) -> int:
        """The first master's gRPC port (the only one's, with one master)."""
        return self.ports.masters[0].grpc

    @property
    def frame_port(self) -> int:
        return self.ports.masters[0].frame

    def master_ports(self, i: int) -> MasterPorts:
        return self.ports.masters[i]

    def master_ip(self, i: int) -> str:
        """The address master i is reached at (every master shares this machine's)."""
        return self.ip

    def master_bind(self, i: int) -> str:
        """The address master i listens on."""
        return self.bind

    @property
    def master_addresses(self) -> tuple[str, ...]:
        """Every master's gRPC address, master 0 first."""
        return tuple(f"{self.master_ip(i)}:{self.master_ports(i).grpc}" for i in range(self.n_masters))

    @property
    def master_address(self) -> str:
        """What clients and workers are given: the master's address, or every master's
        comma-separated (config.addresses reads either)."""
        return ",".join(self.master_addresses)

    def raft_peers(self) -> str:
        """Every master's ip:raft_port, comma-separated ("" for a single master)."""
        if self.n_masters == 1:
            return ""
        return ",".join(f"{self.master_ip(i)}:{self.master_ports(i).raft}" for i in range(self.n_masters))

    def meta_dir(self, i: int) -> Path:
        """D/master for a single master (as ever), D/master<i> for each of several."""
        return self.dir / ("master" if self.n_masters == 1 else f"master{i}")

    def master_name(self, i: int) -> str:
        return "master" if self.n_masters == 1 else f"master{i}"

    @property
    def masters(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == "master"]

    @property
    def master(self) -> ProcessRecord:
        """The first master's record (the only master's, with one)."""
        return self.masters[0]

    @property
    def workers(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == "worker"]

    def worker_ports(self, i: int) -> tuple[int, int]:
        """(rpc, data) ports of worker i."""
        return self.ports.workers[i]

    def metrics_port(self, role: str, i: int = 0) -> int:
        """The /metrics port of a daemon (role master i, worker i, or fuse)."""
        if role == "master":
            return self.master_ports(i).metrics
        return self.ports.worker_metrics[i] if role == "worker" else self.ports.mount_metrics

    def worker_host(self, i: int) -> str:
        return f"{self.hostname}-w{i}"

    def worker_dir_spec(self, i: int) -> str:
        tier = f"SSD:{self.capacity}" if self.capacity else "SSD"
        return f"[{tier}]{self.dir / f'worker{i}' / 'data'}"

    def effective_config(self) -> cfgmod.Config:
        """The settings written to D/curvine.toml; per-daemon values show master0's and
        worker0's."""
        cfg = cfgmod.Config()
        cfg.master.bind = self.bind
        cfg.master.port = self.master_port
        cfg.master.frame_port = self.frame_port
        cfg.master.meta_dir = str(self.meta_dir(0))
        if self.n_masters > 1:
            cfg.master.ip = self.master_ip(0)
            cfg.master.raft_port = self.master_ports(0).raft
            cfg.master.raft_peers = self.raft_peers()
        cfg.worker.master = self.master_address
        cfg.worker.bind = self.bind
        cfg.worker.ip = self.ip
        cfg.worker.rpc_port, cfg.worker.data_port = self.worker_ports(0)
        cfg.worker.dirs = [self.worker_dir_spec(0)]
        cfg.client.master = self.master_address
        cfg.client.host = self.worker_host(0)   # this machine; see the module docstring
        return cfg

    def _boot(self, role: str) -> list[str]:
        """The interpreter that runs role's main (see _BOOTSTRAP)."""
        boot = _BOOTSTRAP.format(prog=f"curvine-{role}", die_with_parent=self.die_with_parent,
                                 parent=os.getpid(), module=ROLE_MODULES[role])
        return [sys.executable, "-c", boot]

    def master_flags(self, i: int) -> list[str]:
        """Master i's own flags: ports, metadata dir, and its place in the Raft group."""
        ports = self.master_ports(i)
        flags = ["--master-port", str(ports.grpc), "--master-bind", self.master_bind(i),
                 "--master-frame-port", str(ports.frame), "--master-meta-dir", str(self.meta_dir(i)),
                 "--master-metrics-port", str(ports.metrics)]
        if self.n_masters > 1:
            flags += ["--master-ip", self.master_ip(i), "--master-raft-port", str(ports.raft),
                      "--master-raft-peers", self.raft_peers()]
        return flags

    def _command(self, role: str, i: int) -> list[str]:
        """argv of a daemon: the bootstrap interpreter plus the role's flags."""
        argv = self._boot(role)
        if role == "master":
            return argv + ["--config", str(self.config_path), *self.master_flags(i),
                           *self.tls_flags(self.master_name(i)), *self.extra_master_flags]
        if role == "worker":
            rpc, data = self.worker_ports(i)
            return argv + ["--config", str(self.config_path),
                           "--worker-master", self.master_address, "--worker-bind", self.bind,
                           "--worker-ip", self.ip, "--worker-host", self.worker_host(i),
                           "--worker-rpc-port", str(rpc), "--worker-data-port", str(data),
                           "--worker-dirs", self.worker_dir_spec(i),
                           "--worker-metrics-port", str(self.metrics_port("worker", i)),
                           *self.tls_flags(f"worker{i}"), *self.extra_worker_flags]
        if role == "fuse":
            assert self.mount is not None
            return argv + [self.mount, "--master", self.master_address, "--config", str(self.config_path),
                           "--fuse-metrics-port", str(self.metrics_port("fuse")), "--foreground"]
        raise ValueError(role)

    def _record(self, role: str, i: int) -> ProcessRecord:
        if role == "master":
            name, ip = self.master_name(i), self.master_ip(i)
            raft = self.master_ports(i).raft
            return ProcessRecord(role, name, i, self.master_addresses[i], str(self.dir / "logs" / f"{name}.log"),
                                 metrics=f"{ip}:{self.metrics_port(role, i)}", raft=f"{ip}:{raft}" if raft else "")
        metrics = f"{self.ip}:{self.metrics_port(role, i)}"
        if role == "worker":
            rpc, data = self.worker_ports(i)
            return ProcessRecord(role, f"worker{i}", i, f"{self.ip}:{rpc}",
                                 str(self.dir / "logs" / f"worker{i}.log"),
                                 data_address=f"{self.ip}:{data}", host=self.worker_host(i), metrics=metrics)
        return ProcessRecord(role, "fuse", 0, self.mount or "", str(self.dir / "logs" / "fuse.log"), metrics=metrics)

    def prepare(self) -> None:
        """Create the directory tree and D/curvine.toml (only when absent: users may edit it)."""
        metas = [self.meta_dir(i).name for i in range(self.n_masters)]
        for sub in ("logs", *metas, *(f"worker{i}/data" for i in range(self.n_workers))):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if self.mount:
            Path(self.mount).mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            header = ("# Written by `cv cluster start`; edit freely, it is not overwritten.\n"
                      "# Every daemon of this cluster reads it (--config).  Per-daemon values\n"
                      "# (host, ports, data dir) are passed to each as flags; the [master] and\n"
                      "# [worker] sections show master0's and worker0's (port layout: docs/cli.md).\n\n")
            tmp = self.config_path.with_suffix(".tmp")
            tmp.write_text(header + cfgmod.to_toml(self.effective_config()))
            os.replace(tmp, self.config_path)
        ensure_secret(self.config_path)
        self.secret = daemon_secret(self.config_path)
        if self.want_tls:
            ensure_tls(self.config_path, self.tls_dir, self.want_tls_data)
        self._prepare_certificates()

    def _prepare_certificates(self) -> None:
        """With TLS on in the config: the CA (when absent) and each process's certificate,
        issued here up front (a daemon could issue its own, but two clients issuing one
        file at once could pair one's certificate with the other's key)."""
        tls = cfgmod.load(path=str(self.config_path)).tls
        if not tls.enabled:
            self.tls = None
            return
        ca = Path(tls.ca)
        if not ca.exists():
            tlsmod.create_ca(ca)
        names = [("client", "client")] + [(self.master_name(i), "master") for i in range(self.n_masters)] \
            + [(f"worker{i}", "worker") for i in range(self.n_workers)]
        for name, role in names:
            cert = Path(tls.cert) if name == "client" and tls.cert else self.tls_dir / f"{name}.pem"
            if not cert.exists():
                key = Path(tls.key) if name == "client" and tls.key else tlsmod.key_path_of(cert)
                tlsmod.issue(ca, f"{name} of {self.dir}", role, cert, key)
        self.tls = daemon_tls(self.config_path)

    def tls_flags(self, name: str) -> list[str]:
        """A daemon's own certificate (with TLS on), as flags."""
        if self.tls is None:
            return []
        cert = self.tls_dir / f"{name}.pem"
        return ["--tls-cert", str(cert), "--tls-key", str(tlsmod.key_path_of(cert))]

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
        clash = self.ports.clash()
        if clash:
            raise ClusterError(f"two daemons would share a port ({clash}); "
                               "choose other ports (--master-port / --base-port; make run ARGS=...)")
        for port, what in self.ports.labelled():
            if port_in_use(self.bind, port):
                raise self._in_use(port, what)

    def _in_use(self, port: int, what: str) -> ClusterError:
        return ClusterError(f"port {port} ({what}) on {self.bind} is already in use; "
                            "choose other ports (--master-port / --base-port; make run ARGS=...)")

    def _move_taken_ports(self) -> None:
        """A port of the plan that another process holds (a leftover mount's metrics, say)
        becomes a free one, said in one line each and shown in the status table: every
        port but the first master's, which clients are given, can move (workers register
        theirs, metrics are found through the master)."""
        keep = self.ports.masters[0].grpc
        for port, what in self.ports.labelled():   # that one taken: the one error, before any port moved
            if port == keep and port_in_use(self.bind, port):
                raise self._in_use(port, what)
        taken = [(p, what) for p, what in self.ports.labelled() if p != keep and port_in_use(self.bind, p)]
        if not taken:
            return
        fresh = free_ports(len(taken), self.bind)
        for (port, what), new in zip(taken, fresh):
            print(f"port {port} ({what}) is taken: using {new}", file=sys.stderr)
        self.ports = self.ports.moved({port: new for (port, _), new in zip(taken, fresh)})

    def start(self, timeout: float = START_TIMEOUT_S) -> "LocalCluster":
        """Start every daemon and wait until the master (the leader, of several) reports
        all workers live.

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
            self._move_taken_ports()
            self._check_ports()
            try:
                self._start_all(timeout)
            except BaseException:
                self.stop()
                raise
        return self

    def _start_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.processes = [self._spawn(self._record("master", i), "master") for i in range(self.n_masters)]
        self.write_state()
        self._wait(lambda: self.report() is not None, self._answer_what(), deadline, self.masters)
        spawned_ms = int(time.time() * 1000)
        for i in range(self.n_workers):
            self.processes.append(self._spawn(self._record("worker", i), "worker"))
        self.write_state()
        self._wait_workers(self.workers, spawned_ms, deadline)
        if self.mount and fuse_available():
            fuse = self._spawn(self._record("fuse", 0), "fuse")
            self.processes.append(fuse)
            self.write_state()
            self._wait(lambda: is_mounted(fuse.address), f"the mount at {fuse.address}",
                       deadline, [fuse])
        self.write_state()

    def _answer_what(self) -> str:
        return "the master to answer" if self.n_masters == 1 else "a leader to be elected and answer"

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
            "masters": list(self.master_addresses),
            "mount": self.mount,
            "launcher_pid": self.launcher_pid,
            "launcher_start_ticks": _start_ticks(self.launcher_pid) if self.launcher_pid else None,
            "processes": [p.to_json() for p in self.processes],
        })

    # ------------------------------------------------------------ readiness

    @property
    def group(self) -> MasterGroup:
        """Channels to every master, opened on first use (the secret is known by then)."""
        if self._group is None:
            self._group = MasterGroup(self.master_addresses, self.secret, self.tls)
        return self._group

    def report(self, timeout: float = 1.0) -> curvine_pb2.ReportReply | None:
        """The leader's Report, or None when no master answers it within timeout."""
        return typing.cast("curvine_pb2.ReportReply | None",
                           self.group.call(Master.Report, curvine_pb2.Empty(), timeout))

    def master_status(self, i: int, timeout: float = 1.0) -> curvine_pb2.MasterStatusReply | None:
        """Master i's MasterStatus (role, term, indexes), or None when it does not answer."""
        return self.group.status(i, timeout)

    def leader_index(self, timeout: float = 10.0) -> int:
        """Which master is the ready leader, waiting up to timeout for one; ClusterError
        when none is (an election that does not end, a minority left)."""
        found: list[int] = []

        def elected() -> bool:
            i = self.group.leader()
            if i is not None:
                found.append(i)
            return i is not None
        self._wait(elected, "a ready leader", time.monotonic() + timeout, [])
        return found[-1]

    def _wait(self, ready: typing.Callable[[], bool], what: str,
              deadline: float, watch: typing.Sequence[ProcessRecord],
              culprit: typing.Callable[[], ProcessRecord] | None = None) -> None:
        """Poll until ready(); fail fast when a watched process dies.  On timeout the log
        shown is culprit()'s (the process that kept us waiting), else watch[0]'s."""
        while True:
            for p in watch:
                if not p.is_alive():
                    code = p.exit_code()
                    how = f"exited with code {code}" if code is not None and code >= 0 else (
                        f"was killed by signal {-code}" if code is not None else "exited")
                    raise ClusterError(f"{p.name} (pid {p.pid}) {how} while waiting for {what}; "
                                       f"last lines of {p.log}:", log_tail(p.log))
            if ready():
                return
            if time.monotonic() >= deadline:
                p = culprit() if culprit else watch[0] if watch else self.masters[0]
                raise ClusterError(f"timed out waiting for {what} ({p.name} is not ready); "
                                   f"last lines of {p.log}:", log_tail(p.log))
            time.sleep(0.1)

    def _watched_masters(self) -> list[ProcessRecord]:
        """The masters a wait fails on when they die: the one, or those of several still
        running (a test may have killed the others on purpose)."""
        return self.masters if self.n_masters == 1 else [m for m in self.masters if m.is_alive()]

    def _wait_workers(self, workers: typing.Sequence[ProcessRecord], since_ms: int,
                      deadline: float) -> None:
        """Wait until the leader reports these workers live (heard from after since_ms)."""
        def missing() -> list[ProcessRecord]:
            rep = self.report()
            live = _live_hosts(rep, since_ms) if rep is not None else set()
            return [w for w in workers if w.host not in live] or [self.master]

        def registered() -> bool:
            rep = self.report()
            return rep is not None and {w.host for w in workers} <= _live_hosts(rep, since_ms)

        where = f"the master at {self.master_address}" if self.n_masters == 1 else "the leader"
        self._wait(registered, f"{len(workers)} worker(s) to register with {where}",
                   deadline, [*self._watched_masters(), *workers], culprit=lambda: missing()[0])

    def wait_ready(self, timeout: float = START_TIMEOUT_S, since_ms: int = 0) -> None:
        """Wait until the master (the leader) answers and every running worker is live in
        its report."""
        deadline = time.monotonic() + timeout
        self._wait(lambda: self.report() is not None, self._answer_what(), deadline, self._watched_masters())
        self._wait_workers([w for w in self.workers if w.is_alive()], since_ms, deadline)

    # ------------------------------------------------------------ faults (for tests)

    def kill_worker(self, i: int, sig: int = signal.SIGKILL, wait: bool | None = None) -> None:
        """Send sig to worker i; wait for it to exit when sig terminates (not SIGSTOP)."""
        self._signal(self.workers[i], sig, wait)

    def kill_master(self, i: int = 0, sig: int = signal.SIGKILL, wait: bool | None = None) -> None:
        """Send sig to master i.  ``kill_master(signal.SIGSTOP)``, a signal first, is the
        single-master form (signals are ``signal.Signals``, never a master's index)."""
        if isinstance(i, signal.Signals):
            i, sig = 0, i
        self._signal(self.masters[i], sig, wait)

    def _signal(self, p: ProcessRecord, sig: int, wait: bool | None) -> None:
        p.signal(sig)
        if sig == signal.SIGSTOP and not wait_stopped(p, STOP_TIMEOUT_S):
            raise ClusterError(f"{p.name} (pid {p.pid}) did not stop after SIGSTOP")
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

    def restart_master(self, i: int = 0, timeout: float = START_TIMEOUT_S, wait: bool = True) -> ProcessRecord:
        """Stop master i if it runs, start it again on its ports and metadata, and wait:
        one master, until every running worker has re-registered with it; several, until
        it has rejoined the group (it answers and knows the leader) and the leader reports
        every running worker live.  wait=False only starts it: restarting a group that
        lost its majority is every master started first, then ``wait_ready`` (none of
        them can rejoin a group until enough of them run)."""
        since, new = self._respawn(self.masters[i], "master")
        if not wait:
            return new
        if self.n_masters == 1:
            self.wait_ready(timeout, since_ms=since)
            return new
        deadline = time.monotonic() + timeout
        self._wait(lambda: _joined(self.master_status(i)), f"{new.name} to rejoin the group", deadline, [new])
        self.wait_ready(max(0.0, deadline - time.monotonic()))
        return new

    def _respawn(self, old: ProcessRecord, role: str) -> tuple[int, ProcessRecord]:
        terminate([old])
        self._reread_tls()
        since = int(time.time() * 1000)
        new = self._spawn(self._record(role, old.index), role)
        self.processes[self.processes.index(old)] = new
        self.write_state()
        return since, new

    def _reread_tls(self) -> None:
        """The tools' client identity read again from its files, as a new process would:
        a restart may be one step of a certificate's or the CA's rotation (docs/security.md),
        after which the restarted process presents what the old files could not verify."""
        if self.tls is None:
            return
        self.tls = daemon_tls(self.config_path)
        if self._group is not None:
            self._group.close()
            self._group = None

    # ------------------------------------------------------------ stopping

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> list[ProcessRecord]:
        """Stop everything (mount first, so it can flush to live workers); idempotent.

        Returns the processes that were still running.
        """
        running = [p for p in self.processes if p.is_alive()]
        _stop_ordered(self.processes, timeout)
        if self._group is not None:
            self._group.close()
            self._group = None
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()
        return running

    def __enter__(self) -> "LocalCluster":
        if not self.processes:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _joined(status: curvine_pb2.MasterStatusReply | None) -> bool:
    """A master that answers and is part of a working group: the leader, or a follower
    that knows it."""
    return status is not None and (status.role == "leader" or bool(status.leader))


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
