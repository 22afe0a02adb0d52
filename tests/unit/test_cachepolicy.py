"""Cache policies (pin, ttl, tier xattrs) and the evict op, on a real namespace + journal."""
from __future__ import annotations

import errno
from pathlib import Path
from typing import Iterator

import pytest

from curvine_py.common.errors import CurvineError
from curvine_py.common.types import ROOT_INO
from curvine_py.master import schema
from curvine_py.master.cachepolicy import PIN, TIER, TTL, Policies, parse_ttl
from curvine_py.master.posix import Cred
from curvine_py.master.records import (
    Allocate, Commit, CommitBlock, Evict, LastRead, Link, RecordReads, Setxattr, Victim,
)

from tests.unit.test_namespace import NS, errno_of


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NS]:
    n = NS(tmp_path)
    yield n
    n.journal.stop()


def _file(ns: NS, parent: int, name: str, size: int = 10) -> int:
    r = ns.create(parent, name)
    ino = r["attr"].ino
    alloc = ns.do(Allocate, ino=ino, lease_id=r["lease_id"], count=1)
    bid = alloc["block_ids"][0]
    ns.do(Commit, ino=ino, lease_id=r["lease_id"], size=size, release=True,
          blocks=[CommitBlock(bid, 0, size, 1)])
    return ino


def test_parse_ttl() -> None:
    assert parse_ttl("7d") == 7 * 86400
    assert parse_ttl("90") == 90
    assert parse_ttl(" 2h ") == 7200
    assert parse_ttl("1w") == 7 * 86400
    for bad in ("", "0", "-5", "7x", "d", "1.5h"):
        with pytest.raises(CurvineError) as e:
            parse_ttl(bad)
        assert e.value.errno == errno.EINVAL


def test_policy_xattrs_are_validated_and_normalised(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "d")
    ns.do(Setxattr, ino=d, name=TTL, value=b"2h")
    ns.do(Setxattr, ino=d, name=TIER, value=b"SSD")
    ns.do(Setxattr, ino=d, name=PIN, value=b"true")
    assert ns.ns.getxattr(Cred(0, 0, frozenset()), d, TTL) == b"7200"
    assert ns.ns.getxattr(Cred(0, 0, frozenset()), d, PIN) == b"1"
    assert errno_of(lambda: ns.do(Setxattr, ino=d, name=TTL, value=b"soon")) == errno.EINVAL
    assert errno_of(lambda: ns.do(Setxattr, ino=d, name=TIER, value=b"tape")) == errno.EINVAL
    assert errno_of(lambda: ns.do(Setxattr, ino=d, name=PIN, value=b"maybe")) == errno.EINVAL


def test_effective_policies_inherit(ns: NS) -> None:
    a = ns.mkdir(ROOT_INO, "a")
    b = ns.mkdir(a, "b")
    f = _file(ns, b, "f")
    g = _file(ns, ROOT_INO, "g")
    ns.do(Setxattr, ino=a, name=TTL, value=b"100")
    ns.do(Setxattr, ino=b, name=TIER, value=b"mem")
    ns.do(Setxattr, ino=a, name=PIN, value=b"1")
    p = Policies(ns.ns.conn)
    assert p.pinned(f) and not p.pinned(g)
    assert p.ttl_s(f) == 100 and p.ttl_s(g) is None
    assert p.tier(f) == "MEM" and p.tier(g) == ""
    ns.do(Link, ino=g, new_parent=b, new_name="g2")   # a name under a pinned tree pins the file
    assert Policies(ns.ns.conn).pinned(g)


def test_evict_removes_every_name_and_rechecks(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "d")
    f = _file(ns, d, "f")
    ns.do(Link, ino=f, new_parent=ROOT_INO, new_name="f2")
    gen = ns.ns.inode(f).generation
    stale = ns.do(Evict, victims=[Victim(f, gen - 1)])          # rewritten since the decision: kept
    assert stale["evicted"] == [] and ns.lookup(d, "f").ino == f
    r = ns.do(Evict, victims=[Victim(f, gen)])
    assert r["evicted"] == [f] and r["bytes"] == 10 and len(r["freed"]) == 1
    assert errno_of(lambda: ns.lookup(d, "f")) == errno.ENOENT
    assert errno_of(lambda: ns.lookup(ROOT_INO, "f2")) == errno.ENOENT


def test_evict_spares_pinned_and_open_files(ns: NS) -> None:
    p = _file(ns, ROOT_INO, "p")
    ns.do(Setxattr, ino=p, name=PIN, value=b"1")
    w = ns.create(ROOT_INO, "w")["attr"].ino        # open for writing (lease held)
    r = ns.do(Evict, victims=[Victim(p, ns.ns.inode(p).generation), Victim(w, ns.ns.inode(w).generation)])
    assert r["evicted"] == []
    ns.do(RecordReads, reads=[LastRead(p, 1_800_000_000_123_456_789), LastRead(999999, 5)])
    assert [tuple(r) for r in ns.ns.conn.execute("SELECT ino, last_read_ms FROM inodes WHERE last_read_ms != ?",
                                                 (schema.NEVER_READ_MS,))] == [(p, 1_800_000_000_123)]
    ns.do(RecordReads, reads=[LastRead(p, 1_700_000_000_000_000_000)])   # an older read (another flush): kept
    assert ns.ns.conn.execute("SELECT last_read_ms FROM inodes WHERE ino=?", (p,)).fetchone()[0] == 1_800_000_000_123
