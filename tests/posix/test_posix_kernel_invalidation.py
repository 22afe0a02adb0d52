"""The kernel forgets what the master's pushes take (fuse/notify.py; issues 39 §2 and 41).

Both mounts run with kernel entry and attribute timeouts of 30 s: without the mount
telling its kernel, a name or size changed through the other mount would show stale for
up to 30 s.  Each case first has mount b's kernel cache the old state (a second stat
does not reach b's daemon: checked), then changes it through mount a, and requires b to
see the change within 1 s (in practice at once: the push is acknowledged, and the change
answered, once b's kernel forgot).
"""
from __future__ import annotations

import os
import re
import stat
import time
import typing
import urllib.request
from pathlib import Path

import pytest

from curvine_py.sdk import Client
from tests.conftest import client_config, wait_until
from tests.posix.conftest import Mount

MOUNT_FLAGS = ("--fuse-attr-timeout-s", "30", "--fuse-entry-timeout-s", "30", "--fuse-kernel-invalidation", "true")
WITHIN_S = 1.0


def daemon_ops(m: Mount) -> float:
    """Lookups and getattrs the mount's daemon answered (the kernel's cache misses)."""
    address = os.getxattr(m.path, "user.curvine.metrics").decode()
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(
        r'^curvine_fuse_op_duration_seconds_count\{op="(?:lookup|getattr)"\} (\S+)$', text, re.M))


def sessions(m: Mount) -> float:
    address = os.getxattr(m.path, "user.curvine.metrics").decode()
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    found = re.search(r"^curvine_client_metadata_cache_sessions (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def seen_within(what: str, check: typing.Callable[[], bool]) -> float:
    """Seconds until check holds (failing after WITHIN_S)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > WITHIN_S:
            pytest.fail(f"mount b still shows the old state {WITHIN_S} s after a's change: {what}")
        time.sleep(0.001)
    took = time.monotonic() - start
    print(f"{what}: b saw a's change {took * 1e3:.2f} ms after it returned")
    return took


def exists(p: Path) -> bool:
    return os.path.lexists(p)


@pytest.fixture(scope="module")
def dirs(mounted: Mount, second_mount: Mount) -> tuple[Path, Path]:
    (mounted.path / "kinval").mkdir()
    wait_until("b's cache session", lambda: sessions(second_mount) >= 1, timeout=10)
    return mounted.path / "kinval", second_mount.path / "kinval"


def cached_in_b_kernel(second_mount: Mount, p: Path) -> os.stat_result:
    """Stat p on b until b's kernel holds it: a further stat reaches no daemon."""
    st = p.stat()
    before = daemon_ops(second_mount)
    for _ in range(10):
        p.stat()
    assert daemon_ops(second_mount) == before, "b's kernel does not cache (the 30 s timeouts are not in effect)"
    return st


def test_size_and_mode_changed_on_a_show_on_b(dirs: tuple[Path, Path], second_mount: Mount) -> None:
    a, b = dirs
    (a / "f").write_bytes(b"1")
    assert cached_in_b_kernel(second_mount, b / "f").st_size == 1
    (a / "f").write_bytes(b"4444")
    seen_within("size", lambda: (b / "f").stat().st_size == 4)
    cached_in_b_kernel(second_mount, b / "f")
    os.chmod(a / "f", 0o600)
    seen_within("chmod", lambda: stat.S_IMODE((b / "f").stat().st_mode) == 0o600)
    with open(a / "f", "ab") as f:
        f.write(b"55555")
    seen_within("append", lambda: (b / "f").stat().st_size == 9)


def test_names_changed_on_a_show_on_b(dirs: tuple[Path, Path], second_mount: Mount) -> None:
    a, b = dirs
    (a / "old").write_bytes(b"22")
    cached_in_b_kernel(second_mount, b / "old")
    os.rename(a / "old", a / "new")
    seen_within("rename (old name)", lambda: not exists(b / "old"))
    assert (b / "new").stat().st_size == 2
    cached_in_b_kernel(second_mount, b / "new")
    os.unlink(a / "new")
    seen_within("unlink", lambda: not exists(b / "new"))

    assert not exists(b / "made")                 # b's cache holds "no such name"
    (a / "made").write_bytes(b"333")
    seen_within("create", lambda: exists(b / "made"))
    assert (b / "made").stat().st_size == 3

    (a / "over").write_bytes(b"1")
    cached_in_b_kernel(second_mount, b / "made")
    cached_in_b_kernel(second_mount, b / "over")
    os.rename(a / "over", a / "made")             # a name replaced: b's dentry points at the old inode
    seen_within("rename over", lambda: (b / "made").stat().st_size == 1)
    seen_within("rename over (source)", lambda: not exists(b / "over"))


def test_a_directory_mode_changed_on_a_shows_on_b(dirs: tuple[Path, Path], second_mount: Mount) -> None:
    a, b = dirs
    (a / "sub").mkdir(mode=0o755)
    cached_in_b_kernel(second_mount, b / "sub")
    os.chmod(a / "sub", 0o700)
    seen_within("directory chmod", lambda: stat.S_IMODE((b / "sub").stat().st_mode) == 0o700)


def test_a_name_under_a_ufs_mount_is_not_kept_by_the_kernel(mounted: Mount, second_mount: Mount,
                                                            tmp_path: Path) -> None:
    """Under a UFS mount the master grants nothing (names change behind it) and pushes
    nothing: b's kernel drops each answer right after taking it (MetaCache.on_refused),
    instead of keeping it for its 30 s.  A name made there behind everyone's back shows
    on b at once too."""
    nas = tmp_path / "nas"
    nas.mkdir()
    (nas / "f").write_bytes(b"1")
    with Client(master=mounted.cluster.master_address, config=client_config(mounted.cluster)) as sdk:
        sdk.ufs.mount(f"file://{nas}", "/ufs-kinval")
    a, b = mounted.path / "ufs-kinval", second_mount.path / "ufs-kinval"
    assert (b / "f").stat().st_size == 1 and (b / "f").stat().st_size == 1
    os.chmod(a / "f", 0o640)
    seen_within("chmod under a UFS mount", lambda: stat.S_IMODE((b / "f").stat().st_mode) == 0o640)
    assert not exists(b / "g")
    (a / "g").write_bytes(b"22")
    seen_within("create under a UFS mount", lambda: exists(b / "g"))
    os.unlink(a / "g")
    seen_within("unlink under a UFS mount", lambda: not exists(b / "g"))


def test_what_b_held_when_its_session_ended_leaves_its_kernel(mounted: Mount, second_mount: Mount,
                                                              dirs: tuple[Path, Path]) -> None:
    """The master restarts: b's session ends, and so do the pushes that would tell b's
    kernel of a change.  b's kernel drops what b's cache held at that moment
    (MetaCache.on_end), so a file changed through a after the restart shows on b at once,
    not after the 30 s."""
    a, b = dirs
    (a / "r").write_bytes(b"1")
    cached_in_b_kernel(second_mount, b / "r")
    before = sessions(second_mount)
    mounted.cluster.kill_master()
    mounted.cluster.restart_master()
    wait_until("b's new session", lambda: sessions(second_mount) > before, timeout=20)
    (a / "r").write_bytes(b"4444")
    seen_within("size, after b's session ended", lambda: (b / "r").stat().st_size == 4)
