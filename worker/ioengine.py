"""What the block store needs from a disk I/O engine, and the engine a worker runs on.

Two engines satisfy ``IoEngine``: ``Uring`` (worker/uring.py, one io_uring through the
``liburing`` binding) and ``ThreadIO`` (worker/threadio.py, ``preadv``/``pwritev`` on a
thread pool).  Both return ``Future[int]`` from the same calls, so the block writer and
reader (worker/blockfile.py) do not know which one runs.  Why two: io_uring cannot be
used everywhere (the binding may be missing, built for another CPU and die with
SIGILL, or the kernel refuses it: docker's seccomp profile, ``kernel.io_uring_disabled``),
and the worker must run on every machine.

``select_engine`` turns ``worker.io_engine`` (``auto`` | ``uring`` | ``threads``) into an
``EngineChoice``; io_uring is only ever tried after a probe in a child process passed
(worker/uringprobe.py), so a native crash of the binding cannot take the worker down.
"""
from __future__ import annotations

import errno
import importlib.util
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Protocol, Self, Sequence

from curvine_py.common.errors import ConfigError

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
ENGINES = ("auto", "uring", "threads")
# What `auto` picks when the io_uring probe passes.  Measured on the 2-vCPU test VM
# (docs/worker.md, "I/O engines"; bench/worker_bench.py's pattern, the two engines
# interleaved, 24 rounds each, on a busy machine): io_uring wrote A->B faster than the
# thread pool in 17 of 24 pairs (medians 0.38 vs 0.30 GB/s) at less worker CPU
# (2.3 vs 2.7 s per GB), and read O_DIRECT blocks back about as fast (1.27 vs 1.15).
# "threads" here would make auto skip the probe.
AUTO_PREFERS = "uring"


class EngineClosed(OSError):
    """An op was submitted after close()."""

    def __init__(self, engine: str) -> None:
        super().__init__(errno.EBADF, f"{engine} I/O engine is closed")


class IoEngine(Protocol):
    """Asynchronous positional disk I/O returning Futures; thread-safe submission.

    Buffers must stay untouched (and alive: the engine keeps a reference) until the
    op's Future is done.  Reads and writes may be short, like preadv/pwritev."""

    name: str

    def read_into(self, fd: int, view: Buffer, offset: int, punt: bool = True) -> Future[int]: ...

    def write_from(self, fd: int, view: Buffer, offset: int) -> Future[int]: ...

    def readv_into(self, fd: int, views: Sequence[Buffer], offset: int, punt: bool = True) -> Future[int]: ...

    def writev_from(self, fd: int, views: Sequence[Buffer], offset: int) -> Future[int]: ...

    def fsync(self, fd: int, datasync: bool = False) -> Future[int]: ...

    def pread_full(self, fd: int, view: Buffer, offset: int) -> int: ...

    def pwrite_full(self, fd: int, view: Buffer, offset: int) -> int: ...

    def close(self, timeout: float = 10.0) -> None: ...

    @property
    def in_flight(self) -> int: ...

    def __enter__(self) -> "IoEngine": ...

    def __exit__(self, *exc: object) -> None: ...


