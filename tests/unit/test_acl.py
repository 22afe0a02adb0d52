"""POSIX.1e ACLs: the xattr format's checks, the access algorithm, chmod and inheritance
(master/acl.py), and the namespace keeping, enforcing and inheriting them."""
from __future__ import annotations

import errno
import sqlite3
import stat
import struct
from pathlib import Path
from typing import Iterator

import pytest

from curvine_py.common.errors import CurvineError
from curvine_py.common.types import ROOT_INO, SETATTR_MODE
from curvine_py.master import acl, posix, schema
from curvine_py.master.acl import GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ
from curvine_py.master.posix import R, W, X, Cred
from curvine_py.master.records import Mknod, Removexattr, Setattr, Setxattr
from curvine_py.master.store import InodeRow
from tests.unit.test_namespace import NS

OWNER = Cred(1000, 1000, frozenset())
NAMED = Cred(1001, 1001, frozenset())           # a named user entry's
MEMBER = Cred(1002, 1002, frozenset({2000}))    # a named group entry's member
GROUPIE = Cred(1003, 1000, frozenset())         # in the owning group
STRANGER = Cred(1004, 1004, frozenset())


def value(*entries: tuple[int, int, int], version: int = 2) -> bytes:
    return struct.pack("<I", version) + b"".join(struct.pack("<HHI", *e) for e in entries)


U = 0xFFFFFFFF


def full(user: int = 6, named: int = 6, group: int = 4, dgroup: int = 6, mask: int = 6, other: int = 0) -> bytes:
    """u::user, u:1001:named, g::group, g:2000:dgroup, m::mask, o::other."""
    return value((USER_OBJ, user, U), (USER, named, 1001), (GROUP_OBJ, group, U), (GROUP, dgroup, 2000),
                 (MASK, mask, U), (OTHER, other, U))


# ---------------------------------------------------------------- the format


@pytest.mark.parametrize("bad", [
    b"", b"\x02\x00\x00", value((USER_OBJ, 6, U))[:-1],                            # sizes
    value((USER_OBJ, 6, U), (GROUP_OBJ, 4, U)),                                    # no other
    value((USER_OBJ, 6, U), (GROUP_OBJ, 4, U), (OTHER, 0, U), (OTHER, 0, U)),       # two others
    value((GROUP_OBJ, 4, U), (USER_OBJ, 6, U), (OTHER, 0, U)),                      # out of order
    value((USER_OBJ, 6, U), (USER, 4, 7), (GROUP_OBJ, 4, U), (OTHER, 0, U)),        # named, no mask
    value((USER_OBJ, 6, U), (USER, 4, 9), (USER, 4, 7), (GROUP_OBJ, 4, U), (MASK, 7, U), (OTHER, 0, U)),
    value((USER_OBJ, 6, U), (USER, 4, 7), (USER, 4, 7), (GROUP_OBJ, 4, U), (MASK, 7, U), (OTHER, 0, U)),
    value((USER_OBJ, 8, U), (GROUP_OBJ, 4, U), (OTHER, 0, U)),                      # perm bits
    value((USER_OBJ, 6, U), (0x40, 4, U), (GROUP_OBJ, 4, U), (OTHER, 0, U)),        # tag
])
def test_malformed_or_noncanonical_acls_are_einval(bad: bytes) -> None:
    with pytest.raises(CurvineError) as e:
        acl.parse(bad)
    assert e.value.errno == errno.EINVAL


def test_version_other_than_2_is_eopnotsupp_and_empty_means_none() -> None:
    with pytest.raises(CurvineError) as e:
        acl.parse(value((USER_OBJ, 6, U), (GROUP_OBJ, 4, U), (OTHER, 0, U), version=1))
    assert e.value.errno == errno.EOPNOTSUPP
    assert acl.parse(value()) is None


def test_round_trip_is_canonical() -> None:
    offered = value((USER_OBJ, 6, 5), (GROUP_OBJ, 4, 5), (OTHER, 0, 5))   # ids of unnamed entries ignored
    a = acl.parse(offered)
    assert a is not None and a.minimal and a.mode_bits() == 0o640
    assert a.to_bytes() == value((USER_OBJ, 6, U), (GROUP_OBJ, 4, U), (OTHER, 0, U))
    assert acl.parse(full()).to_bytes() == full()   # type: ignore[union-attr]


# ---------------------------------------------------------------- the access check


@pytest.mark.parametrize("cred, want, ok", [
    (NAMED, R | W, True), (NAMED, X, False),
    (MEMBER, R | W, True), (MEMBER, X, False),
    (GROUPIE, R, True), (GROUPIE, W, False),
    (STRANGER, R, False),
])
def test_named_entries_owning_group_and_other(cred: Cred, want: int, ok: bool) -> None:
    assert posix.allowed(stat.S_IFREG | 0o660, 1000, 1000, cred, want, full()) is ok


