"""The kernel's mount table (/proc/self/mountinfo), read fresh at each question.

One reader for everything that asks "what is mounted here": the mount daemon's `cv umount`,
the local cluster's start and stop, the CSI node service and the test tooling.  Never a
stat() of the mount point: a stat of a hung FUSE mount blocks.
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(r"\\([0-7]{3})")
DETACH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo (proc(5))."""
    mount_id: int
    parent_id: int
    dev: str            # "major:minor": the same for a FUSE mount and every bind of it
    root: str           # the directory of the filesystem mounted here ("/" for a whole mount)
    point: str
    options: frozenset[str]
    fstype: str
    source: str

    @property
    def readonly(self) -> bool:
        return "ro" in self.options

    @classmethod
    def parse(cls, line: str) -> "MountEntry":
        left, _, right = line.rstrip("\n").partition(" - ")
        f, r = left.split(" "), right.split(" ")
        return cls(int(f[0]), int(f[1]), f[2], _unescape(f[3]), _unescape(f[4]), frozenset(f[5].split(",")),
                   r[0], _unescape(r[1]) if len(r) > 1 else "")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040...)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def read_mounts(path: str = MOUNTINFO) -> list[MountEntry]:
    with open(path) as f:
        return [MountEntry.parse(line) for line in f if line.strip()]


def mount_at(mounts: list[MountEntry], point: str) -> MountEntry | None:
    """The topmost mount at point (the last one listed: later mounts stack on earlier ones)."""
    found = None
    for m in mounts:
        if m.point == point:
            found = m
    return found


def mount_of(path: str, fstype: str, mounts: list[MountEntry] | None = None) -> MountEntry | None:
    """The mount of type fstype that path lies in (the deepest one), if any: decided by the
    mount table, with the path's symlinks resolved first (as is_mounted does)."""
    target = os.path.realpath(path)
    found = None
    for m in read_mounts() if mounts is None else mounts:
        inside = target == m.point or target.startswith(m.point.rstrip("/") + "/")
        if inside and (found is None or len(m.point) >= len(found.point)):
            found = m
    return found if found is not None and found.fstype == fstype else None


def is_mounted(mountpoint: str) -> bool:
    """Whether anything is mounted at mountpoint (symlinks resolved, as the kernel lists it)."""
    target = os.path.realpath(mountpoint)
    try:
        return mount_at(read_mounts(), target) is not None
    except OSError:
        return False


def detach(mountpoint: str) -> None:
    """Lazily detach a mount whose FUSE daemon is gone (best effort): fusermount3 (or the
    older fusermount) -u -z, else util-linux's umount -l.  Nothing mounted there: nothing run."""
    if not is_mounted(mountpoint):
        return
    for cmd in (["fusermount3", "-u", "-z"], ["fusermount", "-u", "-z"], ["umount", "-l"]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if subprocess.run([*cmd, mountpoint], capture_output=True, timeout=DETACH_TIMEOUT_S).returncode == 0:
                return