class BlockingHelpers:
    """The one-buffer and blocking forms on top of readv_into/writev_from, and the context
    manager over close, shared by both engines."""

    def readv_into(self, fd: int, views: Sequence[Buffer], offset: int, punt: bool = True) -> Future[int]:
        raise NotImplementedError

    def writev_from(self, fd: int, views: Sequence[Buffer], offset: int) -> Future[int]:
        raise NotImplementedError

    _lock: threading.Lock
    _closing: bool

    def close(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        raise NotImplementedError

    def _begin_close(self, timeout: float) -> float | None:
        """Refuse new ops and wait up to timeout for those in flight; the deadline, or
        None when a close is already under way (close is idempotent)."""
        with self._lock:
            if self._closing:
                return None
            self._closing = True
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        return deadline

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_into(self, fd: int, view: Buffer, offset: int, punt: bool = True) -> Future[int]:
        """Read up to len(view) bytes at offset into view; the Future gives the count.
        punt=False lets io_uring issue the read at submit (O_DIRECT reads do not block
        there) instead of handing it to an io-wq thread; a pool thread always runs it."""
        mv = memoryview(view)
        if mv.readonly:
            raise TypeError("read_into needs a writable buffer")
        return self.readv_into(fd, [mv], offset, punt)

    def write_from(self, fd: int, view: Buffer, offset: int) -> Future[int]:
        """Write view at offset; the Future gives the count (may be short)."""
        return self.writev_from(fd, [view], offset)

    def pread_full(self, fd: int, view: Buffer, offset: int) -> int:
        """Fill view from offset, looping on short reads; returns bytes read (< len at EOF)."""
        mv = memoryview(view).cast("B")
        got = 0
        while got < len(mv):
            n = self.read_into(fd, mv[got:], offset + got).result()
            if n == 0:
                break
            got += n
        return got

    def pwrite_full(self, fd: int, view: Buffer, offset: int) -> int:
        """Write all of view at offset, looping on short writes; returns len(view)."""
        mv = memoryview(view).cast("B")
        done = 0
        while done < len(mv):
            n = self.write_from(fd, mv[done:], offset + done).result()
            if n <= 0:
                raise OSError(errno.EIO, f"write made no progress at offset {offset + done}")
            done += n
        return done


def done_future(n: int) -> Future[int]:
    """A Future already holding n (an op with nothing to do)."""
    f: Future[int] = Future()
    f.set_result(n)
    return f


# ---------------------------------------------------------------- selection

@dataclass(frozen=True)
class EngineChoice:
    """The engine a worker runs on and why (logged once, sent to the master)."""
    name: str          # "uring" or "threads"
    reason: str


@dataclass(frozen=True)
class ProbeResult:
    """The io_uring probe's verdict (worker/uringprobe.py); reason is one line."""
    ok: bool
    reason: str


ProbeFn = Callable[[str], ProbeResult]


def liburing_installed() -> bool:
    """Is the binding installed at all?  find_spec does not run its __init__."""
    try:
        return importlib.util.find_spec("liburing") is not None
    except (ImportError, ValueError):
        return False


def select_engine(setting: str, probe_dir: str, probe: ProbeFn | None = None) -> EngineChoice:
    """Decide the engine for worker.io_engine = setting.

    "threads" never touches liburing.  "uring" and "auto" probe io_uring in a child
    process (probe_dir: where the probe writes its test file, a data dir); "uring"
    raises ConfigError when the probe fails, "auto" falls back to threads.  When both
    work, "auto" takes AUTO_PREFERS (the faster one measured here)."""
    if setting not in ENGINES:
        raise ConfigError(f"worker.io_engine must be one of {', '.join(ENGINES)}, not {setting!r}")
    if setting == "threads":
        return EngineChoice("threads", "worker.io_engine = threads")
    if setting == "auto" and AUTO_PREFERS == "threads":
        return EngineChoice("threads", "auto: the thread pool measured faster here")
    result = _probe(probe_dir, probe)
    if result.ok:
        return EngineChoice("uring", f"io_uring probe passed: {result.reason}")
    if setting == "uring":
        raise ConfigError(f"worker.io_engine = uring, but io_uring does not work here: {result.reason}")
    return EngineChoice("threads", f"io_uring probe failed: {result.reason}")


def _probe(probe_dir: str, probe: ProbeFn | None) -> ProbeResult:
    if not liburing_installed():
        return ProbeResult(False, "the liburing package is not installed")
    if probe is None:
        from curvine_py.worker.uringprobe import probe_uring
        probe = probe_uring
    return probe(probe_dir)


def open_engine(choice: EngineChoice, entries: int) -> IoEngine:
    """Construct the chosen engine; entries bounds the ops in flight for both."""
    if choice.name == "uring":
        from curvine_py.worker.uring import Uring
        return Uring(entries)
    from curvine_py.worker.threadio import ThreadIO
    return ThreadIO(entries)


def start_engine(setting: str, probe_dir: str, entries: int,
                 probe: ProbeFn | None = None) -> tuple[IoEngine, EngineChoice]:
    """select_engine, then open it; logs the one line saying which engine and why.

    A ring that the probe built but this process cannot (it ran out of locked memory,
    say) is an error for "uring" and falls back to threads for "auto"."""
    choice = select_engine(setting, probe_dir, probe)
    try:
        engine = open_engine(choice, entries)
    except (OSError, ImportError) as e:
        if setting == "uring":
            raise ConfigError(f"worker.io_engine = uring, but the io_uring cannot be set up: {e}") from None
        choice = EngineChoice("threads", f"io_uring passed its probe but failed here: {e}")
        engine = open_engine(choice, entries)
    log.info("io engine: %s (%s)", choice.name, choice.reason)
    return engine, choice
