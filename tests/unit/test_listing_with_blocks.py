"""A Lookup's listing with its one-block files' blocks (LookupRequest.one_block with
listing_max; master/service.py _listed_blocks, namespace.listing_with_blocks) says of
each name what that name's own Lookup with one_block says: the same attributes, the same
blocks, and a valid read token exactly where the caller may read the file (by its mode or
its ACL).  A real master service over a temporary store, with block tokens on."""
from __future__ import annotations

import os
import sqlite3
import struct
import typing
from pathlib import Path

import pytest

from curvine_py.common.config import Config
from curvine_py.master.acl import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ
from curvine_py.master.service import MasterService
from curvine_py.pb import curvine_pb2 as pb

ROOT_INO = 1
MiB = 1 << 20
ROOT = pb.Caller(client_id="writer")
U = 0xFFFFFFFF


@pytest.fixture
def master(tmp_path: Path) -> typing.Iterator[MasterService]:
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path)
    cfg.cluster.secret = "listing-blocks-test"
    service = MasterService(cfg, str(tmp_path / "meta.db"))
    service.journal.start()
    for i in range(2):
        service.RegisterWorker(pb.RegisterRequest(host=f"h{i}", ip="127.0.0.1", data_port=9000 + i, storage_id=f"s{i}",
                                                  dirs=[pb.DataDir(path="/d", tier="SSD", capacity=1 << 40)]))
    try:
        yield service
    finally:
        service.group.stop()


def write(m: MasterService, d: int, name: str, mode: int, sizes: list[int], release: bool = True,
          checksum: int = 7) -> int:
    """A file of blocks of these sizes (1 MiB blocks), committed (and closed: release)."""
    f = m.Create(pb.MknodRequest(caller=ROOT, parent=d, name=name, mode=mode, block_size=MiB,
                                 open_flags=os.O_WRONLY))
    blocks = []
    if sizes:
        got = m.AllocateBlocks(pb.AllocateBlocksRequest(caller=ROOT, ino=f.attr.ino, lease_id=f.lease_id,
                                                        count=len(sizes)))
        blocks = [pb.BlockInfo(block_id=b.block_id, offset=i * MiB, length=n, checksum=checksum + i, workers=b.workers)
                  for i, (b, n) in enumerate(zip(got.blocks, sizes))]
    m.Commit(pb.CommitRequest(caller=ROOT, ino=f.attr.ino, lease_id=f.lease_id, size=sum(sizes), release=release,
                              blocks=blocks))
    return f.attr.ino