def test_the_mask_limits_named_users_and_groups_not_the_owner_or_other() -> None:
    masked = full(named=7, dgroup=7, mask=4, other=7)
    assert posix.allowed(stat.S_IFREG | 0o647, 1000, 1000, NAMED, R, masked)
    assert not posix.allowed(stat.S_IFREG | 0o647, 1000, 1000, NAMED, W, masked)
    assert not posix.allowed(stat.S_IFREG | 0o647, 1000, 1000, MEMBER, X, masked)
    assert posix.allowed(stat.S_IFREG | 0o647, 1000, 1000, STRANGER, R | W | X, masked)
    assert posix.allowed(stat.S_IFREG | 0o647, 1000, 1000, OWNER, R | W, masked)


def test_a_matching_group_that_denies_hides_other() -> None:
    """A caller in a group entry gets none of other's bits, even when other grants more."""
    a = full(group=0, dgroup=0, other=7, mask=7)
    assert not posix.allowed(stat.S_IFREG | 0o777, 1000, 1000, MEMBER, R, a)
    both = Cred(1002, 1000, frozenset({2000}))   # in two group entries: any one that grants
    assert posix.allowed(stat.S_IFREG | 0o777, 1000, 1000, both, R, full(group=0, dgroup=4))


def test_a_named_user_entry_wins_over_its_groups() -> None:
    named_in_group = Cred(1001, 1000, frozenset({2000}))
    assert not posix.allowed(stat.S_IFREG | 0o660, 1000, 1000, named_in_group, R, full(named=0, group=6))


# ---------------------------------------------------------------- chmod and inheritance


def test_chmod_sets_the_mask_and_mode_bits_show_it() -> None:
    a = acl.parse(full()).chmod(0o751)   # type: ignore[union-attr]
    assert (a.perm(USER_OBJ), a.perm(MASK), a.perm(OTHER), a.perm(GROUP_OBJ)) == (7, 5, 1, 4)
    assert a.mode_bits() == 0o751
    minimal = acl.from_mode(0o640).chmod(0o705)
    assert minimal.perm(GROUP_OBJ) == 0 and minimal.mode_bits() == 0o705


def test_inherit_cuts_owner_mask_and_other_to_the_create_mode() -> None:
    access, bits = acl.inherit(acl.parse(full(user=7, mask=7, other=5)), 0o640)   # type: ignore[arg-type]
    assert access is not None and bits == 0o640
    assert (access.perm(USER_OBJ), access.perm(MASK), access.perm(OTHER), access.perm(USER)) == (6, 4, 0, 6)
    none, bits = acl.inherit(acl.from_mode(0o750), 0o666)
    assert none is None and bits == 0o640


# ---------------------------------------------------------------- the namespace


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NS]:
    n = NS(tmp_path)
    n.do(Setattr, ino=ROOT_INO, valid=SETATTR_MODE, mode=0o777)   # (as root) others may make names here
    yield n
    n.journal.stop()


def set_acl(ns: NS, ino: int, data: bytes, name: str = acl.ACCESS, cred: Cred = OWNER) -> None:
    ns.do(Setxattr, cred, ino=ino, name=name, value=data)


def mkfile(ns: NS, mode: int = 0o600, parent: int = ROOT_INO, name: str = "f") -> InodeRow:
    return ns.do(Mknod, OWNER, parent=parent, name=name, mode=stat.S_IFREG | mode, umask=0o022)["attr"]


def test_an_access_acl_is_enforced_and_sets_the_mode(ns: NS) -> None:
    ns.mkdir(ROOT_INO, "d", 0o777)
    d = ns.lookup(ROOT_INO, "d").ino
    f = mkfile(ns, parent=d)
    with pytest.raises(CurvineError) as e:
        posix.require(ns.ns.inode(f.ino), NAMED, R)
    assert e.value.errno == errno.EACCES
    set_acl(ns, f.ino, full())
    row = ns.ns.inode(f.ino)
    assert stat.S_IMODE(row.mode) == 0o660 and row.acl == full()
    posix.require(row, NAMED, R | W)
    posix.require(row, MEMBER, W)
    assert ns.ns.getxattr(STRANGER, f.ino, acl.ACCESS) == full()
    assert acl.ACCESS in ns.ns.listxattr(STRANGER, f.ino)
    with pytest.raises(CurvineError) as e:
        posix.require(row, STRANGER, R)
    assert e.value.errno == errno.EACCES


def test_setting_an_acl_is_for_the_owner_and_must_be_valid(ns: NS) -> None:
    f = mkfile(ns)
    for cred, data, code in ((NAMED, full(), errno.EPERM), (OWNER, full()[:-2], errno.EINVAL),
                             (OWNER, value((USER_OBJ, 6, U), (OTHER, 0, U)), errno.EINVAL)):
        with pytest.raises(CurvineError) as e:
            set_acl(ns, f.ino, data, cred=cred)
        assert e.value.errno == code
    assert ns.ns.inode(f.ino).acl is None
    with pytest.raises(CurvineError) as e:
        set_acl(ns, f.ino, full(), name=acl.DEFAULT)
    assert e.value.errno == errno.EACCES, "a default ACL on a file"
    with pytest.raises(CurvineError) as e:
        ns.do(Setxattr, OWNER, ino=f.ino, name="system.nfs4_acl", value=b"x")
    assert e.value.errno == errno.EOPNOTSUPP, "an ACL kind nothing would enforce is refused"


