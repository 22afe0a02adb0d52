"""LMCache's own concurrency through real mounts on network-namespace hosts (issue 20).

The writer mount is on a worker's host (1); the chunks are read back through fresh mounts
on the other worker's host (2: a replica is local, read by short-circuit or, for one-block
files with direct-I/O reads, by FUSE passthrough) and on a host with no worker (3: every
block over the network).  `cv bench kvcache --writers/--readers` drives them as LMCache's
pools do (every chunk opened first, then the payloads or whole reads) and verifies every
byte.  The mounts' block pools are shrunk (client.buffer_pool_bytes) so that at test size
more files are open part-written, or being read, than there are buffers: the state in
which the mounts used to hang (shared/findings/lmcache-concurrency).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import pytest

from curvine_py.testing.netcluster import NetCluster
from tests.conftest import CV

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]

MiB = 1 << 20
PHASE_TIMEOUT_S = 120   # a phase past this is a hang: cv bench fails it (--timeout)

# name -> (writer mount flags, reader mount flags, file size)
SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {
    # 4 MiB blocks, 4 buffers: 3-block chunks, 8 writers, 24 files open at once
    "defaults": (("--client-buffer-pool-bytes", str(16 * MiB)),
                 ("--client-buffer-pool-bytes", str(16 * MiB)), 10 * MiB),
    # docs/config.md's KV settings: one 16 MiB block per chunk, direct-I/O reads, blocks
    # fetched from their lookups and staged for the kernel; 2 buffers
    "kv": (("--client-block-size", str(16 * MiB), "--client-buffer-pool-bytes", str(32 * MiB)),
           ("--fuse-direct-io-reads", "true", "--fuse-fetch-ahead", "true", "--fuse-stage-remote", "true",
            "--client-buffer-pool-bytes", str(32 * MiB)), 14 * MiB),
}


def bench(directory: Path, *args: str) -> dict[str, typing.Any]:
    """One cv bench phase in a fresh process; its figures (a failure names the reason)."""
    argv = [CV, "bench", str(directory), "--workloads", "kvcache", "--timeout", str(PHASE_TIMEOUT_S),
            "--json", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3 * PHASE_TIMEOUT_S)
    assert proc.returncode == 0, f"{' '.join(args)}: {proc.stderr.strip()}"
    return typing.cast(dict[str, typing.Any], json.loads(proc.stdout))


def write_chunks(directory: Path, files: int, size: int, writers: int) -> None:
    figures = bench(directory, "--phase", "write", "--files", str(files), "--file-size", str(size),
                    "--writers", str(writers), "--readers", str(files))
    assert figures["kvcache"]["write_threads"] == writers


def read_chunks(directory: Path) -> None:
    """Every chunk read whole, all opened at once, every byte verified (the manifest says
    how many readers: one per file)."""
    figures = bench(directory, "--phase", "read")
    assert figures["kvcache"]["read_threads"] > 1


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_lmcache_pools_finish_byte_exact_on_every_read_path(net_cluster: NetCluster, tmp_path: Path,
                                                            setting: str) -> None:
    writer_flags, reader_flags, size = SETTINGS[setting]
    c = net_cluster
    w = c.mount(1, tmp_path / "w", *writer_flags)
    (w / "kv").mkdir()
    write_chunks(w / "kv", files=24, size=size, writers=8)

    for host in (2, 3):   # a replica on the reader's host, and none
        r = c.mount(host, tmp_path / f"r{host}", *reader_flags)
        read_chunks(r / "kv")
        if host == 3:
            read_chunks(r / "kv")   # a second reader process on the same mount (it used to hang)
        c.unmount(r)
    c.unmount(w)


def test_32_writers_read_back_exactly_while_block_files_are_recycled(net_cluster: NetCluster,
                                                                     tmp_path: Path) -> None:
    """Three rounds of 32 concurrent writers; each round's chunks are read through the
    three paths and then deleted, so the next round's blocks land in recycled block files
    (worker/blockstore.py reuses freed ones) while earlier readers' mounts are still up."""
    c = net_cluster
    w = c.mount(1, tmp_path / "w", "--client-block-size", str(16 * MiB))
    readers = {"passthrough": c.mount(2, tmp_path / "pt", "--fuse-direct-io-reads", "true"),
               "short-circuit": c.mount(2, tmp_path / "sc", "--fuse-passthrough", "false"),
               "network": c.mount(3, tmp_path / "net", "--fuse-direct-io-reads", "true")}
    for round_ in range(3):
        d = w / f"round{round_}"
        d.mkdir()
        write_chunks(d, files=32, size=6 * MiB, writers=32)
        for r in readers.values():
            read_chunks(r / f"round{round_}")
        shutil.rmtree(d)   # the blocks freed here are recycled by the next round
    for r in readers.values():
        c.unmount(r)
    c.unmount(w)


