"""The harness itself: hosts reach each other only by their addresses, a cut host is
unreachable until restored, and teardown leaves nothing behind (also after a failure,
and after the creating process was killed)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from curvine_py.testing import testhosts
from curvine_py.common.mounttable import is_mounted
from curvine_py.cluster.processes import pid_alive
from curvine_py.testing.netcluster import NetCluster
from curvine_py.testing.testhosts import Host, Hosts

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(120)]

PORT = 7000
# Accepts and closes connections forever; prints "ready" once listening.
LISTENER = ("import socket, sys\n"
            "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    s.accept()[0].close()\n")
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()"


def listen(host: Host) -> subprocess.Popen[str]:
    p = host.popen([sys.executable, "-c", LISTENER, host.ip, str(PORT)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def reaches(src: Host | None, dst: Host) -> bool:
    """Whether a TCP connect from src (None: the root namespace) to dst's listener succeeds."""
    argv = [sys.executable, "-c", CONNECT, dst.ip, str(PORT)]
    r = (src.run(argv, capture_output=True) if src else subprocess.run(argv, capture_output=True, timeout=30))
    return r.returncode == 0


def leftovers(h: Hosts) -> list[str]:
    """Namespaces, links and state files of h that still exist."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    out = [n for n in h.state["netns"] if n in netns]
    out += [link for link in [h.bridge, *h.state["veths"]] if f" {link}:" in links or f" {link}@" in links]
    if (testhosts.STATE_DIR / f"{h.id}.json").exists():
        out.append("state file")
    return out


def test_hosts_reach_each_other_by_address(hosts: Hosts) -> None:
    assert len({h.ip for h in hosts.hosts} | {hosts.gateway_ip}) == len(hosts) + 1
    for h in hosts.hosts:
        addrs = h.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        assert f"{h.ip}/24" in addrs and "127.0.0.1" in addrs
        assert len(addrs.strip().splitlines()) == 2, addrs   # lo and its one shared-network address
    for h in hosts.hosts[:2]:
        listen(h)
    a, b, c = hosts[0], hosts[1], hosts[2]
    assert reaches(b, a) and reaches(c, a) and reaches(a, b) and reaches(None, a) and reaches(None, b)
    assert not reaches(c, hosts[3])   # nothing listens there: refused, not hung


def test_cut_and_restore(hosts: Hosts) -> None:
    listen(hosts[0])
    listen(hosts[1])
    hosts[1].cut()
    assert hosts[1].is_cut()
    t0 = time.monotonic()
    assert not reaches(hosts[2], hosts[1])      # dropped: the 1 s connect timeout runs out
    assert not reaches(None, hosts[1])
    assert not reaches(hosts[1], hosts[0])      # and nothing leaves the cut host
    assert time.monotonic() - t0 < 15
    assert reaches(hosts[2], hosts[0])          # the others are unaffected
    hosts[1].restore()
    assert not hosts[1].is_cut()
    assert reaches(hosts[2], hosts[1]) and reaches(None, hosts[1]) and reaches(hosts[1], hosts[0])


def test_teardown_after_a_failure_kills_processes_and_removes_everything() -> None:
    if testhosts.unavailable_reason():
        pytest.skip(testhosts.unavailable_reason())
    with pytest.raises(RuntimeError):
        with Hosts(2) as h:
            sleeper = h[1].popen(["sleep", "600"])
            raise RuntimeError("a failing test")
    assert sleeper.wait(timeout=10) is not None
    assert leftovers(h) == []


def test_a_killed_creators_run_is_reaped_by_the_next_one() -> None:
    if testhosts.unavailable_reason():
        pytest.skip(testhosts.unavailable_reason())
    code = ("import sys, time\n"
            "from curvine_py.testing.testhosts import Hosts\n"
            "h = Hosts(2)\n"
            "h[0].popen(['sleep', '600'])\n"
            "print(h.id, flush=True)\n"
            "time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    run_id = p.stdout.readline().strip()
    state_path = testhosts.STATE_DIR / f"{run_id}.json"
    assert state_path.exists()
    os.kill(p.pid, signal.SIGKILL)   # no atexit, no context exit: the run is left behind
    p.wait()
    status = subprocess.run([sys.executable, "-m", "curvine_py.testing.hostsctl", "status"],
                            capture_output=True, text=True, timeout=30).stdout
    assert run_id in status and "dead" in status
    with Hosts(1):                   # any new run reaps runs whose creator died
        assert not state_path.exists()
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert run_id not in netns
    r = subprocess.run([sys.executable, "-m", "curvine_py.testing.hostsctl", "down", run_id],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "removed 0 run(s)" in r.stdout, r.stdout + r.stderr


def test_up_status_down_by_hand() -> None:
    if testhosts.unavailable_reason():
        pytest.skip(testhosts.unavailable_reason())
    cli = [sys.executable, "-m", "curvine_py.testing.hostsctl"]
    r = subprocess.run([*cli, "up", "--hosts", "2", "--prefix", "cvu"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines() if line.startswith("cvu")]
    run_id = names[0][:-2]
    try:
        assert len(names) == 2 and run_id in subprocess.run([*cli, "status"], capture_output=True,
                                                            text=True, timeout=30).stdout
        ip = r.stdout.split()[1]
        assert subprocess.run(["nsenter", f"--net=/var/run/netns/{names[0]}", "ip", "-o", "addr"],
                              capture_output=True, text=True).stdout.count(ip) == 1
    finally:
        d = subprocess.run([*cli, "down", run_id], capture_output=True, text=True, timeout=60)
    assert d.returncode == 0 and run_id in d.stdout
    assert run_id not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    bad = subprocess.run([*cli, "up", "--hosts", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("testhosts: ") and "Traceback" not in bad.stderr


def test_closing_the_hosts_alone_stops_a_running_cluster_and_its_mount(tmp_path: Path) -> None:
    """What a crashed test leaves (no NetCluster.stop): the hosts' teardown still kills the
    daemons and detaches the mount."""
    if testhosts.unavailable_reason():
        pytest.skip(testhosts.unavailable_reason())
    h = Hosts(3)
    try:
        c = NetCluster(h, tmp_path / "c", worker_hosts=(1, 2)).start()
        mp = c.mount(0, tmp_path / "m")
        pids = [p.pid for p in c.processes]
        assert len(pids) == 4 and is_mounted(str(mp))
    finally:
        h.close()
    assert not is_mounted(str(mp))
    assert not any(pid_alive(pid) for pid in pids)
    assert leftovers(h) == []
