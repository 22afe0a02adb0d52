"""A lookup's leased listing (issue 39 section 2, "complete directories"): a mount's first
lookup it cannot answer in a small directory brings the directory's whole listing under
the session's lease, so its next lookups there, hits and misses, cost no master call;
another mount's change of a name there still shows at once (the master's push takes the
listing first); a large directory keeps its lookups one name at a time.

The mounts run with the kernel's own caches off (entry and attribute timeouts 0): every
stat reaches the mount, which answers it from its cache or asks the master (counted by
curvine_client_meta_rpc_duration_seconds_count{method="Lookup"}).
"""
from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import errno
import typing

import trio

from curvine_py.client.cachesession import CacheSession
from curvine_py.client.metaclient import Identity
from curvine_py.client.metacache import LISTING_MAX, MetaCache
from curvine_py.client.mount.policy import MountOpens
from curvine_py.client.vfs import VFS
from curvine_py.common.types import ROOT_INO
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master, Method
from tests.conftest import client_on_host, wait_until
from tests.integration.test_verify_ahead import opens_of, settled
from tests.posix.conftest import Mount, raises_errno, start_mount

MOUNT_FLAGS = ("--fuse-attr-timeout-s", "0", "--fuse-entry-timeout-s", "0")
FIELDS = ("st_ino", "st_mode", "st_uid", "st_gid", "st_size", "st_nlink", "st_blocks", "st_mtime_ns", "st_ctime_ns")


def metrics_of(m: Mount) -> str:
    address = os.getxattr(m.path, "user.curvine.metrics").decode()
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()


def lookups(m: Mount) -> float:
    """Lookups the mount sent the master so far."""
    found = re.search(r'^curvine_client_meta_rpc_duration_seconds_count\{method="Lookup"\} (\S+)$',
                      metrics_of(m), re.M)
    return float(found.group(1)) if found else 0.0


def fetched(m: Mount) -> float:
    """Blocks the mount fetched at lookups (fuse.fetch_ahead)."""
    found = re.search(r"^curvine_client_lookup_fetches_total (\S+)$", metrics_of(m), re.M)
    return float(found.group(1)) if found else 0.0


def with_session(m: Mount) -> None:
    wait_until("the mount's cache session",
               lambda: re.search(r"^curvine_client_metadata_cache_sessions ([1-9]\S*)$", metrics_of(m), re.M),
               timeout=10)


def fill(d: Path, n: int, empty: bool = False) -> list[str]:
    """n files named as LMCache's chunks, holding their names (or nothing)."""
    names = [f"chunk{i:04d}.data" for i in range(n)]
    for name in names:
        (d / name).write_bytes(b"" if empty else name.encode())
    return names


def test_a_fresh_mounts_lookups_in_a_small_directory_cost_one_master_call(mounted: Mount, second_mount: Mount,
                                                                           d: Path) -> None:
    names = fill(d, 32, empty=True)         # (not one-block files: see the test after this one)
    b = second_mount.path / d.name
    with_session(second_mount)
    assert b.is_dir()                       # the directory's own lookup (in its parent)
    before = lookups(second_mount)
    for name in names:                      # LMCache's lookup: one stat per chunk, then the first miss
        assert (b / name).stat().st_size == 0
    assert not (b / "chunk0032.data").exists()
    assert not (b / "other").exists()
    assert lookups(second_mount) - before == 1, "the directory's lookups were not answered by its listing"
    for name in names[:8]:                    # every attribute from the listing as the master has it
        got, want = os.lstat(b / name), os.lstat(d / name)
        assert [getattr(got, f) for f in FIELDS] == [getattr(want, f) for f in FIELDS], name
    assert lookups(second_mount) - before == 1
    os.chmod(d / names[5], 0o640)             # changes elsewhere: the names' and the listing's leases end
    os.symlink(names[0], d / "link")
    for name in names[:8] + ["link"]:
        got, want = os.lstat(b / name), os.lstat(d / name)
        assert [getattr(got, f) for f in FIELDS] == [getattr(want, f) for f in FIELDS], name


