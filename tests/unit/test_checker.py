"""The block checker process (client/checker.py): the chunk sums of an open file, hashed
by a child at idle priority, equal the writer's; bad input gets an error, not a hang; a
child that died is started again."""
from __future__ import annotations

import os
from typing import Iterator
from pathlib import Path

import pytest

from curvine_py.client.checker import Checker
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
