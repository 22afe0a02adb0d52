"""A commit's holes and an inode's allocated bytes, on the master's namespace (issue 41;
docs/posix.md "Space"): a slot in CommitRequest.holes loses its block, which the commit
returns as freed (the workers delete it), and inodes.allocated, kept by triggers on the
blocks table, is the sum of the file's block lengths through commits, holes, truncation
and unlink -- and a store made before the column gets it summed at upgrade."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from curvine_py.common.types import ROOT_INO, SETATTR_SIZE
from curvine_py.master import schema
from curvine_py.master.records import Allocate, Commit, CommitBlock, OpenWrite, Setattr, Unlink
from curvine_py.master.service import to_attr
from tests.unit.test_namespace import NS

BS = 4 << 20


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NS]:
    n = NS(tmp_path)
    yield n
    n.journal.stop()


def summed(ns: NS, ino: int) -> int:
    """What allocated must be: the file's block lengths, summed from the blocks table."""
    return sum(b.length for b in ns.ns.blocks(ino))


def three_blocks(ns: NS, name: str) -> tuple[int, int, list[int]]:
    """A file of blocks BS, BS, 100 (committed, lease kept): ino, lease, block ids."""
    r = ns.create(ROOT_INO, name)
    ino, lease = r["attr"].ino, r["lease_id"]
    ids = ns.do(Allocate, ino=ino, lease_id=lease, count=3)["block_ids"]
    ns.do(Commit, ino=ino, lease_id=lease, size=2 * BS + 100,
          blocks=[CommitBlock(ids[0], 0, BS, 1), CommitBlock(ids[1], BS, BS, 2), CommitBlock(ids[2], 2 * BS, 100, 3)])
    return ino, lease, ids


def test_holes_empty_their_slots_and_free_the_blocks(ns: NS) -> None:
    ino, lease, ids = three_blocks(ns, "f")
    assert ns.ns.inode(ino).allocated == 2 * BS + 100
    out = ns.do(Commit, ino=ino, lease_id=lease, size=2 * BS + 100, holes=(1, 7))   # 7: a hole already
    assert out["freed"] == [ids[1]]
    assert [b.idx for b in ns.ns.blocks(ino)] == [0, 2]
    assert to_attr(out["attr"]).allocated == BS + 100 == summed(ns, ino)
    assert out["attr"].size == 2 * BS + 100                    # the size stays
    # a block and a hole for one slot: the block is installed, then the slot emptied
    more = ns.do(Allocate, ino=ino, lease_id=lease, count=1)["block_ids"]
    out = ns.do(Commit, ino=ino, lease_id=lease, size=2 * BS + 100, blocks=[CommitBlock(more[0], 0, BS, 4)],
                holes=(0,), release=True)
    assert sorted(out["freed"]) == sorted([ids[0], more[0]])
    assert ns.ns.inode(ino).allocated == 100 == summed(ns, ino)
    assert ns.lookup(ROOT_INO, "f").allocated == 100          # a lookup's row carries it too


def test_allocated_follows_truncation_rewrite_and_unlink(ns: NS) -> None:
    ino, lease, ids = three_blocks(ns, "g")
    again = ns.do(Allocate, ino=ino, lease_id=lease, count=1)["block_ids"]
    ns.do(Commit, ino=ino, lease_id=lease, size=2 * BS + 100, blocks=[CommitBlock(again[0], 2 * BS, 50, 5)],
          release=True)                                          # a slot's block replaced by a shorter one
    assert ns.ns.inode(ino).allocated == 2 * BS + 50 == summed(ns, ino)
    ns.do(Setattr, ino=ino, valid=SETATTR_SIZE, size=BS + 10)     # cut inside block 1
    assert ns.ns.inode(ino).allocated == BS + 10 == summed(ns, ino)
    ns.do(Setattr, ino=ino, valid=SETATTR_SIZE, size=1 << 31)     # a truncate up holds nothing more
    assert ns.ns.inode(ino).allocated == BS + 10
    w = ns.do(OpenWrite, ino=ino, lease_ms=60000, flags=0)
    ns.do(Commit, ino=ino, lease_id=w["lease_id"], size=1 << 31, holes=(0, 1), release=True)
    assert ns.ns.inode(ino).allocated == 0
    ns.do(Unlink, parent=ROOT_INO, name="g")
    assert ns.ns.conn.execute("SELECT count(*) FROM blocks WHERE ino=?", (ino,)).fetchone()[0] == 0


def test_a_store_from_before_the_column_gets_it_summed(ns: NS) -> None:
    ino, _, _ = three_blocks(ns, "h")
    ns.journal.stop()
    conn = schema.open_db(ns.path)
    for name in schema.ALLOCATED_TRIGGERS:
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("ALTER TABLE inodes DROP COLUMN allocated")   # (SQLite 3.35+) as an older master left it
    schema.upgrade(conn)
    assert conn.execute("SELECT allocated FROM inodes WHERE ino=?", (ino,)).fetchone()[0] == 2 * BS + 100
    assert conn.execute("SELECT allocated FROM inodes WHERE ino=?", (ROOT_INO,)).fetchone()[0] == 0
    conn.close()
