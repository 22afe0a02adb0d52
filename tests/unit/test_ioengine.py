"""The IoEngine contract, on both engines (io_uring and the thread pool), and how the
worker chooses between them (worker/ioengine.py, worker/uringprobe.py)."""
from __future__ import annotations

import errno
import mmap
import os
import signal
import threading
import typing

import pytest

from curvine_py.common.errors import ConfigError
from curvine_py.worker import ioengine
from curvine_py.worker.ioengine import EngineClosed, IoEngine, ProbeResult, select_engine
from curvine_py.worker.uringprobe import judge
from tests.conftest import open_engine

MiB = 1 << 20
ENGINES = ["uring", "threads"]


@pytest.fixture
def fd(tmp_path) -> typing.Iterator[int]:
    f = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o644)
    yield f
    os.close(f)


# ---------------------------------------------------------------- the contract

def test_write_then_read_bytes_bytearray_and_mmap_slices(io_engine: IoEngine, fd: int) -> None:
    payload = os.urandom(3 * MiB + 17)
    assert io_engine.write_from(fd, payload, 0).result() == len(payload)
    buf = bytearray(len(payload))
    assert io_engine.pread_full(fd, buf, 0) == len(payload) and bytes(buf) == payload
    m = mmap.mmap(-1, 2 * MiB)
    with memoryview(m) as view:
        assert io_engine.read_into(fd, view[100:100 + MiB], 5).result() == MiB
        assert view[100:100 + MiB] == payload[5:5 + MiB]
        view[:10] = b"0123456789"
        assert io_engine.write_from(fd, view[2:6], 1).result() == 4
    assert os.pread(fd, 6, 0) == payload[:1] + b"2345" + payload[5:6]


def test_scatter_gather_and_empty_views(io_engine: IoEngine, fd: int) -> None:
    a, b = bytearray(b"x" * 4), bytearray(b"y" * 6)
    assert io_engine.writev_from(fd, [b"hello", b"", memoryview(b"world!")[1:]], 0).result() == 10
    assert io_engine.readv_into(fd, [a, bytearray(), memoryview(b)], 0).result() == 10
    assert bytes(a) == b"hell" and bytes(b) == b"oorld!"
    assert io_engine.write_from(fd, b"", 3).result() == 0     # nothing to do is not an error
    assert io_engine.read_into(fd, bytearray(), 0).result() == 0


def test_short_reads_at_eof_and_full_writes(io_engine: IoEngine, fd: int) -> None:
    os.pwrite(fd, b"abc", 0)
    buf = bytearray(10)
    assert io_engine.pread_full(fd, buf, 1) == 2 and buf[:2] == b"bc"
    assert io_engine.pread_full(fd, buf, 100) == 0
    data = os.urandom(9 * MiB)
    assert io_engine.pwrite_full(fd, memoryview(data), MiB) == len(data)
    assert os.pread(fd, len(data), MiB) == data


