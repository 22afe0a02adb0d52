"""A Lookup's leased listing in the mount's cache (client/metacache.py, issue 39 section 2):
what a listing answers, when a lookup asks for one, and the hold-off that keeps a
directory another mount keeps changing from being listed again on every miss.

The mounts' side of it is tests/posix/test_posix_dirlisting.py.
"""
from __future__ import annotations

import time
import typing

import pytest

from curvine_py.client import metrics
from curvine_py.client.metacache import (
    LISTED_BLOCKS_MAX, LISTED_BLOCKS_S, LISTING, LISTING_MAX, NEGATIVE, RELIST_MAX_S, MetaCache,
)
from curvine_py.client.metaclient import Identity
from curvine_py.pb import curvine_pb2 as pb

ROOT = Identity(0, 0)
LEASE = 0.3
D = pb.Attr(ino=10, mode=0o040755)


def cache() -> MetaCache:
    c = MetaCache()
    c.begin(5, time.monotonic() + LEASE)
    return c


def entries(n: int) -> list[pb.DirEntry]:
    return [pb.DirEntry(name=f"f{i}", attr=pb.Attr(ino=100 + i, mode=0o100644, size=i)) for i in range(n)]


def listed(c: MetaCache, seq: int, listing: list[pb.DirEntry], name: str = "f0") -> None:
    """A Lookup of name in D answered with D's listing (lease_seq seq)."""
    found = [e.attr for e in listing if e.name == name]
    c.granted(5, seq, found, (D.ino, name, found[0].ino if found else 0), D, listing=listing)


def push(c: MetaCache, seq: int, *keys: tuple[int, str]) -> None:
    c.invalidate(pb.Invalidation(seq=seq, keys=[pb.CacheKey(ino=i, name=n, entry=True) for i, n in keys]))


def test_a_listing_answers_every_name_and_every_missing_one() -> None:
    c = cache()
    assert c.listing_max(D.ino) == LISTING_MAX
    listed(c, 1, entries(32))
    for i in range(32):
        hit = c.lookup(D.ino, f"f{i}", ROOT)
        assert isinstance(hit, pb.Attr) and hit.ino == 100 + i and hit.size == i
    assert c.lookup(D.ino, "f32", ROOT) is NEGATIVE
    assert c.lookup(D.ino, "f0", Identity(1000, 1000, ())) is not None   # o+x: anyone may search
    assert c.listing_max(D.ino) == 0          # complete: nothing to ask for
    c.end()
    assert c.lookup(D.ino, "f0", ROOT) is None


def test_an_empty_directory_listed_answers_every_name_missing() -> None:
    c = cache()
    listed(c, 1, [], name="x")
    assert c.lookup(D.ino, "x", ROOT) is NEGATIVE and c.lookup(D.ino, "y", ROOT) is NEGATIVE


def test_a_push_takes_the_listing_and_no_listing_is_asked_for_a_lease() -> None:
    c = cache()
    listed(c, 1, entries(4))
    push(c, 1, (D.ino, LISTING))              # another mount made a name there
    assert c.lookup(D.ino, "new", ROOT) is None          # ask the master
    assert isinstance(c.lookup(D.ino, "f1", ROOT), pb.Attr)   # the names keep their own leases
    assert c.listing_max(D.ino) == 0          # churn: the single-name Lookup for now
    time.sleep(LEASE * 1.1)
    c.renewed(time.monotonic() + 10)
    assert c.listing_max(D.ino) == LISTING_MAX


def test_listings_lost_soon_after_each_grant_wait_twice_as_long_each_time() -> None:
    c = cache()
    holds = []
    for seq in range(1, 5):
        listed(c, seq, entries(2))
        push(c, seq, (D.ino, LISTING))
        holds.append(c._unlisted[D.ino] - time.monotonic())
    assert holds[0] < LEASE * 1.1
    for a, b in zip(holds, holds[1:]):
        assert b > a * 1.8
    assert max(holds) <= RELIST_MAX_S


def test_a_refused_listing_is_not_complete_and_is_held_off() -> None:
    c = cache()
    push(c, 3, (D.ino, "f1"))                 # handled before the reply (made at push count 2) came
    listed(c, 3, entries(4))
    assert c.lookup(D.ino, "missing", ROOT) is None and c.lookup(D.ino, "f0", ROOT) is None
    assert c.listing_max(D.ino) == 0
    listed(c, 4, entries(4))                  # a later one is kept
    assert c.lookup(D.ino, "missing", ROOT) is NEGATIVE


def test_a_directory_too_large_to_list_is_not_asked_again_for_a_while() -> None:
    c = cache()
    assert c.listing_max(D.ino) == LISTING_MAX
    c.unlisted(D.ino, refused=False)
    assert c.listing_max(D.ino) == 0
    assert RELIST_MAX_S - 1 < c._unlisted[D.ino] - time.monotonic() <= RELIST_MAX_S
    assert c.listing_max(11) == LISTING_MAX   # another directory is asked for


