"""The master's lock table (master/locks.py) and the range arithmetic it shares with the
mounts (common/lockranges.py): POSIX rules checked byte by byte against a model, flock,
leases, reclaim after a master change, and EDEADLK."""
from __future__ import annotations

import errno
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curvine_py.common.errors import CurvineError, Unavailable
from curvine_py.common.lockranges import RDLCK, TO_EOF, UNLCK, WRLCK, Range, put
from curvine_py.master.locks import LockCall, LockTable

SIZE = 24   # bytes the model tracks: every range below ends inside them


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def table(lease_s: float = 5.0) -> tuple[LockTable, Clock]:
    clock = Clock()
    t = LockTable(lease_s, clock)
    return t, clock


def posix(client: str, owner: int, type: int, start: int = 0, end: int = TO_EOF, pid: int = 1) -> LockCall:
    return LockCall(client, 7, owner, False, type, start, end, pid)


def fl(client: str, owner: int, type: int) -> LockCall:
    return LockCall(client, 7, owner, True, type)


# ---------------------------------------------------------------- the range arithmetic
def test_unlock_of_the_middle_splits_a_range() -> None:
    held = put((), Range(WRLCK, 0, 99))
    assert put(held, Range(UNLCK, 40, 59)) == (Range(WRLCK, 0, 39), Range(WRLCK, 60, 99))


def test_touching_ranges_of_one_type_merge_and_other_types_replace() -> None:
    held = put(put((), Range(RDLCK, 0, 9)), Range(RDLCK, 10, 19))
    assert held == (Range(RDLCK, 0, 19),)
    held = put(held, Range(WRLCK, 5, 14))
    assert held == (Range(RDLCK, 0, 4), Range(WRLCK, 5, 14), Range(RDLCK, 15, 19))


ops = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([RDLCK, WRLCK, UNLCK]), st.integers(0, SIZE - 1),
                         st.integers(0, 8), st.booleans()), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_table_agrees_with_a_byte_model(steps: list[tuple[int, int, int, int, bool]]) -> None:
    """Three owners on two mounts lock, unlock and test random ranges; after each step
    every byte's holders are what a byte-by-byte model says, and every refusal names a
    lock that really conflicts."""
    t, _ = table()
    model: list[dict[int, int]] = [{} for _ in range(SIZE)]   # byte -> owner -> type
    for owner, type, start, length, test in steps:
        end = min(start + length, SIZE - 1)
        c = posix("a" if owner < 2 else "b", owner, type, start, end)
        blocked = [o for b in range(start, end + 1) for o, ty in model[b].items()
                   if o != owner and WRLCK in (ty, type) and type != UNLCK]
        found = t.test(c) if test else t.set(c)
        assert (found is not None) == bool(blocked), (c, found, blocked)
        if found is not None:
            assert found.overlaps(start, end) and WRLCK in (found.type, type)
        elif not test:
            for b in range(start, end + 1):
                if type == UNLCK:
                    model[b].pop(owner, None)
                else:
                    model[b][owner] = type
        for b in range(SIZE):   # a stranger's probe is blocked exactly where somebody holds a byte
            assert (t.test(posix("z", 99, WRLCK, b, b)) is not None) == bool(model[b]), (b, model[b])
            readers_only = all(ty == RDLCK for ty in model[b].values())
            assert (t.test(posix("z", 99, RDLCK, b, b)) is None) == readers_only, (b, model[b])


def test_getlk_reports_the_holders_range_type_and_pid() -> None:
    t, _ = table()
    assert t.set(posix("a", 1, RDLCK, 100, 199, pid=4242)) is None
    assert t.test(posix("b", 2, RDLCK, 150, 160)) is None           # readers share
    assert t.test(posix("b", 2, WRLCK, 150, 160)) == Range(RDLCK, 100, 199, 4242)
    assert t.test(posix("b", 2, WRLCK, 200, 300)) is None


def test_one_owner_never_conflicts_with_itself() -> None:
    t, _ = table()
    assert t.set(posix("a", 1, WRLCK, 0, 9)) is None
    assert t.set(posix("a", 1, RDLCK, 5, 20)) is None
    assert t.test(posix("a", 2, WRLCK, 0, 4)) == Range(WRLCK, 0, 4, 1)   # another owner, same mount


