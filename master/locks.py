"""The master's lock table: flock(2) and POSIX byte-range locks of every mount (issue 41).

Locks are keyed by (mount, lock owner): the mount is its client id (``Caller.client_id``),
the owner the kernel's lock owner of the open file description or process (FUSE's
``lock_owner``), so two processes on one mount, or two mounts, exclude each other as two
processes on one host would.  flock and POSIX locks are separate tables, as in Linux.

Why in memory, and how a lock survives anyway:
- A lock is held by a live mount and dies with it.  Each mount renews a lock lease of its
  own (``master.lock_lease_s``) while it holds one; a mount silent for a lease (killed,
  cut off) loses all its locks at the next housekeeping tick.
- A master that starts, or becomes the leader, knows no locks.  For one lease it grants
  none (``grace``, answered UNAVAILABLE, which clients retry), while the mounts, told
  by their next renewal that it holds nothing of theirs, give it back what they hold
  (``reclaim``), as NFS clients do after a server restart.  A mount whose lease this
  master ran out gets no reclaim: it was told its locks are gone.  So the table needs no
  journal records (a lock call is not an fsync), and what a failover loses is only what
  the mounts lost too.

A lock of owner MOUNT_OWNER is its mount's own: it conflicts with other mounts' locks
only, never with its own processes' (a mount keeps SQLite's WAL index and database to
itself while its processes use them in WAL mode, client/locks.py ``gate``).

Blocking waits are the clients' (they ask again with ``wait``); the table remembers who
waits for whom for a few seconds (``WAIT_TTL_S``), and a POSIX wait that would close a
cycle of mounts' owners gets EDEADLK, as the kernel's own detection does locally.
"""
from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from curvine_py.common import lockranges
from curvine_py.common.errors import Unavailable, err
from curvine_py.common.lockranges import Range

log = logging.getLogger(__name__)
WAIT_TTL_S = 5.0    # a waiter not heard from again in this long no longer counts for EDEADLK
MAX_RANGES = 100_000   # lock ranges one mount may hold (the master's memory): ENOLCK past it, as the kernel's
Owner = tuple[str, int]      # (the mount's client id, the kernel's lock owner)
MOUNT_OWNER = (1 << 64) - 1  # the mount's own locks (no kernel lock owner is this): client/locks.py GATE_OWNER
Held = dict[Owner, tuple[Range, ...]]


@dataclass(frozen=True)
class LockCall:
    """One lock request as the table sees it (MasterService translates the wire's)."""

    client: str
    ino: int
    owner: int
    flock: bool
    type: int
    start: int = 0
    end: int = lockranges.TO_EOF
    pid: int = 0

    @property
    def key(self) -> Owner:
        return (self.client, self.owner)


@dataclass
class Mount:
    """What the table keeps of one mount: when it was last heard, and where it holds locks."""

    heard: float
    inodes: set[tuple[bool, int]] = field(default_factory=set)   # (flock, ino)
    ranges: int = 0   # lock ranges it holds (MAX_RANGES)