def test_one_block_files_cost_one_master_call_where_their_blocks_are_checked_at_lookups(
        mounted: Mount, second_mount: Mount, d: Path) -> None:
    """The mounts here check a one-block file's local block at its lookup (fuse.verify_ahead
    with passthrough): the listing brings each one-block file's block too
    (AttrReply.listing_blocks), so LMCache's lookup of 32 chunks and the first miss cost
    the master one Lookup, no Lookup per file beside it (VFS.lookup_blocks)."""
    names = fill(d, 32)
    b = second_mount.path / d.name
    with_session(second_mount)
    assert b.is_dir()
    before = lookups(second_mount)
    for name in names:
        assert (b / name).stat().st_size == len(name)
    assert not (b / "chunk0032.data").exists() and not (b / "other").exists()
    time.sleep(0.3)                           # (a Lookup asked for beside would have gone by now)
    for name in names:
        assert (b / name).stat().st_size == len(name)
    assert lookups(second_mount) - before == 1, "a one-block file's block was asked for beside its stat"


def test_a_listing_still_fetches_one_block_files_ahead(mounted: Mount, d: Path, tmp_path: Path) -> None:
    """fuse.fetch_ahead on a host with no worker: the blocks of the files a listing answered
    for are fetched ahead as a lookup of each would have."""
    names = fill(d, 6)
    c = start_mount(mounted.cluster, tmp_path / "c", tmp_path / "run", tmp_path / "c.log",
                    MOUNT_FLAGS + ("--client-host", "no-worker-here", "--fuse-fetch-ahead", "true"))
    try:
        with_session(c)
        cd = c.path / d.name
        assert cd.is_dir()                       # the directory's own lookup (in its parent)
        before = lookups(c)
        for name in names:
            assert (cd / name).stat().st_size == len(name)
        wait_until("every block fetched ahead", lambda: fetched(c) >= len(names), timeout=10)
        assert lookups(c) - before == 1, "the blocks did not come with the listing"
        for name in names:
            assert (cd / name).read_bytes() == name.encode()
    finally:
        c.stop()


def test_a_listings_blocks_are_checked_ahead_as_the_lookups_blocks_were(mounted: Mount, d: Path) -> None:
    """The mount's own lookup (VFS.lookup, as fuse/ops.py drives it) on a worker's host with
    its cache session, in this process to see its checks ahead (ShortCircuit.stats): every
    one-block file a listing answered for is checked ahead, one master Lookup for them
    all; and only files the caller may read carry a read token (as their own Lookup's)."""
    names = fill(d, 8)
    os.chmod(d / names[1], 0o600)
    c = client_on_host(mounted.cluster, mounted.cluster.worker_host(0))
    cache = c.core.meta.cache = MetaCache()      # (as fuse/main.py sets a mount up)
    session = CacheSession(c.core.meta, cache).start()
    vfs = VFS(c.core, opens=MountOpens(c.core))
    opens_of(vfs).local.enabled = True           # (passthrough.start's, and what it starts)
    opens_of(vfs).local.warm()
    sc = c.core.paths.shortcircuit
    assert sc is not None
    asked: list[pb.LookupRequest] = []

    async def call(method: Method[typing.Any, typing.Any], request: typing.Any) -> typing.Any:
        if method is Master.Lookup:
            asked.append(request)
        return vfs.meta.call(method, request)

    async def blocking(fn: typing.Callable[..., typing.Any], *args: typing.Any) -> typing.Any:
        return fn(*args)

    def stat_each(ident: Identity, *path: str) -> int:
        async def walk() -> int:
            ino = ROOT_INO
            for name in path:
                ino = (await VFS.drive(vfs.lookup(ino, name, ident), call, blocking)).ino
            return ino
        return trio.run(walk)

    try:
        wait_until("the cache session", lambda: cache.session, timeout=10)
        me = vfs.meta.identity
        parent = stat_each(me, d.name)
        before, asked[:] = sc.stats()["ahead"], []
        for name in names:
            stat_each(me, d.name, name)
        raises_errno(errno.ENOENT, stat_each, me, d.name, "chunk0008.data")
        assert len(asked) == 1 and asked[0].one_block and asked[0].listing_max
        settled(vfs)
        assert sc.stats()["ahead"] == before + len(names)
        request = vfs.meta.lookup_request(parent, names[0], Identity(4242, 4242))
        request.one_block, request.listing_max = True, 16
        reply = vfs.meta.call(Master.Lookup, request)   # (in the cache session: a listing needs one)
        assert reply.listed and reply.listing_blocks
        tokens = {e.name: [b.token for b in e.blocks] for e in reply.listing}
        assert set(tokens) == set(names) and all(len(t) == 1 for t in tokens.values())
        assert tokens[names[1]] == [""] and all(tokens[n][0] for n in names if n != names[1])
    finally:
        vfs.close()
        session.stop()
        c.close()


