"""Daemon processes of a local cluster: records, liveness, stopping, ports, log tails.

A process is identified by its pid *and* its start time (from /proc), so a pid the
kernel recycled for another program is never mistaken for one of ours and never killed.
"""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path

LOCAL_IP = "127.0.0.1"
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 20


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (from /proc), None when it is gone.

    Stored next to the pid so that a recycled pid is never mistaken for our daemon.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    if fields[0] == b"Z":  # a zombie has finished; only its parent has not reaped it
        return None
    return int(fields[19])


def pid_alive(pid: int | None, start_ticks: int | None = None) -> bool:
    """Whether pid runs and (when start_ticks is known) is the same process as recorded."""
    if not pid:
        return False
    ticks = _start_ticks(pid)  # Linux only, like the rest of the project (/proc, FUSE)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


@dataclass
class ProcessRecord:
    """One daemon of the cluster: how it was started and where it is."""
    role: str                     # master, worker, fuse
    name: str                     # master (master0, master1, .. of several), worker0, worker1, fuse
    index: int
    address: str                  # rpc address (mountpoint for fuse)
    log: str
    cmd: list[str] = field(default_factory=list)
    data_address: str = ""        # workers: the data-channel address
    host: str = ""                # workers: the host identity used for placement
    metrics: str = ""             # ip:port of its Prometheus /metrics ("" = off)
    raft: str = ""                # masters of a Raft group: ip:raft_port ("" = a single master)
    pid: int = 0
    start_ticks: int | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def is_alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid, self.start_ticks)

    def exit_code(self) -> int | None:
        """The exit status if we started it and it ended (negative = killed by signal)."""
        return self.popen.poll() if self.popen is not None else None

    def signal(self, sig: int) -> None:
        """Send sig to the daemon's whole process group (it leads its own session)."""
        if not self.is_alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def to_json(self) -> dict[str, typing.Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "popen"}

    @classmethod
    def from_json(cls, d: dict[str, typing.Any]) -> "ProcessRecord":
        names = {f for f in cls.__dataclass_fields__ if f != "popen"}
        return cls(**{k: v for k, v in d.items() if k in names})


def wait_dead(procs: typing.Iterable[ProcessRecord], timeout: float) -> list[ProcessRecord]:
    """Wait up to timeout for procs to exit; return the ones still alive."""
    pending = list(procs)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [p for p in pending if p.is_alive()]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return pending


def wait_stopped(p: ProcessRecord, timeout: float) -> bool:
    """Wait up to timeout until every thread of p is stopped (a SIGSTOP takes effect as
    each thread next runs: a call sent right after the signal could still be answered by
    one); False if some thread still runs, or p's threads cannot be read."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            states = [Path(f"/proc/{p.pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                      for t in os.listdir(f"/proc/{p.pid}/task")]
        except (OSError, IndexError):
            states = []   # a thread came or went between the listing and the read: look again
        if states and all(s in ("T", "t") for s in states):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def terminate(procs: typing.Sequence[ProcessRecord], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM procs, wait up to timeout, then SIGKILL whatever remains."""
    for p in procs:
        p.signal(signal.SIGTERM)
        p.signal(signal.SIGCONT)  # a stopped (SIGSTOP) daemon cannot act on SIGTERM
    for p in wait_dead(procs, timeout):
        p.signal(signal.SIGKILL)
    wait_dead(procs, 5.0)
    for p in procs:
        if p.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=1.0)  # reap, so no zombie lingers in the launcher


def log_tail(path: str | Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, for error messages ('' when unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- ports


_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[1]))  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    sys.exit(0)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n")


def dying_with_parent(argv: typing.Sequence[str], sig: int = signal.SIGTERM) -> list[str]:
    """argv run so that the kernel sends it sig when this process's thread dies.

    The signal is asked for after the fork, in a small interpreter that then execs argv
    (the request survives exec), not in a ``preexec_fn``: that makes subprocess fork()
    instead of vfork(), which runs grpc's fork handlers in the child, and their poller
    thread there aborted on an epoll fd that the child's close_fds had closed (SIGABRT
    before exec: a Raft master that never started, twice in the suite)."""
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(int(sig)), str(os.getpid()), *argv]


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections (ip_local_port_range)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(n: int, host: str = LOCAL_IP) -> list[int]:
    """n distinct ports the kernel considers free right now, taken outside the ephemeral
    range where it can: a port chosen by binding port 0 comes from that range, and any
    outgoing connection (a master's Raft link to a peer not yet started) may take it as
    its own local port before the server meant to listen there binds it."""
    lo, hi = _ephemeral_range()
    candidates = [p for p in range(10000, 65536) if not lo <= p <= hi]
    random.shuffle(candidates)
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:   # no room outside the range: the kernel's choice
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_in_use(host: str, port: int) -> bool:
    """Whether a listener holds host:port (SO_REUSEADDR so TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# ---------------------------------------------------------------- cluster state files
