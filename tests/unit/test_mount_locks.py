"""The mount's record of its locks (curvine_py/client/locks.py): which unlock of a file is
its last on this mount, the one that gives the write lease up (VFS.setlk)."""
from __future__ import annotations

from curvine_py.client.locks import LockAsk, MountLocks
from curvine_py.common.lockranges import RDLCK, UNLCK, WRLCK

INO = 7


def holding(*asks: LockAsk) -> MountLocks:
    locks = MountLocks()
    for a in asks:
        locks.granted(a, 5000)
    return locks


def test_two_owners_unlocking_at_once_leave_one_last_unlock() -> None:
    """Both unlocks ask before either is answered (two processes' fcntl at once): the
    later one sees nothing left and gives the lease up.  (Each seeing the other's lock
    kept the lease on a host that held no lock: SQLite's "disk I/O error", issue 41.)"""
    a, c = LockAsk(INO, 1, False, RDLCK, 10, 20), LockAsk(INO, 2, False, WRLCK, 30, 31)
    locks = holding(a, c)
    ua, uc = LockAsk(INO, 1, False, UNLCK), LockAsk(INO, 2, False, UNLCK)
    assert locks.unlocking(ua)            # c's lock stays
    assert not locks.unlocking(uc)        # a's is going: this is the last
    locks.granted(uc, 5000)
    locks.granted(ua, 5000)
    assert not locks.any()


def test_a_partial_unlock_or_another_file_leaves_the_lock() -> None:
    locks = holding(LockAsk(INO, 1, False, WRLCK, 0, 100), LockAsk(INO + 1, 2, True, WRLCK))
    assert locks.unlocking(LockAsk(INO, 1, False, UNLCK, 0, 50))     # [50, 100) stays
    assert not locks.unlocking(LockAsk(INO, 1, False, UNLCK, 50, 100))
    assert not locks.unlocking(LockAsk(INO + 1, 2, True, UNLCK))     # flock of another file: its own


def test_a_failed_unlock_is_forgotten() -> None:
    """An unlock the master never answered: the lock still counts (the master holds it)."""
    a, c = LockAsk(INO, 1, False, RDLCK), LockAsk(INO, 2, False, RDLCK)
    locks = holding(a, c)
    ua = LockAsk(INO, 1, False, UNLCK)
    assert locks.unlocking(ua)
    locks.unlock_failed(ua)
    assert locks.unlocking(LockAsk(INO, 2, False, UNLCK))   # a's lock is there still
    assert locks.holds(INO, 1, False)
