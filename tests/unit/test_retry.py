"""curvine_py/common/retry.py: the one retry helper (tenacity underneath), with real waits
kept short: predicate, attempts, deadlines, reraise, hooks, and the first attempt made
without building tenacity's Retrying."""
from __future__ import annotations

import errno
import threading
import time

import pytest

from curvine_py.common import retry
from curvine_py.common.retry import Delays, Exponential, Failed, Retry


class Transient(Exception):
    pass


class Fatal(Exception):
    pass


def flaky(*outcomes: object) -> tuple[list[tuple[object, ...]], object]:
    """A function that raises or returns each outcome in turn; and the list of its calls' args."""
    calls: list[tuple[object, ...]] = []
    pending = list(outcomes)

    def fn(*args: object) -> object:
        calls.append(args)
        out = pending.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out
    return calls, fn


def is_transient(e: BaseException) -> bool:
    return isinstance(e, Transient)


@pytest.fixture
def no_tenacity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a Retrying fails the test: the call must not get that far."""
    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("a Retrying was built")
    monkeypatch.setattr(retry, "Retrying", refuse)


def test_a_first_attempt_that_succeeds_builds_no_retrying(no_tenacity: None) -> None:
    calls, fn = flaky("ok")
    assert Retry(transient=is_transient, attempts=3).call(fn, 1, "a") == "ok"
    assert calls == [(1, "a")]


def test_an_error_that_is_not_transient_is_raised_at_once_as_it_is(no_tenacity: None) -> None:
    error = Fatal("no")
    calls, fn = flaky(error, "never")
    with pytest.raises(Fatal) as got:
        Retry(transient=is_transient, attempts=5).call(fn)
    assert got.value is error and len(calls) == 1


def test_keyboard_interrupt_is_never_retried(no_tenacity: None) -> None:
    calls, fn = flaky(KeyboardInterrupt(), "never")
    with pytest.raises(KeyboardInterrupt):
        Retry(transient=lambda e: True, attempts=5).call(fn)
    assert len(calls) == 1


def test_transient_errors_are_retried_until_an_answer() -> None:
    calls, fn = flaky(Transient(1), Transient(2), "ok")
    slept: list[float] = []
    policy = Retry(transient=is_transient, attempts=5, wait=Exponential(0.01, 1.0), sleep=slept.append)
    assert policy.call(fn, "x") == "ok"
    assert calls == [("x",)] * 3
    # attempt numbers count from the fast first attempt: its failure gets the first wait
    assert slept == pytest.approx([0.01, 0.02])


def test_attempts_run_out_and_the_last_error_is_raised_not_a_retry_error() -> None:
    last = Transient(3)
    calls, fn = flaky(Transient(1), Transient(2), last, "never")
    with pytest.raises(Transient) as got:
        Retry(transient=is_transient, attempts=3, sleep=lambda s: None).call(fn)
    assert got.value is last and len(calls) == 3


def test_attempts_one_means_no_retry() -> None:
    calls, fn = flaky(Transient(1), "never")
    with pytest.raises(Transient):
        Retry(transient=is_transient, attempts=1).call(fn)
    assert len(calls) == 1


def test_a_non_transient_error_after_transient_ones_ends_the_retries() -> None:
    calls, fn = flaky(Transient(1), Fatal(2), "never")
    with pytest.raises(Fatal):
        Retry(transient=is_transient, attempts=10, sleep=lambda s: None).call(fn)
    assert len(calls) == 2


def test_attempts_may_depend_on_the_latest_error() -> None:
    """As the block writer's: ENOSPC gets many attempts, other errors three in all."""
    def attempts(e: BaseException) -> int:
        return 31 if isinstance(e, OSError) and e.errno == errno.ENOSPC else 3

    nospace = OSError(errno.ENOSPC, "full")
    _, fn = flaky(*[nospace] * 10, "ok")
    assert Retry(transient=lambda e: isinstance(e, OSError), attempts=attempts,
                 sleep=lambda s: None).call(fn) == "ok"
    calls, fn = flaky(nospace, nospace, nospace, nospace, OSError(errno.EIO, "io"), "never")
    with pytest.raises(OSError) as got:
        Retry(transient=lambda e: isinstance(e, OSError), attempts=attempts, sleep=lambda s: None).call(fn)
    assert got.value.errno == errno.EIO and len(calls) == 5


def test_waits_may_depend_on_the_error() -> None:
    slept: list[float] = []
    policy = Retry(transient=lambda e: True, attempts=3, sleep=slept.append,
                   wait=lambda n, e: 0.5 if isinstance(e, Transient) else 0.0)
    _, fn = flaky(Transient(), Fatal(), "ok")
    assert policy.call(fn) == "ok"
    assert slept == [0.5]   # and no sleep(0) for "at once"


