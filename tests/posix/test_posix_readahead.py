"""The mount's kernel read-ahead (``fuse.read_ahead_kb``, fuse/readahead.py, issue 43).

The mount writes its bdi's ``read_ahead_kb`` once the kernel's INIT is answered (a value
written before the reply is cut back to the kernel's 128 KiB: the mount lost its 16 MiB
that way until issue 43, so these tests fail on that code).  A big sequential read of a
file whose blocks have no replica on the mount's host (the local cluster's workers are
other "hosts": ``<host>-w0``, ``<host>-w1``) then reaches the mount as fewer, larger FUSE
reads: counted by the mount's own ``/metrics``.
"""
from __future__ import annotations

import os
import re
import time
import typing
import urllib.request
from pathlib import Path

import pytest

from curvine_py.common.config import FuseConfig
from curvine_py.fuse import readahead
from tests.posix.conftest import Mount, mount_table_entry, start_mount

pytestmark = pytest.mark.timeout(180)

CONFIGURED_KB = 2048          # not the default, so the test sees the flag applied
KERNEL_KB = 128               # the kernel's own read-ahead of a FUSE bdi (VM_READAHEAD_PAGES)
MOUNT_FLAGS = ("--fuse-read-ahead-kb", str(CONFIGURED_KB))
MiB = 1 << 20
SIZE = 64 * MiB               # 16 blocks of 4 MiB
SETTLE_S = 10.0


def bdi_kb(m: Mount) -> int:
    entry = mount_table_entry(m.path)
    assert entry is not None, f"{m.path} is not mounted"
    value = readahead.read_kb(entry[2])
    assert value is not None, f"no read_ahead_kb for the mount's device {entry[2]}"
    return value


def settled_kb(m: Mount, want: int) -> int:
    """The bdi's value once the mount's tuning (a thread after INIT) had time to run: the
    wanted value as soon as it shows, else what is there after SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while (kb := bdi_kb(m)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return kb


def metric(m: Mount, pattern: str) -> float:
    address = os.getxattr(m.path, "user.curvine.metrics").decode()
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def fuse_reads(m: Mount) -> float:
    return metric(m, r'^curvine_fuse_op_duration_seconds_count\{op="read"\} (\S+)$')


def remote_bytes(m: Mount) -> float:
    return metric(m, r'^curvine_client_read_bytes_total\{source="remote"\} (\S+)$')


def sequential_read(m: Mount, path: Path, data: bytes) -> tuple[float, float]:
    """(FUSE reads, bytes fetched from workers) of one buffered read of the whole file,
    its cached pages dropped first; every byte checked."""
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    reads, fetched = fuse_reads(m), remote_bytes(m)
    with open(path, "rb", buffering=0) as f:
        got = f.read(len(data) + 1)
    assert got == data
    return fuse_reads(m) - reads, remote_bytes(m) - fetched


@pytest.fixture(scope="module")
def data() -> bytes:
    return os.urandom(SIZE)


@pytest.fixture(scope="module")
def untuned(mounted: Mount, tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[Mount]:
    """A second mount of the same cluster with ``fuse.read_ahead_kb = 0``."""
    base = tmp_path_factory.mktemp("mnt0")
    m = start_mount(mounted.cluster, base / "m", base / "run", base / "m.log", ("--fuse-read-ahead-kb", "0"))
    try:
        yield m
    finally:
        m.stop()


def test_the_default_is_a_whole_request_or_more() -> None:
    """The default asks at least one maximal FUSE read (1 MiB at 256 pages) of read-ahead."""
    assert FuseConfig().read_ahead_kb >= 1024


def test_a_bdi_that_cannot_be_written_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """No sysfs entry for the device (a read-only /sys or no root fail the same way): the
    value stays, one warning says so, nothing raises."""
    dev = "0:1048575"   # the largest minor: no such bdi
    assert not readahead.bdi_file(dev).parent.exists()
    with caplog.at_level("INFO", logger="curvine.fuse"):
        assert readahead.apply(dev, "/nowhere", 4096) is None
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "not applied" in caplog.records[0].getMessage()


def test_the_mount_sets_its_bdi_to_the_configured_value(mounted: Mount) -> None:
    assert settled_kb(mounted, CONFIGURED_KB) == CONFIGURED_KB, mounted.log_tail()
    assert f"set to {CONFIGURED_KB} KiB" in mounted.log.read_text()


def test_zero_leaves_the_kernels_value(untuned: Mount) -> None:
    time.sleep(1.0)   # the tuning, were it wrongly on, would have run by now
    assert bdi_kb(untuned) == KERNEL_KB, untuned.log_tail()
    assert "left at the kernel's" in untuned.log.read_text()


def test_a_remote_sequential_read_sends_fewer_larger_fuse_reads(mounted: Mount, untuned: Mount,
                                                               data: bytes) -> None:
    """64 MiB with no replica on the mount's host: at the kernel's 128 KiB it is >= 512
    FUSE reads; with the configured 2 MiB each read is as large as the connection allows
    (1 MiB where fs.fuse.max_pages_limit is 256), so at most a quarter of that."""
    cap = readahead.request_cap_kb()
    if cap is None or cap < 512:
        pytest.skip(f"this kernel caps FUSE reads at {cap or 128} KiB: larger read-ahead cannot make them larger")
    name = f"big-{os.urandom(3).hex()}"
    (mounted.path / name).write_bytes(data)
    settled_kb(mounted, CONFIGURED_KB)   # (waits for the tuning: the test above checks its value)
    tuned_reads, tuned_fetched = sequential_read(mounted, mounted.path / name, data)
    small_reads, small_fetched = sequential_read(untuned, untuned.path / name, data)
    assert tuned_fetched >= SIZE and small_fetched >= SIZE, "the blocks were not read from workers"
    assert small_reads >= SIZE // (KERNEL_KB * 1024), f"untuned mount: {small_reads:.0f} FUSE reads"
    assert tuned_reads <= SIZE // (512 * 1024), (
        f"{tuned_reads:.0f} FUSE reads for {SIZE >> 20} MiB with read_ahead_kb {CONFIGURED_KB} "
        f"(untuned: {small_reads:.0f})")
