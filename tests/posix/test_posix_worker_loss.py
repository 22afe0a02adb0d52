"""A worker lost in the middle of a read through the mount: the reader must not notice.

This module gets its own cluster (the fixtures are module-scoped) because it kills
workers.  Every block has two replicas on two workers, so any single worker's loss
leaves every block readable.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

MiB = 1 << 20
# a hung (SIGSTOPped) worker is given up after this long and the other replica is asked
MOUNT_FLAGS = ("--client-data-timeout-s", "2")


def make_file(path: Path, size: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(size)
    with open(path, "wb") as f:
        f.write(data)
    return data


def read_with_fault(path: Path, fault_after: int, fault: "callable[[], None]") -> bytes:  # type: ignore[valid-type]
    """Read path in 1 MiB calls; after fault_after bytes, run fault() and go on reading."""
    out = bytearray()
    faulted = False
    with open(path, "rb", buffering=0) as f:
        while True:
            if not faulted and len(out) >= fault_after:
                fault()
                faulted = True
            chunk = f.read(MiB)
            if not chunk:
                break
            out += chunk
    assert faulted
    return bytes(out)


@pytest.mark.timeout(180)
def test_worker_killed_mid_read_is_failed_over(mounted, d: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = mounted.cluster
    data = make_file(d / "big", 40 * MiB, 1)
    try:
        start = time.monotonic()
        got = read_with_fault(d / "big", 6 * MiB, lambda: cluster.kill_worker(0, signal.SIGKILL))
        took = time.monotonic() - start
        assert len(got) == len(data)
        assert got == data
        assert took < 30, f"fail-over took {took:.1f} s"
        # a fresh open after the loss reads everything from the surviving replicas
        with open(d / "big", "rb") as f:
            assert f.read() == data
    finally:
        cluster.restart_worker(0)


@pytest.mark.timeout(180)
def test_worker_hung_mid_read_is_failed_over(mounted, d: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = mounted.cluster
    data = make_file(d / "big", 40 * MiB, 2)
    w = cluster.workers[1]
    try:
        got = read_with_fault(d / "big", 6 * MiB, lambda: cluster.kill_worker(1, signal.SIGSTOP))
        assert got == data
    finally:
        w.signal(signal.SIGCONT)


@pytest.mark.timeout(180)
def test_concurrent_readers_survive_a_worker_kill(mounted, d: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = mounted.cluster
    files = {f"f{i}": make_file(d / f"f{i}", 12 * MiB, 10 + i) for i in range(3)}
    results: dict[str, bytes | BaseException] = {}

    def reader(name: str) -> None:
        try:
            out = bytearray()
            with open(d / name, "rb", buffering=0) as f:
                while chunk := f.read(256 * 1024):
                    out += chunk
                    time.sleep(0.005)
            results[name] = bytes(out)
        except BaseException as e:  # reported below
            results[name] = e

    threads = [threading.Thread(target=reader, args=(n,)) for n in files]
    try:
        for t in threads:
            t.start()
        time.sleep(0.2)
        cluster.kill_worker(1, signal.SIGKILL)
        for t in threads:
            t.join(120)
        for name, data in files.items():
            got = results.get(name)
            assert not isinstance(got, BaseException), f"{name}: {got!r}"
            assert got == data, f"{name}: wrong bytes"
    finally:
        cluster.restart_worker(1)


@pytest.mark.timeout(180)
def test_write_with_one_worker_down_then_read(mounted, d: Path) -> None:  # type: ignore[no-untyped-def]
    """With a worker gone, new files still get written (to the survivor) and read back."""
    cluster = mounted.cluster
    cluster.kill_worker(0, signal.SIGKILL)
    try:
        data = make_file(d / "during", 9 * MiB, 3)
        with open(d / "during", "rb") as f:
            assert f.read() == data
    finally:
        cluster.restart_worker(0)
    with open(d / "during", "rb") as f:
        assert f.read() == data
    assert os.stat(d / "during").st_size == len(data)
