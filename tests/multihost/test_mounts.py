"""Mounts on different hosts: each mount daemon runs inside its host's network namespace
(so it reaches the cluster only by the hosts' addresses), yet its mount is visible here."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from curvine_py.localcluster import is_mounted
from curvine_py.testhosts import NetCluster

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
