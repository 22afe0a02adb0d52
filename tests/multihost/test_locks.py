"""flock(2) and POSIX byte-range locks across mounts on different hosts (issue 41): the
master holds them (master/locks.py), so two or three mounts of one pool exclude each
other as processes on one host do; a mount that dies loses its locks within its lock
lease; a blocked waiter gets the lock when it is released, and a signal ends its wait.

Several mounts may write one file at once (master/files.py merges their commits per block;
tests/multihost/test_shared_writers.py); under locks each holder's unlock commits its
writes, and the next holder's lock drops what its mount had cached (NFS's rule)."""
from __future__ import annotations

import errno
import fcntl
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import pytest

from curvine_py.testing.netcluster import NetCluster
from tests.conftest import FAST_MASTER_FLAGS

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(240)]
LEASE_S = 2.0
LOCK_FLAGS = (*FAST_MASTER_FLAGS, "--master-lock-lease-s", str(LEASE_S))
Factory = typing.Callable[..., NetCluster]
# struct flock on x86-64 Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
FLOCK_FMT = "hhqqi4x"


def lk(fd: int, cmd: int, type: int, start: int, length: int) -> tuple[int, int, int, int]:
    """fcntl(fd, cmd, struct flock): the (type, start, len, pid) it leaves (F_GETLK's answer)."""
    out = fcntl.fcntl(fd, cmd, struct.pack(FLOCK_FMT, type, os.SEEK_SET, start, length, 0))
    t, _whence, s, n, pid = struct.unpack(FLOCK_FMT, out)
    return t, s, n, pid


def cluster(factory: Factory, **kw: typing.Any) -> NetCluster:
    c = factory(worker_hosts=(1, 2), extra_master_flags=LOCK_FLAGS, **kw)
    return c


def wait_granted(c: NetCluster, path: Path) -> None:
    """The first lock of a fresh master waits out its reclaim grace (one lease)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_UN)


# A process holding locks through one mount until told (a line on stdin) to go on.
HOLDER = r"""
import fcntl, os, struct, sys
path, script = sys.argv[1], sys.argv[2:]
fd = os.open(path, os.O_RDWR)
for step in script:
    kind, *args = step.split(":")
    if kind == "flock":
        fcntl.flock(fd, {"ex": fcntl.LOCK_EX, "sh": fcntl.LOCK_SH, "un": fcntl.LOCK_UN}[args[0]])
    elif kind == "wait":
        print("ready", flush=True)
        sys.stdin.readline()
    else:  # lk:TYPE:START:LEN with TYPE w, r or u
        t = {"w": fcntl.F_WRLCK, "r": fcntl.F_RDLCK, "u": fcntl.F_UNLCK}[args[0]]
        fcntl.fcntl(fd, fcntl.F_SETLKW, struct.pack("hhqqi4x", t, 0, int(args[1]), int(args[2]), 0))