def test_flock_is_whole_file_and_apart_from_posix() -> None:
    t, _ = table()
    assert t.set(fl("a", 1, WRLCK)) is None
    assert t.set(fl("b", 2, RDLCK)) is not None
    assert t.set(posix("b", 2, WRLCK)) is None        # POSIX locks do not see flock ones (Linux)
    t.release("a", 7, 1, flock=True)
    assert t.set(fl("b", 2, RDLCK)) is None
    assert t.set(fl("c", 3, RDLCK)) is None           # shared
    assert t.set(fl("c", 3, WRLCK)) is not None       # upgrade blocked by b's shared lock


def test_bad_ranges_are_einval() -> None:
    t, _ = table()
    for c in (posix("a", 1, WRLCK, 10, 5), posix("a", 1, 7), posix("a", 1, WRLCK, 0, TO_EOF + 1)):
        with pytest.raises(CurvineError) as e:
            t.set(c)
        assert e.value.errno == errno.EINVAL


# ---------------------------------------------------------------- leases, reclaim
def after_grace(t: LockTable, clock: Clock) -> None:
    clock.t += t.lease_s + 0.1


def test_a_new_master_grants_nothing_during_its_grace_but_takes_reclaims() -> None:
    t, clock = table()
    t.new_term()
    with pytest.raises(Unavailable):
        t.set(posix("b", 2, WRLCK))
    with pytest.raises(Unavailable):              # an unlock too: it would come before a's reclaim
        t.set(posix("a", 1, UNLCK))
    assert t.renew("a", [posix("a", 1, WRLCK, 0, 9)]) is True     # a mount gives back its lock
    assert t.set(posix("a", 1, UNLCK, 0, 4)) is None               # known now: its unlock goes through
    assert t.renew("a", [posix("a", 1, WRLCK, 0, 9)]) is True      # a known mount's list is ignored
    assert t.renew("c", []) is True                                # nothing to give back, nothing lost
    after_grace(t, clock)
    assert t.set(posix("b", 2, WRLCK, 5, 5)) == Range(WRLCK, 5, 9, 1)
    assert t.set(posix("b", 2, WRLCK, 0, 4)) is None
    assert t.renew("d", [posix("d", 4, WRLCK, 20, 20)]) is False   # after the grace: too late
    assert t.set(posix("b", 2, WRLCK, 20, 20)) is None


def test_a_silent_mount_loses_its_locks_and_cannot_reclaim_them() -> None:
    t, clock = table(lease_s=3.0)
    assert t.set(posix("a", 1, WRLCK)) is None
    assert t.set(fl("a", 1, WRLCK)) is None
    clock.t += 2.0
    assert t.renew("a", []) is True
    clock.t += 2.5
    assert t.expire() == []                      # renewed 2.5 s ago
    clock.t += 1.0
    assert t.expire() == ["a"]
    assert t.count() == 0
    assert t.set(posix("b", 2, WRLCK)) is None
    assert t.renew("a", [posix("a", 1, WRLCK)]) is False   # told its locks are gone
    assert t.renew("a", []) is False
    assert t.test(posix("c", 3, RDLCK)) == Range(WRLCK, 0, TO_EOF, 1)   # b's, not a's


def test_a_mount_that_unlocked_everything_is_forgotten_quietly() -> None:
    t, clock = table()
    assert t.set(posix("a", 1, WRLCK, 0, 9)) is None
    t.release("a", 7, 1, flock=False)
    assert t.count() == 0
    clock.t += 10
    assert t.expire() == []                      # it held nothing: nothing is lost
    assert t.renew("a", []) is True


# ---------------------------------------------------------------- EDEADLK
def test_a_wait_that_closes_a_cycle_is_edeadlk() -> None:
    t, _ = table()
    assert t.set(posix("a", 1, WRLCK, 0, 0)) is None
    assert t.set(posix("b", 2, WRLCK, 1, 1)) is None
    assert t.set(posix("a", 1, WRLCK, 1, 1), wait=True) is not None   # a waits for b
    with pytest.raises(CurvineError) as e:
        t.set(posix("b", 2, WRLCK, 0, 0), wait=True)                  # b would wait for a
    assert e.value.errno == errno.EDEADLK
    assert t.set(posix("b", 2, WRLCK, 0, 0)) is not None               # F_SETLK: just EAGAIN


