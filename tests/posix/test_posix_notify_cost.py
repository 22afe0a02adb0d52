"""What ``fuse.kernel_invalidation`` costs the kernel's caches (issue 39): a push for a
file's attributes takes its attributes, never its pages, and LMCache's own chunk pattern
does not keep the kernel asking the mount.

A push becomes ``invalidate_inode(ino, attr_only=True)`` (fuse/notify.py): the kernel
asks the mount for the attributes once more, but keeps the file's page cache, which it
drops only when the new attributes show another size or mtime.  Passthrough is off here
so that the file's reads go through the page cache and the mount (a read the page cache
missed is counted in ``curvine_fuse_read_bytes``); the kernel timeouts are 30 s, so what
reaches the daemon is what the invalidations made the kernel forget.
"""
from __future__ import annotations

import os
import re
import stat
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.posix.conftest import Mount
from tests.posix.test_posix_passthrough import write_kv   # (as LMCache's fs connector writes a chunk)

MOUNT_FLAGS = ("--fuse-attr-timeout-s", "30", "--fuse-entry-timeout-s", "30", "--fuse-kernel-invalidation", "true",
               "--fuse-passthrough", "false")
MiB = 1 << 20
CHUNKS = 8


def metric(m: Mount, pattern: str) -> float:
    """The sum of the mount's samples whose line matches pattern (name{labels} value)."""
    address = os.getxattr(m.path, "user.curvine.metrics").decode()
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^{pattern} (\S+)$", text, re.M))


def read_bytes(m: Mount) -> float:
    return metric(m, "curvine_fuse_read_bytes_total")


def told(m: Mount) -> float:
    """Notifications m's kernel took (fuse/notify.py)."""
    return metric(m, r'curvine_fuse_kernel_invalidations_total\{outcome="told"\}')


def pushes(m: Mount) -> float:
    return metric(m, r'curvine_fuse_kernel_invalidations_total\{outcome="push"\}')


def daemon_ops(m: Mount) -> float:
    """Lookups and getattrs m's daemon answered (its kernel's misses)."""
    return metric(m, r'curvine_fuse_op_duration_seconds_count\{op="(?:lookup|getattr)"\}')


def sessions(m: Mount) -> float:
    return metric(m, "curvine_client_metadata_cache_sessions")


def settled(m: Mount, quiet_s: float = 0.3, most_s: float = 5.0) -> None:
    """Until m's kernel has been told nothing new for quiet_s (at most most_s): the pushes
    of what was just done are handled."""
    deadline = time.monotonic() + most_s
    last, since = told(m), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        now = told(m)
        if now != last:
            last, since = now, time.monotonic()


@pytest.fixture(scope="module")
def dirs(mounted: Mount, second_mount: Mount) -> tuple[Path, Path]:
    (mounted.path / "kinval-cost").mkdir()
    wait_until("b's cache session", lambda: sessions(second_mount) >= 1, timeout=10)
    return mounted.path / "kinval-cost", second_mount.path / "kinval-cost"


def test_a_push_for_attributes_leaves_the_page_cache(dirs: tuple[Path, Path], second_mount: Mount) -> None:
    a, b = dirs
    data = os.urandom(2 * MiB)
    write_kv(a / "c.data", data)
    assert (b / "c.data").read_bytes() == data            # b's page cache has it now
    before = read_bytes(second_mount)
    assert (b / "c.data").read_bytes() == data
    assert read_bytes(second_mount) == before, "b's kernel did not keep the file's pages (no baseline)"

    was_told = told(second_mount)
    os.chmod(a / "c.data", 0o600)                         # a push to b for the file's attributes
    deadline = time.monotonic() + 1.0
    while stat.S_IMODE((b / "c.data").stat().st_mode) != 0o600:
        assert time.monotonic() < deadline, "b's kernel kept the old mode: the push did not reach it"
        time.sleep(0.001)
    wait_until("b's notifier counting it", lambda: told(second_mount) > was_told, timeout=1)

    before = read_bytes(second_mount)
    assert (b / "c.data").read_bytes() == data
    assert read_bytes(second_mount) == before, "the push for the attributes dropped b's page cache of the file"


def test_lmcache_chunks_written_and_looked_up_on_one_mount_stay_in_its_kernel(dirs: tuple[Path, Path],
                                                                              mounted: Mount) -> None:
    """The master pushes the writing mount nothing about its own chunks: every change they
    make (the create, the first block's allocation, which makes the file incomplete, the
    commit, the rename) comes back in the call's reply; once each chunk was statted,
    LMCache's later lookups of them are answered by the kernel alone."""
    a, _ = dirs
    data = os.urandom(3 * MiB)
    pushed = pushes(mounted)
    names = [a / f"m@1@0@{i:08x}@bf16.data" for i in range(CHUNKS)]
    for p in names:
        write_kv(p, data)
    settled(mounted)   # (a push handled after the first stats would rightly send the next one to the daemon)
    for p in names:
        assert p.stat().st_size == len(data)
    assert pushes(mounted) == pushed, "the master pushed the mount that wrote the chunks about its own change"
    before = daemon_ops(mounted)
    for _ in range(3):
        for p in names:
            assert p.stat().st_size == len(data)
    assert daemon_ops(mounted) == before, "LMCache's repeated lookups reached the daemon"
    for p in names:
        with open(p, "rb", buffering=0) as f:
            assert f.read(4096) + f.read() == data
