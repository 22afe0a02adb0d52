"""The node's mount table and the mount commands the node service runs.

Every decision the node service makes about mounts is read from /proc/self/mountinfo
at the moment it is made, never from the driver's memory: a FUSE mount and its bind
mounts share one device number (the FUSE superblock's), so "which staging mount serves
this target" and "how many targets still use this staging mount" are questions the
kernel answers, and they have the same answers after the driver restarted (Curvine's
issue #582 was a driver that forgot its mounts and unmounted pods' volumes).

Mounting is done by util-linux's ``mount``/``umount`` (what Kubernetes' own mount-utils
run), never by stat()ing a mount: a stat of a hung FUSE mount blocks.
"""
from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("curvine.csi")

MOUNTINFO = "/proc/self/mountinfo"
FUSE_TYPE = "fuse.curvine"      # the mount daemon's type (fsname=curvine, subtype=curvine)
COMMAND_TIMEOUT_S = 30.0
_ESCAPE = re.compile(r"\\([0-7]{3})")


class MountError(Exception):
    """A mount command failed; str() is the command's own one-line reason."""


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


def same_device(mounts: list[MountEntry], dev: str) -> list[MountEntry]:
    return [m for m in mounts if m.dev == dev]


def _run(cmd: list[str], timeout: float = COMMAND_TIMEOUT_S) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise MountError(f"{' '.join(cmd)}: no answer in {timeout:.0f} s") from None
    except OSError as e:
        raise MountError(f"{cmd[0]}: {e.strerror}") from None
    if r.returncode != 0:
        reason = (r.stderr.strip() or r.stdout.strip() or f"exit status {r.returncode}").splitlines()[-1]
        raise MountError(reason)


def bind(source: str, target: str, readonly: bool) -> None:
    """target becomes a bind mount of source; read-only by a remount of the bind alone
    (a bind mount takes no ro flag of its own on older kernels; the source stays rw)."""
    _run(["mount", "--bind", source, target])
    if readonly:
        try:
            _run(["mount", "-o", "remount,bind,ro", target])
        except MountError:
            unmount(target)   # never leave a writable mount where a read-only one was asked for
            raise


def unmount(target: str) -> None:
    """Unmount target; one whose FUSE daemon died (or that is busy) is detached lazily."""
    try:
        _run(["umount", target])
    except MountError as e:
        log.warning("umount %s: %s; detaching it lazily", target, e)
        _run(["umount", "-l", target])


def remove_dir(path: str) -> None:
    """Remove an (empty) mount point directory; never anything below it."""
    try:
        Path(path).rmdir()
    except FileNotFoundError:
        pass
