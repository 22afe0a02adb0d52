"""The master's cache sessions (master/sessions.py) and the mount's cache (client/
metacache.py): who may cache what, what each change pushes, what a writer waits for.

The integration side (real mounts, a restarted master) is tests/posix/test_posix_metacache.py.
"""
from __future__ import annotations

import threading
import time

from curvine_py.client.metacache import NEGATIVE, MetaCache
from curvine_py.client.metaclient import Identity
from curvine_py.master.sessions import Sessions
from curvine_py.pb import curvine_pb2 as pb

LEASE = 0.3
ROOT = Identity(0, 0)


class Stream:
    """A session's stream as the master sees it: the pushes it was sent."""

    def __init__(self, ok: bool = True) -> None:
        self.pushes: list[pb.Invalidation] = []
        self.ok = ok

    def __call__(self, push: pb.Invalidation) -> bool:
        self.pushes.append(push)
        return self.ok


def table(lease: float = LEASE) -> Sessions:
    s = Sessions(lease)
    s._grace_until = 0.0   # (a started master's first lease: tested on its own below)
    return s


def test_a_change_pushes_to_the_holders_and_the_writer_waits_for_their_ack() -> None:
    s = table()
    a, b = Stream(), Stream()
    sa, sb = s.open(0, a).session, s.open(0, b).session
    epoch = s.epoch()
    assert s.grant(sa, [(1, "x"), (7, None)], epoch) == 1
    assert s.grant(sb, [(1, "x")], epoch) == 1
    barrier = s.changed([(1, "x"), (1, None)])
    assert [list(p.keys) for p in a.pushes] == [[pb.CacheKey(ino=1, name="x", entry=True)]]
    assert len(b.pushes) == 1 and b.pushes[0].seq == 1
    acked = threading.Timer(0.1, lambda: s.beat(sb, 1))
    acked.start()
    start = time.monotonic()
    assert s.wait(barrier, sa) == 1     # a's own push: its number, not waited for here
    assert 0.08 < time.monotonic() - start < LEASE   # b's ack, not b's lease
    # forgotten: the next change pushes nobody
    assert s.changed([(1, "x")]).seqs == {}


def test_a_read_older_than_a_change_is_not_granted() -> None:
    """A reply computed before a commit, registered after the commit's push went out,
    would be cached and never invalidated: its epoch says it is older."""
    s = table()
    sid = s.open(0, Stream()).session
    before = s.epoch()
    s.changed([(1, "x")])
    assert s.grant(sid, [(1, "x")], before) == 0
    assert s.grant(sid, [(1, "y")], before) == 1      # another key: fine
    assert s.grant(sid, [(1, "x")], s.epoch()) == 1   # read after the change: fine


def test_a_silent_session_costs_a_writer_one_lease_and_then_ends() -> None:
    s = table()
    quiet = Stream()
    sid = s.open(0, quiet).session
    s.grant(sid, [(1, "x")], s.epoch())
    start = time.monotonic()
    s.wait(s.changed([(1, "x")]), 0)
    assert LEASE * 0.8 < time.monotonic() - start < LEASE * 3
    assert s.count() == 0 and not s.beat(sid, 1)   # over: a late beat is refused (the mount starts again)


def test_a_broken_stream_is_waited_out_and_no_longer_granted() -> None:
    s = table()
    sid = s.open(0, Stream(ok=False)).session
    s.grant(sid, [(1, "x")], s.epoch())
    barrier = s.changed([(1, "x")])          # the push fails: the stream is marked gone
    assert s.grant(sid, [(2, "y")], s.epoch()) == 0
    start = time.monotonic()
    s.wait(barrier, 0)
    assert time.monotonic() - start > LEASE * 0.8


def test_a_new_term_forgets_every_session_and_waits_out_their_leases() -> None:
    term = [1]
    s = Sessions(LEASE, lambda: term[0])
    s._grace_until = 0.0
    sid = s.open(0, Stream()).session
    term[0] = 2
    start = time.monotonic()
    s.wait_grace()
    assert time.monotonic() - start > LEASE * 0.8
    assert not s.beat(sid, 0)


def test_the_mount_keeps_a_grant_only_when_no_later_push_was_handled() -> None:
    c = MetaCache()
    c.begin(5, time.monotonic() + 10)
    d = pb.Attr(ino=1, mode=0o040700, uid=0)
    f = pb.Attr(ino=7, mode=0o100644, size=3)
    c.granted(5, 1, (f,), (1, "x", 7), d)
    assert c.lookup(1, "x", ROOT) == f
    assert c.lookup(1, "x", Identity(1000, 1000)) is None   # no search permission: ask the master
    c.granted(5, 1, (), (1, "gone", 0), d)
    assert c.lookup(1, "gone", ROOT) is NEGATIVE
    c.invalidate(pb.Invalidation(seq=1, keys=[pb.CacheKey(ino=1, name="x", entry=True)]))
    assert c.lookup(1, "x", ROOT) is None
    c.granted(5, 1, (f,), (1, "x", 7), d)          # made before push 1: may be what it undid
    assert c.lookup(1, "x", ROOT) is None
    c.granted(4, 9, (f,), (1, "x", 7), d)          # another (old) session's
    assert c.lookup(1, "x", ROOT) is None
    c.granted(5, 2, (f,), (1, "x", 7), d)
    assert c.lookup(1, "x", ROOT) == f


