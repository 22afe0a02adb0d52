"""SQLite's WAL index (``<db>-shm``) locked from two mounts (issue 41): its locks are one
mount's at a time.  A mount takes the file's gate (client/locks.py ``gate``: a write lock
of its own on the file's last byte) before its processes' first lock of the file and gives
it up after their last, so another mount's F_GETLK sees a write lock (SQLite: SQLITE_BUSY)
and its lock calls are refused until then.  Driven here against the master's real lock
table (master/locks.py), each request as the master's Lock handler would take it."""
from __future__ import annotations

import typing

from curvine_py.client.locks import GATE_BYTE, GATE_OWNER, PENDING_BYTE, LockAsk, MountLocks, gate, is_shared_index
from curvine_py.common.lockranges import RDLCK, UNLCK, WRLCK
from curvine_py.master.locks import MOUNT_OWNER, LockCall, LockTable
from curvine_py.pb import curvine_pb2 as pb

INO = 9
DMS = 128   # SQLite's "dead man switch" byte of the -shm file (os_unix.c UNIX_SHM_DMS)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Mount:
    """One mount's record of its locks, its calls answered by the table (as Master.Lock)."""

    def __init__(self, table: LockTable, name: str) -> None:
        self.table, self.locks, self.caller = table, MountLocks(), pb.Caller(client_id=name)

    def drive(self, op: typing.Generator[typing.Any, typing.Any, bool]) -> bool:
        try:
            _method, r = next(op)
            c = LockCall(r.caller.client_id, r.ino, r.owner, r.flock, r.type, r.start, r.end, r.pid)
            found = self.table.test(c) if r.test else self.table.set(c)
            op.send(pb.LockReply(granted=found is None, lease_ms=int(self.table.lease_s * 1000)))
        except StopIteration as done:
            return bool(done.value)
        raise AssertionError("gate() made more than one call")

    def gate_open(self) -> bool:
        """F_GETLK's first question on a WAL index (client/walgate.py WalGates.getlk)."""
        return self.locks.gated(INO) or self.drive(gate(self.locks, self.caller, INO, WRLCK, test=True))

    def lock(self, owner: int, type: int, start: int = DMS, end: int = DMS) -> bool:
        """One process's F_SETLK on the WAL index (client/walgate.py WalGates.setlk): the gate
        first, the lock, then the gate given up when nothing of this mount's is left."""
        if type != UNLCK and not self.locks.gated(INO) and not self.drive(gate(self.locks, self.caller, INO, WRLCK)):
            return False
        a = LockAsk(INO, owner, False, type, start, end)
        c = LockCall(self.caller.client_id, INO, owner, False, type, start, end)
        granted = self.table.set(c) is None
        if granted:
            self.locks.granted(a, 5000)
        if self.locks.gated(INO) and not self.locks.others_on(INO):
            assert self.drive(gate(self.locks, self.caller, INO, UNLCK))
        return granted


def two_mounts(lease_s: float = 5.0) -> tuple[Mount, Mount, LockTable, Clock]:
    clock = Clock()
    table = LockTable(lease_s, clock)
    return Mount(table, "host-a"), Mount(table, "host-b"), table, clock


def test_only_a_wal_index_is_gated() -> None:
    assert is_shared_index("x.db-shm")
    assert not is_shared_index("x.db") and not is_shared_index("x.db-wal") and not is_shared_index("shm")


def test_a_second_mount_is_shut_out_while_the_first_holds_a_lock() -> None:
    """SQLite's open of the index on host B while host A has it open: F_GETLK on the DMS
    byte finds a write lock (SQLITE_BUSY), and any lock B tries is refused, a read lock
    too (A's connections hold read locks only, which would otherwise be shared)."""
    a, b, table, _ = two_mounts()
    assert a.gate_open()
    assert a.lock(1, WRLCK)                 # A's first connection: recovery, then...
    assert a.lock(1, RDLCK)                 # ...the read lock it keeps while connected
    assert a.locks.gated(INO)
    assert not b.gate_open()
    assert not b.lock(5, RDLCK)
    assert not b.lock(5, WRLCK, 120, 120)   # the WAL's write lock: another byte, refused all the same
    assert not b.locks.any()                # B holds nothing (not even the gate) after its refusals