def test_a_miss_the_listing_answered_is_told_apart_from_a_leased_one() -> None:
    """The kernel may keep a negative entry only for a name whose own lease a push ends."""
    c = cache()
    listed(c, 1, entries(2), name="asked")
    assert c.lookup(D.ino, "asked", ROOT) is NEGATIVE and not c.listed_miss(D.ino, "asked")
    assert c.lookup(D.ino, "other", ROOT) is NEGATIVE and c.listed_miss(D.ino, "other")
    assert not c.listed_miss(D.ino, "f0")


def test_each_name_of_a_listing_is_first_seen_once() -> None:
    """A mount that fetches one-block files ahead asks the master at a name's first lookup."""
    c = cache()
    listed(c, 1, entries(3))
    assert c.first_from_listing(D.ino, "f1") and not c.first_from_listing(D.ino, "f1")
    assert not c.first_from_listing(D.ino, "f0")   # the lookup that brought the listing
    assert not c.first_from_listing(D.ino, "missing") and not c.first_from_listing(11, "f1")
    listed(c, 2, entries(3))                  # listed again: seen afresh
    assert c.first_from_listing(D.ino, "f1")


def listed_with_blocks(c: MetaCache, seq: int, listing: list[pb.DirEntry], who: Identity = ROOT) -> None:
    """D's listing from a master that puts one-block files' blocks in it (listing_blocks)."""
    found = [e.attr for e in listing if e.name == "f0"]
    c.granted(5, seq, found, (D.ino, "f0", found[0].ino), D, listing=listing, listed_for=who)


def test_a_listings_blocks_answer_each_names_first_lookup() -> None:
    """A master that lists one-block files' blocks (AttrReply.listing_blocks): a name's first
    lookup takes its block from there, unless another caller looks it up (the tokens are
    the lister's), its attributes changed since, or the listing is LISTED_BLOCKS_S old."""
    c = cache()
    listing = entries(6)
    for i, e in enumerate(listing[:5]):
        e.blocks.add(block_id=1000 + i, length=i, token=f"t{i}")
    listed_with_blocks(c, 1, listing)

    def first(name: str, who: Identity = ROOT) -> bool | typing.Sequence[pb.BlockInfo]:
        hit = c.lookup(D.ino, name, ROOT)
        assert isinstance(hit, pb.Attr)
        return c.first_from_listing(D.ino, name, hit, who)

    got = first("f1")
    assert not isinstance(got, bool) and [(b.block_id, b.token) for b in got] == [(1001, "t1")]
    assert first("f1") is False                          # counted once
    assert first("f5") == ()                             # listed with none: nothing to check
    assert first("f2", Identity(4242, 4242)) is True     # another caller: the master mints its tokens
    c.granted(5, 2, [pb.Attr(ino=103, mode=0o100644, size=7)])   # f3's attributes anew (a GetAttr, say)
    assert first("f3") is True
    blocks = c._listed_blocks[D.ino]
    c._listed_blocks[D.ino] = blocks._replace(at=blocks.at - LISTED_BLOCKS_S - 1)
    assert first("f4") is True                           # old replicas and tokens: asked again
    listed(c, 3, entries(3))                             # an older master's listing: no blocks
    assert first("f1") is True


def test_listings_blocks_are_kept_for_the_latest_directories_only() -> None:
    c = cache()
    for d in range(LISTED_BLOCKS_MAX + 2):
        e = pb.DirEntry(name="f0", attr=pb.Attr(ino=1000 + d, mode=0o100644, size=1))
        e.blocks.add(block_id=d, length=1)
        parent = pb.Attr(ino=20 + d, mode=0o040755)
        c.granted(5, 1, [e.attr], (parent.ino, "f0", e.attr.ino), parent, listing=[e], listed_for=ROOT)
    assert len(c._listed_blocks) == LISTED_BLOCKS_MAX and 20 not in c._listed_blocks


def listing_counts() -> dict[str, float]:
    """curvine_client_metadata_cache_listings_total by outcome, as a scrape would read it."""
    return {o: metrics.LISTINGS.labels(o)._value.get() for o in metrics.LISTING_OUTCOMES}


def test_each_listings_outcome_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """listed, lost (a push took it), too_large and refused (the master gave none), stale
    (given, but a push had undid it): one each; nothing in a mount without metrics."""
    monkeypatch.setattr(metrics, "on", True)
    before = listing_counts()
    c = cache()
    listed(c, 1, entries(4))
    push(c, 1, (D.ino, LISTING))              # another mount's change takes it
    push(c, 3, (D.ino, "f1"))                 # handled before the next reply (lease_seq 3) came
    listed(c, 3, entries(4))
    c.unlisted(11, refused=False)
    c.unlisted(12, refused=True)
    after = listing_counts()
    assert {o: after[o] - before[o] for o in after} == dict.fromkeys(metrics.LISTING_OUTCOMES, 1)
    monkeypatch.setattr(metrics, "on", False)
    listed(cache(), 1, entries(4))
    assert listing_counts() == after
