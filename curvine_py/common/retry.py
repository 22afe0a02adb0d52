"""One retry helper, on tenacity (pinned in pyproject.toml: 9.2.1), for every retry loop.

The master client, block reads and block writes each had a loop of their own, with its
own attempt counting, sleeping and last-error bookkeeping.  A ``Retry`` is the policy
they share, built once (module level, or once per client) and used for many calls:

* ``transient(error)``: is this failure worth another attempt?  Any other error is
  raised at once, as it is.
* ``attempts`` and ``deadline_s``: when to give up; the last error is then raised as it
  is (tenacity's ``reraise``: callers never see a ``RetryError``).
* ``wait(attempt, error)``: the seconds between failed attempt ``attempt`` (1 = the
  first) and the next (``Exponential``, ``Delays``, or any function); a wait never runs
  past the deadline, so giving up is at most one attempt late.
* ``before_sleep(Failed)``: the log line saying what is retried and why.
* ``before_retry(Failed)``: prepares the next attempt after the wait (the writer asks the
  master for another block on other workers); what it raises ends the retries at once.

``acall`` is the same policy for a coroutine on an event loop (the mount's master calls
on its trio loop), sleeping with ``async_sleep`` (``trio.sleep``) instead of blocking.

The first attempt runs without tenacity: building a ``Retrying`` costs ~15 us, a quarter
of a framed master call, and is only needed once an attempt failed with a transient
error.  tenacity then carries on as if it had made that attempt itself (it is replayed:
attempt numbers, waits and the deadline all count from it).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar, TypeVarTuple, Unpack

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Seconds to wait after failed attempt n (1 = the first) that raised the error.
Wait = Callable[[int, BaseException], float]


def no_wait(attempt: int, error: BaseException) -> float:
    """Try again at once (a block write retried on other workers)."""
    return 0.0


@dataclass(frozen=True)
class Exponential:
    """first_s after the first failure, times factor after each further one, at most cap_s.

    Callable without an error too: the worker's heartbeat loop, which is no retry but a
    steady period, takes its backoff after failures from here."""

    first_s: float
    cap_s: float
    factor: float = 2.0

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        try:
            return min(self.cap_s, self.first_s * self.factor ** max(0, attempt - 1))
        except OverflowError:   # a master down for days: thousands of failures in a row
            return self.cap_s


@dataclass(frozen=True)
class Delays:
    """These waits in turn; the last one again after that."""

    seconds: tuple[float, ...]

    def __call__(self, attempt: int, error: BaseException | None = None) -> float:
        return self.seconds[min(max(attempt, 1), len(self.seconds)) - 1]


@dataclass(frozen=True)
class Failed:
    """What before_sleep and before_retry are told: attempt `attempt` (1 = the first) of
    fn(*args) raised `error`, and the next one starts in `wait_s` seconds."""

    error: BaseException
    attempt: int
    wait_s: float
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Retry:
    """A retry policy (see the module's docstring); immutable, so shared by threads."""

    transient: Callable[[BaseException], bool]
    wait: Wait = no_wait
    # At most this many attempts in all; a function of the latest error when that decides
    # (a worker out of space is given more attempts than one that failed otherwise).
    attempts: int | Callable[[BaseException], int] | None = None
    # Give up once this long has passed since the first attempt started; a function when
    # it must be read at each call (client.retry_s, which the mount lowers while mounting).
    deadline_s: float | Callable[[], float] | None = None
    before_sleep: Callable[[Failed], None] | None = None
    before_retry: Callable[[Failed], None] | None = None
    sleep: Callable[[float], None] = time.sleep
    async_sleep: Callable[[float], Awaitable[None]] | None = None   # acall's (trio.sleep on the mount's loop)

    def call(self, fn: Callable[[Unpack[Ts]], T], *args: Unpack[Ts]) -> T:
        """fn(*args), retried as the policy says; raises fn's last error when it gives up."""
        start = time.monotonic()
        try:
            return fn(*args)
        except Exception as e:   # never KeyboardInterrupt or SystemExit
            if not self.transient(e):
                raise
            first = e
        return self._retry(first, start, fn, args)

    async def acall(self, fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: Unpack[Ts]) -> T:
        """await fn(*args), retried as the policy says, the waits awaited (async_sleep)."""
        asleep = self.async_sleep
        assert asleep is not None, "acall needs async_sleep"
        start = time.monotonic()
        try:
            return await fn(*args)
        except Exception as e:
            if not self.transient(e):
                raise
            first = e
        replay: list[Exception] = [first]

        async def attempt(*a: Unpack[Ts]) -> T:
            if replay:   # tenacity's attempt 1 is the one already made: its error again
                raise replay.pop()
            return await fn(*a)

        async def sleep(seconds: float) -> None:
            if seconds > 0:
                await asleep(seconds)

        retrying = AsyncRetrying(sleep=sleep, **self._policy(start, args))
        return await retrying(attempt, *args)

    def _retry(self, first: Exception, start: float, fn: Callable[[Unpack[Ts]], T], args: tuple[Unpack[Ts]]) -> T:
        """The attempts after a first one that failed with a transient error, by tenacity."""
        replay: list[Exception] = [first]

        def attempt(*a: Unpack[Ts]) -> T:
            if replay:   # tenacity's attempt 1 is the one already made: its error again
                raise replay.pop()
            return fn(*a)

        def sleep(seconds: float) -> None:
            if seconds > 0:   # "at once" is at once: no sleep(0)
                self.sleep(seconds)

        retrying = Retrying(sleep=sleep, **self._policy(start, args))
        return retrying(attempt, *args)

    def _policy(self, start: float, args: tuple[Any, ...]) -> dict[str, Any]:
        """tenacity's arguments for this policy, but its sleep (call's and acall's differ)."""
        deadline = self.deadline_s() if callable(self.deadline_s) else self.deadline_s
        latest: list[Failed] = []

        def left() -> float:
            return float("inf") if deadline is None else start + deadline - time.monotonic()

        def wait(rs: RetryCallState) -> float:
            return max(0.0, min(self.wait(rs.attempt_number, _error(rs)), left()))

        def stop(rs: RetryCallState) -> bool:
            most = self.attempts(_error(rs)) if callable(self.attempts) else self.attempts
            return (most is not None and rs.attempt_number >= most) or left() <= 0

        def before_sleep(rs: RetryCallState) -> None:
            failed = Failed(_error(rs), rs.attempt_number, rs.upcoming_sleep, args)
            latest[:] = [failed]
            if self.before_sleep is not None:
                self.before_sleep(failed)

        def before(rs: RetryCallState) -> None:
            if latest and self.before_retry is not None:   # not before the replayed attempt
                self.before_retry(latest[0])

        return dict(retry=retry_if_exception(self.transient), stop=stop, wait=wait, reraise=True,
                    before_sleep=before_sleep, before=before)


def _error(rs: RetryCallState) -> BaseException:
    """The error of the attempt that just failed (only asked after a failure)."""
    assert rs.outcome is not None
    error = rs.outcome.exception()
    assert error is not None
    return error
