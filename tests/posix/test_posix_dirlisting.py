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

from curvine_py.client.metacache import LISTING_MAX
from tests.conftest import wait_until
from tests.posix.conftest import Mount, start_mount

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


def test_one_block_files_are_asked_for_once_where_their_blocks_are_checked_at_lookups(
        mounted: Mount, second_mount: Mount, d: Path) -> None:
    """The mounts here check a one-block file's local block at its lookup (fuse.verify_ahead
    with passthrough), whose block only the master's answer brings: each such name's first
    lookup after the listing asks for it beside (VFS.lookup_blocks), answered meanwhile;
    its later ones and the misses do not."""
    names = fill(d, 8)
    b = second_mount.path / d.name
    with_session(second_mount)
    assert b.is_dir()
    before = lookups(second_mount)
    for name in names:
        assert (b / name).stat().st_size == len(name)
    assert not (b / "missing").exists() and not (b / "other").exists()
    wait_until("the blocks asked for", lambda: lookups(second_mount) - before >= len(names), timeout=10)
    for name in names:
        assert (b / name).stat().st_size == len(name)
    time.sleep(0.2)
    assert lookups(second_mount) - before == len(names)


def test_a_listing_still_fetches_one_block_files_ahead(mounted: Mount, d: Path, tmp_path: Path) -> None:
    """fuse.fetch_ahead on a host with no worker: the blocks of the files a listing answered
    for are fetched ahead as a lookup of each would have."""
    names = fill(d, 6)
    c = start_mount(mounted.cluster, tmp_path / "c", tmp_path / "run", tmp_path / "c.log",
                    MOUNT_FLAGS + ("--client-host", "no-worker-here", "--fuse-fetch-ahead", "true"))
    try:
        with_session(c)
        cd = c.path / d.name
        for name in names:
            assert (cd / name).stat().st_size == len(name)
        wait_until("every block fetched ahead", lambda: fetched(c) >= len(names), timeout=10)
        for name in names:
            assert (cd / name).read_bytes() == name.encode()
    finally:
        c.stop()


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