print("done", flush=True)
"""


class Holder:
    """A process that locks through one mount, step by step (HOLDER)."""

    def __init__(self, path: Path, *script: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), *script], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def until_ready(self) -> None:
        assert self.p.stdout is not None
        line = self.p.stdout.readline().strip()
        assert line == "ready", f"holder said {line!r} (exit {self.p.poll()})"

    def go_on(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("\n")
        self.p.stdin.flush()

    def end(self) -> None:
        self.p.kill()
        self.p.wait(10)


def refused(fn: typing.Callable[[], object]) -> bool:
    try:
        fn()
    except OSError as e:
        assert e.errno in (errno.EAGAIN, errno.EACCES), e
        return True
    return False


def eventually(fn: typing.Callable[[], object], within: float = 5.0) -> float:
    """Seconds until fn stops being refused (a lock released by an asynchronous RELEASE)."""
    t0 = time.monotonic()
    while refused(fn):
        assert time.monotonic() - t0 < within, "still refused"
        time.sleep(0.01)
    return time.monotonic() - t0


def test_flock_across_three_mounts(net_cluster_factory: Factory, tmp_path: Path) -> None:
    c = cluster(net_cluster_factory)
    m = [c.mount(h, tmp_path / f"m{h}") for h in (1, 2, 3)]
    (m[0] / "lockfile").write_bytes(b"x")
    wait_granted(c, m[0] / "lockfile")
    f = [open(mp / "lockfile", "rb") for mp in m]
    try:
        fcntl.flock(f[0], fcntl.LOCK_EX)
        for other in f[1:]:   # exclusive: nobody else gets either kind
            assert refused(lambda: fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB))
            assert refused(lambda: fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB))
        fcntl.flock(f[0], fcntl.LOCK_UN)
        t0 = time.perf_counter()
        for _ in range(50):   # what a lock and an unlock cost (two master calls)
            fcntl.flock(f[0], fcntl.LOCK_EX)
            fcntl.flock(f[0], fcntl.LOCK_UN)
        print(f"flock + unlock through a mount: {(time.perf_counter() - t0) / 50 * 1000:.2f} ms")
        fcntl.flock(f[1], fcntl.LOCK_SH | fcntl.LOCK_NB)   # shared by two mounts
        fcntl.flock(f[2], fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert refused(lambda: fcntl.flock(f[0], fcntl.LOCK_EX | fcntl.LOCK_NB))
        fcntl.flock(f[2], fcntl.LOCK_UN)
        fcntl.flock(f[1], fcntl.LOCK_UN)

        # a blocked waiter on host 2 gets the lock when host 1's holder lets it go
        fcntl.flock(f[0], fcntl.LOCK_EX)
        got: list[float] = []

        def wait() -> None:
            fcntl.flock(f[1], fcntl.LOCK_EX)
            got.append(time.monotonic())
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(1.0)
        assert not got, "the waiter got a lock that was held"
        released = time.monotonic()
        fcntl.flock(f[0], fcntl.LOCK_UN)
        waiter.join(10)
        assert got and got[0] - released < 1.5, f"waiter got it {got[0] - released if got else None} s after"
        print(f"a waiter on another host got the flock {got[0] - released:.3f} s after its release")
        assert refused(lambda: fcntl.flock(f[2], fcntl.LOCK_SH | fcntl.LOCK_NB))
        f[1].close()   # the close of the holder's descriptor ends its flock (at the kernel's RELEASE, just after)
        assert eventually(lambda: fcntl.flock(f[2], fcntl.LOCK_EX | fcntl.LOCK_NB)) < 0.5
    finally:
        for x in f:
            if not x.closed:
                x.close()


def test_byte_ranges_across_two_mounts(net_cluster_factory: Factory, tmp_path: Path) -> None:
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "db").write_bytes(b"\0" * 4096)
    wait_granted(c, m1 / "db")
    h = Holder(m1 / "db", "lk:w:0:100", "lk:r:200:100", "wait", "lk:u:0:50", "wait")
    fd = os.open(m2 / "db", os.O_RDONLY)
    try:
        h.until_ready()
        # F_GETLK reports the holder's range and type
        t, s, n, pid = lk(fd, fcntl.F_GETLK, fcntl.F_WRLCK, 50, 10)
        assert (t, s, n) == (fcntl.F_WRLCK, 0, 100)
        t, s, n, _ = lk(fd, fcntl.F_GETLK, fcntl.F_WRLCK, 250, 1)
        assert (t, s, n) == (fcntl.F_RDLCK, 200, 100)
        t, *_ = lk(fd, fcntl.F_GETLK, fcntl.F_RDLCK, 250, 1)
        assert t == fcntl.F_UNLCK                                    # readers share
        assert refused(lambda: lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 99, 2))
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 100, 100)               # between the two: free
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 250, 10)                # a read lock beside a read lock
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 1000, 0)                # to the end of the file, however long
        t, s, n, _ = lk(fd, fcntl.F_GETLK, fcntl.F_WRLCK, 5000, 1)   # the holder sees ours (from here)
        h.go_on()
        h.until_ready()                                              # the holder unlocked [0, 50)
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 0, 50)
        assert refused(lambda: lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 49, 2))
        t, s, n, _ = lk(fd, fcntl.F_GETLK, fcntl.F_WRLCK, 0, 0)      # the first lock in the way
        assert (t, s, n) == (fcntl.F_WRLCK, 50, 50)
        h.go_on()
        assert h.p.stdout is not None and h.p.stdout.readline().strip() == "done"
        h.p.wait(10)                                                 # its exit ends its locks
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 0, 1000)
    finally:
        os.close(fd)
        h.end()


def test_ofd_locks_across_two_mounts(net_cluster_factory: Factory, tmp_path: Path) -> None:
    """OFD locks belong to the open file description: two descriptors of one process
    conflict, and the last close of the description ends its locks."""
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "f").write_bytes(b"\0" * 100)
    wait_granted(c, m1 / "f")
    w = os.open(m1 / "f", os.O_RDWR)
    r1, r2 = os.open(m2 / "f", os.O_RDONLY), os.open(m2 / "f", os.O_RDONLY)
    try:
        lk(w, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, 0, 10)
        t, s, n, _ = lk(r1, fcntl.F_OFD_GETLK, fcntl.F_RDLCK, 5, 1)
        assert (t, s, n) == (fcntl.F_WRLCK, 0, 10)
        assert refused(lambda: lk(r1, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, 9, 1))
        lk(r1, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, 10, 10)
        lk(r2, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, 15, 10)     # readers share, across descriptions too
        lk(w, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, 0, 10)
        assert refused(lambda: lk(w, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, 0, 11))   # r1's read lock at 10
        lk(w, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, 0, 10)
        os.close(r1)                                          # its description's locks end (RELEASE)
        r1 = -1
        assert eventually(lambda: lk(w, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, 0, 15)) < 0.5
        assert refused(lambda: lk(w, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, 0, 16))   # r2's still there
    finally:
        for fd in (w, r1, r2):
            if fd >= 0:
                os.close(fd)


def test_a_lock_holder_reads_what_the_previous_holder_wrote(net_cluster_factory: Factory, tmp_path: Path) -> None:
    """NFS's rule: the writer's data reaches the master at its unlock (the file stays open
    for writing), and a lock taken on another host drops what that host cached, so the
    reader there, whose descriptor was open all along, reads the new bytes."""
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "log").write_bytes(b"v1" * 4096)
    wait_granted(c, m1 / "log")
    r = os.open(m2 / "log", os.O_RDONLY)
    w = os.open(m1 / "log", os.O_RDWR)
    try:
        assert os.pread(r, 4, 0) == b"v1v1"                   # host 3 has read (and cached) v1
        fcntl.flock(w, fcntl.LOCK_EX)
        os.pwrite(w, b"v2" * 4096, 0)
        fcntl.flock(w, fcntl.LOCK_UN)                         # flushed here; w stays open
        fcntl.flock(r, fcntl.LOCK_SH)
        assert os.pread(r, 8192, 0) == b"v2" * 4096
        fcntl.flock(r, fcntl.LOCK_UN)
        lk(w, fcntl.F_SETLKW, fcntl.F_WRLCK, 0, 0)            # and with POSIX locks
        os.pwrite(w, b"v3" * 4096, 0)
        lk(w, fcntl.F_SETLK, fcntl.F_UNLCK, 0, 0)
        lk(r, fcntl.F_SETLKW, fcntl.F_RDLCK, 0, 0)
        assert os.pread(r, 8192, 0) == b"v3" * 4096
    finally:
        os.close(r)
        os.close(w)


# A process whose F_SETLKW (a read lock of one byte) is interrupted by SIGALRM after 1 s:
# the handler raises, so Python does not retry; prints how long the wait lasted.
INTERRUPTED_WAIT = (
    "import fcntl, os, signal, struct, sys, time\n"
    "def late(*_): raise TimeoutError\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY); print('ready', flush=True); sys.stdin.readline()\n"
    "t = time.monotonic(); signal.signal(signal.SIGALRM, late); signal.alarm(1)\n"
    "try: fcntl.fcntl(fd, fcntl.F_SETLKW, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, int(sys.argv[2]), 1, 0))\n"
    "except TimeoutError: print(round(time.monotonic() - t, 2))\n")


def interrupted_wait(path: Path, start: int, first: typing.Callable[[], object] = lambda: None) -> float | None:
    """Seconds until SIGALRM ended a blocking lock of byte start; None: the lock came first.
    The waiter opens the file and starts Python before first() runs, so that its second
    of patience starts at the lock call (a cold interpreter takes over a second on a
    loaded machine, longer than a new leader's grace once it has been elected)."""
    p = subprocess.Popen([sys.executable, "-c", INTERRUPTED_WAIT, str(path), str(start)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr
        first()
        out, err = p.communicate("\n", timeout=60)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0, err
    return float(out) if out.strip() else None


def test_a_blocked_wait_ends_with_eintr_and_a_cycle_with_edeadlk(net_cluster_factory: Factory, tmp_path: Path) -> None:
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "f").write_bytes(b"\0" * 10)
    wait_granted(c, m1 / "f")
    a = Holder(m1 / "f", "lk:w:0:1", "wait", "lk:w:1:1")   # host 1: byte 0, then waits for byte 1
    fd = os.open(m2 / "f", os.O_RDONLY)
    try:
        a.until_ready()
        # a signal ends a blocked F_SETLKW
        took = interrupted_wait(m2 / "f", 0)
        assert took is not None and took < 2.5, took
        # a cycle: host 3 holds byte 1 and waits for byte 0, host 1 holds 0 and waits for 1
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 1, 1)
        a.go_on()
        time.sleep(0.5)                                       # host 1 now waits for byte 1
        with pytest.raises(OSError) as e:
            lk(fd, fcntl.F_SETLKW, fcntl.F_RDLCK, 0, 1)
        assert e.value.errno == errno.EDEADLK
        lk(fd, fcntl.F_SETLK, fcntl.F_UNLCK, 1, 1)            # host 1's wait ends: it gets byte 1
        assert a.p.stdout is not None and a.p.stdout.readline().strip() == "done"
    finally:
        os.close(fd)
        a.end()


def test_a_killed_mount_loses_its_locks_within_the_lease(net_cluster_factory: Factory, tmp_path: Path) -> None:
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "f").write_bytes(b"x")
    wait_granted(c, m1 / "f")
    h = Holder(m1 / "f", "flock:ex", "lk:w:0:0", "wait")
    fd = os.open(m2 / "f", os.O_RDONLY)
    try:
        h.until_ready()
        assert refused(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
        daemon = next(p for p in c.processes if p.role == "fuse" and p.address == str(m1))
        killed = time.monotonic()
        os.kill(daemon.pid, signal.SIGKILL)
        fcntl.flock(fd, fcntl.LOCK_EX)                        # blocks until the master drops m1's locks
        lk(fd, fcntl.F_SETLKW, fcntl.F_RDLCK, 0, 0)
        took = time.monotonic() - killed
        # the lease, then the next housekeeping tick (1 s) and the waiter's next poll (0.5 s at most)
        assert took < LEASE_S + 2.0, f"the locks of a killed mount were freed after {took:.1f} s"
        print(f"killed mount's locks free after {took:.2f} s (lock lease {LEASE_S} s)")
    finally:
        os.close(fd)
        h.end()


def test_locks_survive_a_leader_failover(net_cluster_factory: Factory, tmp_path: Path) -> None:
    c = cluster(net_cluster_factory, master_hosts=(0, 1, 2))
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "f").write_bytes(b"x")
    wait_granted(c, m1 / "f")
    h = Holder(m1 / "f", "flock:ex", "lk:w:10:10", "wait")
    fd = os.open(m2 / "f", os.O_RDONLY)
    try:
        h.until_ready()
        leader = c.leader_index()
        t0 = time.monotonic()
        # a free byte: the wait is for a leader, then for its grace; a signal still ends it
        took = interrupted_wait(m2 / "f", 50, first=lambda: c.kill_master(leader))
        assert took is not None and took < 2.5, took
        # the new leader knows no locks; m1 gives them back while it grants none (one lease)
        assert refused(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
        assert refused(lambda: lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 15, 1))
        t, s, n, _ = lk(fd, fcntl.F_GETLK, fcntl.F_RDLCK, 0, 0)
        assert (t, s, n) == (fcntl.F_WRLCK, 10, 10)
        print(f"after the failover the locks held; the first lock call answered in {time.monotonic() - t0:.2f} s")
        h.go_on()
        assert h.p.stdout is not None and h.p.stdout.readline().strip() == "done"
        h.p.wait(10)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 0, 0)
    finally:
        os.close(fd)
        h.end()


