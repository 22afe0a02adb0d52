"""The bounded cache through the SDK on real small-capacity clusters.

Watermark LRU eviction, pins, TTL sweeps, ENOSPC when only pinned data is left, tier
preference with fallback, and the policy commands of the CLI.
"""
from __future__ import annotations

import errno
import os
import subprocess
import time
import typing

import pytest

from curvine_py.common.errors import CurvineError
from curvine_py.cluster.local import LocalCluster
from curvine_py.sdk.results import Report
from curvine_py.sdk import Client

from tests.conftest import CV, FAST_MASTER_FLAGS, client_config

MiB = 1 << 20
FILE = 4 * MiB
EVICT_FLAGS = (*FAST_MASTER_FLAGS, "--master-evict-interval-s", "0.1", "--master-ttl-sweep-s", "0.3",
               "--master-block-size", "1MiB")


def payload(i: int, size: int = FILE) -> bytes:
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


def connect(c: LocalCluster) -> Client:
    cfg = client_config(c)
    cfg.client.block_size = MiB
    return Client(master=c.master_address, config=cfg)


@pytest.fixture
def small(cluster_factory: typing.Callable[..., LocalCluster]) -> typing.Iterator[tuple[LocalCluster, Client]]:
    """Two workers of 48 MiB each, two replicas: 48 MiB of files fit."""
    c = cluster_factory(capacity="48MiB", extra_master_flags=EVICT_FLAGS)
    client = connect(c)
    try:
        yield c, client
    finally:
        client.close()


def present(client: Client, path: str) -> bool:
    try:
        client.stat(path)
        return True
    except FileNotFoundError:
        return False


