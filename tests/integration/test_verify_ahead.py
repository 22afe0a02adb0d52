"""Checks ahead of the open (client/mount/localfiles.py) through a real local cluster: a
lookup made as the mount makes it asks the master for a one-block file's block
(LookupRequest.one_block), and a file whose block has a replica on the client's host has
that block file verified in the background, so the open's check (FUSE passthrough) finds
it verified.  A corrupt copy is never marked verified; the open then reads the other
replica."""
from __future__ import annotations

import os
import time
import typing

import trio

from curvine_py.client.mount.policy import MountOpens
from curvine_py.client.vfs import VFS
from curvine_py.common.types import ROOT_INO
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master, Method
from tests.integration.test_shortcircuit import local_block_files

if typing.TYPE_CHECKING:
    from curvine_py.client.shortcircuit import ShortCircuit
    from curvine_py.cluster.local import LocalCluster
    from curvine_py.sdk import Client

MiB = 1 << 20
ONE_BLOCK = 3 * MiB + 5          # under the default 4 MiB block size


def lookup(vfs: VFS, path: str) -> pb.Attr:
    """Resolve path one name at a time with the mount's own lookup, driven on a trio loop
    as the mount drives it (VFS.drive)."""
    async def call(method: Method[typing.Any, typing.Any], request: typing.Any) -> typing.Any:
        return vfs.meta.call(method, request)

    async def blocking(fn: typing.Callable[..., typing.Any], *args: typing.Any) -> typing.Any:
        return fn(*args)

    async def walk() -> pb.Attr:
        ino, attr = ROOT_INO, pb.Attr()
        for name in path.strip("/").split("/"):
            attr = await VFS.drive(vfs.lookup(ino, name, vfs.meta.identity), call, blocking)
            ino = attr.ino
        return attr
    return trio.run(walk)


def settled(vfs: VFS, timeout: float = 10.0) -> None:
    """Wait until no check ahead is queued or running."""
    deadline = time.monotonic() + timeout
    while opens_of(vfs).local._queued and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not opens_of(vfs).local._queued, "checks ahead did not finish"


def opens_of(vfs: VFS) -> MountOpens:
    """The mount's policy of a VFS made as a mount makes it."""
    assert isinstance(vfs.opens, MountOpens)
    return vfs.opens


def mount_vfs(client: "Client") -> tuple[VFS, "ShortCircuit"]:
    vfs = VFS(client.core, opens=MountOpens(client.core))
    opens_of(vfs).local.enabled = True          # as passthrough.start does once the kernel took it
    sc = client.core.paths.shortcircuit
    assert sc is not None
    return vfs, sc


def test_lookup_returns_the_block_of_one_block_files_only(client: "Client", remote_dir: str) -> None:
    client.put_bytes(f"{remote_dir}/one", os.urandom(ONE_BLOCK))
    client.put_bytes(f"{remote_dir}/two", os.urandom(4 * MiB + 1))
    client.put_bytes(f"{remote_dir}/empty", b"")
    meta = client.core.meta
    parent = client.stat(remote_dir).ino

    def blocks(name: str, one_block: bool = True) -> list[pb.BlockInfo]:
        request = meta.lookup_request(parent, name)
        request.one_block = one_block
        return list(meta.call(Master.Lookup, request).blocks)

    (b,) = blocks("one")
    want = meta.block_locations(client.stat(f"{remote_dir}/one").ino).blocks[0]
    assert (b.block_id, b.offset, b.length, b.checksum, list(b.workers)) == \
        (want.block_id, 0, ONE_BLOCK, want.checksum, list(want.workers))
    assert blocks("one", one_block=False) == []
    assert b.token   # a read token (fuse.fetch_ahead fetches the block with it)...
    client.chmod(f"{remote_dir}/one", 0o600)
    request = meta.lookup_request(parent, "one")
    request.one_block = True
    request.caller.uid = request.caller.gid = 4242
    del request.caller.groups[:]
    (other,) = meta.call(Master.Lookup, request).blocks
    assert other.block_id == b.block_id and other.token == ""   # ...only for a caller who may read the file
    assert blocks("two") == []
    assert blocks("empty") == []
    client.mkdir(f"{remote_dir}/d")
    assert blocks("d") == []


def test_a_lookup_checks_the_local_block_file_before_the_open(local_client: "Client", remote_dir: str) -> None:
    data = os.urandom(ONE_BLOCK)
    local_client.put_bytes(f"{remote_dir}/chunk", data)
    vfs, sc = mount_vfs(local_client)
    try:
        before = sc.stats()["ahead"]
        attr = lookup(vfs, f"{remote_dir}/chunk")
        settled(vfs)
        assert sc.stats()["ahead"] == before + 1
        lookup(vfs, f"{remote_dir}/chunk")      # the same version is checked ahead once
        settled(vfs)
        assert sc.stats()["ahead"] == before + 1

        def no_hashing(*args: object) -> list[int]:
            raise AssertionError("the open hashed a block the lookup had verified")
        sc._chunk_sums = no_hashing               # type: ignore[method-assign]
        opened = vfs.run(vfs.open(attr.ino, os.O_RDONLY, vfs.meta.identity))
        try:
            assert opened.backed
            fd = vfs.backing_file(opened.fh)
            assert fd is not None
            try:
                assert os.pread(fd, ONE_BLOCK + 1, 0) == data
            finally:
                os.close(fd)
        finally:
            vfs.run(vfs.release(opened.fh))
    finally:
        vfs.close()


def test_a_corrupt_copy_is_not_verified_ahead(shared_cluster: "LocalCluster", local_client: "Client",
                                              remote_dir: str) -> None:
    data = os.urandom(ONE_BLOCK)
    local_client.put_bytes(f"{remote_dir}/chunk", data)
    (path,) = local_block_files(local_client, shared_cluster, f"{remote_dir}/chunk")
    with open(path, "r+b") as f:
        f.seek(2 * MiB + 3)
        byte = f.read(1)
        f.seek(2 * MiB + 3)
        f.write(bytes([byte[0] ^ 0x01]))
    vfs, sc = mount_vfs(local_client)
    try:
        before = sc.stats()["ahead"]
        attr = lookup(vfs, f"{remote_dir}/chunk")
        settled(vfs)
        assert sc.stats()["ahead"] == before
        opened = vfs.run(vfs.open(attr.ino, os.O_RDONLY, vfs.meta.identity))
        try:
            assert vfs.backing_file(opened.fh) is None   # not handed to the kernel: read the usual way
            assert vfs.read(opened.fh, 0, ONE_BLOCK + 1) == data
        finally:
            vfs.run(vfs.release(opened.fh))
    finally:
        vfs.close()
