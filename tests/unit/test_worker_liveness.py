"""The master's worker liveness: a worker is lost after a timeout of silence during which
the master itself was running (a paused master must not lose every worker at its resume)."""
from __future__ import annotations

import pytest

from curvine_py.master import workers
from curvine_py.pb import curvine_pb2 as pb


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(workers.time, "monotonic", c)
    return c


def _registry(clock: Clock, timeout_s: float = 5.0) -> workers.Registry:
    reg = workers.Registry(timeout_s=timeout_s)
    for wid in (1, 2):
        reg.register(wid, pb.RegisterRequest(host=f"h{wid}", ip="127.0.0.1", rpc_port=1, data_port=2))
    return reg


def _run(reg: workers.Registry, clock: Clock, seconds: float, beating: tuple[int, ...] = ()) -> list[int]:
    """Advance in 1 s housekeeping ticks, the workers in beating heard at each."""
    lost: list[int] = []
    for _ in range(int(seconds)):
        clock.now += 1.0
        for wid in beating:
            reg.heartbeat(wid, [])
        lost += reg.check_liveness()
    return lost


@pytest.mark.parametrize("timeout_s", [2.0, 5.0, 30.0])
def test_a_silent_worker_is_lost_after_the_timeout_and_a_beating_one_is_not(clock: Clock,
                                                                             timeout_s: float) -> None:
    """Also with the tests' 2 s timeout, where ordinary 1 s ticks once looked like pauses."""
    reg = _registry(clock, timeout_s)
    assert _run(reg, clock, int(timeout_s), beating=(1,)) == []
    assert _run(reg, clock, 1, beating=(1,)) == [2]
    assert [w.worker_id for w in reg.live_workers()] == [1]


def test_a_master_paused_past_the_timeout_loses_no_worker_at_its_resume(clock: Clock) -> None:
    reg = _registry(clock)
    clock.now += 30.0                        # SIGSTOP for 30 s: no check ran, no beat was read
    assert reg.check_liveness() == []        # the first check after the resume
    reg.heartbeat(1, [])                     # the queued beats arrive; worker 2 is dead for real
    assert _run(reg, clock, 5, beating=(1,)) == []   # a whole timeout from the resume
    assert _run(reg, clock, 1, beating=(1,)) == [2]
    assert [w.worker_id for w in reg.live_workers()] == [1]


def test_late_ticks_are_not_a_pause(clock: Clock) -> None:
    """Housekeeping ticks that run a little late (1.1 s apart) with a 2 s timeout: the silent
    worker is still lost (a pause threshold of timeout/2 once took every tick for a pause)."""
    reg = _registry(clock, timeout_s=2.0)
    lost: list[int] = []
    for _ in range(3):
        clock.now += 1.1
        reg.heartbeat(1, [])
        lost += reg.check_liveness()
    assert lost == [2]
