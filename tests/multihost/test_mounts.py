"""Mounts on different hosts: each mount daemon runs inside its host's network namespace
(so it reaches the cluster only by the hosts' addresses), yet its mount is visible here."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from curvine_py.common.mounttable import is_mounted
from curvine_py.testing.netcluster import NetCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(180)]


def daemon_netns(c: NetCluster, mountpoint: Path) -> int:
    """The inode of the network namespace the daemon serving mountpoint runs in."""
    rec = next(p for p in c.processes if p.role == "fuse" and p.address == str(mountpoint))
    return os.stat(f"/proc/{rec.pid}/ns/net").st_ino


def test_write_on_one_host_read_from_a_fresh_mount_on_another(net_cluster: NetCluster, tmp_path: Path) -> None:
    c = net_cluster
    m1 = c.mount(1, tmp_path / "m1")
    assert is_mounted(str(m1))
    assert daemon_netns(c, m1) == os.stat(c.hosts[1].netns_path).st_ino
    data = os.urandom(9 * (1 << 20) + 123)   # three 4 MiB blocks, the last one short
    (m1 / "kv").mkdir()
    tmp = m1 / "kv" / "chunk.tmp"
    with open(tmp, "wb") as f:
        f.write(data[:28])
        f.write(data[28:])
    os.rename(tmp, m1 / "kv" / "chunk.data")

    m3 = c.mount(3, tmp_path / "m3")          # a fresh mount on a host with no worker
    assert daemon_netns(c, m3) == os.stat(c.hosts[3].netns_path).st_ino
    assert os.listdir(m3 / "kv") == ["chunk.data"]
    with open(m3 / "kv" / "chunk.data", "rb") as f:
        assert f.read(4096) == data[:4096]
        assert f.read() == data[4096:]
    with c.client(2) as cl:                   # and the SDK agrees
        assert cl.get_bytes("/kv/chunk.data") == data

    c.unmount(m1)
    c.unmount(m3)
    assert not is_mounted(str(m1)) and not is_mounted(str(m3))


def test_a_blocks_head_is_read_before_its_tail_has_crossed_the_link(net_cluster: NetCluster, tmp_path: Path) -> None:
    """Host 3's link is slowed to 2 MB/s: the first 4 KiB of a fresh mount's read come as
    soon as they have crossed it, not once the whole block has (reader.py's `got`).  One
    block, so one connection: how two connections share the slowed link (the data
    sockets' congestion control decides that) is not what this tests."""
    c = net_cluster
    data = os.urandom(4 << 20)                # one 4 MiB block
    with c.client() as cl:
        cl.put_bytes("/slow.data", data)
    m3 = c.mount(3, tmp_path / "m3")
    os.listdir(m3)
    host3 = c.hosts[3]
    subprocess.run(["tc", "qdisc", "add", "dev", host3.veth, "root", "tbf", "rate", "16mbit",
                    "burst", "64kb", "latency", "10s"], check=True)   # into host 3: ~2 s for the file
    try:
        with open(m3 / "slow.data", "rb") as f:
            t0 = time.monotonic()
            head = f.read(4096)
            t_head = time.monotonic() - t0
            rest = f.read()
            t_all = time.monotonic() - t0
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", host3.veth, "root"], check=False)
    assert head + rest == data
    # Before, the head waited for the whole block: all of the read.  Now it waits for the
    # first FUSE request's bytes, at most 1 MiB of the 4: about a quarter of the read or less.
    assert t_all > 1.0, f"the link was not slowed ({t_all:.2f} s for 4 MiB)"
    assert t_head < 0.5 * t_all, f"head {t_head:.2f} s of {t_all:.2f} s"
    c.unmount(m3)
