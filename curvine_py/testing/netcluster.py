"""A cluster across network-namespace hosts (curvine_py/testing/testhosts.py): the master (or
three, five with Raft: ``master_hosts``), workers and mounts each run inside a Host, bound
to its address.

Used by ``tests/multihost`` and ``bench/compare``; ``python -m curvine_py.testing.hostsctl up
--cluster DIR`` starts one by hand.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import signal
import sys
import time
import typing
from pathlib import Path

from curvine_py.cluster import ports as clusterports
from curvine_py.cluster.ports import PortPlan
from curvine_py.common import config as cfgmod
from curvine_py.common.mounttable import detach, is_mounted
from curvine_py.cluster.local import (
    _BOOTSTRAP, DEFAULT_MASTER_PORT, ROLE_MODULES, START_TIMEOUT_S, ClusterError, LocalCluster, log_tail,
)
from curvine_py.pb import curvine_pb2
from curvine_py.cluster.processes import ProcessRecord, terminate
from curvine_py.testing.testhosts import Host, Hosts

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client


class _Daemons(LocalCluster):
    """LocalCluster's bookkeeping (records, readiness waits, restarts, ordered stop) with
    each daemon started inside its Host and bound to that host's address.  Every namespace
    has its own ports, so the documented default ports are used on every host: each
    master listens on its host's 8995 (gRPC), 8996 (frames) and, of several, 8994 (Raft)."""

    def __init__(self, hosts: Hosts, dir: str | Path, master_hosts: list[Host], worker_hosts: list[Host],
                 secret: str, **kw: typing.Any) -> None:
        self.hosts = hosts
        self.master_host_list = master_hosts
        self.worker_host_list = worker_hosts
        # The secret is passed in the environment too: it must win over a CURVINE_CLUSTER_SECRET
        # the caller's environment may hold (the test suite sets one).
        super().__init__(dir, workers=len(worker_hosts), master_port=DEFAULT_MASTER_PORT,
                         masters=len(master_hosts), bind=master_hosts[0].ip,
                         env={"CURVINE_CLUSTER_SECRET": secret}, **kw)
        self.secret = secret
        self.mounts: dict[int, tuple[Host, str, tuple[str, ...]]] = {}   # fuse index -> where

    def _plan_ports(self, master_port: int | None, base_port: int | None) -> PortPlan:
        """Workers as documented for one master; every master on the same ports (each on
        its own host), Raft on the configured default."""
        plan = clusterports.documented(1, self.n_workers, master_port or DEFAULT_MASTER_PORT, base_port)
        raft = cfgmod.MasterConfig().raft_port if self.n_masters > 1 else 0
        return dataclasses.replace(plan, masters=(dataclasses.replace(plan.masters[0], raft=raft),) * self.n_masters)

    def master_ip(self, i: int) -> str:
        return self.master_host_list[i].ip

    def master_bind(self, i: int) -> str:
        return self.master_host_list[i].ip

    def worker_host(self, i: int) -> str:
        return self.worker_host_list[i].name

    def effective_config(self) -> cfgmod.Config:
        cfg = super().effective_config()
        cfg.cluster.secret = self.secret
        cfg.worker.bind = cfg.worker.ip = self.worker_host_list[0].ip
        cfg.client.host = ""   # clients here are on hosts of their own (CURVINE_CLIENT_HOST)
        return cfg

    def prepare(self) -> None:
        """Write D/curvine.toml afresh (addresses differ per run), then LocalCluster's layout."""
        self.dir.mkdir(parents=True, exist_ok=True)
        header = ("# Written by curvine_py.testing.testhosts for a cluster across network-namespace hosts.\n"
                  f"# Masters on {', '.join(h.name for h in self.master_host_list)}; workers on "
                  f"{', '.join(h.name for h in self.worker_host_list)}.\n\n")
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(header + cfgmod.to_toml(self.effective_config()))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.config_path)
        secret = self.secret
        super().prepare()
        self.secret = secret

    def _check_ports(self) -> None:
        """The hosts' namespaces are fresh: nothing else can hold their ports."""

    def _move_taken_ports(self) -> None:
        """(Nor are there taken ones to move.)"""

    def _command(self, role: str, i: int) -> list[str]:
        boot = _BOOTSTRAP.format(prog=f"curvine-{role}", die_with_parent=self.die_with_parent,
                                 parent=os.getpid(), module=ROLE_MODULES[role])
        argv = [sys.executable, "-c", boot, "--config", str(self.config_path)]
        if role == "master":
            return self.master_host_list[i].wrap(argv + [*self.master_flags(i), *self.tls_flags(self.master_name(i)),
                                                         *self.extra_master_flags])
        if role == "worker":
            h = self.worker_host_list[i]
            rpc, data = self.worker_ports(i)
            return h.wrap(argv + [
                "--worker-master", self.master_address, "--worker-bind", h.ip, "--worker-ip", h.ip,
                "--worker-host", h.name, "--worker-rpc-port", str(rpc), "--worker-data-port", str(data),
                "--worker-dirs", self.worker_dir_spec(i),
                "--worker-metrics-port", str(self.metrics_port("worker", i)), *self.tls_flags(f"worker{i}"),
                *self.extra_worker_flags])
        host, mountpoint, extra = self.mounts[i]
        return host.wrap(argv[:3] + [mountpoint, "--master", self.master_address, "--config",
                                     str(self.config_path), "--client-host", host.name,
                                     "--foreground", *extra])

    def _record(self, role: str, i: int) -> ProcessRecord:
        if role == "worker":
            h = self.worker_host_list[i]
            rpc, data = self.worker_ports(i)
            return ProcessRecord(role, f"worker{i}", i, f"{h.ip}:{rpc}", str(self.dir / "logs" / f"worker{i}.log"),
                                 data_address=f"{h.ip}:{data}", host=h.name,
                                 metrics=f"{h.ip}:{self.metrics_port('worker', i)}")
        if role == "fuse":
            host, mountpoint, _ = self.mounts[i]
            return ProcessRecord(role, f"fuse{i}", i, mountpoint, str(self.dir / "logs" / f"fuse{i}.log"),
                                 host=host.name)
        return dataclasses.replace(super()._record(role, i), host=self.master_host_list[i].name)

    def _spawn(self, rec: ProcessRecord, role: str) -> ProcessRecord:
        rec = super()._spawn(rec, role)
        self.hosts.track_pid(rec.pid)
        return rec


