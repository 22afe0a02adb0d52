"""Many hosts on one machine: network namespaces on a shared bridge (a cluster across them:
curvine_py/testing/netcluster.py).

Used by ``tests/multihost`` and ``bench/compare``, and by hand::

    python -m curvine_py.testing.hostsctl up --hosts 4 [--cluster DIR]   # leaves them running
    python -m curvine_py.testing.hostsctl status
    python -m curvine_py.testing.hostsctl down                           # also reaps crashed runs

Layout of one run (id = 4 random hex digits, prefix ``cvt`` by default)::

    bridge  <prefix><id>br      in the root namespace, address 10.213.X.1/24 (gateway_ip)
    host i  netns <prefix><id>h<i>, veth <prefix><id>v<i> on the bridge, its peer (eth0 inside)
            has 10.213.X.(10+i)/24; ``lo`` is up.  The netns name is the host's identity.

X is a /24 no interface or route of this machine uses, so two runs coexist.  Daemons are
started with ``nsenter --net=...`` (not ``ip netns exec``, which also unshares the mount
namespace): a FUSE mount made inside a host is then visible to the test process.  ``cut()``
takes a host's bridge port down: its packets are dropped silently (a partition, not a
refused connection) until ``restore()``.

Teardown survives failures: every run records what it creates (and every pid and mount it
starts) in ``/run/curvine-testhosts/<id>.json`` *before* creating it, with the creating
pid.  ``close()`` (context exit, atexit) kills the processes, lazily unmounts, deletes the
namespaces and the bridge.  A run whose creator died (a killed pytest) is reaped by the
next ``Hosts()`` and by ``down``.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import time
import typing
from pathlib import Path

from curvine_py.common.mounttable import detach, is_mounted
from curvine_py.cluster.local import STATE_FILE
from curvine_py.cluster.processes import _start_ticks, pid_alive

STATE_DIR = Path(os.environ.get("CURVINE_TESTHOSTS_DIR", "/run/curvine-testhosts"))
NETNS_DIR = Path("/var/run/netns")
SUBNET_PREFIX = "10.213"
HOST_OFFSET = 10              # host i has .(10+i); the gateway (root namespace) has .1
MAX_HOSTS = 200
IFNAMSIZ = 15                 # Linux interface names are at most 15 characters
KILL_WAIT_S = 5.0


class HostsError(Exception):
    """Namespaces or links could not be created or removed (one line for the user)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` in the root namespace; a failure raises HostsError with ip's message."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise HostsError(f"ip {' '.join(args)}: {r.stderr.strip() or f'exit {r.returncode}'}")
    return r


def unavailable_reason() -> str | None:
    """Why this machine cannot run network-namespace hosts, or None when it can."""
    if os.geteuid() != 0:
        return "network-namespace hosts need root"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    probe = f"cvprobe{os.getpid() % 100000}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns is unavailable here: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


# ---------------------------------------------------------------- state files


@contextlib.contextmanager
def _state_lock() -> typing.Iterator[None]:
    """Serialise subnet choice and reaping between concurrent runs on this machine."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def read_states() -> list[dict[str, typing.Any]]:
    out = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return out


def _write_state(state: dict[str, typing.Any]) -> None:
    path = STATE_DIR / f"{state['id']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)


def owner_alive(state: dict[str, typing.Any]) -> bool:
    return pid_alive(state.get("owner_pid"), state.get("owner_ticks"))


def _used_subnets() -> set[int]:
    """Third octets of 10.213.X.0/24 networks this machine (or a recorded run) uses."""
    used = {s["octet"] for s in read_states()}
    ours = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.0.0/16")
    for word in (_ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout).split():
        try:
            net = ipaddress.IPv4Network(word, strict=False)
        except ValueError:
            continue
        if net.subnet_of(ours):
            used.add(int(net.network_address.packed[2]))
        elif net.overlaps(ours):
            used.update(range(256))   # a wider route covers all of 10.213/16
    return used


def _new_id(prefix: str) -> str:
    """A run id no recorded run, namespace or link uses (a clash would make a failed
    creation tear down someone else's).  Called with the state lock held."""
    taken = " ".join([s["id"] for s in read_states()] + [_ip("netns", "list").stdout,
                                                          _ip("-o", "link").stdout])
    while True:
        run_id = prefix + secrets.token_hex(2)
        if run_id not in taken:
            return run_id


def teardown_state(state: dict[str, typing.Any]) -> list[str]:
    """Remove everything one run recorded: processes, mounts, namespaces, links, the file.

    Best effort and idempotent; returns what could not be removed (empty when clean).
    """
    problems: list[str] = []
    pids = [(p, t) for p, t in state.get("pids", []) if pid_alive(p, t)]
    for ns in state.get("netns", []):   # anything else still running inside a host
        r = _ip("netns", "pids", ns, check=False)
        pids += [(int(p), None) for p in r.stdout.split() if p.isdigit()]
    _kill_all(pids)
    for mp in state.get("mounts", []):
        detach(mp)
        if is_mounted(mp):
            problems.append(f"mount {mp} is still mounted")
    for ns in state.get("netns", []):
        if (NETNS_DIR / ns).exists():
            r = _ip("netns", "del", ns, check=False)
            if r.returncode != 0:
                problems.append(f"netns {ns}: {r.stderr.strip()}")
    for link in [*state.get("veths", []), state.get("bridge", "")]:
        if link and _ip("link", "show", link, check=False).returncode == 0:
            r = _ip("link", "del", link, check=False)   # a veth may vanish meanwhile with its netns
            if r.returncode != 0 and not any(gone in r.stderr for gone in ("Cannot find device", "No such device")):
                problems.append(f"link {link}: {r.stderr.strip()}")
    for directory in state.get("clusters", []):   # its cluster.json names dead processes now
        with contextlib.suppress(OSError):
            (Path(directory) / STATE_FILE).unlink()
    if not problems:
        with contextlib.suppress(FileNotFoundError):
            (STATE_DIR / f"{state['id']}.json").unlink()
    return problems


def _kill_all(pids: list[tuple[int, int | None]]) -> None:
    """SIGTERM each process group (then each pid), wait a little, SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, _ in pids:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, sig)
                    if sig == signal.SIGTERM:
                        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline and any(pid_alive(p, t) for p, t in pids):
            time.sleep(0.05)
        pids = [(p, t) for p, t in pids if pid_alive(p, t)]
        if not pids:
            return


def reap_stale(ids: typing.Collection[str] = (), kept: bool = False, force: bool = False) -> list[str]:
    """Tear down runs whose creator died; with kept, also the runs ``up`` left; with ids,
    only those runs.  A run whose creating process still runs (another test session) is
    left alone unless force.  Returns the ids removed."""
    removed = []
    with _state_lock():
        for state in read_states():
            if ids and state["id"] not in ids:
                continue
            dead = not owner_alive(state)
            if force or (dead and (kept or not state.get("keep"))):
                if not teardown_state(state):
                    removed.append(state["id"])
    return removed


# ---------------------------------------------------------------- hosts


class Host:
    """One network namespace with one address on the shared bridge."""

    def __init__(self, hosts: "Hosts", index: int, name: str, ip: str, veth: str) -> None:
        self._hosts = hosts
        self.index = index
        self.name = name
        self.ip = ip
        self.veth = veth          # its port on the bridge (root namespace side)

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.ip!r})"

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.name)

    def wrap(self, argv: typing.Sequence[str]) -> list[str]:
        """argv run in this host's network namespace only (mounts stay shared)."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]

    def run(self, argv: list[str], **kw: typing.Any) -> subprocess.CompletedProcess[typing.Any]:
        kw.setdefault("timeout", 60)
        return subprocess.run(self.wrap(argv), **kw)

    def popen(self, argv: list[str], **kw: typing.Any) -> subprocess.Popen[typing.Any]:
        """A process in this host; it leads its own process group, killed at teardown."""
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.wrap(argv), **kw)
        self._hosts.track_pid(p.pid)
        return p

    def cut(self) -> None:
        """Partition this host: its bridge port goes down, every packet to or from it is dropped."""
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        """Bring the host back; reachable at once (the failed ARP entries the cut left
        would otherwise drop the first packets to and from it for about a second)."""
        _ip("link", "set", self.veth, "up")
        self._hosts.wait_link(self)
        _ip("neigh", "flush", "to", self.ip, check=False)
        _ip("-n", self.name, "neigh", "flush", "all", check=False)
        for other in self._hosts.hosts:
            if other is not self:
                _ip("-n", other.name, "neigh", "flush", "to", self.ip, check=False)

    def is_cut(self) -> bool:
        return not link_up(self.veth)


def link_up(link: str) -> bool:
    """Whether link is administratively up (UP among its <flags>); False when it is gone."""
    out = _ip("-o", "link", "show", link, check=False).stdout
    flags = out[out.find("<") + 1:out.find(">")].split(",") if "<" in out else []
    return "UP" in flags


class Hosts:
    """n hosts (network namespaces) on one bridge whose root-namespace address is gateway_ip.

    Created by the constructor; ``close()`` (context exit, or atexit) removes everything.
    ``keep=True`` (``up`` from the command line) leaves them for a later ``down``.
    """

    def __init__(self, n: int, prefix: str = "cvt", keep: bool = False) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise HostsError(f"between 1 and {MAX_HOSTS} hosts, not {n}")
        if len(prefix) + 4 + 1 + len(str(n - 1)) > IFNAMSIZ or not prefix.isalnum():
            raise HostsError(f"prefix {prefix!r} must be alphanumeric and short (interface names <= 15)")
        reason = unavailable_reason()
        if reason:
            raise HostsError(reason)
        reap_stale()
        self.keep = keep
        self.hosts: list[Host] = []
        self._closed = False
        with _state_lock():
            self.id = _new_id(prefix)
            free = sorted(set(range(1, 255)) - _used_subnets(), key=lambda _: random.random())
            if not free:
                raise HostsError(f"no free /24 in {SUBNET_PREFIX}.0.0/16")
            octet = free[0]
            self.bridge = f"{self.id}br"
            self.gateway_ip = f"{SUBNET_PREFIX}.{octet}.1"
            self.hosts = [Host(self, i, f"{self.id}h{i}", f"{SUBNET_PREFIX}.{octet}.{HOST_OFFSET + i}",
                               f"{self.id}v{i}") for i in range(n)]
            self.state: dict[str, typing.Any] = {
                "id": self.id, "octet": octet, "owner_pid": os.getpid(),
                "owner_ticks": _start_ticks(os.getpid()), "keep": keep, "bridge": self.bridge,
                "gateway_ip": self.gateway_ip, "netns": [h.name for h in self.hosts],
                "veths": [h.veth for h in self.hosts], "ips": [h.ip for h in self.hosts],
                "pids": [], "mounts": [], "clusters": []}
            _write_state(self.state)
            try:
                self._create()
            except BaseException:
                teardown_state(self.state)
                raise
        if not keep:
            atexit.register(self.close)

    def _create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for h in self.hosts:
            peer = f"{self.id}p{h.index}"
            _ip("netns", "add", h.name)
            _ip("link", "add", h.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", h.name)
            _ip("link", "set", h.veth, "master", self.bridge)
            _ip("link", "set", h.veth, "up")
            ns = ["-n", h.name]
            _ip(*ns, "link", "set", peer, "name", "eth0")
            _ip(*ns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            _ip(*ns, "link", "set", "eth0", "up")
            _ip(*ns, "link", "set", "lo", "up")
        for h in self.hosts:
            self.wait_link(h)

    def wait_link(self, host: Host, timeout: float = 10.0) -> None:
        """Wait until the bridge forwards to host (its port leaves the listening states)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "bridge_slave state forwarding" in _ip("-d", "link", "show", host.veth).stdout:
                return
            time.sleep(0.05)
        raise HostsError(f"link of {host.name} did not come up within {timeout:.0f} s")

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ bookkeeping for teardown

    def _update(self, key: str, value: typing.Any) -> None:
        if self._closed:
            return
        self.state[key].append(value)
        with _state_lock():
            _write_state(self.state)

    def track_pid(self, pid: int) -> None:
        """Kill this process (group) at teardown if it still runs."""
        self._update("pids", [pid, _start_ticks(pid)])

    def track_mount(self, mountpoint: str) -> None:
        self._update("mounts", os.path.realpath(mountpoint))

    def track_cluster(self, directory: str) -> None:
        self._update("clusters", directory)

    def close(self) -> None:
        """Kill every process started here, unmount, delete namespaces and links; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        problems = teardown_state(self.state)
        if problems:
            raise HostsError("teardown left: " + "; ".join(problems))

    # ------------------------------------------------------------ inspection

    def status(self) -> list[dict[str, typing.Any]]:
        return [{"name": h.name, "ip": h.ip, "cut": h.is_cut()} for h in self.hosts]


# ---------------------------------------------------------------- command line
