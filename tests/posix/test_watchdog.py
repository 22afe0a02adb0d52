"""The mount's watchdog (fuse/watchdog.py): no request hangs forever, no detached mount lingers.

Real hangs, made with real processes: both workers of this module's own cluster are
SIGSTOPped, so a block fetch of a mount whose page cache cannot serve the file waits on
the data channel (the mounts here wait up to 600 s for a worker, far past the
watchdog's limit).  Every test SIGCONTs the workers and stops its mounts, whatever happened.
"""
from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import threading
import time
import typing
from pathlib import Path

import pytest

import trio

from curvine_py.fuse.watchdog import Abandoned, Requests, hop
from curvine_py.common.mounttable import is_mounted
from curvine_py.cluster.local import LocalCluster
from tests.posix.conftest import Mount, start_mount

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
# a stopped worker is waited for, not failed over: only the watchdog ends the wait
PATIENT = ("--client-read-timeout-s", "600", "--client-data-timeout-s", "600")
LIMIT_S = 2.0


class Outcome:
    """What a call made in a thread did: its value or error, and how long it took."""

    def __init__(self) -> None:
        self.value: typing.Any = None
        self.error: BaseException | None = None
        self.took: float | None = None
        self.done = threading.Event()


def in_thread(fn: typing.Callable[[], typing.Any]) -> Outcome:
    out = Outcome()

    def run() -> None:
        start = time.monotonic()
        try:
            out.value = fn()
        except BaseException as e:
            out.error = e
        out.took = time.monotonic() - start
        out.done.set()

    threading.Thread(target=run, daemon=True).start()   # a hung call must not hold pytest
    return out


def bounded(fn: typing.Callable[[], typing.Any], timeout: float) -> Outcome:
    out = in_thread(fn)
    assert out.done.wait(timeout), f"still blocked after {timeout} s"
    return out


