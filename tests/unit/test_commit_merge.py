"""The master's merge of several writers' commits of one file (master/files.py op_commit):
per block slot the last commit wins, the size only grows unless a commit carries its
writer's truncation, and a truncation ends every other writer's lease (docs/posix.md
"Several writers").  Through the journal, as the master applies them; no mounts."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from curvine_py.common.types import ROOT_INO
from curvine_py.master.records import Allocate, Commit, CommitBlock, OpenWrite
from tests.unit.test_namespace import NS, errno_of

MB = 1 << 20
BS = 4 * MB


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NS]:
    n = NS(tmp_path)
    yield n
    n.journal.stop()


def writer(ns: NS, ino: int, client: str, flags: int = 0) -> int:
    return int(ns.do(OpenWrite, client_id=client, ino=ino, flags=flags, lease_ms=60000)["lease_id"])


def commit(ns: NS, ino: int, client: str, lease: int, size: int, slots: dict[int, int], **kw: Any) -> dict:
    """Commit one new block per slot (slot -> length; its checksum is its block id)."""
    ids = ns.do(Allocate, client_id=client, ino=ino, lease_id=lease, count=max(1, len(slots)))["block_ids"]
    blocks = [CommitBlock(bid, idx * BS, length, bid) for bid, (idx, length) in zip(ids, sorted(slots.items()))]
    return ns.do(Commit, client_id=client, ino=ino, lease_id=lease, size=size, blocks=tuple(blocks), **kw)


def slot_ids(ns: NS, ino: int) -> dict[int, int]:
    return {r.idx: r.block_id for r in ns.ns.blocks(ino)}


def test_two_writers_of_different_blocks_both_survive_and_the_size_only_grows(ns: NS) -> None:
    ino = ns.create(ROOT_INO, "f")["attr"].ino
    a, b = writer(ns, ino, "a"), writer(ns, ino, "b")
    commit(ns, ino, "b", b, 3 * BS, {2: BS})          # b wrote the third block (its size: 3 blocks)
    commit(ns, ino, "a", a, BS, {0: BS})              # a wrote the first, seeing a 1-block file
    ids = slot_ids(ns, ino)
    assert set(ids) == {0, 2} and ns.ns.inode(ino).size == 3 * BS   # a's smaller size cut nothing


def test_the_same_block_from_two_writers_the_last_commit_wins_it_whole(ns: NS) -> None:
    ino = ns.create(ROOT_INO, "f")["attr"].ino
    a, b = writer(ns, ino, "a"), writer(ns, ino, "b")
    first = commit(ns, ino, "a", a, 2 * BS, {0: BS, 1: BS})
    commit(ns, ino, "b", b, BS, {0: BS})
    last_b = slot_ids(ns, ino)[0]
    assert slot_ids(ns, ino)[1] != last_b and ns.ns.inode(ino).size == 2 * BS
    assert first["freed"] == [] and last_b not in (slot_ids(ns, ino)[1],)
    freed = commit(ns, ino, "a", a, 2 * BS, {0: BS})["freed"]
    assert freed == [last_b]                          # b's block of slot 0 gave way to a's newer one


def test_a_truncating_open_ends_the_other_writers_and_frees_their_blocks(ns: NS) -> None:
    """LMCache's two pods opening one .tmp name "wb": the second open's generation is the
    file's; the first writer's commit gets ESTALE, and the file holds one writer's bytes."""
    ino = ns.create(ROOT_INO, "chunk.tmp")["attr"].ino
    a = writer(ns, ino, "a", os.O_TRUNC)
    ids_a = ns.do(Allocate, client_id="a", ino=ino, lease_id=a, count=2)["block_ids"]
    b = writer(ns, ino, "b", os.O_TRUNC)
    assert errno_of(lambda: ns.do(Commit, client_id="a", ino=ino, lease_id=a, size=2 * BS, release=True,
                                  blocks=(CommitBlock(ids_a[0], 0, BS, 1), CommitBlock(ids_a[1], BS, BS, 2)))) \
        == errno.ESTALE
    assert ns.ns.pending_of(ino, a, ids_a) == []      # freed by b's open (its result's "freed")
    commit(ns, ino, "b", b, BS + 5, {0: BS, 1: 5}, release=True)
    row = ns.ns.inode(ino)
    assert row.size == BS + 5 and row.lease_id == 0 and row.complete == 1