def test_a_three_owner_cycle_is_found_and_an_old_wait_forgotten() -> None:
    t, clock = table()
    for o, b in ((1, 0), (2, 1), (3, 2)):
        assert t.set(posix(f"m{o}", o, WRLCK, b, b)) is None
    assert t.set(posix("m1", 1, WRLCK, 1, 1), wait=True) is not None  # 1 -> 2
    assert t.set(posix("m2", 2, WRLCK, 2, 2), wait=True) is not None  # 2 -> 3
    with pytest.raises(CurvineError):
        t.set(posix("m3", 3, WRLCK, 0, 0), wait=True)                 # 3 -> 1 closes it
    clock.t += 10                                                      # waits not renewed: gone
    assert t.set(posix("m3", 3, WRLCK, 0, 0), wait=True) is not None


# ---------------------------------------------------------------- the mount's side
def test_the_mounts_record_follows_grants_and_is_what_it_reclaims() -> None:
    from curvine_py.client.locks import LockAsk, MountLocks
    from curvine_py.pb import curvine_pb2 as pb
    m = MountLocks()
    m.granted(LockAsk(7, 1, False, WRLCK, 0, 99), 5000)
    m.granted(LockAsk(7, 1, False, UNLCK, 40, 59), 5000)
    m.granted(LockAsk(8, 2, True, RDLCK), 5000)
    assert m.lease_s == 5.0 and m.holds(7, 1, False) and not m.holds(7, 1, True)
    assert sorted(m.owners_on(7)) == [(1, False)]
    renew = m.reclaim(pb.Caller(client_id="me"))
    got = sorted((r.ino, r.owner, r.flock, r.type, r.start, r.end) for r in renew.reclaim)
    assert got == [(7, 1, False, WRLCK, 0, 39), (7, 1, False, WRLCK, 60, 99), (8, 2, True, RDLCK, 0, TO_EOF)]
    m.granted(LockAsk(8, 2, True, UNLCK), 0)
    assert not m.holds(8, 2, True) and m.any()
    assert m.lost() == 1 and not m.any()


def test_acquire_tries_once_without_block_and_polls_until_granted_or_interrupted() -> None:
    import trio

    from curvine_py.client.locks import POLL_MAX_S, acquire, polls
    pauses: list[float] = []

    async def sleep(s: float) -> None:
        pauses.append(s)

    def attempts(grant_at: int, log: list[bool]) -> typing.Callable[[bool], typing.Awaitable[bool]]:
        async def attempt(waiting: bool) -> bool:
            log.append(waiting)
            return len(log) >= grant_at
        return attempt

    tries: list[bool] = []
    with pytest.raises(CurvineError) as e:
        trio.run(acquire, attempts(2, tries), False, sleep, lambda: False)
    assert e.value.errno == errno.EAGAIN and tries == [False]
    tries = []
    trio.run(acquire, attempts(9, tries), True, sleep, lambda: False)
    assert tries == [False] + [True] * 8             # tries after the first say they wait (EDEADLK)
    assert pauses[:3] == [0.01, 0.02, 0.04] and max(pauses) == POLL_MAX_S
    tries, stop = [], iter([False, False, True])
    with pytest.raises(CurvineError) as e:
        trio.run(acquire, attempts(99, tries), True, sleep, lambda: next(stop))
    assert e.value.errno == errno.EINTR and len(tries) == 3
    p = polls()
    assert [next(p) for _ in range(8)][-1] == POLL_MAX_S


def test_a_mount_past_its_lock_ranges_gets_enolck(monkeypatch: pytest.MonkeyPatch) -> None:
    from curvine_py.master import locks
    monkeypatch.setattr(locks, "MAX_RANGES", 3)
    t, _ = table()
    for b in (0, 2, 4):
        assert t.set(posix("a", 1, WRLCK, b, b)) is None
    with pytest.raises(CurvineError) as e:
        t.set(posix("a", 1, WRLCK, 6, 6))
    assert e.value.errno == errno.ENOLCK
    assert t.set(posix("a", 1, UNLCK, 0, 0)) is None          # an unlock always goes
    assert t.set(posix("a", 1, WRLCK, 6, 6)) is None          # room again
    assert t.set(posix("b", 2, WRLCK, 9, 9)) is None          # another mount counts its own
    with pytest.raises(CurvineError) as e:
        t.set(LockCall("a", 0, 1, False, WRLCK))
    assert e.value.errno == errno.EINVAL