def test_eight_readers_without_a_replica_overlap_and_a_stat_answers_meanwhile(net_cluster: NetCluster,
                                                                               tmp_path: Path) -> None:
    """Issue 26: eight whole-file reads at once on a mount whose host holds no replica do
    not queue behind one another (the last reader has its first 4 KiB before half the
    reads' time is over; one after another, 7/8 of it), and lookups of new names keep
    being answered meanwhile (none takes half the reads' time)."""
    c = net_cluster
    w = c.mount(1, tmp_path / "w", "--client-block-size", str(16 * MiB))
    files = {f"c{i}.data": os.urandom(96 * MiB) for i in range(8)}
    for name, data in files.items():
        (w / name).write_bytes(data)
    for i in range(400):
        (w / f"probe{i}").touch()
    r = c.mount(3, tmp_path / "r", "--fuse-direct-io-reads", "true")
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    stats: list[float] = []
    reading = threading.Event()
    start = threading.Barrier(len(files) + 1)

    def read(name: str) -> None:
        start.wait()
        with open(r / name, "rb", buffering=0) as f:
            head = f.read(4096)
            first[name] = time.perf_counter()
            rest = f.read()
        done[name] = time.perf_counter()
        assert head + rest == files[name], name

    def probe() -> None:
        for i in range(400):
            if not reading.is_set():
                return
            t = time.perf_counter()
            os.stat(r / f"probe{i}")   # a name this mount never looked up: a LOOKUP each time
            stats.append(time.perf_counter() - t)
            time.sleep(0.005)

    threads = [threading.Thread(target=read, args=(n,)) for n in files]
    for t in threads:
        t.start()
    reading.set()
    prober = threading.Thread(target=probe)
    prober.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=120)
    reading.clear()
    prober.join(timeout=30)
    assert len(done) == len(files), f"{len(files) - len(done)} reads did not finish"
    span = max(done.values()) - t0
    assert max(first.values()) - t0 < span / 2, \
        f"the last reader's first 4 KiB came at {max(first.values()) - t0:.3f} s of {span:.3f} s"
    assert len(stats) >= 3 and max(stats) < span / 2, \
        f"{len(stats)} lookups during {span:.3f} s of reads, the slowest {max(stats, default=0):.3f} s"
    c.unmount(r)
    c.unmount(w)


def remote_read_bytes(c: NetCluster, host: int, mountpoint: Path) -> float:
    """The bytes the mount on hosts[host] fetched from workers (its /metrics, which listens
    on that host's loopback: asked from inside the host)."""
    address = os.getxattr(mountpoint, "user.curvine.metrics").decode()
    script = ("import sys, urllib.request; "
              f"sys.stdout.write(urllib.request.urlopen('http://{address}/metrics', timeout=10).read().decode())")
    text = subprocess.run(c.hosts[host].wrap([sys.executable, "-c", script]), capture_output=True, text=True,
                          timeout=30, check=True).stdout
    return sum(float(v) for v in re.findall(r'^curvine_client_read_bytes_total\{source="remote"\} (\S+)$', text, re.M))


@pytest.mark.parametrize("block_mib", [16, 4])
def test_many_readers_on_few_buffers_fetch_each_byte_about_once(net_cluster: NetCluster, tmp_path: Path,
                                                                block_mib: int) -> None:
    """Issue 43: 32 chunks read at once through a default mount with no replica on its host
    and buffers for far fewer blocks (4 of 16 MiB, or 16 of 4 MiB).  Reads that waited for a
    buffer held the kernel's few request slots, the readers holding buffers looked idle,
    theirs were taken back and fetched again whole: 32 one-block 14 MiB chunks fetched
    12.6 GB for 0.47 GB.  Now the mount fetches each byte about once, and soon."""
    c = net_cluster
    files, size = 32, 6 * MiB
    w = c.mount(1, tmp_path / "w", "--client-block-size", str(block_mib * MiB))
    (w / "kv").mkdir()
    write_chunks(w / "kv", files=files, size=size, writers=8)
    # its own network namespace: the default metrics port is free there (tests turn it off)
    r = c.mount(3, tmp_path / "r", "--client-buffer-pool-bytes", str(64 * MiB), "--fuse-metrics-port", "9002")
    t0 = time.monotonic()
    read_chunks(r / "kv")
    took = time.monotonic() - t0
    fetched = remote_read_bytes(c, 3, r)
    assert fetched <= 1.5 * files * size, f"{fetched / MiB:.0f} MiB fetched for {files * size // MiB} MiB read"
    assert took < 60, f"the reads took {took:.1f} s"
    c.unmount(r)
    c.unmount(w)