def test_a_commit_carrying_a_truncation_cuts_first_and_ends_the_others(ns: NS) -> None:
    ino = ns.create(ROOT_INO, "f")["attr"].ino
    a, b = writer(ns, ino, "a"), writer(ns, ino, "b")
    commit(ns, ino, "a", a, 3 * BS, {0: BS, 1: BS, 2: BS})
    # b cut the file to 1 MiB, then wrote the third block again: slot 1 is a hole now
    commit(ns, ino, "b", b, 3 * BS, {2: BS}, truncate_to=MB)
    assert set(slot_ids(ns, ino)) == {0, 2} and ns.ns.inode(ino).size == 3 * BS
    assert next(r.length for r in ns.ns.blocks(ino) if r.idx == 0) == MB
    assert errno_of(lambda: commit(ns, ino, "a", a, 3 * BS, {})) == errno.ESTALE
    commit(ns, ino, "b", b, MB // 2, {}, truncate_to=MB // 2)   # a truncation alone shrinks exactly
    assert ns.ns.inode(ino).size == MB // 2 and set(slot_ids(ns, ino)) == {0}


def test_a_writer_commits_only_blocks_its_own_lease_allocated(ns: NS) -> None:
    ino = ns.create(ROOT_INO, "f")["attr"].ino
    a, b = writer(ns, ino, "a"), writer(ns, ino, "b")
    bid = ns.do(Allocate, client_id="a", ino=ino, lease_id=a, count=1)["block_ids"][0]
    assert errno_of(lambda: ns.do(Commit, client_id="b", ino=ino, lease_id=b, size=BS,
                                  blocks=(CommitBlock(bid, 0, BS, 1),))) == errno.EINVAL


def test_a_commit_replacing_the_block_the_file_ends_in_also_says_where_it_ends(ns: NS) -> None:
    """Two writers of a short file: "other" committed first, then "mine" (its writer saw an
    empty file): the file is "mine", not "mine" and a zero byte neither wrote."""
    ino = ns.create(ROOT_INO, "f")["attr"].ino
    a, b = writer(ns, ino, "a"), writer(ns, ino, "b")
    commit(ns, ino, "b", b, 5, {0: 5})
    commit(ns, ino, "a", a, 4, {0: 4})
    assert ns.ns.inode(ino).size == 4
    commit(ns, ino, "b", b, 2 * BS + 7, {2: 7})   # b's end is past a's block: it stays
    commit(ns, ino, "a", a, 4, {0: 4})
    assert ns.ns.inode(ino).size == 2 * BS + 7


def test_a_lease_is_usable_only_by_the_client_that_holds_it(ns: NS) -> None:
    """Lease ids come from a counter: another client naming one (guessed, or a stale id
    of its own) can neither allocate under it nor commit with it."""
    ino = ns.create(ROOT_INO, "f")["attr"].ino
    a = writer(ns, ino, "a")
    assert errno_of(lambda: ns.do(Allocate, client_id="b", ino=ino, lease_id=a, count=1)) == errno.EACCES
    ids = ns.do(Allocate, client_id="a", ino=ino, lease_id=a, count=1)["block_ids"]
    block = (CommitBlock(ids[0], 0, MB, ids[0]),)
    assert errno_of(lambda: ns.do(Commit, client_id="b", ino=ino, lease_id=a, size=MB, blocks=block)) == errno.EACCES
    ns.do(Commit, client_id="a", ino=ino, lease_id=a, size=MB, blocks=block)
    assert slot_ids(ns, ino) == {0: ids[0]}