def settle(client: Client, timeout: float = 15.0) -> Report:
    """Wait until eviction is over: at or below the high watermark and no eviction for 1.5 s
    (deletes reach workers by heartbeat; the look-ahead may evict a little after writes stop)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        rep = client.report()
        if rep.evicted_files != last:
            last, since = rep.evicted_files, time.monotonic()
        quiet = time.monotonic() - since >= 1.5
        if (quiet and rep.used <= 0.9 * rep.capacity) or time.monotonic() > deadline:
            return rep
        time.sleep(0.1)


def test_watermark_eviction_keeps_recently_read_files(small: tuple[LocalCluster, Client]) -> None:
    _, client = small
    client.mkdir("/kv")
    for i in range(8):
        client.put_bytes(f"/kv/{i}", payload(i))
    peak = 0
    for i in range(8, 24):   # 96 MiB written into a 48 MiB pool: no write fails
        if i % 3 == 2:       # 0, 1, 2 are read again and again: the most recently used
            for h in (0, 1, 2):
                assert client.get_bytes(f"/kv/{h}") == payload(h)
        client.put_bytes(f"/kv/{i}", payload(i))
        peak = max(peak, client.report().used)
    rep = settle(client)
    assert rep.used <= 0.9 * rep.capacity, rep
    assert peak <= rep.capacity   # never full (writes would have waited)
    assert rep.evicted_files >= 10 and rep.evicted_bytes >= 10 * FILE
    survivors = [i for i in range(24) if present(client, f"/kv/{i}")]
    assert {0, 1, 2} <= set(survivors), survivors                      # read recently
    assert all(i in survivors for i in range(22, 24)), survivors      # written last
    assert not any(i in survivors for i in range(3, 8)), survivors     # unread old files went first
    for i in survivors:   # whole files or nothing: every survivor is byte-exact
        assert client.get_bytes(f"/kv/{i}") == payload(i)
    for i in set(range(24)) - set(survivors):
        with pytest.raises(FileNotFoundError):
            client.get_bytes(f"/kv/{i}")
    assert sorted(int(n) for n in client.listdir("/kv")) == survivors


def test_pinned_files_survive_and_full_pinned_pool_is_enospc(small: tuple[LocalCluster, Client]) -> None:
    _, client = small
    client.mkdir("/pinned")
    client.mkdir("/kv")
    client.pin("/pinned")
    for i in range(3):
        client.put_bytes(f"/pinned/{i}", payload(100 + i))
    for i in range(16):
        client.put_bytes(f"/kv/{i}", payload(i))
    assert all(present(client, f"/pinned/{i}") for i in range(3))
    # only pinned data may stay: filling the pool with pinned files ends in ENOSPC
    failed = -1
    with pytest.raises(CurvineError) as e:
        for failed in range(3, 40):
            client.put_bytes(f"/pinned/{failed}", payload(100 + failed))
    assert e.value.errno == errno.ENOSPC, e.value
    assert not client.listdir("/kv")
    # nothing else broke: pinned files read back, and unpinning lets writes evict again
    kept = sorted(int(n) for n in client.listdir("/pinned"))
    assert kept == list(range(failed + 1)) and failed >= 8
    assert client.stat(f"/pinned/{failed}").size == 0   # the failed put left an empty file
    for i in kept[:-1]:
        assert client.get_bytes(f"/pinned/{i}") == payload(100 + i)
    client.unpin("/pinned")
    client.put_bytes("/kv/after", payload(7))
    assert client.get_bytes("/kv/after") == payload(7)


def test_a_write_out_of_space_never_commits_a_hole(small: tuple[LocalCluster, Client]) -> None:
    """Bytes the master found no block for (ENOSPC) must not turn into zeros of a file
    whose close succeeded: the close fails and the file keeps what it had (here: empty).
    The writes come in half blocks, as through the mount (blocks shipped as they fill)."""
    _, client = small
    client.mkdir("/pinned")
    client.pin("/pinned")
    with pytest.raises(CurvineError) as e:
        for i in range(40):
            client.put_bytes(f"/pinned/{i}", payload(100 + i))
    assert e.value.errno == errno.ENOSPC
    data = payload(300)
    f = client.open("/pinned/holey", "wb")
    with pytest.raises(CurvineError) as e:
        try:
            for off in range(0, len(data), MiB // 2):
                f.write(data[off:off + MiB // 2])
        finally:
            f.close()
    assert e.value.errno == errno.ENOSPC, e.value
    size = client.stat("/pinned/holey").size
    assert size == 0 or client.get_bytes("/pinned/holey") == data[:size], size


def test_ttl_sweep_removes_expired_files(small: tuple[LocalCluster, Client]) -> None:
    _, client = small
    client.mkdir("/ttl/sub", parents=True)
    client.mkdir("/keep")
    client.set_ttl("/ttl", "1")
    client.put_bytes("/ttl/a", b"a" * 1000)
    client.put_bytes("/ttl/sub/b", b"b" * 1000)
    client.put_bytes("/ttl/pinned", b"p")
    client.pin("/ttl/pinned")
    client.put_bytes("/keep/c", b"c")
    assert client.cache_policy("/ttl/sub/b").ttl_s == 1
    deadline = time.monotonic() + 10
    while present(client, "/ttl/a") or present(client, "/ttl/sub/b"):
        assert time.monotonic() < deadline, "ttl sweep did not remove expired files"
        time.sleep(0.1)
    assert present(client, "/ttl/pinned") and present(client, "/keep/c")
    assert client.report().expired_files >= 2
    with pytest.raises(CurvineError) as e:
        client.set_ttl("/ttl", "soon")
    assert e.value.errno == errno.EINVAL and "ttl" in str(e.value)


def test_lru_order_survives_master_restart(small: tuple[LocalCluster, Client]) -> None:
    c, client = small
    client.mkdir("/kv")
    for i in range(6):
        client.put_bytes(f"/kv/{i}", payload(i))
    assert client.get_bytes("/kv/0") == payload(0)   # noted in memory, flushed at shutdown
    c.restart_master()
    for i in range(6, 12):   # 48 MiB: a pass evicts about three of the unread old files
        client.put_bytes(f"/kv/{i}", payload(i))
    settle(client)
    assert client.report().evicted_files >= 1
    assert present(client, "/kv/0"), client.listdir("/kv")
    assert not present(client, "/kv/1"), client.listdir("/kv")


class TieredCluster(LocalCluster):
    """Each worker has a small MEM dir and a larger SSD dir."""

    def worker_dir_spec(self, i: int) -> str:
        base = self.dir / f"worker{i}"
        return f"[MEM:8MiB]{base / 'mem'},[SSD:64MiB]{base / 'data'}"


def dir_used(client: Client, tier: str) -> int:
    rep = client.report()
    return sum(d.used for w in rep.workers for d in w.dirs if d.tier == tier)


def test_tier_preference_and_fallback(cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    client = connect(cluster_factory(cls=TieredCluster, extra_master_flags=EVICT_FLAGS))
    try:
        client.mkdir("/hot")
        client.mkdir("/cold")
        client.set_tier("/hot", "mem")
        client.put_bytes("/cold/x", payload(1))
        time.sleep(0.5)
        assert dir_used(client, "MEM") == 0
        client.put_bytes("/hot/a", payload(2))
        time.sleep(0.5)
        assert dir_used(client, "MEM") >= 2 * FILE      # both replicas in MEM
        for i in range(4):                          # MEM (8 MiB per worker) is full: SSD takes the rest
            client.put_bytes(f"/hot/b{i}", payload(10 + i))
        for i in range(4):
            assert client.get_bytes(f"/hot/b{i}") == payload(10 + i)
        assert client.cache_policy("/hot/b0").tier == "mem"
        with pytest.raises(CurvineError) as e:
            client.set_tier("/hot", "tape")
        assert e.value.errno == errno.EINVAL
    finally:
        client.close()


def test_cli_policy_commands(small: tuple[LocalCluster, Client]) -> None:
    c, client = small
    client.mkdir("/d")
    client.put_bytes("/d/f", b"x")
    env = {**os.environ, "CURVINE_MASTER": c.master_address}

    def cv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CV, "fs", *args], capture_output=True, text=True, env=env, timeout=60)

    assert cv("pin", "/d").returncode == 0
    assert cv("ttl", "/d", "7d").returncode == 0
    assert cv("set-tier", "/d", "ssd").returncode == 0
    out = cv("stat", "/d/f").stdout
    assert "pinned:" in out and "yes (from /d)" in out and "7d (from /d)" in out and "ssd (from /d)" in out
    bad = cv("ttl", "/d", "forever")
    assert bad.returncode != 0 and "bad ttl" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert cv("unpin", "/d").returncode == 0
    assert cv("ttl", "/d", "none").returncode == 0
    assert not client.cache_policy("/d/f").pinned and client.cache_policy("/d/f").ttl_s is None
    rep = subprocess.run([CV, "report"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert "evicted:" in rep


class UnevenCluster(LocalCluster):
    """Worker 0 has a small disk, the others a larger one."""

    def worker_dir_spec(self, i: int) -> str:
        return f"[SSD:{'12MiB' if i == 0 else '64MiB'}]{self.dir / f'worker{i}' / 'data'}"


def test_full_worker_gets_no_new_blocks_and_full_pool_is_enospc(
        cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    """Eviction off: a full worker is skipped by placement; a full pool is ENOSPC."""
    client = connect(cluster_factory(cls=UnevenCluster, workers=3,
                                     extra_master_flags=(*EVICT_FLAGS, "--master-evict", "false")))
    try:
        client.mkdir("/d")
        for i in range(12):                        # 96 MiB of replicas: far more than worker 0 holds
            client.put_bytes(f"/d/{i}", payload(i))
        time.sleep(0.5)
        small = next(w for w in client.report().workers if w.address.host.endswith("-w0"))
        assert small.used <= small.capacity == 12 * MiB
        for i in range(12):
            assert client.get_bytes(f"/d/{i}") == payload(i)
        with pytest.raises(CurvineError) as e:     # 140 MiB of room in all: the pool fills up
            for i in range(12, 40):
                client.put_bytes(f"/d/{i}", payload(i))
        assert e.value.errno == errno.ENOSPC
        assert client.report().evicted_files == 0
        assert client.get_bytes("/d/0") == payload(0)
    finally:
        client.close()


def test_files_open_for_writing_are_never_evicted(small: tuple[LocalCluster, Client]) -> None:
    _, client = small
    client.mkdir("/kv")
    f = client.open("/kv/open", "wb")
    f.write(payload(1))                            # oldest file in the pool, still being written
    for i in range(16):                            # 64 MiB more into a 48 MiB pool
        client.put_bytes(f"/kv/{i}", payload(i))
    assert client.report().evicted_files > 0
    f.write(payload(2))
    f.close()
    assert client.get_bytes("/kv/open") == payload(1) + payload(2)


class SmallDisks(LocalCluster):
    """Each worker's data dir is a 40 MiB tmpfs, while its configured capacity is larger."""

    DISK = "40m"

    def start(self, timeout: float = 60.0) -> "SmallDisks":
        for i in range(self.n_workers):
            d = self.dir / f"worker{i}" / "data"
            d.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.DISK}", "tmpfs", str(d)], check=True)
        super().start(timeout)
        return self

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for i in range(self.n_workers):
                subprocess.run(["umount", "-l", str(self.dir / f"worker{i}" / "data")], capture_output=True)


