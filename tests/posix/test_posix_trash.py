"""A file unlinked while open lives in the trash directory until its last close; when the
mount keeping it dies, the master removes it once that client has been silent for
master.trash_grace_s, and its blocks are freed (common/trash.py, master/trashsweep.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.local import LocalCluster
from curvine_py.common.trash import TRASH_NAME, owner_of
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master
from curvine_py.sdk import Client

from tests.conftest import FAST_MASTER_FLAGS, client_config, start_cluster, wait_until
from tests.posix.conftest import Mount, block_ids, start_mount, wait_deleted

pytestmark = pytest.mark.timeout(120)
GRACE_S = 3.0
FLAGS = (*FAST_MASTER_FLAGS, "--master-trash-grace-s", str(GRACE_S), "--master-lock-lease-s", "1")
HOLD = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.unlink(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp("trash") / "cluster", extra_master_flags=FLAGS)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def mount(cluster: LocalCluster, tmp_path: Path) -> typing.Iterator[Mount]:
    os.chmod(tmp_path, 0o755)
    m = start_mount(cluster, tmp_path / "mnt", tmp_path / "run", tmp_path / "mount.log")
    try:
        yield m
    finally:
        m.stop()


def kept(cluster: LocalCluster) -> list[str]:
    """The tagged names in the trash directory, as the master lists them."""
    with Client(master=cluster.master_address, config=client_config(cluster)) as client:
        try:
            trash = client.meta.resolve("/" + TRASH_NAME).ino
        except FileNotFoundError:
            return []
        reply = client.meta.call(Master.ReadDir, pb.ReadDirRequest(caller=client.meta.caller(), ino=trash, limit=1000))
        return [e.name for e in reply.entries if owner_of(e.name) is not None]


def test_a_live_mount_keeps_its_unlinked_open_file_past_the_grace(cluster: LocalCluster, mount: Mount) -> None:
    path = mount.path / "live"
    data = os.urandom(3 << 20)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.unlink(path)
        [name] = kept(cluster)
        # the master's sweep runs every grace/2: two or more sweeps past the grace had their
        # chance to remove it (3 graces before: 3 s more, the same sweep)
        time.sleep(2 * GRACE_S)
        assert kept(cluster) == [name]
        assert os.pread(fd, len(data), 0) == data
    finally:
        os.close(fd)
    wait_until("the last close removed the kept name", lambda: kept(cluster) == [], timeout=10)


def test_a_dead_mounts_unlinked_open_file_is_removed_and_its_blocks_freed(cluster: LocalCluster,
                                                                         mount: Mount) -> None:
    path = mount.path / "orphan"
    path.write_bytes(os.urandom(5 << 20))
    ids = block_ids(mount, path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        [name] = kept(cluster)
        mount.proc.send_signal(signal.SIGKILL)   # the mount dies with the file open: nobody will close it
        mount.proc.wait(10)
        start = time.monotonic()
        wait_until("the master removed the dead mount's kept name", lambda: kept(cluster) == [],
                   timeout=GRACE_S + 15)
        took = time.monotonic() - start
        assert took > GRACE_S - 1.5, f"{name} removed {took:.1f} s after its mount died, inside the grace"
    finally:
        holder.kill()
        holder.wait(10)
    wait_deleted(mount, ids)