def test_o_direct_from_page_aligned_buffers(io_engine: IoEngine, tmp_path) -> None:
    try:
        dfd = os.open(tmp_path / "direct", os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    out, back = mmap.mmap(-1, MiB), mmap.mmap(-1, MiB)
    try:
        out[:] = os.urandom(MiB)
        assert io_engine.write_from(dfd, memoryview(out), 4096).result() == MiB
        assert io_engine.read_into(dfd, memoryview(back), 4096, punt=False).result() == MiB
        assert back[:] == out[:]
    finally:
        os.close(dfd)


def test_errors_are_oserror_with_errno_and_the_engine_goes_on(io_engine: IoEngine, tmp_path) -> None:
    with pytest.raises(OSError) as e:
        io_engine.read_into(987654, bytearray(10), 0).result()
    assert e.value.errno == errno.EBADF
    ro = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)
    dfd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            io_engine.write_from(ro, b"x", 0).result()
        assert e.value.errno == errno.EBADF
        with pytest.raises(OSError) as e:
            io_engine.pread_full(dfd, bytearray(10), 0)
        assert e.value.errno == errno.EISDIR
    finally:
        os.close(ro)
        os.close(dfd)
    wfd = os.open(tmp_path / "w", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert io_engine.write_from(wfd, b"ok", 0).result() == 2
    finally:
        os.close(wfd)


def test_reads_need_writable_buffers(io_engine: IoEngine, fd: int) -> None:
    with pytest.raises(TypeError):
        io_engine.read_into(fd, b"readonly", 0)
    with pytest.raises(TypeError):
        io_engine.readv_into(fd, [bytearray(2), memoryview(b"ro")], 0)


def test_fsync(io_engine: IoEngine, fd: int) -> None:
    io_engine.write_from(fd, b"x" * 100, 0).result()
    assert io_engine.fsync(fd).result() == 0
    assert io_engine.fsync(fd, datasync=True).result() == 0


@pytest.mark.parametrize("name", ENGINES)
def test_more_ops_than_entries_in_flight(name: str, fd: int) -> None:
    with open_engine(name, 8) as engine:
        pattern = bytes(range(256)) * 64
        os.pwrite(fd, pattern, 0)
        bufs = [bytearray(64) for _ in range(200)]
        futs = [engine.read_into(fd, bufs[i], i * 64) for i in range(200)]
        assert [f.result() for f in futs] == [64] * 200
        assert all(bytes(bufs[i]) == pattern[i * 64:(i + 1) * 64] for i in range(200))
        assert engine.in_flight == 0


@pytest.mark.parametrize("name", ENGINES)
def test_concurrent_submitters(name: str, tmp_path) -> None:
    engine = open_engine(name, 8)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            wfd = os.open(tmp_path / f"t{n}", os.O_RDWR | os.O_CREAT, 0o644)
            data = os.urandom(256 * 1024)
            buf = bytearray(len(data))
            for i in range(30):
                engine.pwrite_full(wfd, data, i * 4096)
                assert engine.pread_full(wfd, buf, i * 4096) == len(data) and buf == data
            os.close(wfd)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    engine.close()
    assert not errors, errors


@pytest.mark.parametrize("name", ENGINES)
def test_a_closed_engine_refuses_ops(name: str, fd: int) -> None:
    engine = open_engine(name, 4)
    with engine:
        assert engine.write_from(fd, b"x", 0).result() == 1
    engine.close()   # idempotent
    with pytest.raises(EngineClosed) as e:
        engine.write_from(fd, b"x", 0)
    assert isinstance(e.value, OSError) and e.value.errno == errno.EBADF


# ---------------------------------------------------------------- judging the probe

def test_judge_names_the_signal_the_exception_or_the_status() -> None:
    assert judge(0, "readv+writev of 4 KiB with O_DIRECT\n", "") == \
        ProbeResult(True, "readv+writev of 4 KiB with O_DIRECT")
    assert judge(-signal.SIGILL, "", "") == ProbeResult(False, "killed by SIGILL")
    assert judge(-signal.SIGSEGV, "", "Fatal Python error: ...\n") == ProbeResult(False, "killed by SIGSEGV")
    assert judge(3, "PermissionError: [Errno 1] Operation not permitted\n", "") == \
        ProbeResult(False, "PermissionError: [Errno 1] Operation not permitted")
    assert judge(1, "", "Traceback...\nModuleNotFoundError: No module named 'x'\n").reason == \
        "ModuleNotFoundError: No module named 'x'"
    assert judge(7, "", "") == ProbeResult(False, "the probe exited with status 7")


# ---------------------------------------------------------------- choosing

def passing(_dir: str) -> ProbeResult:
    return ProbeResult(True, "fine")


def failing(_dir: str) -> ProbeResult:
    return ProbeResult(False, "killed by SIGILL")


def refuse(_dir: str) -> ProbeResult:
    raise AssertionError("the probe must not run")


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the binding is installed (the probe functions decide the rest)."""
    monkeypatch.setattr(ioengine, "liburing_installed", lambda: True)


def test_threads_never_probes(installed: None) -> None:
    assert select_engine("threads", "/nonexistent", refuse).name == "threads"


def test_uring_probes_and_a_failure_is_a_config_error(installed: None) -> None:
    assert select_engine("uring", "/d", passing) == ioengine.EngineChoice("uring", "io_uring probe passed: fine")
    with pytest.raises(ConfigError) as e:
        select_engine("uring", "/d", failing)
    assert str(e.value) == "worker.io_engine = uring, but io_uring does not work here: killed by SIGILL"


def test_auto_takes_the_measured_faster_engine_and_falls_back(installed: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if ioengine.AUTO_PREFERS == "threads":
        choice = select_engine("auto", "/d", refuse)
        assert choice.name == "threads" and "auto" in choice.reason
    monkeypatch.setattr(ioengine, "AUTO_PREFERS", "uring")
    assert select_engine("auto", "/d", passing).name == "uring"
    assert select_engine("auto", "/d", failing) == \
        ioengine.EngineChoice("threads", "io_uring probe failed: killed by SIGILL")


def test_no_binding_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ioengine, "liburing_installed", lambda: False)
    monkeypatch.setattr(ioengine, "AUTO_PREFERS", "uring")
    assert select_engine("auto", "/d", refuse).reason == \
        "io_uring probe failed: the liburing package is not installed"


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ConfigError):
        select_engine("aio", "/d", refuse)