def test_processes_of_one_mount_share_the_index_under_posix_rules() -> None:
    a, _, _, _ = two_mounts()
    assert a.lock(1, RDLCK) and a.lock(2, RDLCK)     # two connections (processes) on host A
    assert not a.lock(3, WRLCK)                      # POSIX: their read locks exclude a write lock
    assert a.lock(2, WRLCK, 120, 120)                # a writer's lock on another byte
    assert a.gate_open()


def test_the_gate_goes_with_the_mounts_last_lock() -> None:
    """Host A's connections close one by one: the gate stays until the last lock goes,
    then host B opens the index (and runs SQLite's recovery from the WAL)."""
    a, b, _, _ = two_mounts()
    assert a.lock(1, RDLCK) and a.lock(2, RDLCK)
    assert a.lock(1, UNLCK, 0, GATE_BYTE)
    assert a.locks.gated(INO) and not b.gate_open()
    assert a.lock(2, UNLCK, 0, GATE_BYTE)
    assert not a.locks.any()
    assert b.gate_open() and b.lock(7, WRLCK)
    assert not a.gate_open() and not a.lock(1, RDLCK)


def test_a_dead_mounts_gate_ends_with_its_lease() -> None:
    a, b, table, clock = two_mounts(lease_s=2.0)
    assert a.lock(1, RDLCK)
    clock.t += 1.0
    assert not b.lock(5, RDLCK)             # (B is heard; A is silent from here on)
    clock.t += 1.5
    assert table.expire() == ["host-a"]
    assert b.lock(5, WRLCK)


def test_the_gate_is_not_a_lock_that_keeps_the_write_lease() -> None:
    """The last unlock of the file by the mount's processes gives its write lease up
    (VFS.setlk, MountLocks.unlocking): the gate, held until just after, does not count."""
    m = MountLocks()
    m.granted(LockAsk(INO, GATE_OWNER, False, WRLCK, GATE_BYTE, GATE_BYTE), 5000)
    m.granted(LockAsk(INO, 1, False, RDLCK, DMS, DMS), 5000)
    assert m.others_on(INO)
    assert not m.unlocking(LockAsk(INO, 1, False, UNLCK))
    m.granted(LockAsk(INO, 1, False, UNLCK), 5000)
    assert m.gated(INO) and not m.others_on(INO)


def test_a_mounts_own_lock_is_in_the_way_of_other_mounts_only() -> None:
    """The database's gate (PENDING_BYTE, which every SQLite reader locks first): another
    host's reader is refused at its database lock (SQLITE_BUSY, which its busy timeout
    retries), the mount's own processes take theirs, and their locks never stop the
    mount's own."""
    assert GATE_OWNER == MOUNT_OWNER
    _, _, table, _ = two_mounts()

    def call(client: str, owner: int, type: int) -> LockCall:
        return LockCall(client, INO, owner, False, type, PENDING_BYTE, PENDING_BYTE)
    assert table.set(call("host-a", 1, WRLCK)) is None                 # a process of A holds the byte...
    assert table.set(call("host-a", MOUNT_OWNER, WRLCK)) is None       # ...and A takes its own lock all the same
    assert table.set(call("host-a", 2, RDLCK)) is not None             # (A's processes: POSIX rules among them)
    assert table.set(call("host-a", 1, UNLCK)) is None
    assert table.set(call("host-a", 2, RDLCK)) is None
    assert table.set(call("host-b", 5, RDLCK)) is not None             # B's reader waits
    assert table.test(call("host-b", 5, RDLCK)) is not None
    assert table.set(call("host-b", MOUNT_OWNER, WRLCK)) is not None   # B's own lock too
    assert table.set(call("host-a", MOUNT_OWNER, UNLCK)) is None
    assert table.set(call("host-b", 5, RDLCK)) is None