class LockTable:
    """Every mount's locks (thread-safe: one mutex, held for dict work only)."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._mu = threading.Lock()
        self._tables: dict[bool, dict[int, Held]] = {False: {}, True: {}}   # flock? -> ino -> owners
        self._mounts: dict[str, Mount] = {}
        self._expired: set[str] = set()      # mounts whose locks this master dropped
        self._waits: dict[Owner, tuple[Owner, float]] = {}
        self._grace_until = 0.0

    # ------------------------------------------------------------------ calls
    def test(self, c: LockCall) -> Range | None:
        """F_GETLK: the lock in c's way (None: c could be had)."""
        self._check(c)
        with self._mu:
            self._in_grace()
            self._heard(c.client)
            found = self._blocker(c)
        return found[1] if found else None

    def set(self, c: LockCall, wait: bool = False) -> Range | None:
        """Take (or with UNLCK give up) c's lock: None when done, else the lock in its
        way.  wait: a blocking request asking again; EDEADLK when its wait would close a
        cycle.  UNAVAILABLE (retried by clients) during a new master's grace."""
        self._check(c)
        with self._mu:
            if c.type != lockranges.UNLCK or c.client not in self._mounts:
                self._in_grace()   # (an unlock, too, comes after its mount's reclaim)
            self._heard(c.client)
            found = self._blocker(c)
            if found is not None:
                if wait and not c.flock:
                    self._wait_for(c.key, found[0])
                return found[1]
            self._waits.pop(c.key, None)
            m = self._mounts[c.client]
            if c.type != lockranges.UNLCK and m.ranges >= MAX_RANGES:
                raise err(errno.ENOLCK, f"this mount holds {m.ranges} lock ranges, the most the master keeps")
            self._install(c)
        return None

    def release(self, client: str, ino: int, owner: int, flock: bool) -> None:
        """Everything owner holds on ino (a close that ends its locks)."""
        self.set(LockCall(client, ino, owner, flock, lockranges.UNLCK))

    # ------------------------------------------------------------------ leases
    def renew(self, client: str, reclaim: list[LockCall]) -> bool:
        """A mount's lease renewed; False: its locks are gone (its lease ran out here, or
        it comes back after the grace).  reclaim: the locks the mount holds, which a
        master that has not heard from it since it began leading takes back during its
        grace (a mount it knows is renewed and its list ignored: the table is the truth)."""
        with self._mu:
            m = self._mounts.get(client)
            if m is not None:
                m.heard = self._clock()
                return True
            if client in self._expired:
                return False
            if not reclaim:
                return True
            if self._clock() >= self._grace_until:
                return False
            for c in reclaim:
                self._install(c)
            self._mounts[client].heard = self._clock()
            log.info("mount %s reclaimed %d locks", client, len(reclaim))
            return True

    def expire(self) -> list[str]:
        """Drop the locks of mounts silent for a lease; the mounts dropped."""
        now = self._clock()
        with self._mu:
            silent = [cid for cid, m in self._mounts.items() if now > m.heard + self.lease_s]
            gone = [cid for cid in silent if self._mounts[cid].inodes]
            for cid in silent:
                self._drop_mount(cid)
            for k in [k for k, (_, until) in self._waits.items() if until < now]:
                del self._waits[k]
        for cid in gone:
            log.warning("mount %s silent for %.1f s: its locks are dropped", cid, self.lease_s)
        return gone

    def new_term(self) -> None:
        """This master starts leading: no locks known, none granted for one lease while
        the mounts reclaim theirs."""
        with self._mu:
            self._tables = {False: {}, True: {}}
            self._mounts.clear()
            self._expired.clear()
            self._waits.clear()
            self._grace_until = self._clock() + self.lease_s

    def count(self) -> int:
        """Owners holding a lock on some inode (cv report, tests)."""
        with self._mu:
            return sum(len(h) for t in self._tables.values() for h in t.values())

    # ------------------------------------------------------------------ inside the mutex
    @staticmethod
    def _check(c: LockCall) -> None:
        try:
            lockranges.check(c.type, c.start, c.end)
        except ValueError as e:
            raise err(errno.EINVAL, str(e)) from None
        if not c.ino:
            raise err(errno.EINVAL, "a lock needs an inode")

    def _in_grace(self) -> None:
        if self._clock() < self._grace_until:
            raise Unavailable("locks are being reclaimed after a master change; try again")

    def _heard(self, client: str) -> None:
        m = self._mounts.get(client)
        if m is None:
            m = self._mounts[client] = Mount(self._clock())
        m.heard = self._clock()
        self._expired.discard(client)

    def _blocker(self, c: LockCall) -> tuple[Owner, Range] | None:
        held = self._tables[c.flock].get(c.ino, {})
        if c.owner == MOUNT_OWNER:   # the mount's own lock: only other mounts' are in its way...
            others = {k: v for k, v in held.items() if k[0] != c.client}
        else:                        # ...and it is in no way of its own processes'
            others = {k: v for k, v in held.items() if k != c.key and k != (c.client, MOUNT_OWNER)}
        return lockranges.blocker(others, c.type, c.start, c.end)

    def _install(self, c: LockCall) -> None:
        held = self._tables[c.flock].setdefault(c.ino, {})
        before = held.get(c.key, ())
        ranges = lockranges.put(before, Range(c.type, c.start, c.end, c.pid))
        m = self._mounts.setdefault(c.client, Mount(self._clock()))
        m.ranges += len(ranges) - len(before)
        if ranges:
            held[c.key] = ranges
            m.inodes.add((c.flock, c.ino))
            return
        held.pop(c.key, None)
        if not held:
            del self._tables[c.flock][c.ino]
        if not any(k[0] == c.client for k in held):
            m.inodes.discard((c.flock, c.ino))

    def _wait_for(self, waiter: Owner, holder: Owner) -> None:
        """Remember that waiter waits for holder, unless that closes a cycle (EDEADLK)."""
        now, seen, at = self._clock(), {holder}, holder
        while at in self._waits and self._waits[at][1] >= now:
            at = self._waits[at][0]
            if at == waiter:
                raise err(errno.EDEADLK, "waiting for this lock would deadlock (a cycle of lock owners)")
            if at in seen:   # a cycle of others (each of them will be told): not ours
                break
            seen.add(at)
        self._waits[waiter] = (holder, now + WAIT_TTL_S)

    def _drop_mount(self, client: str) -> None:
        m = self._mounts.pop(client, None)
        for k in [k for k in self._waits if k[0] == client]:
            del self._waits[k]
        if m is None or not m.inodes:
            return
        for flock, ino in m.inodes:
            held = self._tables[flock].get(ino, {})
            for k in [k for k in held if k[0] == client]:
                del held[k]
            if not held:
                self._tables[flock].pop(ino, None)
        self._expired.add(client)
