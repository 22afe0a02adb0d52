"""The placement ring: distinct hosts, stability under membership change, spread."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from curvine_py.common.hashring import HashRing, RingNode


def ring(n: int, hosts: int | None = None, vnodes: int = 64) -> HashRing:
    return HashRing([RingNode(i, f"h{i % (hosts or n)}") for i in range(1, n + 1)], vnodes)


@given(st.integers(min_value=0, max_value=2**63))
@settings(max_examples=200)
def test_replicas_on_distinct_hosts(block: int) -> None:
    r = ring(6, hosts=3)
    placed = r.place_block(block, 2)
    assert len(placed) == 2
    assert len({r.nodes[w].host for w in placed}) == 2


def test_fewer_hosts_than_replicas() -> None:
    r = ring(3, hosts=1)
    assert len(r.place_block(42, 2)) == 1
    assert HashRing([], 8).place_block(1, 2) == []


def test_adding_a_worker_moves_only_its_share() -> None:
    before, after = ring(4), ring(5)
    moved = sum(before.place_block(b, 1) != after.place_block(b, 1) for b in range(20000))
    # the new worker should take about 1/5 of the primaries; nothing else moves
    assert 0.10 < moved / 20000 < 0.30
    for b in range(20000):
        new = after.place_block(b, 1)[0]
        assert new == 5 or new == before.place_block(b, 1)[0]


def test_removing_a_worker_moves_only_its_blocks() -> None:
    before = ring(5)
    after = HashRing([n for n in before.nodes.values() if n.worker_id != 3], 64)
    for b in range(5000):
        old = before.place_block(b, 1)[0]
        if old != 3:
            assert after.place_block(b, 1)[0] == old


def test_spread_is_even_enough() -> None:
    r = ring(4)   # once: built inside the generator it was built 40,000 times (11 s)
    counts = Counter(r.place_block(b, 1)[0] for b in range(40000))
    assert max(counts.values()) / min(counts.values()) < 1.6


def test_exclude_skips_workers() -> None:
    r = ring(4)
    for b in range(100):
        assert 2 not in r.place_block(b, 2, frozenset({2}))


@given(st.integers(min_value=0, max_value=2**63))
@settings(max_examples=200)
def test_a_preferred_host_gets_the_first_replica_and_the_ring_the_rest(block: int) -> None:
    r = ring(6, hosts=3)                     # h0: workers 3, 6; h1: 1, 4; h2: 2, 5
    placed = r.place_block(block, 2, prefer_host="h1")
    assert r.nodes[placed[0]].host == "h1" and len(placed) == 2
    assert r.nodes[placed[1]].host != "h1"
    # the second replica is the ring's first choice off that host
    assert placed[1] == next(w for w in r.place_block(block, 6) if r.nodes[w].host != "h1")
    assert placed[0] in (1, 4)


def test_a_preferred_host_that_is_excluded_or_unknown_changes_nothing() -> None:
    r = ring(6, hosts=3)
    for b in range(200):
        plain = r.place_block(b, 2)
        assert r.place_block(b, 2, prefer_host="nowhere") == plain
        off = r.place_block(b, 2, frozenset({1, 4}), prefer_host="h1")
        assert off == r.place_block(b, 2, frozenset({1, 4}))
        assert r.place_block(b, 1, prefer_host="h2")[0] in (2, 5)
