"""A mount's side of the master's locks (master/locks.py, docs/posix.md "Locks").

The master holds every flock(2) and POSIX byte-range lock, keyed by (this mount's client
id, the kernel's lock owner).  This module keeps the mount's own record of what it
holds (the same range arithmetic as the master's, common/lockranges.py), because:
- the mount renews its lock lease while it holds anything (every third of the lease),
  and gives the record back to a master that lost it (a new leader, a restart: reclaim);
- a close that ends an owner's locks needs a call only when the owner holds one.

A blocking wait (F_SETLKW, flock without LOCK_NB) is a loop of bounded calls (``acquire``):
a master call never stays open while another owner holds the lock, each try tells the
master this owner waits (EDEADLK detection), and between tries the kernel's interrupt
(a signal to the waiting process) ends the wait with EINTR.

SQLite's WAL index (``<db>-shm``) is memory every connection maps: two hosts cannot share
it, so its byte-range locks belong to one mount at a time (``gate``): a mount holds a
write lock of its own (owner GATE_OWNER, the file's last byte) while any of its processes
holds a lock on a ``-shm`` file, and another mount's lock calls on that file meet it as a
conflict: SQLite's open of the index (os_unix.c, unixLockSharedMemory: F_GETLK on the
DMS byte, then F_SETLK) answers SQLITE_BUSY on the second host.  SQLite retries that
itself for about 10 s only (then SQLITE_PROTOCOL), so the mount also holds a write lock
of its own on the database's PENDING_BYTE, the byte every reader locks first: another
host's connection gets SQLITE_BUSY at its database lock, which its busy timeout retries
until the first host's connections are gone (docs/posix.md, SQLite).
"""
from __future__ import annotations

import errno
import logging
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generator, Iterator

from curvine_py.common import lockranges
from curvine_py.common.errors import err
from curvine_py.common.lockranges import Range
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master

log = logging.getLogger(__name__)
FIRST_POLL_S = 0.01     # a blocked waiter asks again after this, then twice as long each time...
POLL_MAX_S = 0.5        # ...up to this: a released lock is taken within half a second
Key = tuple[bool, int, int]   # (flock?, ino, lock owner)
SHARED_INDEX_SUFFIX = "-shm"   # SQLite's WAL index: its locks are one mount's at a time (gate)
GATE_OWNER = (1 << 64) - 1     # the mount's own locks (master/locks.py MOUNT_OWNER): never in its processes' way
GATE_BYTE = lockranges.TO_EOF  # the index's gate: one byte past anything SQLite locks there (bytes 120-128)
PENDING_BYTE = 0x40000000      # SQLite's database lock byte every reader takes first (os_unix.c): the database's gate


def is_shared_index(name: str) -> bool:
    """A name whose file's locks one mount holds at a time (SQLite's ``<db>-shm``)."""
    return name.endswith(SHARED_INDEX_SUFFIX)


@dataclass(frozen=True)
class LockAsk:
    """One lock call of the mount: which lock, for whom."""

    ino: int
    owner: int
    flock: bool
    type: int
    start: int = 0
    end: int = lockranges.TO_EOF
    pid: int = 0

    def request(self, caller: pb.Caller, test: bool = False, wait: bool = False) -> pb.LockRequest:
        return pb.LockRequest(caller=caller, ino=self.ino, owner=self.owner, flock=self.flock, type=self.type,
                              start=self.start, end=self.end, pid=self.pid, test=test, wait=wait)