def test_a_name_made_elsewhere_after_the_listing_shows_at_once(mounted: Mount, second_mount: Mount,
                                                                d: Path) -> None:
    names = fill(d, 4)
    b = second_mount.path / d.name
    with_session(second_mount)
    assert (b / names[0]).exists() and not (b / "late").exists()   # b holds the listing now
    t0 = time.monotonic()
    (d / "late").write_bytes(b"x")          # through the other mount: the push takes b's listing first
    assert (b / "late").stat().st_size == 1
    assert time.monotonic() - t0 < 1.0
    os.rename(d / names[1], d / "moved")
    assert not (b / names[1]).exists() and (b / "moved").exists()
    os.unlink(d / names[2])
    assert not (b / names[2]).exists()
    (d / names[3]).write_bytes(b"longer")   # an inode's attributes from the listing
    assert (b / names[3]).stat().st_size == 6
    os.mkdir(d / "sub")
    assert (b / "sub").is_dir()
    # b's own change in a directory whose listing it holds: answered right by b, and a
    assert (b / names[0]).exists()
    (b / "mine").write_bytes(b"yz")
    assert (b / "mine").stat().st_size == 2 and (d / "mine").stat().st_size == 2
    os.unlink(b / "mine")
    assert not (b / "mine").exists() and not (d / "mine").exists()


def test_a_large_directory_keeps_its_lookups_one_name_at_a_time(mounted: Mount, second_mount: Mount,
                                                                 d: Path) -> None:
    names = fill(d, LISTING_MAX + 1)
    b = second_mount.path / d.name
    with_session(second_mount)
    assert b.is_dir()
    before = lookups(second_mount)
    for name in names[:10]:
        assert (b / name).stat().st_size == len(name)
    assert not (b / "missing").exists()
    assert lookups(second_mount) - before == 11
    for name in names[:10]:                 # the names looked up are kept, one by one
        assert (b / name).exists()
    assert lookups(second_mount) - before == 11


def test_a_miss_a_listing_answered_is_not_kept_by_the_kernel(mounted: Mount, d: Path,
                                                              tmp_path: Path) -> None:
    """With fuse.negative_timeout_s the kernel keeps a lookup's "no such name": only for a
    name whose own lease a push ends, never for one the listing answered (no push would
    end it when another mount makes the name)."""
    fill(d, 2, empty=True)
    c = start_mount(mounted.cluster, tmp_path / "c", tmp_path / "run", tmp_path / "c.log",
                    MOUNT_FLAGS + ("--fuse-negative-timeout-s", "30"))
    try:
        with_session(c)
        cd = c.path / d.name
        assert (cd / "chunk0000.data").exists()          # the listing comes with this
        before = lookups(c)
        assert not (cd / "late").exists() and not (cd / "late").exists()   # answered by the listing
        assert lookups(c) == before
        (d / "late").write_bytes(b"x")
        assert (cd / "late").stat().st_size == 1
    finally:
        c.stop()


def test_a_directory_another_mount_keeps_adding_to_stays_true(mounted: Mount, second_mount: Mount,
                                                               d: Path) -> None:
    """LMCache's pattern across hosts: one mount writes chunk after chunk (a .tmp, then its
    rename), the other looks each up as it lands, and the next one missing.  Every push
    takes the reader's listing; it is not asked for again meanwhile (the hold-off), and
    every answer is still right at once."""
    b = second_mount.path / d.name
    with_session(second_mount)
    assert not (b / "chunk0000.data").exists()   # the listing (empty) comes with this
    for i in range(40):
        name = f"chunk{i:04d}.data"
        (d / f"{name}.tmp").write_bytes(name.encode())
        os.rename(d / f"{name}.tmp", d / name)
        assert (b / name).read_bytes() == name.encode()
        assert not (b / f"{name}.tmp").exists()
        assert not (b / f"chunk{i + 1:04d}.data").exists()
