"""Which master of a group a client or worker calls next (common/leader.py, docs/ha.md)."""
from __future__ import annotations

import threading

import pytest

from curvine_py.common.leader import Leader
from curvine_py.common.retry import Exponential, Retry

BACKOFF = Exponential(0.05, 2.0)


def group(text: str = "a:1,b:2,c:3") -> Leader:
    return Leader(text, BACKOFF)


def test_the_list_is_parsed_and_the_first_master_called_first() -> None:
    masters = group(" a:1, b:2 ,,a:1,c:3 ")
    assert masters.addresses == ("a:1", "b:2", "c:3") and masters.current() == "a:1"
    assert str(masters) == "a:1, b:2, c:3"
    assert Leader(["x:1", "y:2", "x:1"], BACKOFF).addresses == ("x:1", "y:2")
    with pytest.raises(ValueError):
        Leader(" , ", BACKOFF)


def test_a_named_leader_is_called_at_once() -> None:
    masters = group()
    assert masters.not_leader("a:1", "c:3") == "c:3" == masters.current()
    # from there, "no leader known" moves on along the list: c is the last, a comes next
    assert masters.not_leader("c:3", "") == "a:1"


def test_no_leader_known_or_no_answer_tries_the_next_master() -> None:
    masters = group()
    assert masters.not_leader("a:1", "") == "b:2"
    assert masters.unreachable("b:2") == "c:3"
    assert masters.unreachable("c:3") == "a:1"        # round and round
    assert masters.not_leader("a:1", "a:1") == "b:2"   # a follower naming itself: ignored


def test_a_hint_outside_the_list_is_followed_then_the_list_resumes() -> None:
    """The configured list may be stale: the leader a follower names is called even if it
    is not listed; if it does not answer, the master after the one that named it is next."""
    masters = group()
    masters.unreachable("a:1")                          # at b
    assert masters.not_leader("b:2", "d:4") == "d:4" == masters.current()
    assert masters.addresses == ("a:1", "b:2", "c:3")   # the list itself is not changed
    assert masters.unreachable("d:4") == "c:3"


def test_a_stale_report_changes_nothing() -> None:
    """Threads failing on the same dead master move the choice once, not once each."""
    masters = group()
    assert masters.unreachable("a:1") == "b:2"
    assert masters.unreachable("a:1") == "b:2"
    assert masters.not_leader("a:1", "c:3") == "b:2"
    assert masters.current() == "b:2"


def test_concurrent_reports_of_one_failure_move_once() -> None:
    masters = group()
    start = threading.Barrier(8)
    seen: list[str] = []

    def report() -> None:
        start.wait()
        seen.append(masters.unreachable("a:1"))
    threads = [threading.Thread(target=report) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == ["b:2"] * 8 and masters.current() == "b:2"


def test_one_master_stays_that_master_and_waits_after_every_failure() -> None:
    masters = Leader("127.0.0.1:8995", BACKOFF)
    assert masters.unreachable("127.0.0.1:8995") == "127.0.0.1:8995"
    assert masters.not_leader("127.0.0.1:8995", "") == "127.0.0.1:8995"
    assert [masters.wait(n) for n in (1, 2, 3)] == [BACKOFF(1), BACKOFF(2), BACKOFF(3)]
    assert all(masters.round_over(n) for n in range(1, 5))
    # a follower configured alone may still name the leader: it is called, and left on failure
    assert masters.not_leader("127.0.0.1:8995", "10.0.0.2:8995") == "10.0.0.2:8995"
    assert masters.unreachable("10.0.0.2:8995") == "127.0.0.1:8995"


def test_waits_come_only_at_the_end_of_a_round() -> None:
    masters = group()
    waits = [masters.wait(n) for n in range(1, 10)]
    assert waits == [0, 0, BACKOFF(1), 0, 0, BACKOFF(2), 0, 0, BACKOFF(3)]
    assert [masters.round_over(n) for n in range(1, 7)] == [False, False, True, False, False, True]


def test_as_a_retry_wait_the_next_master_is_tried_at_once() -> None:
    """The clients' Retry takes Leader.wait as its wait: a call that fails on two masters
    and is answered by the third slept not at all; a round of failures slept once."""
    masters = group()
    slept: list[float] = []
    tried: list[str] = []

    def attempt(answer_at: str) -> str:
        at = masters.current()
        tried.append(at)
        if at != answer_at:
            masters.unreachable(at)
            raise ConnectionError(at)
        return at

    retry = Retry(transient=lambda e: isinstance(e, ConnectionError), wait=masters.wait, sleep=slept.append,
                  attempts=7)
    assert retry.call(attempt, "c:3") == "c:3" and tried == ["a:1", "b:2", "c:3"] and slept == []
    tried.clear()
    with pytest.raises(ConnectionError):
        retry.call(attempt, "nowhere")
    assert tried == ["c:3", "a:1", "b:2", "c:3", "a:1", "b:2", "c:3"]
    assert slept == [BACKOFF(1), BACKOFF(2)]
