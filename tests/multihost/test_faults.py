"""The fault suite: failures on real hosts (network namespaces) that must cost nothing
that was acknowledged.  Each scenario records a row (data written, data verified, bytes
lost, time to recover) in tests/multihost/faulttable.py; the table is printed at the end
of the run.  The master's worker timeout is 5 s here (default 30 s) to keep the suite
short; every wait is bounded.

Layout: master on host 0, workers on hosts 1-3, the writer's mount on host 0; data is
verified through fresh mounts (no page cache of the writer) or the SDK.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import grpc
import pytest

from curvine_py.pb import curvine_pb2, curvine_pb2_grpc
from curvine_py.testing.netcluster import NetCluster
from tests import conftest
from tests.multihost.faulttable import Row, record

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]
MiB = 1 << 20
WORKER_TIMEOUT_S = 5
FLAGS = ("--master-heartbeat-ms", "200", "--master-worker-timeout-s", str(WORKER_TIMEOUT_S),
         "--master-replication-scan-s", "2")


# ---------------------------------------------------------------- helpers

def payload(seed: int, size: int) -> bytes:
    block = seed.to_bytes(8, "little") + os.urandom(MiB - 8)
    return (block * (size // MiB + 1))[:size]


def write_file(path: Path, data: bytes, piece: int = 4 * MiB) -> None:
    with open(path, "wb") as f:
        view = memoryview(data)
        for off in range(0, len(data), piece):
            f.write(view[off:off + piece])


def wait_until(what: str, check: typing.Callable[[], object], timeout: float = 60.0) -> float:
    """tests/conftest.py's, asking again while the master restarts."""
    return conftest.wait_until(what, check, timeout, retry_errors=True)


def under_replicated(c: NetCluster) -> int:
    return c.report().under_replicated


def differs(got: bytes, want: bytes) -> str:
    """'' when equal, else a one-line description.  (A bare `assert got == want` on MiBs of
    bytes makes pytest diff them with difflib, which took minutes in a CI run.)"""
    if got == want:
        return ""
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"{len(got)} bytes read, {len(want)} written, first difference at byte {first}"


def verify(files: dict[Path, bytes], root: Path) -> int:
    """Bytes of files (named relative to the writer's mount) read back exactly under root."""
    good = 0
    for p, data in files.items():
        with open(root / p.name, "rb") as f:
            got = f.read()
        assert not differs(got, data), f"{p.name}: {differs(got, data)}"
        good += len(data)
    return good


def stat_block(c: NetCluster, i: int, block_id: int) -> curvine_pb2.BlockStatReply:
    h = c.worker_host(i)
    rpc = c.worker_ports(i)[0]
    with grpc.insecure_channel(f"{h.ip}:{rpc}") as ch:
        return curvine_pb2_grpc.WorkerServiceStub(ch).StatBlock(
            curvine_pb2.BlockRequest(block_id=block_id), timeout=5, metadata=(("curvine-secret", c.secret),))


def worker_index(c: NetCluster) -> dict[int, int]:
    """worker id -> index of the worker in the cluster (by host)."""
    names = {c.worker_host(i).name: i for i in range(len(c.workers))}
    return {w.address.worker_id: names[w.address.host] for w in c.report().workers}


@pytest.fixture
def three(net_cluster_factory: typing.Callable[..., NetCluster]) -> NetCluster:
    return net_cluster_factory(worker_hosts=(1, 2, 3), extra_master_flags=FLAGS)


# ---------------------------------------------------------------- workers: kill, return, corrupt

