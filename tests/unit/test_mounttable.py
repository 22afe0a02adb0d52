"""The one reader of the kernel's mount table (common/mounttable.py)."""
from __future__ import annotations

from pathlib import Path

from curvine_py.common.mounttable import MountEntry, detach, is_mounted, mount_at, read_mounts


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