def acl_reading(uid: int) -> bytes:
    """u::rw-, u:<uid>:r--, g::---, m::r--, o::---."""
    entries = [(USER_OBJ, 6, U), (USER, 4, uid), (GROUP_OBJ, 0, U), (MASK, 4, U), (OTHER, 0, U)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def session(m: MasterService, uid: int) -> pb.Caller:
    sid = m.open_session(pb.SessionRequest(caller=ROOT, lease_ms=60_000), lambda _: True).session
    return pb.Caller(uid=uid, gid=uid, client_id=f"reader-{uid}", session=sid)


def same_as_own_lookups(m: MasterService, caller: pb.Caller, d: int, names: set[str], listing_max: int) -> None:
    """The listing of d names exactly `names`, each entry as its own Lookup answers it."""
    first = sorted(names)[0]
    reply = m.Lookup(pb.LookupRequest(caller=caller, parent=d, name=first, one_block=True, listing_max=listing_max))
    assert reply.listed and reply.listing_blocks and reply.lease_seq
    assert sorted(e.name for e in reply.listing) == sorted(names)
    for e in reply.listing:
        own = m.Lookup(pb.LookupRequest(caller=caller, parent=d, name=e.name, one_block=True))
        assert e.attr == own.attr, e.name
        assert len(e.blocks) == len(own.blocks), e.name
        for got, want in zip(e.blocks, own.blocks):
            assert (got.block_id, got.offset, got.length, got.checksum, list(got.workers)) == \
                (want.block_id, want.offset, want.length, want.checksum, list(want.workers)), e.name
            assert bool(got.token) == bool(want.token), e.name
            if got.token:
                m.tokens.check(got.token, got.block_id, write=False)


def test_each_listed_file_has_its_own_lookups_blocks_and_tokens(master: MasterService) -> None:
    m = master
    d = m.Mknod(pb.MknodRequest(caller=ROOT, parent=ROOT_INO, name="kv", mode=0o40755)).attr.ino
    names = {f"chunk{i}.data" for i in range(5)}
    for i, name in enumerate(sorted(names)):
        write(m, d, name, 0o100644, [MiB - i], checksum=(1 << 63) + i)   # (stored signed: read back unsigned)
    write(m, d, "private", 0o100600, [100])                  # not readable by uid 1000: no token
    acl_ino = write(m, d, "acl-read", 0o100600, [200])       # readable by uid 1000 through its ACL only
    m.SetXattr(pb.XattrRequest(caller=ROOT, ino=acl_ino, name="system.posix_acl_access", value=acl_reading(1000)))
    write(m, d, "two-blocks", 0o100644, [MiB, 10])           # not one block: none listed
    write(m, d, "empty", 0o100644, [])
    write(m, d, "open", 0o100644, [300], release=False)     # not complete: none listed
    m.Mknod(pb.MknodRequest(caller=ROOT, parent=d, name="sub", mode=0o40755))
    chunk0 = m.Lookup(pb.LookupRequest(caller=ROOT, parent=d, name="chunk0.data")).attr.ino
    m.Link(pb.LinkRequest(caller=ROOT, ino=chunk0, new_parent=d, new_name="chunk0.link"))
    names |= {"private", "acl-read", "two-blocks", "empty", "open", "sub", "chunk0.link"}
    for uid in (1000, 1001, 0):
        same_as_own_lookups(m, session(m, uid), d, names, listing_max=1024)
    reader = session(m, 1000)
    reply = m.Lookup(pb.LookupRequest(caller=reader, parent=d, name="private", one_block=True, listing_max=1024))
    listed = {e.name: e for e in reply.listing}
    assert listed["acl-read"].blocks[0].token and not listed["private"].blocks[0].token
    assert not listed["two-blocks"].blocks and not listed["open"].blocks and not listed["empty"].blocks
    assert listed["chunk0.link"].blocks[0].block_id == listed["chunk0.data"].blocks[0].block_id
    assert listed["chunk1.data"].blocks[0].checksum == (1 << 63) + 1
    # a directory of more names than listing_max is not listed; of exactly as many, it is
    too_few = m.Lookup(pb.LookupRequest(caller=reader, parent=d, name="sub", one_block=True,
                                        listing_max=len(names) - 1))
    assert not too_few.listed and not too_few.listing and too_few.lease_seq
    same_as_own_lookups(m, reader, d, names, listing_max=len(names))


def test_a_one_block_file_of_two_block_rows_is_listed_once_with_both(master: MasterService) -> None:
    """No commit leaves a block row past a file's size; if a store holds one anyway, the
    listing (one row per block) still names the file once, as its own Lookup gives it,
    and counts it once against listing_max."""
    m = master
    d = m.Mknod(pb.MknodRequest(caller=ROOT, parent=ROOT_INO, name="odd", mode=0o40755)).attr.ino
    names = [f"f{i}" for i in range(4)]
    inos = [write(m, d, name, 0o100644, [1000]) for name in names]
    with sqlite3.connect(m.db_path) as db:
        db.execute("INSERT INTO blocks (ino, idx, block_id, length, checksum) VALUES (?, 1, 999999, 5, -3)", (inos[1],))
    reader = session(m, 1000)
    same_as_own_lookups(m, reader, d, set(names), listing_max=len(names))
    reply = m.Lookup(pb.LookupRequest(caller=reader, parent=d, name="f0", one_block=True, listing_max=len(names)))
    assert [len(e.blocks) for e in reply.listing] == [1, 2, 1, 1]
    assert reply.listing[1].blocks[1].checksum == (1 << 64) - 3
    assert not m.Lookup(pb.LookupRequest(caller=reader, parent=d, name="f0", one_block=True,
                                         listing_max=len(names) - 1)).listed
