"""The block checker process (client/mount/checker.py): the chunk sums of an open file, hashed
by a child at idle priority, equal the writer's; bad input gets an error, not a hang; a
child that died is started again."""
from __future__ import annotations

import os
import signal
from typing import Iterator
from pathlib import Path

import pytest

from curvine_py.client.mount.checker import Checker
from curvine_py.common.blockmeta import CHUNK, BlockHasher, BlockMeta


def meta_of(data: bytes) -> BlockMeta:
    h = BlockHasher()
    h.update(memoryview(data))
    return BlockMeta(len(data), h.checksum, tuple(h.chunk_sums()))


@pytest.fixture
def checker() -> Iterator[Checker]:
    c = Checker()
    yield c
    c.close()


def test_sums_match_the_writers_and_the_child_idles(tmp_path: Path, checker: Checker) -> None:
    for size in (1, CHUNK, 3 * CHUNK + 5):
        data = os.urandom(size)
        (tmp_path / "b").write_bytes(data)
        fd = os.open(tmp_path / "b", os.O_RDONLY)
        try:
            assert checker.sums(fd, meta_of(data)) == list(meta_of(data).chunk_sums)
        finally:
            os.close(fd)
    proc = checker._proc
    assert proc is not None
    assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
    checker.boost()
    assert os.sched_getscheduler(proc.pid) == os.SCHED_OTHER
    checker.idle()
    assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE


def test_a_short_file_is_an_error_and_a_dead_child_is_replaced(tmp_path: Path, checker: Checker) -> None:
    data = os.urandom(2 * CHUNK)
    (tmp_path / "b").write_bytes(data[:CHUNK])          # shorter than its meta says
    fd = os.open(tmp_path / "b", os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="fewer than"):
            checker.sums(fd, meta_of(data))
        proc = checker._proc
        assert proc is not None
        proc.kill()
        proc.wait()
        with pytest.raises(OSError, match="exited"):
            checker.sums(fd, meta_of(data[:CHUNK]))
        assert checker.sums(fd, meta_of(data[:CHUNK])) == list(meta_of(data[:CHUNK]).chunk_sums)
    finally:
        os.close(fd)


def test_a_silent_child_is_replaced_after_the_timeout(tmp_path: Path) -> None:
    data = os.urandom(CHUNK + 1)
    (tmp_path / "b").write_bytes(data)
    checker = Checker(timeout_s=0.5)
    fd = os.open(tmp_path / "b", os.O_RDONLY)
    try:
        checker.start()
        proc = checker._proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        with pytest.raises(OSError, match="did not answer"):
            checker.sums(fd, meta_of(data))
        assert proc.poll() is not None                       # killed, not left stopped
        checker.timeout_s = 30.0   # the new child's start (at idle priority) is no answer's delay
        assert checker.sums(fd, meta_of(data)) == list(meta_of(data).chunk_sums)
    finally:
        os.close(fd)
        checker.close()


def test_an_open_does_not_wait_for_a_stuck_check_ahead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ShortCircuit: an open that finds its block under a check ahead that never ends
    (here: a check registered and never finished) hashes the block itself after
    CHECK_WAIT_S, instead of hanging the open."""
    import threading
    import time

    from curvine_py.client import shortcircuit
    from curvine_py.client.shortcircuit import LocalBlock, ShortCircuit

    data = os.urandom(2 * CHUNK + 3)
    (tmp_path / "b").write_bytes(data)
    monkeypatch.setattr(shortcircuit, "CHECK_WAIT_S", 0.3)
    sc = ShortCircuit("here")
    lent = []
    sc._verifying[(1, 7)] = (threading.Event(), lambda: lent.append(1))
    fd = os.open(tmp_path / "b", os.O_RDONLY)
    try:
        t = time.monotonic()
        sc._ensure_verified((1, 7), LocalBlock(str(tmp_path / "b"), meta_of(data)), fd, sc._chunk_sums, None)
        assert 0.3 <= time.monotonic() - t < 5
        assert lent == [1]                                   # it lent the check its priority first
        assert (1, 7) in sc._verified
    finally:
        os.close(fd)
        sc.close()
