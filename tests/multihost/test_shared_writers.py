"""Several writers of one file on different hosts (issue 41; docs/posix.md "Several
writers"): no EBUSY; the master merges each writer's commit per block slot (the last
commit wins a slot, whole); a truncation (an O_TRUNC open) starts a new generation, and a
writer whose writes began before it gets ESTALE at its close, so LMCache's two pods
writing one `.tmp` name "wb" always leave one whole chunk, never a mix."""
from __future__ import annotations

import errno
import hashlib
import os
import struct
import threading
import time
import typing
from pathlib import Path

import pytest

from curvine_py.testing.netcluster import NetCluster
from tests.conftest import FAST_MASTER_FLAGS

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]
Factory = typing.Callable[..., NetCluster]
MB = 1 << 20
BS = 4 * MB   # the cluster's default block size
HEADER = struct.Struct("<I32s")   # (the writer's tag, sha256 of the payload): 36 bytes


def two_mounts(factory: Factory, tmp_path: Path) -> tuple[NetCluster, Path, Path]:
    c = factory(worker_hosts=(1, 2), extra_master_flags=FAST_MASTER_FLAGS)
    # (each host's kernel forgets a name the other made or renamed at once: the rounds read
    # the chunk through both mounts right after the second store)
    flags = ("--fuse-kernel-invalidation", "true")
    return c, c.mount(1, tmp_path / "m1", *flags), c.mount(3, tmp_path / "m3", *flags)


def at_once(*jobs: typing.Callable[[threading.Barrier], None]) -> list[BaseException]:
    """Run the jobs on threads of their own, each handed one barrier for all of them (to
    line up their opens and writes); the exceptions they raised (joined within 120 s)."""
    barrier = threading.Barrier(len(jobs), timeout=60)
    errors: list[BaseException] = []

    def run(job: typing.Callable[[threading.Barrier], None]) -> None:
        try:
            job(barrier)
        except BaseException as e:   # reported by the caller
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(j,), daemon=True) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a writer hung"
    return errors


def write_at(path: Path, offset: int, data: bytes) -> typing.Callable[[threading.Barrier], None]:
    """A writer that opens path O_RDWR, waits for the others to open, writes data at
    offset, waits for the others to have written, and closes (commits)."""
    def job(barrier: threading.Barrier) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            barrier.wait()
            os.pwrite(fd, data, offset)
            barrier.wait()
        finally:
            os.close(fd)
    return job


