"""POSIX.1e access control lists: their xattr format, their rules and their check.

An ACL travels as Linux's xattr value of ``system.posix_acl_access`` (the access ACL:
checked on every access) and ``system.posix_acl_default`` (a directory's default ACL: what
a new file or directory in it starts with).  The master stores each as that value,
canonical, in its inode row (``inodes.acl``, ``inodes.default_acl``), so a permission check
reads it with the inode and an inode without one costs nothing more.  ``stored`` is
cached by value: the few distinct ACLs of a tree are parsed once.

The rules are the kernel's (fs/posix_acl.c): ``parse`` refuses what
``posix_acl_from_xattr`` + ``posix_acl_valid`` refuse (EINVAL; a version other than 2:
EOPNOTSUPP), ``Acl.allows`` is ``posix_acl_permission``, ``Acl.chmod`` is
``posix_acl_chmod``, ``inherit`` is ``posix_acl_create``, and an ACL that says no more than
the mode bits (``minimal``) is stored as just the mode, as Linux drops such an xattr.
"""
from __future__ import annotations

import errno
import functools
import struct
from dataclasses import dataclass
from typing import Callable

from curvine_py.common.errors import err

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
NAMES = (ACCESS, DEFAULT)

VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
UNDEFINED_ID = 0xFFFFFFFF
MAX_ENTRIES = 1024          # far more than any tool makes; bounds a hostile value's parse

_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_NAMED = (USER, GROUP)
# The order entries must come in (posix_acl_valid's state machine); named entries may repeat.
_ORDER = {USER_OBJ: 0, USER: 1, GROUP_OBJ: 2, GROUP: 3, MASK: 4, OTHER: 5}


@dataclass(frozen=True)
class Entry:
    tag: int
    perm: int           # rwx bits, 0-7
    id: int             # uid or gid of a named entry; UNDEFINED_ID otherwise


@dataclass(frozen=True)
class Acl:
    """A valid ACL, its entries in canonical order."""
    entries: tuple[Entry, ...]

    def perm(self, tag: int) -> int | None:
        """The perm of the (single) entry with this tag, None when absent."""
        for e in self.entries:
            if e.tag == tag:
                return e.perm
        return None

    @property
    def minimal(self) -> bool:
        """Owner, group and other only: it says exactly what the mode bits say."""
        return len(self.entries) == 3

    def mode_bits(self) -> int:
        """The permission bits the mode shows: owner, the mask (or owning group), other."""
        group = self.perm(MASK)
        if group is None:
            group = self.perm(GROUP_OBJ) or 0
        return ((self.perm(USER_OBJ) or 0) << 6) | (group << 3) | (self.perm(OTHER) or 0)

    def chmod(self, mode: int) -> Acl:
        """This ACL after a chmod to mode: owner and other take the mode's bits, and the
        mask (the owning group's entry when there is no mask) takes the group bits."""
        group_tag = MASK if self.perm(MASK) is not None else GROUP_OBJ
        new = {USER_OBJ: (mode >> 6) & 7, group_tag: (mode >> 3) & 7, OTHER: mode & 7}
        return Acl(tuple(Entry(e.tag, new[e.tag], e.id) if e.tag in new else e for e in self.entries))

    def allows(self, owner_gid: int, uid: int, in_group: Callable[[int], bool], want: int) -> bool:
        """The POSIX.1e check for a caller who is not the owner (the owner's bits are the
        mode's): a named user entry, else the owning group and named groups (any one that
        grants), each limited by the mask; else other, but only when no group matched."""
        mask = self.perm(MASK)
        limit = 7 if mask is None else mask
        group_matched = False
        for e in self.entries:
            if e.tag == USER and e.id == uid:
                return e.perm & limit & want == want
            if (e.tag == GROUP_OBJ and in_group(owner_gid)) or (e.tag == GROUP and in_group(e.id)):
                group_matched = True
                if e.perm & limit & want == want:
                    return True
        if group_matched:
            return False
        return (self.perm(OTHER) or 0) & want == want

    def to_bytes(self) -> bytes:
        return _HEADER.pack(VERSION) + b"".join(_ENTRY.pack(e.tag, e.perm, e.id) for e in self.entries)


