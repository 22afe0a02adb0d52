"""POSIX permission rules, in one place, as ext4 applies them.

Every namespace operation asks these functions; nothing else in the system
decides who may do what.  ``Cred`` is the caller (uid, gid, supplementary groups).
"""
from __future__ import annotations

import errno
import stat
from dataclasses import dataclass

from curvine_py.common.errors import err
from curvine_py.common.types import NAME_MAX
from curvine_py.master import acl as acls
from curvine_py.master.store import InodeRow

R, W, X = 4, 2, 1


@dataclass(frozen=True)
class Cred:
    uid: int
    gid: int
    groups: frozenset[int]

    @property
    def root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


def allowed(mode: int, uid: int, gid: int, cred: Cred, want: int, acl: bytes | None = None) -> bool:
    """May cred access an inode (mode/uid/gid, and its access ACL's stored value, if it
    has one) for want (R|W|X bits)?  The owner is judged by the mode's bits (an ACL's
    owner entry is those bits); anyone else by the ACL when there is one."""
    if cred.root:
        # root bypasses rwx, but execute needs some x bit on non-directories
        if want & X and not stat.S_ISDIR(mode) and not mode & 0o111:
            return False
        return True
    if cred.uid == uid:
        perm = (mode >> 6) & 7
    elif acl and (a := acls.stored(acl)) is not None:
        return a.allows(gid, cred.uid, cred.in_group, want)
    elif cred.in_group(gid):
        perm = (mode >> 3) & 7
    else:
        perm = mode & 7
    return perm & want == want


def require(row: InodeRow, cred: Cred, want: int) -> None:
    if not allowed(row.mode, row.uid, row.gid, cred, want, row.acl):
        raise err(errno.EACCES)


def require_owner(row: InodeRow, cred: Cred) -> None:
    """chmod, utimes with explicit times, xattrs of trusted.*: owner or root only."""
    if not cred.root and cred.uid != row.uid:
        raise err(errno.EPERM)


def sticky_ok(dir_row: InodeRow, victim: InodeRow, cred: Cred) -> bool:
    """In a sticky directory only the file's owner, the directory's owner or root may remove it."""
    if not dir_row.mode & stat.S_ISVTX or cred.root:
        return True
    return cred.uid in (victim.uid, dir_row.uid)


def check_name(name: str) -> None:
    """Validate one path component."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise err(errno.EINVAL, f"invalid name {name!r}")
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise err(errno.ENAMETOOLONG)


def new_owner(parent: InodeRow, cred: Cred, mode: int) -> tuple[int, int]:
    """(gid, mode) of a new inode: setgid directories pass on their group (and, to subdirectories, the bit)."""
    if parent.mode & stat.S_ISGID:
        gid = parent.gid
        if stat.S_ISDIR(mode):
            mode |= stat.S_ISGID
        elif mode & stat.S_ISGID and not cred.root and not cred.in_group(gid):
            mode &= ~stat.S_ISGID
    else:
        gid = cred.gid
    return gid, mode


def chmod_mode(row: InodeRow, cred: Cred, mode: int) -> int:
    """New permission bits for chmod; a non-root caller outside the group loses setgid."""
    require_owner(row, cred)
    mode &= 0o7777
    if not cred.root and not cred.in_group(row.gid) and mode & stat.S_ISGID:
        mode &= ~stat.S_ISGID
    return (row.mode & ~0o7777) | mode


def chown_check(row: InodeRow, cred: Cred, uid: int | None, gid: int | None) -> None:
    """Only root changes the owner; the owner may change the group to one of its own groups."""
    if cred.root:
        return
    if uid is not None and uid != row.uid:
        raise err(errno.EPERM)
    if gid is not None and gid != row.gid:
        if cred.uid != row.uid or not cred.in_group(gid):
            raise err(errno.EPERM)


def clear_suid(mode: int, cred: Cred | None = None) -> int:
    """Bits left after a write or chown: setuid goes, setgid goes if group-executable."""
    if cred is not None and cred.root:
        return mode
    if stat.S_ISDIR(mode):
        return mode
    mode &= ~stat.S_ISUID
    if mode & stat.S_IXGRP:
        mode &= ~stat.S_ISGID
    return mode


def only_clears_suid(old: int, new: int) -> bool:
    """A mode change that only drops setuid/setgid: what the kernel sends when a
    non-owner writes to such a file (file_remove_privs), so anyone may make it."""
    old, new = old & 0o7777, new & 0o7777
    return new != old and new | (stat.S_ISUID | stat.S_ISGID) == old | (stat.S_ISUID | stat.S_ISGID) \
        and new & ~old == 0
