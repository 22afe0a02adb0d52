"""The bounded cache through a real mount, with LMCache's fs:// write and read pattern.

A 2-worker cluster of 64 MiB per worker (two replicas: 64 MiB of files) gets about three
times its size in 4 MiB chunks written through the mount (create ``.tmp``, write the
28-byte header, write the payload in one call, close, rename to ``.data``).  No write may
fail, usage (df through the mount) stays under the high watermark plus one file, the
chunks read recently survive, pinned chunks survive, a TTL directory empties, and every
chunk still there is byte-exact.  Pin, TTL and tier are xattrs through the mount.
"""
from __future__ import annotations

import errno
import os
import time
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.local import LocalCluster

from tests.conftest import FAST_MASTER_FLAGS, start_cluster

pytestmark = pytest.mark.timeout(300)

MiB = 1 << 20
CHUNK = 4 * MiB
HEADER = 28
EVICT_FLAGS = (*FAST_MASTER_FLAGS, "--master-evict-interval-s", "0.1", "--master-ttl-sweep-s", "0.3",
               "--master-block-size", "1MiB")


@pytest.fixture(scope="module")
def posix_cluster(tmp_path_factory: pytest.TempPathFactory,
                  request: pytest.FixtureRequest) -> typing.Iterator[LocalCluster]:
    """Overrides conftest's: small capacity, fast eviction and TTL sweeps, 1 MiB blocks."""
    request.module._failed_before = request.session.testsfailed
    c = start_cluster(tmp_path_factory.mktemp("evict") / "cluster", capacity="64MiB",
                      extra_master_flags=EVICT_FLAGS)
    try:
        yield c
    finally:
        c.stop()


def chunk_bytes(i: int) -> tuple[bytes, bytes]:
    """(header, payload) of chunk i: distinct bytes per chunk."""
    header = b"LMC" + i.to_bytes(4, "little") * 6 + b"!"
    seed = os.urandom(0) + i.to_bytes(4, "little")
    return header, (seed * (CHUNK // 4))


def write_chunk(d: Path, i: int) -> None:
    """LMCache's pattern: tmp name, header, payload in one call, close, rename."""
    header, payload = chunk_bytes(i)
    tmp = d / f"m@1@0@{i:05d}@bf16.data.tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(payload)
    os.rename(tmp, d / f"m@1@0@{i:05d}@bf16.data")


def read_chunk(d: Path, i: int) -> bytes | None:
    """open, read 4 KiB, read the rest, close; None when the chunk is gone (a miss)."""
    try:
        with open(d / f"m@1@0@{i:05d}@bf16.data", "rb") as f:
            head = f.read(4096)
            return head + f.read()
    except FileNotFoundError:
        return None


def expected(i: int) -> bytes:
    header, payload = chunk_bytes(i)
    return header + payload


def used_and_capacity(mountpoint: Path) -> tuple[int, int]:
    st = os.statvfs(mountpoint)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


def test_kvcache_far_past_capacity(mounted: typing.Any) -> None:
    root: Path = mounted.path
    kv, pinned, ttl = root / "kv", root / "pinned", root / "ttl"
    for d in (kv, pinned, ttl):
        d.mkdir()
    os.setxattr(pinned, "user.curvine.pin", b"1")
    os.setxattr(ttl, "user.curvine.ttl", b"1")
    assert os.getxattr(pinned, "user.curvine.pin") == b"1"
    for i in (9000, 9001):
        write_chunk(pinned, i)
    write_chunk(ttl, 9100)
    _, capacity = used_and_capacity(root)
    assert capacity == 128 * MiB
    hot = (0, 1)
    peak = 0
    n = 48                                          # 192 MiB of chunks into a 64 MiB pool
    for i in range(n):
        write_chunk(kv, i)                          # no write may fail
        if i > 1 and i % 3 == 0:
            for h in hot:                           # the hot prefix is read again and again
                assert read_chunk(kv, h) == expected(h)
        peak = max(peak, used_and_capacity(root)[0])
    bound = 0.9 * capacity + 2 * (CHUNK + HEADER)   # the watermark plus one file (two replicas)
    print(f"peak usage {peak / MiB:.1f} MiB of {capacity / MiB:.0f} MiB (bound {bound / MiB:.1f} MiB)")
    assert peak <= bound, (peak / MiB, bound / MiB)
    survivors = [i for i in range(n) if (kv / f"m@1@0@{i:05d}@bf16.data").exists()]
    assert set(hot) <= set(survivors), survivors
    assert n - 1 in survivors and len(survivors) < n // 2, survivors
    for i in range(n):                              # whole chunks or misses, never torn ones
        got = read_chunk(kv, i)
        assert got is None or got == expected(i), i
    assert [got for got in (read_chunk(pinned, i) for i in (9000, 9001))] == [expected(9000), expected(9001)]
    deadline = time.monotonic() + 10
    while (ttl / "m@1@0@09100@bf16.data").exists():
        assert time.monotonic() < deadline, "TTL sweep did not remove the expired chunk"
        time.sleep(0.1)
    assert not [p.name for p in kv.iterdir() if p.name.endswith(".tmp")]


def test_policy_xattrs_through_the_mount(mounted: typing.Any) -> None:
    d: Path = mounted.path / "xattrs"
    d.mkdir()
    os.setxattr(d, "user.curvine.ttl", b"7d")
    assert os.getxattr(d, "user.curvine.ttl") == b"604800"
    os.setxattr(d, "user.curvine.tier", b"SSD")
    assert os.getxattr(d, "user.curvine.tier") == b"ssd"
    for name, bad in (("user.curvine.ttl", b"later"), ("user.curvine.tier", b"tape"),
                      ("user.curvine.pin", b"perhaps")):
        with pytest.raises(OSError) as e:
            os.setxattr(d, name, bad)
        assert e.value.errno == errno.EINVAL
    os.removexattr(d, "user.curvine.ttl")
    assert "user.curvine.ttl" not in os.listxattr(d)


def test_full_pool_of_pinned_chunks_is_enospc_through_the_mount(mounted: typing.Any) -> None:
    d: Path = mounted.path / "allpinned"
    d.mkdir()
    os.setxattr(d, "user.curvine.pin", b"1")
    written, failure = [], None
    for i in range(40):                             # 160 MiB of pinned chunks into a 64 MiB pool
        try:
            write_chunk(d, i)
            written.append(i)
        except OSError as e:
            failure = e
            break
    assert failure is not None and failure.errno == errno.ENOSPC, failure
    assert 8 <= len(written) <= 16, written
    for i in written:                               # nothing else broke: the pinned chunks read back
        assert read_chunk(d, i) == expected(i)
    os.removexattr(d, "user.curvine.pin")           # unpinned, they may go: writes work again
    for i in range(100, 104):
        write_chunk(d, i)
        assert read_chunk(d, i) == expected(i)