class NetCluster:
    """A curvine cluster whose masters, workers and mounts each run inside a Host.

    ``master_hosts=(0, 1, 2)`` starts three masters replicating by Raft (docs/ha.md), one
    per host; workers and clients are given all three addresses.  Attributes not defined
    here (``processes``, ``workers``, ``masters``, ``wait_ready``, ...) are the underlying
    LocalCluster's.
    """

    def __init__(self, hosts: Hosts, dir: str | Path, master_hosts: typing.Sequence[int] = (0,),
                 worker_hosts: typing.Sequence[int] = (1, 2), extra_master_flags: typing.Sequence[str] = (),
                 extra_worker_flags: typing.Sequence[str] = (), secret: str | None = None,
                 capacity: int | str | None = None, die_with_parent: bool = True, tls: bool = False,
                 tls_data: bool = False) -> None:
        """tls: mutual TLS (common/tls.py), certificates under dir/tls; tls_data: on the
        block-data channel too."""
        self.hosts = hosts
        self._d = _Daemons(hosts, dir, [hosts[i] for i in master_hosts], [hosts[i] for i in worker_hosts],
                           secret or secrets.token_hex(16), capacity=capacity,
                           extra_master_flags=extra_master_flags, extra_worker_flags=extra_worker_flags,
                           die_with_parent=die_with_parent, tls=tls, tls_data=tls_data)
        self.dir = self._d.dir
        self.config_path = self._d.config_path

    def __getattr__(self, name: str) -> typing.Any:
        if name == "_d":   # not yet set (a failed __init__): no endless recursion
            raise AttributeError(name)
        return getattr(self._d, name)

    @property
    def master_address(self) -> str:
        return self._d.master_address

    @property
    def secret(self) -> str:
        return self._d.secret

    def worker_host(self, i: int) -> Host:
        """The Host worker i runs on."""
        return self._d.worker_host_list[i]

    def master_host(self, i: int = 0) -> Host:
        """The Host master i runs on."""
        return self._d.master_host_list[i]

    def worker_data_dir(self, i: int) -> Path:
        return self.dir / f"worker{i}" / "data"

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = START_TIMEOUT_S) -> "NetCluster":
        """Start the master and every worker; wait until all workers are registered and live."""
        self.hosts.track_cluster(str(self.dir))
        self._d.start(timeout)
        return self

    def stop(self) -> None:
        """Stop the mounts, then workers and master; idempotent."""
        self._d.stop()

    def __enter__(self) -> "NetCluster":
        if not self._d.processes:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill_worker(self, i: int, sig: int = signal.SIGKILL) -> None:
        self._d.kill_worker(i, sig)

    def restart_worker(self, i: int) -> None:
        """Start worker i again (same host, ports and data dir); wait until it is live."""
        self._d.restart_worker(i)

    def kill_master(self, i: int = 0, sig: int = signal.SIGKILL) -> None:
        """Send sig to master i (``kill_master(signal.SIGSTOP)``: the single master)."""
        self._d.kill_master(i, sig)

    def restart_master(self, i: int = 0, wait: bool = True) -> None:
        """Start master i again on its host and metadata; wait until every running worker
        re-registered (one master) or until it rejoined the group and the leader reports
        every running worker live (several).  wait=False only starts it (all masters of
        a group that lost its majority: start each, then ``wait_ready``)."""
        self._d.restart_master(i, wait=wait)

    def master_status(self, i: int = 0, timeout: float = 1.0) -> curvine_pb2.MasterStatusReply | None:
        """Master i's MasterStatus (role, term, indexes), or None when it does not answer."""
        return self._d.master_status(i, timeout)

    def leader_index(self, timeout: float = 10.0) -> int:
        """Which master is the ready leader, waiting up to timeout (ClusterError after)."""
        return self._d.leader_index(timeout)

    @contextlib.contextmanager
    def partitioned(self, host: Host | int) -> typing.Iterator[Host]:
        """The host cut off for the with block (``Host.cut``: every packet to or from it
        dropped silently, a partition rather than a refused connection), restored after
        it, also when the block fails; ``c.partitioned(c.master_host(i))`` cuts master i."""
        h = self.hosts[host] if isinstance(host, int) else host
        h.cut()
        try:
            yield h
        finally:
            h.restore()

    def report(self, timeout: float = 5.0) -> curvine_pb2.ReportReply:
        """The leader's Report; ClusterError when no master answers it within timeout."""
        rep = self._d.report(timeout=timeout)
        if rep is None:
            raise ClusterError(f"no master of {self.master_address} answered within {timeout} s")
        return rep

    # ------------------------------------------------------------ mounts

    def mount(self, host: int, mountpoint: str | Path, *extra_flags: str) -> Path:
        """Mount the cluster at mountpoint, the mount daemon running inside hosts[host] with
        that host's identity; returns once the mount shows in this process's mount table."""
        mp = Path(mountpoint).absolute()
        mp.mkdir(parents=True, exist_ok=True)
        index = max(self._d.mounts, default=-1) + 1
        self._d.mounts[index] = (self.hosts[host], str(mp), tuple(extra_flags))
        self.hosts.track_mount(str(mp))
        rec = self._d._spawn(self._d._record("fuse", index), "fuse")
        self._d.processes.append(rec)
        self._d.write_state()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not is_mounted(str(mp)):
            if not rec.is_alive() or time.monotonic() >= deadline:
                how = "exited" if not rec.is_alive() else "did not mount in time"
                self.unmount(mp)
                raise ClusterError(f"the mount daemon on {self.hosts[host].name} {how}; "
                                   f"last lines of {rec.log}:", log_tail(rec.log))
            time.sleep(0.05)
        return mp

    def unmount(self, mountpoint: str | Path) -> None:
        """Stop the mount daemon serving mountpoint (SIGTERM unmounts) and detach what is left."""
        mp = str(Path(mountpoint).absolute())
        recs = [p for p in self._d.processes if p.role == "fuse" and p.address == mp]
        terminate(recs)
        detach(mp)
        self._d.processes = [p for p in self._d.processes if p not in recs]
        self._d.write_state()

    # ------------------------------------------------------------ clients

    def client_config(self, host: int | None = None) -> cfgmod.Config:
        """This cluster's client settings; host identity hosts[host].name (None: the gateway's)."""
        cfg = cfgmod.Config()
        cfgmod.load_file(cfg, self.config_path)
        cfg.client.master = self.master_address
        cfg.client.host = self.hosts[host].name if host is not None else f"{self.hosts.id}gw"
        cfg.client.retry_s = 30.0
        cfg.cluster.secret = self.secret
        return cfg

    def client(self, host: int | None = None) -> "Client":
        """An SDK client in this process (the root namespace reaches every host) that
        identifies itself as hosts[host]: it prefers that host's replicas and reads them
        from their block files (short-circuit; the hosts share this machine's disks)."""
        from curvine_py.sdk import Client
        return Client(master=self.master_address, config=self.client_config(host))