# A writer of one SQLite database: n transactions of one row each (SQLite takes its fcntl
# locks on the database, its journal and, in WAL mode, the -shm file for every one).
SQLITE_WRITER = r"""
import sqlite3, sys
db, mode, tag, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = sqlite3.connect(db, timeout=60, isolation_level=None)
c.execute(f"PRAGMA journal_mode={mode}")
for i in range(n):
    c.execute("BEGIN IMMEDIATE")
    c.execute("INSERT INTO t VALUES (?, ?, randomblob(3000))", (tag, i))
    c.execute("COMMIT")
"""
ROWS = 40


def sqlite_writers(db: Path, mode: str, *writers: tuple[Path, str]) -> list[tuple[int, str]]:
    """Run one SQLITE_WRITER per (mount, tag) at once; their (exit status, output)."""
    ps = [subprocess.Popen([sys.executable, "-c", SQLITE_WRITER, str(m / db.name), mode, tag, str(ROWS)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for m, tag in writers]
    return [(p.wait(120), p.communicate()[0]) for p in ps]


def new_db(path: Path, mode: str) -> None:
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA journal_mode={mode}")
    con.execute("CREATE TABLE t (tag TEXT, i INTEGER, pad BLOB)")
    con.commit()
    con.close()


@pytest.mark.parametrize("mode", ["delete", "wal"])
def test_sqlite_written_by_two_processes_through_the_masters_locks(net_cluster_factory: Factory, tmp_path: Path,
                                                                   mode: str) -> None:
    """Two processes of one mount write one database at once, in rollback (delete) and WAL
    mode: their fcntl locks are the master's now, and the database is whole, as read
    through another host's mount."""
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    wait_granted(c, m1 / "warm")
    new_db(m1 / "x.db", mode)
    results = sqlite_writers(m1 / "x.db", mode, (m1, "a"), (m1, "b"))
    assert all(rc == 0 for rc, _ in results), results
    if mode == "wal":   # the readers below see the WAL's rows once they are in the database
        con = sqlite3.connect(m1 / "x.db")
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
    con = sqlite3.connect(f"file:{m2 / 'x.db'}?mode=ro", uri=True)
    assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert con.execute("SELECT tag, count(*) FROM t GROUP BY tag ORDER BY tag").fetchall() == [("a", ROWS), ("b", ROWS)]
    con.close()


def test_sqlite_written_from_two_hosts(net_cluster_factory: Factory, tmp_path: Path) -> None:
    """Rollback mode, two processes on each of two hosts at once: the hosts take turns as
    the file's writer under SQLite's own locks (the lease goes with each unlock), and the
    database is never corrupt: integrity_check passes and every transaction a writer saw
    committed is there.  Every writer finishes: a write answered EBUSY (the other host
    still held the write lease) was SQLite's "disk I/O error" in about 1 run of 4, from
    two races (an O_RDWR open that took the lease, two unlocks on one host that each
    kept it for the other; test_a_second_hosts_writer_waits_for_the_lease and
    tests/unit/test_mount_locks.py pin each).  (WAL mode
    needs memory shared by every connection, which hosts do not share: SQLite's
    documentation rules it out on network filesystems.)  The kernel's name cache is on
    (the default fuse.entry_timeout_s) with fuse.kernel_invalidation: each mount's kernel forgets the journal's name
    when the other host creates or deletes it (fuse/notify.py: the master's pushes, and
    a lookup whose grant a concurrent change refused).  Without that, a host still saw
    the journal the other host had just deleted and opened it (ENOENT: SQLITE_CANTOPEN):
    6 runs of 6 failed; with the pushes alone, 1 of 6."""
    c = cluster(net_cluster_factory)
    flags = ("--fuse-kernel-invalidation", "true")
    m1, m2 = c.mount(1, tmp_path / "m1", *flags), c.mount(3, tmp_path / "m2", *flags)
    wait_granted(c, m1 / "warm")
    new_db(m1 / "x.db", "delete")
    tags = "abcd"
    results = sqlite_writers(m1 / "x.db", "delete", *zip((m1, m2, m1, m2), tags))
    assert all(rc == 0 for rc, _ in results), [(tag, out) for (rc, out), tag in zip(results, tags) if rc]
    for m in (m1, m2):
        con = sqlite3.connect(f"file:{m / 'x.db'}?mode=ro", uri=True)
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert dict(con.execute("SELECT tag, count(*) FROM t GROUP BY tag").fetchall()) == dict.fromkeys(tags, ROWS)
        con.close()


# A WAL-mode writer that says how far it got: "committed N" (and the error that stopped it).
WAL_WRITER = r"""
import sqlite3, sys, time
db, tag, n, sync = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
done, t0, waited = 0, time.monotonic(), 0.0
try:
    c = sqlite3.connect(db, timeout=50, isolation_level=None)
    c.execute("PRAGMA journal_mode=wal")
    c.execute(f"PRAGMA synchronous={sync}")
    waited = time.monotonic() - t0   # SQLITE_BUSY retried while another host had the database open
    seen = c.execute("SELECT count(*) FROM t").fetchone()[0]
    for i in range(n):
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO t VALUES (?, ?, randomblob(3000))", (tag, i))
        c.execute("COMMIT")
        done += 1
    c.close()
    print(f"committed {done} opened after {waited:.1f} s seeing {seen} rows", flush=True)
except Exception as e:
    print(f"committed {done} failed {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
"""
WAL_ROWS = 25


def wal_writers(db: Path, sync: str, *writers: tuple[Path, str]) -> list[tuple[str, int, str]]:
    """One WAL_WRITER per (mount, tag) at once: (tag, transactions it saw committed, its report)."""
    ps = [subprocess.Popen([sys.executable, "-c", WAL_WRITER, str(m / db.name), tag, str(WAL_ROWS), sync],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for m, tag in writers]
    out = [(tag, p.communicate(timeout=120)[0].strip()) for p, (_, tag) in zip(ps, writers)]
    return [(tag, int(text.split()[1]) if text.startswith("committed") else 0, text) for tag, text in out]


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_sqlite_in_wal_mode_from_two_hosts_loses_nothing(net_cluster_factory: Factory, tmp_path: Path,
                                                         sync: str) -> None:
    """WAL mode, two processes on each of two hosts at once.  The WAL index (-shm) is
    memory shared by one host's connections only, so its locks are one mount's at a time
    (client/locks.py gate): the host that opens the database second gets SQLITE_BUSY,
    which its busy timeout retries until the first host's connections are closed, then
    recovers the index from the WAL and the database as the first host left them (its
    writers report the rows they see at open: the first host's 50).  No writer fails,
    and every transaction a writer saw committed is there, read after a checkpoint from
    each host.  synchronous=NORMAL too, where SQLite syncs the WAL only at checkpoints:
    the first mount commits its WAL before it gives the gate up.  (Before the gate, in 5
    runs the second host's writers always failed with "disk I/O error", and once a
    first-host writer lost 2 committed transactions.  With the gate alone the second
    host recovered from a stale WAL: the first host's 50 transactions lost in 1 run of 8
    with FULL; with its readers reloaded but its own writer of the WAL kept, which read
    the WAL as it was when it began (empty), 5 runs of 26 with NORMAL.)"""
    c = cluster(net_cluster_factory)
    flags = ("--fuse-kernel-invalidation", "true")
    m1, m2 = c.mount(1, tmp_path / "m1", *flags), c.mount(3, tmp_path / "m2", *flags)
    wait_granted(c, m1 / "warm")
    new_db(m1 / "x.db", "wal")
    results = wal_writers(m1 / "x.db", sync, *zip((m1, m2, m1, m2), "abcd"))
    print("\n".join(f"{tag} ({'m1' if tag in 'ac' else 'm2'}): {text}" for tag, _, text in results))
    committed = {tag: n for tag, n, _ in results}
    con = sqlite3.connect(m2 / "x.db", timeout=30)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    for m in (m2, m1):
        con = sqlite3.connect(m / "x.db", timeout=30)
        try:
            assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            rows = dict(con.execute("SELECT tag, count(*) FROM t GROUP BY tag").fetchall())
        finally:
            con.close()
        assert {tag: rows.get(tag, 0) for tag in committed} == committed, (m, rows, results)
    assert all(n == WAL_ROWS for n in committed.values()), results


# A connection that commits n rows in WAL mode (synchronous=FULL: each synced) and stays open.
WAL_HOLDER = r"""
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)
c.execute("PRAGMA journal_mode=wal")
for i in range(int(sys.argv[2])):
    c.execute("INSERT INTO t VALUES ('dead', ?, randomblob(3000))", (i,))
print("ready", flush=True)
sys.stdin.readline()
"""


def wal_held(net_cluster_factory: Factory, tmp_path: Path) -> tuple[NetCluster, Path, Path, subprocess.Popen[str]]:
    """Two mounts (hosts 1 and 3) and a WAL database that a process on host 1 holds open
    with 10 rows committed (WAL_HOLDER, ready; a line on its stdin lets it finish)."""
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    wait_granted(c, m1 / "warm")
    new_db(m1 / "x.db", "wal")
    p = subprocess.Popen([sys.executable, "-c", WAL_HOLDER, str(m1 / "x.db"), "10"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    if p.stdout is None or p.stdout.readline().strip() != "ready":
        p.kill()
        p.wait(10)
        pytest.fail("the WAL holder on host 1 did not get ready")
    return c, m1, m2, p


def test_a_dead_hosts_wal_index_is_freed_by_its_lock_lease(net_cluster_factory: Factory, tmp_path: Path) -> None:
    """A host whose mount dies with the database open in WAL mode keeps the other hosts
    out (SQLITE_BUSY, "database is locked") only until its lock lease runs out; the next
    host then recovers from the WAL every transaction the dead host had committed."""
    c, m1, m2, p = wal_held(net_cluster_factory, tmp_path)
    try:
        con = sqlite3.connect(m2 / "x.db", timeout=0.3)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            con.execute("SELECT count(*) FROM t").fetchall()
        con.close()
        daemon = next(d for d in c.processes if d.role == "fuse" and d.address == str(m1))
        killed = time.monotonic()
        os.kill(daemon.pid, signal.SIGKILL)
        con = sqlite3.connect(m2 / "x.db", timeout=30)
        try:
            rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
            took = time.monotonic() - killed
            assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            con.close()
    finally:
        p.kill()
        p.wait(10)
    assert rows == 10
    assert took < LEASE_S + 3.0, f"the dead host's WAL index was free after {took:.1f} s"
    print(f"the dead host's WAL index free after {took:.2f} s (lock lease {LEASE_S} s), its 10 rows there")


def test_a_second_host_waits_out_a_long_wal_session(net_cluster_factory: Factory, tmp_path: Path) -> None:
    """A host keeps the database open in WAL mode for 12 s: the other host's writer waits
    at its database lock (busy timeout) and then writes.  (SQLite retries a busy WAL
    index for about 10 s only, then fails with "locking protocol": the mount's own lock
    on the database's PENDING_BYTE makes the wait SQLite's busy timeout's.)"""
    c, m1, m2, p = wal_held(net_cluster_factory, tmp_path)
    try:
        w = subprocess.Popen([sys.executable, "-c", WAL_WRITER, str(m2 / "x.db"), "b", str(WAL_ROWS), "full"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(12)
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.wait(20) == 0
        report = w.communicate(timeout=60)[0].strip()
    finally:
        p.kill()
        p.wait(10)
    print("second host:", report)
    assert w.returncode == 0 and report.startswith(f"committed {WAL_ROWS} "), report
    con = sqlite3.connect(m1 / "x.db", timeout=30)
    try:
        assert dict(con.execute("SELECT tag, count(*) FROM t GROUP BY tag").fetchall()) == {"dead": 10, "b": WAL_ROWS}
    finally:
        con.close()


def test_a_second_hosts_writer_writes_while_the_first_holds_its_lease(net_cluster_factory: Factory,
                                                                      tmp_path: Path) -> None:
    """A file open for writing on one host opens and writes on another too, whoever holds
    a lease: no EBUSY (several writers, merged per block at each commit).  Taking turns
    under a lock, each holder reads what the previous one committed at its unlock and adds
    to it.  A write outside the locks goes through too, on the file as committed when its
    writer began; the block it shares with the lock holder's uncommitted write is the
    holder's again at the holder's unlock (the last commit wins the block, whole)."""
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "f").write_bytes(b"a" * 100)
    wait_granted(c, m1 / "f")
    w2 = os.open(m2 / "f", os.O_RDWR)
    try:
        w1 = os.open(m1 / "f", os.O_RDWR)
        try:
            fcntl.flock(w1, fcntl.LOCK_EX)
            os.pwrite(w1, b"1", 0)              # host 1's writer holds a lease now
            os.close(os.open(m2 / "f", os.O_WRONLY))   # no EBUSY (nor at a write: below)
            fcntl.flock(w1, fcntl.LOCK_UN)      # commits (and gives its lease up)
            fcntl.flock(w2, fcntl.LOCK_EX)
            assert os.pread(w2, 2, 0) == b"1a"
            os.pwrite(w2, b"2", 1)
            fcntl.flock(w2, fcntl.LOCK_UN)
            fcntl.flock(w1, fcntl.LOCK_EX)
            assert os.pread(w1, 3, 0) == b"12a"
            os.pwrite(w1, b"3", 2)              # host 1's writer holds a lease, its write uncommitted...
            os.pwrite(w2, b"4", 3)              # ...and host 3 writes without a lock
            os.fsync(w2)
            assert (m2 / "f").read_bytes() == b"12a4" + b"a" * 96
            fcntl.flock(w1, fcntl.LOCK_UN)      # host 1's block 0 (its "3", not the "4") wins
        finally:
            os.close(w1)
    finally:
        os.close(w2)
    assert (m2 / "f").read_bytes() == b"123" + b"a" * 97


def test_locks_survive_a_master_restart(net_cluster_factory: Factory, tmp_path: Path) -> None:
    """One master, SIGKILLed and started again: it knows no locks, and the mounts give
    theirs back in its grace."""
    c = cluster(net_cluster_factory)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "f").write_bytes(b"x")
    wait_granted(c, m1 / "f")
    h = Holder(m1 / "f", "flock:sh", "lk:w:0:0", "wait")
    fd = os.open(m2 / "f", os.O_RDONLY)
    try:
        h.until_ready()
        c.kill_master()
        c.restart_master()
        assert refused(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)                # shared with the reclaimed one
        t, s, n, _ = lk(fd, fcntl.F_GETLK, fcntl.F_RDLCK, 7, 1)
        assert (t, s, n) == (fcntl.F_WRLCK, 0, 0)
        h.go_on()
        assert h.p.stdout is not None and h.p.stdout.readline().strip() == "done"
        h.p.wait(10)
        lk(fd, fcntl.F_SETLK, fcntl.F_RDLCK, 0, 0)
    finally:
        os.close(fd)
        h.end()
