"""Fetches ahead (fuse.fetch_ahead: client/mount/fetchahead.py, and staging.py with
fuse.stage_remote) never run beside a lookup, through a real local cluster and the mount's
own VFS on a host with no worker.  Started at each lookup, they slowed LMCache's run of
32 stats 2x (bench/kv_lookup.py); now a lookup's fetch waits while another lookup runs,
starts in the pause after it, and the open still takes it; a lookup made while a fetch is
stuck on a stopped worker returns at once."""
from __future__ import annotations

import os
import signal
import time
import typing

import pytest

from curvine_py.client.mount.policy import MountOpens
from curvine_py.client.vfs import VFS
from curvine_py.pb.methods import Master
from curvine_py.sdk import Client
from tests.conftest import client_config
from tests.integration.test_verify_ahead import ONE_BLOCK, lookup, opens_of

if typing.TYPE_CHECKING:
    from curvine_py.cluster.local import LocalCluster

STALL_S = 1.0      # workers stopped this long (under client.read_timeout_s: the fetch goes on after)


@pytest.fixture(params=["ahead", "stage"])
def far_vfs(request: pytest.FixtureRequest, shared_cluster: "LocalCluster") -> typing.Iterator[VFS]:
    """A mount's VFS on a host with no worker: fetching ahead into pool buffers (ahead)
    or staging for the kernel from lookups (stage: fetch_ahead with stage_remote)."""
    cfg = client_config(shared_cluster)
    cfg.client.host = "no-worker-here"
    cfg.fuse.fetch_ahead = True
    cfg.fuse.stage_remote = request.param == "stage"
    client = Client(master=shared_cluster.master_address, config=cfg)
    opens = MountOpens(client.core)
    vfs = VFS(client.core, opens=opens)
    if request.param == "stage":
        opens.start_passthrough()      # as fuse/passthrough.py does once the kernel took it
        if opens.stage is None:
            vfs.close()
            client.close()
            pytest.skip("no huge-page tmpfs here (fsopen/fsmount refused): nothing is staged")
    try:
        yield vfs
    finally:
        vfs.close()
        client.close()


def started(vfs: VFS) -> list[bool]:
    """Whether each block queued by a lookup has begun its fetch, in lookup order."""
    opens = opens_of(vfs)
    if opens.stage is not None:
        return [s.started for s in opens.stage._table.values()]
    assert opens.ahead is not None
    return [a.entry is not None for a in opens.ahead._held.values()]


def wait_started(vfs: VFS, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while started(vfs)[:n].count(True) < n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert started(vfs)[:n] == [True] * n, started(vfs)


def read_whole(vfs: VFS, ino: int, size: int) -> bytes:
    opened = vfs.run(vfs.open(ino, os.O_RDONLY, vfs.meta.identity))
    try:
        if opened.backed:     # staged: what the kernel would read
            fd = vfs.backing_file(opened.fh)
            try:
                return os.pread(fd, size + 1, 0)
            finally:
                os.close(fd)
        return vfs.read(opened.fh, 0, size + 1)
    finally:
        vfs.run(vfs.release(opened.fh))


def test_a_fetch_ahead_waits_while_a_lookup_runs(far_vfs: VFS, client: Client, remote_dir: str) -> None:
    a, b = os.urandom(ONE_BLOCK), os.urandom(ONE_BLOCK - 1)
    client.put_bytes(f"{remote_dir}/a", a)
    client.put_bytes(f"{remote_dir}/b", b)
    parent = lookup(far_vfs, remote_dir).ino
    running = far_vfs.lookup(parent, "b", far_vfs.meta.identity)
    step = next(running)       # b's lookup is at the master (the mount awaits its reply)
    assert step[0] is Master.Lookup
    ino_a = lookup(far_vfs, f"{remote_dir}/a").ino   # a's lookup, over while b's runs
    time.sleep(0.3)            # many pauses' worth (lookups.QUIET_S)
    assert started(far_vfs) == [False]                 # a's fetch queued, not begun
    try:
        running.send(far_vfs.meta.call(*step))          # the master's reply: b's lookup is over
    except StopIteration:
        pass
    wait_started(far_vfs, 2)                            # both begin in the pause after it
    assert read_whole(far_vfs, ino_a, ONE_BLOCK) == a


def test_a_lookup_does_not_wait_for_a_stalled_fetch(far_vfs: VFS, client: Client, remote_dir: str,
                                                    shared_cluster: "LocalCluster") -> None:
    files = {f"c{i}": os.urandom(ONE_BLOCK - i) for i in range(3)}
    for name, data in files.items():
        client.put_bytes(f"{remote_dir}/{name}", data)
    lookup(far_vfs, remote_dir)
    pids = [w.pid for w in shared_cluster.workers if w.pid]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        stalled = time.monotonic()
        ino0 = lookup(far_vfs, f"{remote_dir}/c0").ino
        wait_started(far_vfs, 1)                        # c0's fetch runs, stuck on the stopped workers
        t = time.monotonic()
        for name in ("c1", "c2"):
            lookup(far_vfs, f"{remote_dir}/{name}")
        took = time.monotonic() - t
        assert took < STALL_S / 4, f"two lookups took {took:.3f} s beside a stalled fetch"
        time.sleep(max(0.0, stalled + STALL_S - time.monotonic()))
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert read_whole(far_vfs, ino0, ONE_BLOCK) == files["c0"]