class Mounts:
    """The mounts of one test, all stopped at its end (after the workers run again)."""

    def __init__(self, cluster: LocalCluster, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.all: list[Mount] = []
        self.stopped = False

    def start(self, name: str, *extra: str) -> Mount:
        m = start_mount(self.cluster, self.tmp / name, self.tmp / "run", self.tmp / f"{name}.log", extra)
        self.all.append(m)
        return m

    def stop_workers(self) -> None:
        self.stopped = True
        for i in range(len(self.cluster.workers)):
            self.cluster.kill_worker(i, signal.SIGSTOP)

    def cont_workers(self) -> None:
        for w in self.cluster.workers:
            w.signal(signal.SIGCONT)
        self.stopped = False

    def close(self) -> None:
        try:
            self.cont_workers()
        finally:
            for m in self.all:
                m.stop()


@pytest.fixture
def mounts(posix_cluster: LocalCluster, tmp_path: Path) -> typing.Iterator[Mounts]:
    os.chmod(tmp_path, 0o755)
    ms = Mounts(posix_cluster, tmp_path)
    try:
        yield ms
    finally:
        ms.close()


def write_file(path: Path, size: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(size)
    with open(path, "wb") as f:
        f.write(data)
    return data


def read_some(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(MiB)


def test_a_hung_read_is_answered_eio_and_the_mount_goes_on(mounts: Mounts) -> None:
    writer = mounts.start("w")
    d = writer.path / f"hung-{os.urandom(3).hex()}"
    d.mkdir()
    write_file(d / "x", 8 * MiB, 1)
    write_file(d / "other", 4096, 2)
    # a fresh mount: nothing of x in its page cache or block cache
    reader = mounts.start("r", "--fuse-request-timeout-s", str(LIMIT_S), *PATIENT)
    rd = reader.path / d.name
    mounts.stop_workers()

    out = bounded(lambda: read_some(rd / "x"), 30)
    assert isinstance(out.error, OSError) and out.error.errno == errno.EIO, (out.error, out.value)
    assert out.took is not None and LIMIT_S <= out.took < 20, out.took

    # the mount goes on: names, attributes, listings (the master answers them)
    assert bounded(lambda: os.stat(rd / "other").st_size, 10).value == 4096
    missing = bounded(lambda: os.stat(rd / "nope"), 10).error
    assert isinstance(missing, FileNotFoundError)
    assert sorted(bounded(lambda: os.listdir(rd), 10).value) == ["other", "x"]

    log = reader.log.read_text(errors="replace")
    lines = [ln for ln in log.splitlines() if " ERROR " in ln and "request timed out" in ln]
    assert lines, reader.log_tail()
    assert "read fh=" in lines[0] and "abandoned" in lines[0], lines[0]
    record = log[log.index(lines[0]):]
    for part in ("BufferPool size=", "open handles:", "reader(", "fetching=", "writers:",
                 "requests in flight:", "thread hops:"):
        assert part in record, f"{part!r} missing from the watchdog's report:\n{record[:3000]}"

    # cv umount's way (SIGTERM) still ends it, with the workers still stopped and a
    # thread still stuck in a fetch
    start = time.monotonic()
    reader.proc.send_signal(signal.SIGTERM)
    assert reader.proc.wait(20) == 0, reader.log_tail()
    assert time.monotonic() - start < 20
    assert not is_mounted(str(reader.path))


def test_a_lazily_detached_mount_ends_its_daemon(mounts: Mounts) -> None:
    writer = mounts.start("w")
    d = writer.path / f"detach-{os.urandom(3).hex()}"
    d.mkdir()
    write_file(d / "y", 8 * MiB, 3)
    m = mounts.start("m", *PATIENT)   # the default limit (60 s): only the detach ends the wait
    mounts.stop_workers()
    hung = in_thread(lambda: read_some(m.path / d.name / "y"))
    assert not hung.done.wait(1.5), (hung.error, hung.value)   # it does hang

    r = subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    start = time.monotonic()
    try:
        code = m.proc.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon outlived its detached mount by 15 s:\n{m.log_tail()}")
    assert code == 0, m.log_tail()
    assert time.monotonic() - start < 15
    assert hung.done.wait(10), "the reader still waits after the daemon exited"
    assert isinstance(hung.error, OSError), (hung.error, hung.value)
    assert "no longer mounted" in m.log.read_text(errors="replace")


def test_a_write_given_up_is_never_committed(mounts: Mounts) -> None:
    """A write request the watchdog gives up fails its file's writer: the write reports
    EIO, so does the close, and the file is never committed without those bytes.

    With 256 KiB blocks, a write request (up to 1 MiB) covers whole blocks: they are
    shipped from the request's own bytes in a worker thread, which waits for the
    (stopped) workers -- the one write path that hangs in a thread."""
    m = mounts.start("m", "--fuse-request-timeout-s", str(LIMIT_S), "--client-block-size", str(256 << 10), *PATIENT)
    d = m.path / f"wr-{os.urandom(3).hex()}"
    d.mkdir()
    mounts.stop_workers()

    def write() -> list[str]:
        said = []
        fd = os.open(d / "z", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, random.Random(4).randbytes(MiB), 0)
            said.append("written")
        except OSError as e:
            said.append(errno.errorcode.get(e.errno or 0, str(e.errno)))
        finally:
            try:
                os.close(fd)
                said.append("closed")
            except OSError as e:
                said.append("close " + errno.errorcode.get(e.errno or 0, str(e.errno)))
        return said

    out = bounded(write, 60)
    assert out.error is None, out.error
    assert out.value == ["EIO", "close EIO"], (out.value, m.log_tail())
    log = m.log.read_text(errors="replace")
    assert "request timed out" in log and "write fh=" in log, m.log_tail()
    assert "a write request was given up" in log, m.log_tail()

    mounts.cont_workers()   # the abandoned thread's ship completes now: still nothing committed
    time.sleep(2 * LIMIT_S)
    fresh = mounts.start("fresh")
    assert os.stat(fresh.path / d.name / "z").st_size == 0


# ---------------------------------------------------------------------- the hop itself
def test_an_abandoned_hop_answers_at_once_and_drops_its_late_result() -> None:
    """The watchdog gives a request up while its thread still waits: the request goes on
    at once (Abandoned), the thread's later result is handed to discard, and the thread's
    limiter token is held until the thread really ended."""
    release, dropped = threading.Event(), threading.Event()
    seen: list[typing.Any] = []

    def blocked() -> str:
        release.wait(30)
        return "late"

    def discard(value: str) -> None:
        seen.append(("discarded", value))
        dropped.set()

    async def main() -> None:
        requests, limiter = Requests(60.0), trio.CapacityLimiter(4)
        req = requests.begin("read", "fh", 1)

        async def give_up() -> None:   # as the watchdog does, from another task
            await trio.sleep(0.2)
            requests.expire(req)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(give_up)
                start = time.monotonic()
                try:
                    await hop(req, limiter, blocked, discard=discard)
                except Abandoned:
                    seen.append("abandoned")
                seen.append(("waited", time.monotonic() - start < 5))
        finally:
            requests.end(req)
        seen.append(("tokens while the thread runs", limiter.borrowed_tokens))
        release.set()
        with trio.fail_after(10):
            while limiter.borrowed_tokens:
                await trio.sleep(0.01)
        assert await trio.to_thread.run_sync(dropped.wait, 10)

    trio.run(main)
    assert seen == ["abandoned", ("waited", True), ("tokens while the thread runs", 1),
                    ("discarded", "late")], seen


def test_a_hop_cancelled_from_outside_is_abandoned_too() -> None:
    """The loop stopping (an outer cancel scope) does not wait for the thread either."""
    release, dropped = threading.Event(), threading.Event()
    seen: list[str] = []

    async def main() -> None:
        requests, limiter = Requests(60.0), trio.CapacityLimiter(4)
        req = requests.begin("read", "fh", 1)
        try:
            with trio.move_on_after(0.2) as scope:
                await hop(req, limiter, lambda: release.wait(30) and "late",
                          discard=lambda v: (seen.append(v), dropped.set()))
        finally:
            requests.end(req)
        assert scope.cancelled_caught and not seen
        release.set()
        assert await trio.to_thread.run_sync(dropped.wait, 10)
        with trio.fail_after(10):
            while limiter.borrowed_tokens:
                await trio.sleep(0.01)

    trio.run(main)
    assert seen == ["late"]


def test_a_request_waiting_for_a_free_thread_is_given_up_too() -> None:
    """Abandoned threads keep their limiter tokens until they end: a request that finds
    every thread busy waits for one, and the watchdog ends that wait as well."""
    release = threading.Event()
    seen: list[str] = []

    async def main() -> None:
        requests, limiter = Requests(60.0), trio.CapacityLimiter(1)
        first = requests.begin("read", "fh", 1)
        second = requests.begin("read", "fh", 2)

        async def give_up() -> None:
            await trio.sleep(0.2)
            requests.expire(first)     # its thread runs on, holding the only token
            await trio.sleep(0.2)
            seen.append(second.describe(time.monotonic())[2])
            requests.expire(second)

        async def call(req: typing.Any, name: str) -> None:
            try:
                await hop(req, limiter, lambda: release.wait(30))
            except Abandoned:
                seen.append(f"{name} abandoned")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(give_up)
            nursery.start_soon(call, first, "first")
            await trio.sleep(0.1)
            nursery.start_soon(call, second, "second")
        release.set()
        with trio.fail_after(10):
            while limiter.borrowed_tokens:
                await trio.sleep(0.01)

    trio.run(main)
    assert seen == ["first abandoned", "a free thread for <lambda> (every one busy)", "second abandoned"], seen