def test_the_deadline_counts_from_the_first_attempt_and_cuts_the_last_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow first attempt uses up the deadline too; no wait runs past it.  On a clock of
    the test's own (the attempts and waits advance it), so a loaded machine cannot move
    the figures: with real sleeps this failed once with 30 ms to spare."""
    now = [100.0]
    monkeypatch.setattr(retry.time, "monotonic", lambda: now[0])
    calls: list[float] = []
    slept: list[float] = []

    def slow_then_fail() -> None:
        calls.append(now[0] - 100.0)
        now[0] += 0.1
        raise Transient()

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
    policy = Retry(transient=is_transient, deadline_s=0.25, wait=Exponential(0.04, 10.0), sleep=sleep)
    with pytest.raises(Transient):
        policy.call(slow_then_fail)
    # attempts at 0 and 0.14 (0.1 + a 0.04 wait); the next wait (0.08) is cut to end at
    # the deadline (0.25), where the last attempt starts; none after it
    assert calls == pytest.approx([0.0, 0.14, 0.25])
    assert slept == pytest.approx([0.04, 0.01])
    assert now[0] - 100.0 == pytest.approx(0.35)


def test_a_deadline_already_past_after_the_first_attempt_gives_up_without_waiting() -> None:
    slept: list[float] = []
    calls, fn = flaky(Transient(), "never")
    with pytest.raises(Transient):
        Retry(transient=is_transient, deadline_s=0.0, wait=Exponential(1.0, 1.0), sleep=slept.append).call(fn)
    assert len(calls) == 1 and slept == []


def test_a_deadline_function_is_read_at_each_call() -> None:
    limit = [0.0]
    policy = Retry(transient=is_transient, deadline_s=lambda: limit[0], wait=Exponential(0.01, 0.01))
    calls, fn = flaky(Transient(), "never")
    with pytest.raises(Transient):
        policy.call(fn)
    assert len(calls) == 1
    limit[0] = 5.0
    calls, fn = flaky(Transient(), Transient(), "ok")
    assert policy.call(fn) == "ok" and len(calls) == 3


def test_deadline_and_attempts_together_stop_at_whichever_comes_first() -> None:
    calls, fn = flaky(*[Transient()] * 10)
    with pytest.raises(Transient):
        Retry(transient=is_transient, deadline_s=5.0, attempts=4, sleep=lambda s: None).call(fn)
    assert len(calls) == 4


def test_before_sleep_is_told_the_failure_then_before_retry_runs_after_the_wait() -> None:
    events: list[tuple[str, object]] = []
    first, second = Transient("a"), Transient("b")
    calls, fn = flaky(first, second, "ok")

    def log_line(f: Failed) -> None:
        events.append(("log", (f.error, f.attempt, f.wait_s, f.args)))

    def sleep(s: float) -> None:
        events.append(("sleep", s))

    def prepare(f: Failed) -> None:
        events.append(("prepare", f.attempt))

    policy = Retry(transient=is_transient, attempts=5, wait=Delays((0.3, 0.7)), before_sleep=log_line,
                   before_retry=prepare, sleep=sleep)
    assert policy.call(fn, "GetAttr", 7) == "ok"
    assert events == [("log", (first, 1, 0.3, ("GetAttr", 7))), ("sleep", 0.3), ("prepare", 1),
                      ("log", (second, 2, 0.7, ("GetAttr", 7))), ("sleep", 0.7), ("prepare", 2)]


def test_no_hook_runs_when_giving_up() -> None:
    seen: list[int] = []
    _, fn = flaky(Transient(), Transient())
    with pytest.raises(Transient):
        Retry(transient=is_transient, attempts=2, sleep=lambda s: None, before_sleep=lambda f: seen.append(f.attempt),
              before_retry=lambda f: seen.append(-f.attempt)).call(fn)
    assert seen == [1, -1]


def test_what_before_retry_raises_is_raised_at_once_not_retried() -> None:
    """The writer's next block comes from the master: its ENOSPC must not be retried."""
    calls, fn = flaky(Transient(), "never")
    refused = Transient("no block")   # transient by type, but it comes from the hook

    def prepare(f: Failed) -> None:
        raise refused
    with pytest.raises(Transient) as got:
        Retry(transient=is_transient, attempts=5, sleep=lambda s: None, before_retry=prepare).call(fn)
    assert got.value is refused and len(calls) == 1


def test_real_sleeps_with_a_policy_shared_by_threads() -> None:
    policy = Retry(transient=is_transient, attempts=4, wait=Exponential(0.01, 0.02))
    results: list[object] = []

    def run(i: int) -> None:
        _, fn = flaky(Transient(), Transient(), i)
        results.append(policy.call(fn))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(8))   # type: ignore[type-var]
    assert time.monotonic() - start < 2.0


def test_exponential_doubles_up_to_its_cap_and_never_overflows() -> None:
    backoff = Exponential(0.2, 5.0)
    assert [backoff(n) for n in range(1, 8)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert backoff(100_000) == 5.0
    assert Exponential(0.05, 2.0, factor=3.0)(3) == pytest.approx(0.45)


def test_delays_take_turns_then_repeat_the_last() -> None:
    delays = Delays((0.2, 0.5, 1.0))
    assert [delays(n) for n in range(1, 6)] == [0.2, 0.5, 1.0, 1.0, 1.0]


def test_acall_retries_a_coroutine_with_awaited_waits_until_the_deadline() -> None:
    """The mount's master calls on its trio loop: the same policy, the waits awaited
    (the loop keeps serving meanwhile), the last error raised at the deadline."""
    import trio
    slept: list[float] = []

    async def asleep(seconds: float) -> None:
        slept.append(seconds)
        await trio.sleep(seconds)

    calls: list[int] = []

    async def answer_third(n: int) -> int:
        calls.append(n)
        if len(calls) < 3:
            raise Transient(len(calls))
        return n * 2

    async def never(n: int) -> int:
        raise Transient(n)

    policy = Retry(transient=is_transient, wait=Exponential(0.01, 0.04), deadline_s=0.2, async_sleep=asleep)

    async def main() -> None:
        assert await policy.acall(answer_third, 21) == 42
        assert calls == [21, 21, 21] and slept == [0.01, 0.02]
        t0 = time.monotonic()
        with pytest.raises(Transient):
            await policy.acall(never, 1)
        assert 0.18 < time.monotonic() - t0 < 0.5
        with pytest.raises(Fatal):   # not transient: at once
            await policy.acall(lambda: _raise(Fatal()))
    trio.run(main)


async def _raise(e: BaseException) -> None:
    raise e
