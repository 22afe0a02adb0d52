"""Read tokens go only to callers that may read the file (issue 40).

A block's read token is its data: GetBlockLocations must refuse (EACCES) whoever Open
refuses to read -- by mode bits and by POSIX ACL -- and hand a writer opened write-only
its file's tokens only under its own write lease.  A real cluster (shared_cluster); the
callers are other uids as the master sees them (the Caller a client sends, as the mount
sends each request's uid), and another client for someone else's lease.
"""
from __future__ import annotations

import errno
import os
import struct
import typing

import pytest

from curvine_py.client.metaclient import Identity, MasterClient
from curvine_py.common.errors import CurvineError
from curvine_py.master import acl
from curvine_py.pb.methods import Master
from curvine_py.sdk import Client
from tests.conftest import LocalCluster, client_config

U1 = Identity(1001, 1001)
U2 = Identity(1002, 1002)
ANY = 0xFFFFFFFF
DATA = os.urandom(100_000)


def access_acl(*entries: tuple[int, int, int]) -> bytes:
    """system.posix_acl_access in the Linux xattr format: (tag, perm, id) entries."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def refused(call: typing.Callable[[], object]) -> int:
    """The errno call failed with (0: it succeeded)."""
    try:
        call()
    except CurvineError as e:
        return e.errno or -1
    return 0


@pytest.fixture(scope="module")
def root(shared_cluster: LocalCluster) -> typing.Iterator[Client]:
    c = Client(master=shared_cluster.master_address, config=client_config(shared_cluster))
    c.mkdir("/tokens", mode=0o777, exist_ok=True)
    try:
        yield c
    finally:
        c.close()


def file_of(root: Client, name: str, mode: int) -> int:
    """A root-owned file of DATA with mode; its ino."""
    path = f"/tokens/{name}"
    root.put_bytes(path, DATA)
    root.chmod(path, mode)
    return root.stat(path).ino


def test_a_file_others_may_not_read_gives_them_no_read_tokens(root: Client) -> None:
    ino = file_of(root, "private", 0o600)
    meta = root.meta
    assert refused(lambda: meta.open(ino, os.O_RDONLY, write=False, ident=U1)) == errno.EACCES
    assert refused(lambda: meta.block_locations(ino, ident=U1)) == errno.EACCES
    owner = meta.block_locations(ino)
    assert owner.blocks and all(b.token for b in owner.blocks)
    root.chmod("/tokens/private", 0o604)
    granted = meta.block_locations(ino, ident=U1)
    assert [b.block_id for b in granted.blocks] == [b.block_id for b in owner.blocks]
    assert all(b.token for b in granted.blocks)
    assert root.get_bytes("/tokens/private") == DATA


def test_an_acl_decides_as_it_does_for_open(root: Client) -> None:
    """u:1001:--- denies although other may read; u:1002:r-- grants although other may not."""
    ino = file_of(root, "acl", 0o644)
    root.setxattr("/tokens/acl", acl.ACCESS, access_acl(
        (acl.USER_OBJ, 6, ANY), (acl.USER, 0, U1.uid), (acl.USER, 4, U2.uid), (acl.GROUP_OBJ, 0, ANY),
        (acl.MASK, 4, ANY), (acl.OTHER, 4, ANY)))
    meta = root.meta
    for who, want in ((U1, errno.EACCES), (U2, 0)):
        assert refused(lambda: meta.open(ino, os.O_RDONLY, write=False, ident=who)) == want
        assert refused(lambda: meta.block_locations(ino, ident=who)) == want
    root.chmod("/tokens/acl", 0o600)   # the mask: u:1002 loses r, o loses it too
    assert refused(lambda: meta.block_locations(ino, ident=U2)) == errno.EACCES


def test_a_write_only_writer_gets_tokens_under_its_own_lease_only(
        root: Client, shared_cluster: LocalCluster) -> None:
    ino = file_of(root, "dropbox", 0o602)   # others may write, not read
    meta = root.meta
    lease = meta.open(ino, os.O_WRONLY, write=True, ident=U1).lease_id
    assert lease
    assert refused(lambda: meta.block_locations(ino, ident=U1)) == errno.EACCES
    mine = meta.block_locations(ino, ident=U1, lease_id=lease)
    assert mine.blocks and all(b.token for b in mine.blocks)
    shipped = meta.call(Master.AllocateBlocks, meta.allocate_request(ino, lease, 1, ident=U1)).blocks[0].block_id
    assert [b.block_id for b in meta.block_locations(ino, ident=U1, lease_id=lease, pending=[shipped]).pending] \
        == [shipped]
    other = MasterClient(shared_cluster.master_address, client_config(shared_cluster).client,
                         secret=shared_cluster.secret)
    try:   # another client naming this lease is not its holder: R decides, and no write tokens
        assert refused(lambda: other.block_locations(ino, ident=U1, lease_id=lease)) == errno.EACCES
        assert refused(lambda: other.block_locations(ino, ident=U2, lease_id=lease, pending=[shipped])) \
            == errno.EACCES
        as_root = other.block_locations(ino, lease_id=lease, pending=[shipped])
        assert as_root.blocks and not as_root.pending
    finally:
        other.close()