def test_a_mutation_brings_its_own_invalidation_in_its_reply() -> None:
    """The caller's own session is numbered the change but not pushed it (no wake-up, no
    ack on the mutation's path): the reply carries the keys, and the mount forgets them
    before the mutation returns; a grant made before that number is then refused."""
    s = table()
    mine, other = Stream(), Stream()
    sm = s.open(0, mine, client_id="mount-a").session
    so = s.open(0, other, client_id="mount-b").session
    for sid in (sm, so):
        s.grant(sid, [(1, "x")], s.epoch())
    barrier = s.changed([(1, "x")], own_client="mount-a")
    assert mine.pushes == [] and len(other.pushes) == 1
    assert barrier.own_seq(sm) == 1 and barrier.keys[sm] == [(1, "x")]
    s.beat(so, 1)
    assert s.wait(barrier, sm) == 1

    c = MetaCache()
    c.begin(sm, time.monotonic() + 10)
    d = pb.Attr(ino=1, mode=0o040755)
    c.granted(sm, 1, (pb.Attr(ino=7),), (1, "x", 7), d)
    c.own_change(sm, 1, [pb.CacheKey(ino=1, name="x", entry=True)])
    assert c.lookup(1, "x", ROOT) is None and c.handled == 1
    c.granted(sm, 1, (pb.Attr(ino=7),), (1, "x", 7), d)   # a read from before the change
    assert c.lookup(1, "x", ROOT) is None
    c.own_change(sm + 1, 2, [pb.CacheKey(ino=1, name="y", entry=True)])   # an old session's reply: ignored
    assert c.handled == 1


def test_nothing_is_served_once_the_lease_ran_out() -> None:
    c = MetaCache()
    c.begin(5, time.monotonic() + 0.05)
    c.granted(5, 1, (pb.Attr(ino=7),))
    assert c.attr(7) is not None
    time.sleep(0.06)
    assert c.attr(7) is None
    c.renewed(time.monotonic() + 1)
    assert c.attr(7) is not None


def test_a_listing_answers_missing_names_until_a_push_or_an_eviction_takes_it() -> None:
    c = MetaCache(max_entries=3)
    c.begin(5, time.monotonic() + 10)
    d = pb.Attr(ino=10, mode=0o040755)
    listing = pb.CacheKey(ino=10, name="/", entry=True)
    c.granted(5, 1, (d,), (1, "d", 10), d, [listing])        # made here: empty, listed whole
    assert c.lookup(10, "any", ROOT) is NEGATIVE
    c.invalidate(pb.Invalidation(seq=1, keys=[listing]))     # a name changed in it
    assert c.lookup(10, "any", ROOT) is None
    c.granted(5, 2, (pb.Attr(ino=11),), (10, "own", 11), keys=[listing])   # our change: given back
    assert c.lookup(10, "any", ROOT) is NEGATIVE and c.lookup(10, "own", ROOT).ino == 11
    c.granted(5, 2, (), keys=[pb.CacheKey(ino=99, name="/", entry=True)])  # never listed here: not taken
    assert c.lookup(99, "any", ROOT) is None
    for i in range(3):                                        # its names evicted: no longer whole
        c.granted(5, 2, (pb.Attr(ino=20 + i),), (30, f"n{i}", 20 + i))
    assert c.lookup(10, "any", ROOT) is None


def test_keys_a_mount_evicted_are_no_longer_pushed_to_it() -> None:
    """The mount's cache is bounded: what it drops on its own it names in its next beat,
    and the master's table of holders shrinks with it."""
    c = MetaCache(max_entries=1)
    c.begin(5, time.monotonic() + 10)
    c.granted(5, 1, (pb.Attr(ino=7), pb.Attr(ino=8)))
    assert c.forgotten() == [pb.CacheKey(ino=7)] and c.forgotten() == []

    s = table()
    sid = s.open(0, Stream()).session
    s.grant(sid, [(7, None), (1, "x")], s.epoch())
    assert s.beat(sid, 0, [(7, None)])
    assert s.changed([(7, None)]).seqs == {}
    assert s.changed([(1, "x")]).seqs == {sid: 1}


def test_pushes_and_replies_in_any_order_keep_the_listing_whole() -> None:
    """A create's own invalidation (in its reply, number 2) handled after a push of an
    unrelated key (number 3, on the stream): the create's grant (number 3) holds none of
    the keys push 3 took, so it is kept, the new name with it.  A grant refused for its
    name never lets the listing come back without that name."""
    c = MetaCache()
    c.begin(5, time.monotonic() + 10)
    d = pb.Attr(ino=10, mode=0o040755)
    listing = pb.CacheKey(ino=10, name="/", entry=True)
    c.granted(5, 1, (d,), (1, "d", 10), d, [listing])
    c.invalidate(pb.Invalidation(seq=3, keys=[pb.CacheKey(ino=77)]))          # another file's attributes
    c.own_change(5, 2, [listing, pb.CacheKey(ino=10, name="new", entry=True)])
    c.granted(5, 3, (pb.Attr(ino=11),), (10, "new", 11), keys=[listing])
    assert c.lookup(10, "new", ROOT).ino == 11 and c.lookup(10, "other", ROOT) is NEGATIVE

    c.own_change(5, 4, [listing])
    c.invalidate(pb.Invalidation(seq=5, keys=[pb.CacheKey(ino=10, name="late", entry=True)]))
    c.granted(5, 5, (pb.Attr(ino=12),), (10, "late", 12), keys=[listing])   # refused: push 5 took its name
    c.granted(5, 6, (pb.Attr(ino=13),), (10, "next", 13), keys=[listing])   # the listing stays lost
    assert c.lookup(10, "late", ROOT) is None and c.lookup(10, "other", ROOT) is None
