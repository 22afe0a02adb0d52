"""The node's mount table and the mount commands the node service runs.

Every decision the node service makes about mounts is read from /proc/self/mountinfo
at the moment it is made, never from the driver's memory: a FUSE mount and its bind
mounts share one device number (the FUSE superblock's), so "which staging mount serves
this target" and "how many targets still use this staging mount" are questions the
kernel answers, and they have the same answers after the driver restarted (Curvine's
issue #582 was a driver that forgot its mounts and unmounted pods' volumes).

Mounting is done by util-linux's ``mount``/``umount`` (what Kubernetes' own mount-utils
run), never by stat()ing a mount: a stat of a hung FUSE mount blocks.
The mount table itself is read by curvine_py/common/mounttable.py.
"""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from curvine_py.common.mounttable import MountEntry

log = logging.getLogger("curvine.csi")

FUSE_TYPE = "fuse.curvine"      # the mount daemon's type (fsname=curvine, subtype=curvine)
COMMAND_TIMEOUT_S = 30.0


class MountError(Exception):
    """A mount command failed; str() is the command's own one-line reason."""


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
