"""The one reader of the kernel's mount table (common/mounttable.py)."""
from __future__ import annotations

from pathlib import Path

from curvine_py.common.mounttable import MountEntry, detach, is_mounted, mount_at, mount_of, read_mounts


def test_a_mountinfo_line_with_escaped_spaces_parses_to_the_real_path() -> None:
    line = "36 35 0:42 / /mnt/my\\040pool rw,nosuid - fuse.curvine curvine rw,user_id=0\n"
    e = MountEntry.parse(line)
    assert (e.point, e.fstype, e.source, e.dev) == ("/mnt/my pool", "fuse.curvine", "curvine", "0:42")
    assert not e.readonly and mount_at([e], "/mnt/my pool") is e


def test_is_mounted_reads_this_machines_table(tmp_path: Path) -> None:
    assert is_mounted("/proc") and mount_at(read_mounts(), "/proc") is not None
    assert not is_mounted(str(tmp_path))
    detach(str(tmp_path))          # nothing mounted there: nothing run, no error
    assert tmp_path.is_dir()


def test_the_mount_a_path_lies_in_is_the_deepest_one_of_that_type() -> None:
    table = [MountEntry.parse(line) for line in (
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        "36 1 0:42 / /mnt/pool rw - fuse.curvine curvine rw\n",
        "37 36 0:43 / /mnt/pool/sub rw - tmpfs tmpfs rw\n")]
    assert mount_of("/mnt/pool/a/b", "fuse.curvine", table) is table[1]
    assert mount_of("/mnt/pool", "fuse.curvine", table) is table[1]
    assert mount_of("/mnt/pool/sub/x", "fuse.curvine", table) is None     # a tmpfs inside the pool
    assert mount_of("/mnt/poolside", "fuse.curvine", table) is None
    assert mount_of("/etc", "ext4", table) is table[0]