def test_two_hosts_writing_different_blocks_of_one_file_both_survive(net_cluster_factory: Factory,
                                                                     tmp_path: Path) -> None:
    c, m1, m3 = two_mounts(net_cluster_factory, tmp_path)
    base = b"." * (3 * BS)
    (m1 / "f").write_bytes(base)
    a, b = b"A" * BS, b"B" * (BS // 2)
    assert not at_once(write_at(m1 / "f", 0, a), write_at(m3 / "f", 2 * BS + 100, b))
    want = a + base[BS:2 * BS + 100] + b + base[2 * BS + 100 + len(b):]
    for m in (m1, m3):
        got = (m / "f").read_bytes()
        assert len(got) == len(want) and got == want


@pytest.mark.parametrize("last", ["m1", "m3"])
def test_the_same_block_from_two_hosts_the_last_commit_wins_it_whole(net_cluster_factory: Factory,
                                                                     tmp_path: Path, last: str) -> None:
    """Both hosts rewrite overlapping bytes of the second block; the one that closes last
    wins the whole block as it saw it (its bytes on the file's bytes at its open): the
    other's bytes are nowhere in it.  The other blocks are untouched."""
    c, m1, m3 = two_mounts(net_cluster_factory, tmp_path)
    base = bytes(range(256)) * (3 * BS // 256)
    (m1 / "f").write_bytes(base)
    writers = {"m1": (m1, BS + 1000, b"1" * MB), "m3": (m3, BS + 1000 + MB // 2, b"3" * MB)}
    first = "m3" if last == "m1" else "m1"
    order = threading.Event()

    def job(name: str) -> typing.Callable[[threading.Barrier], None]:
        m, offset, data = writers[name]

        def run(barrier: threading.Barrier) -> None:
            fd = os.open(m / "f", os.O_RDWR)
            try:
                barrier.wait()
                os.pwrite(fd, data, offset)
                barrier.wait()
                if name == last:
                    assert order.wait(60)
            finally:
                os.close(fd)
                if name == first:
                    order.set()
        return run

    assert not at_once(job("m1"), job("m3"))
    _, offset, data = writers[last]
    want = bytearray(base)
    want[offset:offset + len(data)] = data
    for m in (m1, m3):
        assert (m / "f").read_bytes() == bytes(want)


def chunk(tag: int, size: int) -> bytes:
    """A chunk as LMCache's fs:// connector writes it: a header (here: the writer's tag and
    the payload's sha256), then the payload."""
    payload = os.urandom(size)
    return HEADER.pack(tag, hashlib.sha256(payload).digest()) + payload


def whole(data: bytes, size: int) -> int:
    """The tag of the writer whose whole chunk data is; fails on a mix or a short chunk."""
    assert len(data) == HEADER.size + size, f"a chunk of {len(data)} bytes, not {HEADER.size + size}"
    tag, digest = HEADER.unpack_from(data)
    assert hashlib.sha256(data[HEADER.size:]).digest() == digest, f"a mix (tag {tag}'s header)"
    return int(tag)


def test_lmcache_tmp_then_rename_from_two_hosts_leaves_one_whole_chunk(net_cluster_factory: Factory,
                                                                        tmp_path: Path) -> None:
    """Two pods store the same key at once, each: open `<key>.tmp` "wb" (O_TRUNC), write
    header + payload, close, rename to `<key>.data`.  Whichever way they interleave, the
    chunk after both is one writer's, whole; a loser's close (ESTALE) or rename (ENOENT,
    its .tmp renamed by the other) fails, and it skips the store, as LMCache does.  One
    pod starts up to 80 ms after the other (by round), so the rounds cover opens at once,
    a truncation of a file the other is writing, closing or renaming, and one after it."""
    c, m1, m3 = two_mounts(net_cluster_factory, tmp_path)
    size = 6 * MB   # two blocks: a mix of two writers' blocks would be possible
    (m1 / "kv").mkdir()
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def store(m: Path, key: str, data: bytes, delay: float) -> typing.Callable[[threading.Barrier], None]:
        def job(barrier: threading.Barrier) -> None:
            barrier.wait()
            time.sleep(delay)
            try:
                with open(m / "kv" / f"{key}.tmp", "wb") as f:
                    f.write(data[:HEADER.size])
                    f.write(data[HEADER.size:])
                os.rename(m / "kv" / f"{key}.tmp", m / "kv" / f"{key}.data")
                outcome = "stored"
            except OSError as e:
                assert e.errno in (errno.ESTALE, errno.ENOENT), e
                outcome = errno.errorcode[e.errno]
            with lock:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return job

    rounds = 12
    for r in range(rounds):
        key, delay = f"k{r}", (0.0, 0.005, 0.01, 0.02, 0.04, 0.08)[r // 2 % 6]
        delays = (delay, 0.0) if r % 2 else (0.0, delay)
        assert not at_once(store(m1, key, chunk(1, size), delays[0]), store(m3, key, chunk(3, size), delays[1]))
        for m in (m1, m3):
            assert whole((m / "kv" / f"{key}.data").read_bytes(), size) in (1, 3)
    print(f"outcomes of {2 * rounds} stores: {outcomes}")
    assert outcomes.get("stored", 0) >= rounds


def test_a_writer_whose_file_another_host_truncated_gets_estale(net_cluster_factory: Factory,
                                                                tmp_path: Path) -> None:
    """Host 1 writes a file opened before host 3 opened it O_TRUNC and wrote it whole: host
    1's writes began under the content that truncation replaced, so its close fails with
    ESTALE and the file is host 3's, whole."""
    c, m1, m3 = two_mounts(net_cluster_factory, tmp_path)
    (m1 / "f").write_bytes(b"o" * (2 * BS))
    fd = os.open(m1 / "f", os.O_RDWR)
    try:
        os.pwrite(fd, b"1" * MB, BS)          # (its writer holds a lease now)
        with open(m3 / "f", "wb") as f:       # O_TRUNC: a new generation
            f.write(b"3" * (BS + 10))
        os.pwrite(fd, b"1" * MB, 0)
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno == errno.ESTALE
    finally:
        try:
            os.close(fd)
        except OSError as e:                  # (the writer's sticky error, reported again)
            assert e.errno == errno.ESTALE
    for m in (m1, m3):
        assert (m / "f").read_bytes() == b"3" * (BS + 10)

    # A writer whose every write was committed (fsync) before the truncation loses nothing:
    # its close does not fail, and its bytes are gone with the truncation, as anyone's.
    fd = os.open(m1 / "f", os.O_RDWR)
    try:
        os.pwrite(fd, b"1" * 10, 0)
        os.fsync(fd)
        with open(m3 / "f", "wb") as f:
            f.write(b"3" * 20)
    finally:
        os.close(fd)
    for m in (m1, m3):
        assert (m / "f").read_bytes() == b"3" * 20