def test_worker_killed_mid_write_then_returns_then_a_replica_rots(
        net_cluster_factory: typing.Callable[..., NetCluster], tmp_path: Path) -> None:
    # The memory tier off: the rotten replica's kept copy would serve the block without its
    # file being read, so the rot would be found only once the copy left memory.
    c = net_cluster_factory(worker_hosts=(1, 2, 3), extra_master_flags=FLAGS,
                            extra_worker_flags=["--worker-memory-cache", "0"])
    mnt = c.mount(0, tmp_path / "w")
    (mnt / "kv").mkdir()
    closed = {mnt / "kv" / f"done{i}": payload(i, 24 * MiB + 4096 * i) for i in range(4)}
    for p, data in closed.items():
        write_file(p, data)

    # Kill the worker on host 1 while a 128 MiB file is being written through the mount.
    big_path, big = mnt / "kv" / "big", payload(99, 128 * MiB)
    progress = threading.Event()
    outcome: dict[str, typing.Any] = {}

    def writer() -> None:
        try:
            with open(big_path, "wb") as f:
                view = memoryview(big)
                for off in range(0, len(big), 4 * MiB):
                    f.write(view[off:off + 4 * MiB])
                    if off >= 32 * MiB:
                        progress.set()
            outcome["ok"] = True
        except OSError as e:
            outcome["error"] = e
        finally:
            progress.set()

    t = threading.Thread(target=writer)
    t.start()
    assert progress.wait(120)
    killed_at = time.monotonic()
    c.kill_worker(0)
    t.join(120)
    assert not t.is_alive(), "the write hung after a worker died"
    if "error" in outcome:   # allowed, if it says so; never silently short
        e = outcome["error"]
        assert e.errno in (errno.EIO, errno.EHOSTDOWN, errno.ENOSPC), e
        acknowledged = dict(closed)
        note = f"big file failed loudly ({errno.errorcode[e.errno]})"
    else:
        acknowledged = {**closed, big_path: big}
        note = "big file completed on the remaining replicas"
    wait_until("under-replicated blocks back to 0", lambda: under_replicated(c) == 0, 60)
    recover_s = time.monotonic() - killed_at
    fresh = c.mount(0, tmp_path / "r1")
    good = verify(acknowledged, fresh / "kv")
    c.unmount(fresh)
    record(Row("worker SIGKILL during a 128 MiB mount write", sum(map(len, acknowledged.values())), good,
               recover_s, f"{note}; recovered = kill -> 0 under-replicated (worker timeout {WORKER_TIMEOUT_S} s)"))
    assert recover_s < 60

    # The worker comes back with its old blocks: reconciled, nothing counted twice.
    t0 = time.monotonic()
    c.restart_worker(0)

    def reconciled() -> bool:
        rep = c.report()
        live = [w for w in rep.workers if w.state == "live"]
        return len(live) == 3 and rep.under_replicated == 0 and sum(w.blocks for w in live) == 2 * rep.blocks
    wait_until("the returned worker's blocks to be reconciled", reconciled, 60)
    fresh = c.mount(0, tmp_path / "r2")
    good = verify(acknowledged, fresh / "kv")
    c.unmount(fresh)
    record(Row("worker returns with its old blocks", sum(map(len, acknowledged.values())), good,
               time.monotonic() - t0, "extra copies deleted; replicas = 2 x blocks"))

    # Flip bytes in one replica of a closed file; a reader on that worker's host hits it first.
    target = next(iter(closed))
    ino = os.stat(target).st_ino
    sdk = c.client()
    info = sdk.meta.block_locations(ino)
    block = info.blocks[1]
    index = worker_index(c)
    bad = block.workers[0]
    st = stat_block(c, index[bad], block.block_id)
    assert st.exists
    with open(st.path, "r+b") as f:
        f.seek(block.length // 3)
        chunk = f.read(64)
        f.seek(block.length // 3)
        f.write(bytes(b ^ 0x5A for b in chunk))
    t0 = time.monotonic()
    reader_host = c.hosts.hosts.index(c.worker_host(index[bad]))
    fresh = c.mount(reader_host, tmp_path / "r3", "--client-short-circuit", "false")
    good = verify({target: closed[target]}, fresh / "kv")

    def repaired() -> bool:
        holders = [w for b in sdk.meta.block_locations(ino).blocks if b.block_id == block.block_id
                   for w in b.workers]
        return (under_replicated(c) == 0 and len(holders) == 2
                and all(stat_block(c, index[w], block.block_id).exists for w in holders))
    wait_until("the corrupt replica to be copied again", repaired, 60)
    for w in [w for b in sdk.meta.block_locations(ino).blocks if b.block_id == block.block_id for w in b.workers]:
        with open(stat_block(c, index[w], block.block_id).path, "rb") as f:
            assert f.read(block.length) == closed[target][block.offset:block.offset + block.length]
    c.unmount(fresh)
    sdk.close()
    record(Row("bytes flipped in a replica on disk", len(closed[target]), good, time.monotonic() - t0,
               "reader got good bytes; bad copy replaced from the good one"))


def test_worker_killed_mid_read_by_a_reader_with_no_replica(
        net_cluster_factory: typing.Callable[..., NetCluster], tmp_path: Path) -> None:
    """Workers on hosts 1 and 2 hold every block; the reader's mount is on host 3, which
    runs no worker, so every byte comes over the network.  One worker is SIGKILLed while a
    64 MiB file is being read through that mount (the reader paused after a quarter of it,
    the mount's read-ahead fetches running): the read goes on from the other replica
    (blocks in flight on the dead worker's connections included, when the kill finds some)
    and returns every byte; the mount's log shows reads that failed over."""
    c = net_cluster_factory(worker_hosts=(1, 2), extra_master_flags=FLAGS)
    writer = c.mount(1, tmp_path / "w")
    data = payload(7, 64 * MiB + 12345)
    write_file(writer / "big", data)
    reader = c.mount(3, tmp_path / "r")
    got = bytearray(len(data))
    done = 0
    quarter, killed = threading.Event(), threading.Event()
    outcome: dict[str, typing.Any] = {}

    def read() -> None:
        nonlocal done
        try:
            with open(reader / "big", "rb", buffering=0) as f:
                view = memoryview(got)
                while done < len(got):
                    n = f.readinto(view[done:done + MiB])
                    if not n:
                        break
                    done += n
                    if done >= len(got) // 4 and not quarter.is_set():
                        quarter.set()     # the mount's read-ahead fetches run on meanwhile
                        killed.wait(30)
        except OSError as e:
            outcome["error"] = e
        finally:
            quarter.set()

    t0 = time.monotonic()
    t = threading.Thread(target=read)
    t.start()
    assert quarter.wait(60)
    killed_at_mib = done / MiB
    c.kill_worker(1)
    killed.set()
    t.join(60)
    took = time.monotonic() - t0
    assert not t.is_alive(), "the read hung after a worker died"
    assert "error" not in outcome, f"the read failed: {outcome.get('error')}"
    assert done == len(data) and not differs(bytes(got), data), differs(bytes(got), data)
    log = next(p.log for p in c.processes if p.role == "fuse" and p.address == str(reader))
    failed_over = Path(log).read_text().count("trying the next replica")
    assert failed_over, "no block was read from the other replica: the kill came after the last fetch"
    c.unmount(reader)
    record(Row("worker SIGKILL during a 64 MiB read, reader with no replica", len(data), len(data), took,
               f"killed after {killed_at_mib:.0f} MiB read, {failed_over} block reads failed over; "
               "recovered = the whole read"))
    assert took < 30


# ---------------------------------------------------------------- the master

# The workload runs in its own process: the test process spawns the new master, and a fork
# made while this process held a file of the mount open would close it in the child.
WORKLOAD = r"""
import os, sys, time
root, stop = sys.argv[1], sys.argv[2]
i = 0
while not os.path.exists(stop):
    name = f"f{i:05d}"
    data = (i.to_bytes(8, "little") * 8193)[:64 * 1024 + i]
    t0 = time.monotonic()
    try:
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        os.rename(os.path.join(root, name), os.path.join(root, name + ".data"))
    except OSError as e:
        print(f"ERR {e!r}", flush=True)
        sys.exit(1)
    print(f"OK {name}.data {time.monotonic() - t0:.3f}", flush=True)
    i += 1
"""


def workload_data(name: str) -> bytes:
    i = int(name[1:6])
    return (i.to_bytes(8, "little") * 8193)[:64 * 1024 + i]


def test_master_killed_and_restarted_under_a_mount_workload(three: NetCluster, tmp_path: Path) -> None:
    c = three
    mnt = c.mount(0, tmp_path / "w")
    (mnt / "meta").mkdir()
    stop_file = tmp_path / "stop"
    out = open(tmp_path / "workload.out", "w+")
    proc = subprocess.Popen([sys.executable, "-c", WORKLOAD, str(mnt / "meta"), str(stop_file)],
                            stdout=out, stderr=subprocess.STDOUT)

    def lines() -> list[str]:
        return (tmp_path / "workload.out").read_text().splitlines()
    try:   # the workload going (20 files written), then the master down for 3 s
        wait_until("the workload to start", lambda: proc.poll() is not None or len(lines()) >= 20, 30)
        before = len(lines())
        killed_at = time.monotonic()
        c.kill_master()
        time.sleep(3)
        c.restart_master()
        wait_until("the workload to go on after the restart",
                   lambda: proc.poll() is not None or len(lines()) > before + 20, 60)
        recover_s = time.monotonic() - killed_at
    finally:
        stop_file.touch()
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
    done = lines()
    assert proc.returncode == 0 and not any(line.startswith("ERR") for line in done), \
        f"a call failed instead of waiting for the master: {done[-1:]}"
    acknowledged = {mnt / "meta" / line.split()[1]: workload_data(line.split()[1]) for line in done}
    latencies = [float(line.split()[2]) for line in done]
    fresh = c.mount(0, tmp_path / "r")
    good = verify(acknowledged, fresh / "meta")
    assert sorted(p.name for p in (fresh / "meta").iterdir()) == sorted(p.name for p in acknowledged)
    c.unmount(fresh)
    record(Row("master SIGKILL, restarted 3 s later", sum(map(len, acknowledged.values())), good, recover_s,
               f"{len(acknowledged)} files created+renamed, 0 failed; longest call {max(latencies):.1f} s"))


# ---------------------------------------------------------------- a partition

def test_replica_host_partitioned_during_reads(three: NetCluster, tmp_path: Path) -> None:
    c = three
    mnt = c.mount(0, tmp_path / "w")
    files = {mnt / f"p{i}": payload(i, 12 * MiB) for i in range(4)}
    for p, data in files.items():
        write_file(p, data)
    victim = c.worker_host(0)
    victim.cut()
    try:
        fresh = c.mount(0, tmp_path / "r")
        slowest = 0.0
        good = 0
        for p, data in files.items():
            t0 = time.monotonic()
            with open(fresh / p.name, "rb") as f:
                got = f.read()
            slowest = max(slowest, time.monotonic() - t0)
            assert got == data
            good += len(data)
        assert slowest < 5.0, f"a read took {slowest:.1f} s with a replica's host cut off"
    finally:
        victim.restore()
    c.unmount(fresh)
    record(Row("replica host cut off (link down) during reads", sum(map(len, files.values())), good, slowest,
               "recovered = slowest whole-file read (limit 5 s)"))


# ---------------------------------------------------------------- a full pool

def test_full_pool_gives_enospc_and_keeps_what_was_written(net_cluster_factory: typing.Callable[..., NetCluster],
                                                           tmp_path: Path) -> None:
    c = net_cluster_factory(worker_hosts=(1, 2), extra_master_flags=(*FLAGS, "--master-evict", "false"),
                            capacity="40MiB")
    mnt = c.mount(0, tmp_path / "w")
    closed: dict[Path, bytes] = {}
    failure: OSError | None = None
    t0 = time.monotonic()
    for i in range(20):   # 20 x 8 MiB into 2 x 40 MiB with 2 replicas: must run out
        p, data = mnt / f"full{i}", payload(i, 8 * MiB)
        try:
            write_file(p, data)
        except OSError as e:
            failure = e
            break
        closed[p] = data
    assert failure is not None and failure.errno == errno.ENOSPC, failure
    took = time.monotonic() - t0
    written = sum(map(len, closed.values()))
    good = verify(closed, mnt)
    # Nothing else broke: deleting makes room, and writing works again.
    for p in list(closed)[:2]:
        os.unlink(p)
    again, more = mnt / "again", payload(77, 4 * MiB)

    def writes_again() -> bool:
        try:
            write_file(again, more)
            return True
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            return False
    wait_until("room after deletes", writes_again, 30)
    got = again.read_bytes()
    assert not differs(got, more), f"again: {differs(got, more)}"
    record(Row("pool full (eviction off)", written, good, took,
               f"ENOSPC on file {len(closed) + 1}; deletes made room again"))
