"""A forked child closing an inherited descriptor sends the kernel's FLUSH for the
parent's open file (every close of every copy of a descriptor does).  That commits what
was written so far and gives the write lease up; the parent's next write takes the lease
again, and its final close leaves the whole file, exactly as written."""
from __future__ import annotations

import os

from tests.posix.conftest import Mount

MiB = 1 << 20


def test_child_closing_an_inherited_descriptor_loses_nothing(mounted: Mount) -> None:
    path = mounted.path / "forked"
    first, second = os.urandom(5 * MiB + 17), os.urandom(3 * MiB + 5)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, first)
        pid = os.fork()
        if pid == 0:                 # the child: close everything inherited and go
            os.close(fd)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        # what the parent wrote before is visible now (the child's close flushed it)
        with open(path, "rb") as f:
            assert f.read() == first
        os.write(fd, second)         # the parent goes on writing after the child's close
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == first + second
    assert os.stat(path).st_size == len(first) + len(second)


def test_a_close_racing_a_forked_childs_close_waits_for_it_and_fails_nothing(mounted: Mount) -> None:
    """The parent's close(2) and a forked child's close of the inherited descriptor reach
    the mount at once (a process spawning helpers while another thread closes a file:
    seen as EBADF under the failover tests).  Whichever FLUSH comes second waits for the
    first's commit: no error, and the parent's close returns with the file complete."""
    for k in range(40):
        path = mounted.path / f"race{k}.tmp"
        data = os.urandom(28) + os.urandom((1 + k % 4) * MiB)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data[:28])
        os.write(fd, data[28:])
        pid = os.fork()
        if pid == 0:
            os.close(fd)
            os._exit(0)
        os.close(fd)                 # races the child's close: must not fail
        _, status = os.waitpid(pid, 0)
        assert status == 0
        os.rename(path, mounted.path / f"race{k}.data")
        with open(mounted.path / f"race{k}.data", "rb") as f:
            assert f.read() == data, f"round {k}"