def test_a_minimal_acl_is_only_the_mode(ns: NS) -> None:
    f = mkfile(ns)
    set_acl(ns, f.ino, value((USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 1, U)))
    row = ns.ns.inode(f.ino)
    assert row.acl is None and stat.S_IMODE(row.mode) == 0o751
    assert acl.ACCESS not in ns.ns.listxattr(OWNER, f.ino)


def test_chmod_updates_the_mask(ns: NS) -> None:
    f = mkfile(ns)
    set_acl(ns, f.ino, full())
    ns.do(Setattr, OWNER, ino=f.ino, valid=SETATTR_MODE, mode=0o640)
    row = ns.ns.inode(f.ino)
    assert acl.parse(row.acl).perm(MASK) == 4   # type: ignore[union-attr]
    posix.require(row, NAMED, R)
    with pytest.raises(CurvineError):
        posix.require(row, NAMED, W)
    ns.do(Removexattr, OWNER, ino=f.ino, name=acl.ACCESS)
    with pytest.raises(CurvineError):
        posix.require(ns.ns.inode(f.ino), NAMED, R)


def test_default_acl_inherited_by_files_and_directories(ns: NS) -> None:
    d = ns.do(Mknod, OWNER, parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755, umask=0)["attr"].ino
    set_acl(ns, d, full(user=7, named=7, mask=7, other=5), name=acl.DEFAULT)
    f = mkfile(ns, 0o666, parent=d)   # umask 022 is not applied: the default ACL decides
    assert stat.S_IMODE(f.mode) == 0o664
    inherited = acl.parse(f.acl)
    assert inherited is not None and f.default_acl is None
    assert (inherited.perm(USER), inherited.perm(MASK), inherited.perm(OTHER)) == (7, 6, 4), "the mask is cut"
    posix.require(f, NAMED, R | W)
    with pytest.raises(CurvineError):
        posix.require(f, NAMED, X)
    sub = ns.do(Mknod, OWNER, parent=d, name="sub", mode=stat.S_IFDIR | 0o750, umask=0o077)["attr"]
    assert stat.S_IMODE(sub.mode) == 0o750
    assert sub.default_acl == full(user=7, named=7, mask=7, other=5)
    assert acl.parse(sub.acl).perm(MASK) == 5   # type: ignore[union-attr]
    posix.require(sub, NAMED, R | X)
    deeper = mkfile(ns, 0o600, parent=sub.ino, name="g")
    assert acl.parse(deeper.acl).perm(MASK) == 0   # type: ignore[union-attr]
    with pytest.raises(CurvineError):
        posix.require(deeper, NAMED, R)


def test_old_store_acl_xattrs_move_into_the_columns(tmp_path: Path) -> None:
    """A store from before enforcement kept ACLs in the xattrs table: at open they become
    enforced (a minimal or broken one is dropped)."""
    path = str(tmp_path / "old.db")
    conn = schema.open_db(path)
    schema.init_db(conn, 4 << 20, 2)
    conn.execute("ALTER TABLE inodes DROP COLUMN acl")
    conn.execute("ALTER TABLE inodes DROP COLUMN default_acl")
    conn.execute("INSERT INTO xattrs VALUES (?,?,?)", (ROOT_INO, acl.ACCESS, full()))
    conn.execute("INSERT INTO xattrs VALUES (?,?,?)", (ROOT_INO, acl.DEFAULT, b"junk"))
    conn.close()
    conn = schema.open_db(path)
    schema.init_db(conn, 4 << 20, 2)
    conn.row_factory = sqlite3.Row
    row = conn.execute("SELECT acl, default_acl FROM inodes WHERE ino=?", (ROOT_INO,)).fetchone()
    assert (row["acl"], row["default_acl"]) == (full(), None)
    assert conn.execute("SELECT count(*) FROM xattrs").fetchone()[0] == 0


def test_a_retried_create_answers_the_inherited_acl_as_bytes(ns: NS) -> None:
    """The retry cache keeps results as JSON (bytes as hex): a retry's row is the same."""
    d = ns.do(Mknod, OWNER, parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755, umask=0)["attr"].ino
    set_acl(ns, d, full(), name=acl.DEFAULT)
    first = ns.do(Mknod, OWNER, parent=d, name="f", mode=stat.S_IFREG | 0o644, umask=0, request_id="r1")
    again = ns.do(Mknod, OWNER, parent=d, name="f", mode=stat.S_IFREG | 0o644, umask=0, request_id="r1")
    assert again["attr"].acl == first["attr"].acl and isinstance(again["attr"].acl, bytes)
    posix.require(again["attr"], NAMED, R)
