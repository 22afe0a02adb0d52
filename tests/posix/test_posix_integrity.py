"""Data integrity through the mount: random writes, truncates and reads against a model.

A hypothesis state machine drives one file on the mount with pwrite at random offsets
(up to ~12 MiB, so several 4 MiB blocks and their boundaries are crossed; small and
large writes), ftruncate/truncate that grow and shrink, reads of random ranges, and
close + reopen (which commits to the master), checking every read against a bytearray.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

MiB = 1 << 20
BS = 4 * MiB
MAX_OFFSET = 12 * MiB

# offsets cluster around block boundaries, where the bugs live
boundary = st.builds(lambda k, delta: max(0, k * BS + delta), st.integers(0, 3), st.integers(-4096, 4096))
offsets = st.one_of(st.integers(0, MAX_OFFSET), boundary)
sizes = st.one_of(st.integers(1, 4096), st.integers(4097, 256 * 1024), st.integers(256 * 1024, 5 * MiB))


def payload(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


class MountedFile(RuleBasedStateMachine):
    directory: Path = Path("/nonexistent")

    def __init__(self) -> None:
        super().__init__()
        self.path = self.directory / f"f-{os.urandom(4).hex()}"
        self.model = bytearray()
        self.fd = -1

    @initialize()
    def create(self) -> None:
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)

    @rule(offset=offsets, size=sizes, seed=st.integers(0, 2**32))
    def pwrite(self, offset: int, size: int, seed: int) -> None:
        data = payload(seed, size)
        assert os.pwrite(self.fd, data, offset) == size
        if offset > len(self.model):
            self.model.extend(bytes(offset - len(self.model)))
        self.model[offset:offset + size] = data

    @rule(offset=offsets, size=sizes, seed=st.integers(0, 2**32))
    def pwrite_through_a_second_descriptor(self, offset: int, size: int, seed: int) -> None:
        """Another descriptor of the same file, opened, written and closed (flushed) meanwhile."""
        fd = os.open(self.path, os.O_WRONLY)
        try:
            data = payload(seed, size)
            assert os.pwrite(fd, data, offset) == size
        finally:
            os.close(fd)
        if offset > len(self.model):
            self.model.extend(bytes(offset - len(self.model)))
        self.model[offset:offset + size] = data

    @rule(offset=offsets, size=sizes)
    def read_through_a_new_descriptor(self, offset: int, size: int) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            got = os.pread(fd, size, offset)
        finally:
            os.close(fd)
        want = bytes(self.model[offset:offset + size])
        assert got == want, f"new-fd read({offset}, {size}) differs first at {first_diff(got, want)}"

    @rule(size=st.one_of(st.integers(0, MAX_OFFSET + 2 * MiB), boundary), by_path=st.booleans())
    def truncate(self, size: int, by_path: bool) -> None:
        if by_path:
            os.truncate(self.path, size)
        else:
            os.ftruncate(self.fd, size)
        if size < len(self.model):
            del self.model[size:]
        else:
            self.model.extend(bytes(size - len(self.model)))

    @rule(offset=offsets, size=sizes)
    def read(self, offset: int, size: int) -> None:
        got = os.pread(self.fd, size, offset)
        want = bytes(self.model[offset:offset + size])
        assert len(got) == len(want), f"read({offset}, {size}): {len(got)} bytes, expected {len(want)}"
        assert got == want, f"read({offset}, {size}) differs first at {first_diff(got, want)}"

    @precondition(lambda self: self.fd >= 0)
    @rule(fsync=st.booleans())
    def close_and_reopen(self, fsync: bool) -> None:
        if fsync:
            os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        with open(self.path, "rb") as f:      # a fresh reader sees the committed file
            got = f.read()
        assert len(got) == len(self.model), f"size after close {len(got)}, expected {len(self.model)}"
        assert got == bytes(self.model), f"after close differs first at {first_diff(got, bytes(self.model))}"
        self.fd = os.open(self.path, os.O_RDWR)

    @invariant()
    def size_matches(self) -> None:
        if self.fd >= 0:
            assert os.fstat(self.fd).st_size == len(self.model)

    def teardown(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with open(self.path, "rb") as f:
            got = f.read()
        assert got == bytes(self.model), f"final contents differ first at {first_diff(got, bytes(self.model))}"
        os.unlink(self.path)


def first_diff(a: bytes, b: bytes) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@pytest.mark.timeout(300)
def test_random_writes_truncates_and_reads_match_a_model(d: Path) -> None:
    MountedFile.directory = d
    run_state_machine_as_test(MountedFile, settings=settings(
        max_examples=30, stateful_step_count=30, deadline=None, derandomize=False, print_blob=True,
        suppress_health_check=list(HealthCheck), database=None))