class MountLocks:
    """What this mount holds (thread-safe), and the requests that renew or reclaim it."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._held: dict[Key, tuple[Range, ...]] = {}
        self._unlocking: dict[Key, tuple[Range, ...]] = {}   # unlocks under way: what they leave (unlocking)
        self.lease_s = 0.0   # the master's lock lease, from its last reply (0: none heard yet)

    def granted(self, ask: LockAsk, lease_ms: int) -> None:
        """The master took ask (or with UNLCK, let it go): the record follows."""
        key = (ask.flock, ask.ino, ask.owner)
        with self._mu:
            if ask.type == lockranges.UNLCK:
                self._unlocking.pop(key, None)
            ranges = lockranges.put(self._held.get(key, ()), Range(ask.type, ask.start, ask.end, ask.pid))
            if ranges:
                self._held[key] = ranges
            else:
                self._held.pop(key, None)
            if lease_ms:
                self.lease_s = lease_ms / 1000

    def holds(self, ino: int, owner: int, flock: bool) -> bool:
        with self._mu:
            return (flock, ino, owner) in self._held

    def unlocking(self, a: LockAsk) -> bool:
        """An unlock (a) begins: will this client still hold a lock on a's file once it is
        done (a range left to a's owner, another owner's lock)?  The unlock counts as done
        from here until its answer (granted, or unlock_failed): two owners unlocking the
        file at once must not each see the other's lock, or neither gives the write lease
        up and this host keeps it holding no lock (a writer on another host then got
        EBUSY under its lock: SQLite's "disk I/O error", issue 41)."""
        key = (a.flock, a.ino, a.owner)
        with self._mu:
            self._unlocking[key] = lockranges.put(self._pending(key), Range(lockranges.UNLCK, a.start, a.end))
            return any(self._pending(k) for k in self._held.keys() | self._unlocking.keys()
                       if k[1] == a.ino and not _is_gate(k))

    def _pending(self, key: Key) -> tuple[Range, ...]:
        """key's locks with its unlock under way applied (under _mu)."""
        return self._unlocking.get(key, self._held.get(key, ()))

    def unlock_failed(self, a: LockAsk) -> None:
        """a's unlock got no answer: the record stands as the master last said."""
        with self._mu:
            self._unlocking.pop((a.flock, a.ino, a.owner), None)

    def gated(self, ino: int) -> bool:
        """This mount holds ino's gate (its processes' locks on it shut other mounts out)."""
        with self._mu:
            return (False, ino, GATE_OWNER) in self._held

    def others_on(self, ino: int) -> bool:
        """A lock of this mount's processes on ino (the gate aside), held or being taken back."""
        with self._mu:
            return any(self._pending(k) for k in self._held.keys() | self._unlocking.keys()
                       if k[1] == ino and not _is_gate(k))

    def owners_on(self, ino: int) -> list[tuple[int, bool]]:
        """(owner, flock?) of every lock this mount holds on ino."""
        with self._mu:
            return [(owner, flock) for flock, i, owner in self._held if i == ino]

    def any(self) -> bool:
        with self._mu:
            return bool(self._held)

    def lost(self) -> int:
        """The master dropped them all (this mount's lease ran out): forget them; how many."""
        with self._mu:
            n = len(self._held)
            self._held.clear()
        return n

    def reclaim(self, caller: pb.Caller) -> pb.LockRenew:
        """The renewal, with every held lock for a master that knows none of them."""
        with self._mu:
            asks = [LockAsk(ino, owner, flock, r.type, r.start, r.end, r.pid)
                    for (flock, ino, owner), ranges in self._held.items() for r in ranges]
        return pb.LockRenew(caller=caller, reclaim=[a.request(caller) for a in asks])


def _is_gate(key: Key) -> bool:
    return not key[0] and key[2] == GATE_OWNER


def gate(locks: MountLocks, caller: pb.Caller, ino: int, type: int, test: bool = False,
         byte: int = GATE_BYTE) -> Generator[Any, Any, bool]:
    """A VFS operation (client/vfs.py ``Op``): take (WRLCK), give up (UNLCK) or, with
    test, look at ino's gate (byte: PENDING_BYTE for a database's); True when done (or
    free).  The gate is an ordinary lock of the master's table (renewed with the mount's
    lease, reclaimed by a new leader, dropped when the mount's lease runs out), so a
    mount that dies holding it frees it."""
    a = LockAsk(ino, GATE_OWNER, False, type, byte, byte)
    reply = yield Master.Lock, a.request(caller, test=test)
    if reply.granted and not test:
        locks.granted(a, reply.lease_ms)
    return bool(reply.granted)


def polls() -> Iterator[float]:
    """The pauses of a blocked waiter between its tries."""
    pause = FIRST_POLL_S
    while True:
        yield pause
        pause = min(pause * 2, POLL_MAX_S)


async def acquire(attempt: Callable[[bool], Awaitable[bool]], block: bool,
                  sleep: Callable[[float], Awaitable[None]], interrupted: Callable[[], bool]) -> None:
    """Take a lock by attempt(waiting) (True: granted): once without block (EAGAIN when
    refused), else again after each pause until granted (EINTR once interrupted)."""
    if await attempt(False):
        return
    if not block:
        raise err(errno.EAGAIN, "the lock is held by another owner")
    for pause in polls():
        await sleep(pause)
        if interrupted():
            raise err(errno.EINTR, "the wait for a lock was interrupted")
        if await attempt(True):
            return