def test_capacity_is_what_the_disk_really_has(cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    """Issue 42, item 4: configured 400 MiB on a 40 MiB disk is 40 MiB, and eviction works
    from that: 96 MiB of files written through two 40 MiB disks, no write fails."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    client = connect(cluster_factory(cls=SmallDisks, capacity="400MiB", extra_master_flags=EVICT_FLAGS,
                                     extra_worker_flags=("--worker-reserve", "0")))
    try:
        rep = client.report()
        assert rep.capacity <= 2 * 40 * MiB, rep
        client.mkdir("/kv")
        for i in range(24):
            client.put_bytes(f"/kv/{i}", payload(i))
        rep = settle(client)   # (a block being written counts in both a dir's used and its free room: slack)
        assert rep.used <= rep.capacity <= 2 * 40 * MiB + FILE, rep
        assert rep.evicted_files >= 8, rep
        for i in (22, 23):   # written last: kept, byte-exact
            assert client.get_bytes(f"/kv/{i}") == payload(i)
    finally:
        client.close()


def test_a_full_disk_is_enospc_within_a_second_and_says_why(
        cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    """Issue 42, item 4: on 40 MiB disks configured at 40 MiB (the disk's own overhead
    makes them hold less), a pool full of pinned files refuses the next put within a
    second (it took 13 s: the master kept placing blocks on a full disk), saying what
    holds the space; an oversized unpinned write fails, and the write right after it
    succeeds once its blocks are gone (the pool said "only pinned or open files" then)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    client = connect(cluster_factory(cls=SmallDisks, capacity="40MiB", extra_master_flags=EVICT_FLAGS,
                                     extra_worker_flags=("--worker-reserve", "0")))
    try:
        client.mkdir("/pinned")
        client.mkdir("/kv")
        client.pin("/pinned")
        slowest = 0.0
        with pytest.raises(CurvineError) as e:
            for i in range(40):
                t = time.monotonic()
                try:
                    client.put_bytes(f"/pinned/{i}", payload(i))
                finally:
                    slowest = max(slowest, time.monotonic() - t)
        assert e.value.errno == errno.ENOSPC, e.value
        assert "MiB in pinned files" in str(e.value), e.value
        assert slowest < 1.0, f"a put took {slowest:.2f} s"
        pinned = sorted(int(n) for n in client.listdir("/pinned"))
        for i in pinned:
            if client.stat(f"/pinned/{i}").size:
                assert client.get_bytes(f"/pinned/{i}") == payload(i)
        for i in pinned:
            client.remove(f"/pinned/{i}")
        client.unpin("/pinned")
        with pytest.raises(CurvineError) as e:   # more than the pool: fails, whatever it evicts
            client.put_bytes("/kv/big", payload(9, 100 * MiB))
        assert e.value.errno == errno.ENOSPC, e.value
        client.put_bytes("/kv/after", payload(7))   # its blocks go; this one waits for them
        assert client.get_bytes("/kv/after") == payload(7)
    finally:
        client.close()
