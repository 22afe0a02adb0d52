"""Does io_uring work here?  Asked of a child process, so that a crash cannot kill us.

The ways io_uring fails are not all exceptions: a liburing wheel built for a newer CPU
dies with SIGILL on its first call (the 2026.3.30 wheel on a CPU without AVX-512), a
broken build can segfault, and the kernel may refuse the ring (``ENOSYS`` or ``EPERM``
under docker's default seccomp profile, ``kernel.io_uring_disabled = 2``) or hang it.  So
the worker (and the test suite's conftest) run this module as a child::

    python -m curvine_py.worker.uringprobe <dir>

which imports liburing the safe way (under its lock, worker/uring.py), builds a small
``Uring`` exactly as the worker does, writes and reads back one 4 KiB page of a temp
file in ``<dir>`` (a data dir: the filesystem the worker will use) with ``O_DIRECT``
where that filesystem takes it, through both the punted (``IOSQE_ASYNC``) and the
inline path, and exits 0.  The parent turns the child's end into a one-line reason:
its exit signal (``killed by SIGILL``), the exception it printed, or a timeout.
"""
from __future__ import annotations

import errno
import mmap
import os
import signal
import subprocess
import sys
import typing

from curvine_py.worker.ioengine import ProbeResult

if typing.TYPE_CHECKING:
    from curvine_py.worker.uring import Uring

PROBE_TIMEOUT_S = 20.0
PAGE = 4096
_FAILED = 3            # the child's exit status when it caught an exception


def probe_uring(directory: str, timeout: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Run the probe in a child process and judge how it ended."""
    # -P: the working directory is not put on sys.path (a checkout or a data dir could
    # shadow the installed package); PYTHONPATH still counts, as for the worker.
    cmd = [sys.executable, "-P", "-m", "curvine_py.worker.uringprobe", directory]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"the probe did not finish in {timeout:.0f} s")
    except OSError as e:
        return ProbeResult(False, f"cannot run the probe: {e}")
    return judge(proc.returncode, proc.stdout, proc.stderr)


def judge(returncode: int, stdout: str, stderr: str) -> ProbeResult:
    """One line from the child's exit: a signal's name, its last words, or its status."""
    last = _last_line(stdout) or _last_line(stderr)
    if returncode == 0:
        return ProbeResult(True, last)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return ProbeResult(False, f"killed by {name}")
    return ProbeResult(False, last or f"the probe exited with status {returncode}")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# ---------------------------------------------------------------- the child

def exercise(directory: str) -> str:
    """The real thing, in this process: ring up, one write and two reads, ring down."""
    from curvine_py.worker.uring import Uring
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f".uring-probe-{os.getpid()}")
    try:
        with Uring(4) as ring:
            try:
                _round_trip(ring, path, direct=True)
                return "readv+writev of 4 KiB with O_DIRECT"
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
            _round_trip(ring, path, direct=False)   # a filesystem without O_DIRECT
            return "readv+writev of 4 KiB through the page cache (no O_DIRECT here)"
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _round_trip(ring: "Uring", path: str, direct: bool) -> None:
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600)
    out, back = mmap.mmap(-1, PAGE), mmap.mmap(-1, PAGE)   # page-aligned, as the worker's pools
    try:
        out[:] = os.urandom(PAGE)
        with memoryview(out) as o, memoryview(back) as b:
            _expect(ring.writev_from(fd, [o], 0).result(timeout=10), "writev")
            _expect(ring.readv_into(fd, [b], 0).result(timeout=10), "readv")
            if b != o:
                raise OSError(errno.EIO, "readv returned other bytes than writev wrote")
            b[:] = bytes(PAGE)
            _expect(ring.read_into(fd, b, 0, punt=False).result(timeout=10), "inline readv")
            if b != o:
                raise OSError(errno.EIO, "inline readv returned other bytes than writev wrote")
    finally:
        os.close(fd)
        out.close()
        back.close()


def _expect(n: int, what: str) -> None:
    if n != PAGE:
        raise OSError(errno.EIO, f"{what} moved {n} of {PAGE} bytes")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m curvine_py.worker.uringprobe DIR", file=sys.stderr)
        return 2
    try:
        print(exercise(argv[0]), flush=True)
    except BaseException as e:   # the reason is the parent's one line
        print(f"{type(e).__name__}: {e}", flush=True)
        return _FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
