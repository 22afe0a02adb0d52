"""A helper process that hashes block files for the checks ahead, at idle priority.

A check ahead (client/mount/localfiles.py) is a guess made while the application may still
be busy with the mount, so it must only use CPU that nobody else wants (SCHED_IDLE).
A thread of the mount at idle priority would share the mount's GIL: preempted while it
held the GIL, it stalled every request of the mount until the scheduler ran it again
(with the two cores busy, a prompt's 32 lookups took 71-102 ms instead of 20-26).  So
the hashing runs in a child process at idle priority, and the mount's thread waits for
its answer without the GIL.  An open that needs the block being checked lends the child
normal priority (``boost``) until the next check starts.

The child opens the mount's own descriptor through ``/proc/<mount pid>/fd/<fd>``, so it
hashes exactly the file the mount opened.  One request at a time, over pipes:
``<path>\\t<length>\\t<chunk size>\\n`` -> ``<sum> <sum> ...\\n`` (decimal) or
``! <error>\\n``.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import subprocess
import sys
import threading
import typing

from curvine_py.common.blockmeta import BlockMeta, file_chunk_sums

log = logging.getLogger(__name__)

ANSWER_TIMEOUT_S = 10.0   # a child silent this long (a stuck disk, a stopped process) is replaced


class Checker:
    """The parent's side: chunk sums of an open block file, computed by the child."""

    def __init__(self, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def sums(self, fd: int, meta: BlockMeta) -> list[int]:
        """Every chunk's xxh3 of the open file fd (as ShortCircuit._chunk_sums); OSError
        when the child cannot tell (it is started again for the next call)."""
        request = f"/proc/{os.getpid()}/fd/{fd}\t{meta.length}\t{meta.chunk_size}\n".encode()
        with self._lock:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
                line = proc.stdout.readline() if ready else None
            except OSError:
                line = b""
            if not line:
                self._stop()
                if line is None:
                    raise OSError(errno.ETIMEDOUT, f"the block checker did not answer in {self.timeout_s:g} s")
                raise OSError(errno.EIO, "the block checker process exited")
        if line.startswith(b"!"):
            raise OSError(errno.EIO, f"block checker: {line[1:].decode(errors='replace').strip()}")
        return [int(x) for x in line.split()]

    def idle(self) -> None:
        """Back to idle priority (a check starts)."""
        self._schedule(os.SCHED_IDLE)

    def boost(self) -> None:
        """Normal priority: an open waits for the check under way."""
        self._schedule(os.SCHED_OTHER)

    def _schedule(self, policy: int) -> None:
        proc = self._proc
        if proc is not None:
            try:
                os.sched_setscheduler(proc.pid, policy, os.sched_param(0))
            except OSError as e:
                log.debug("block checker priority unchanged: %s", e)

    def start(self) -> None:
        """Start the child now rather than at the first check."""
        with self._lock:
            self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            # Its own session: a Ctrl-C meant for a foreground mount does not reach it (it
            # ends when the mount closes the pipe, or dies).
            self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, close_fds=True, start_new_session=True)
            self.idle()
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:      # a request left unsent to the dead child
                        pass

    def close(self) -> None:
        with self._lock:
            self._stop()


def serve(requests: typing.BinaryIO, replies: typing.BinaryIO) -> None:
    """The child's loop: one line in, one line out, until the parent closes the pipe."""
    for line in requests:
        try:
            path, length, chunk = line.decode().rstrip("\n").split("\t")
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                sums = file_chunk_sums(fd, int(length), int(chunk))
            finally:
                os.close(fd)
            reply = " ".join(map(str, sums)) + "\n"
        except (OSError, ValueError) as e:
            reply = f"! {e}\n"
        replies.write(reply.encode())
        replies.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