def parse(value: bytes) -> Acl | None:
    """A stored or offered xattr value as an Acl; None for an empty one (no entries: what
    setfacl -b / -k leave, meaning "remove").  EINVAL for anything the kernel refuses."""
    if len(value) < _HEADER.size or (len(value) - _HEADER.size) % _ENTRY.size:
        raise err(errno.EINVAL, f"ACL xattr of {len(value)} bytes: not 4 + 8n")
    if _HEADER.unpack_from(value)[0] != VERSION:
        raise err(errno.EOPNOTSUPP, f"ACL xattr version {_HEADER.unpack_from(value)[0]} (only 2)")
    count = (len(value) - _HEADER.size) // _ENTRY.size
    if count == 0:
        return None
    if count > MAX_ENTRIES:
        raise err(errno.EINVAL, f"ACL of {count} entries (at most {MAX_ENTRIES})")
    entries = tuple(_entry(*_ENTRY.unpack_from(value, _HEADER.size + i * _ENTRY.size)) for i in range(count))
    _check(entries)
    return Acl(entries)


def _entry(tag: int, perm: int, id_: int) -> Entry:
    if tag not in _ORDER:
        raise err(errno.EINVAL, f"ACL entry tag {tag:#x}")
    if perm & ~7:
        raise err(errno.EINVAL, f"ACL entry perm {perm:#o}")
    return Entry(tag, perm, id_ if tag in _NAMED else UNDEFINED_ID)


def _check(entries: tuple[Entry, ...]) -> None:
    """posix_acl_valid: one owner, owning group and other; named users and groups each in
    ascending id order without repeats; a mask when there is any named entry; in order."""
    order = [_ORDER[e.tag] for e in entries]
    if order != sorted(order):
        raise err(errno.EINVAL, "ACL entries out of order")
    for tag in (USER_OBJ, GROUP_OBJ, OTHER):
        if sum(e.tag == tag for e in entries) != 1:
            raise err(errno.EINVAL, "an ACL needs exactly one owner, owning group and other entry")
    if sum(e.tag == MASK for e in entries) > 1:
        raise err(errno.EINVAL, "an ACL has at most one mask entry")
    for tag in _NAMED:
        ids = [e.id for e in entries if e.tag == tag]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise err(errno.EINVAL, "named ACL entries out of order or repeated")
    if any(e.tag in _NAMED for e in entries) and not any(e.tag == MASK for e in entries):
        raise err(errno.EINVAL, "an ACL with named entries needs a mask entry")


def from_mode(mode: int) -> Acl:
    """The minimal ACL that says what the mode bits say."""
    return Acl((Entry(USER_OBJ, (mode >> 6) & 7, UNDEFINED_ID), Entry(GROUP_OBJ, (mode >> 3) & 7, UNDEFINED_ID),
                Entry(OTHER, mode & 7, UNDEFINED_ID)))


def inherit(default: Acl, mode: int) -> tuple[Acl | None, int]:
    """posix_acl_create: a new inode's access ACL (None: the mode says it all) and its
    permission bits, from its directory's default ACL and the mode it was made with (no
    umask: the default ACL takes its place).  Owner, other and the mask (the owning group
    when there is no mask) are cut down to the mode's bits."""
    cut = {USER_OBJ: (mode >> 6) & 7, OTHER: mode & 7,
           MASK if default.perm(MASK) is not None else GROUP_OBJ: (mode >> 3) & 7}
    acl = Acl(tuple(Entry(e.tag, e.perm & cut[e.tag], e.id) if e.tag in cut else e for e in default.entries))
    bits = (mode & ~0o777) | acl.mode_bits()
    return (None if acl.minimal else acl), bits


def stored(value: bytes | None) -> Acl | None:
    """A stored column's ACL (None: no ACL)."""
    return _stored(bytes(value)) if value else None


@functools.lru_cache(maxsize=1024)   # stored values only (valid, at most 8 KiB each): offered ones are not kept
def _stored(value: bytes) -> Acl | None:
    return parse(value)
