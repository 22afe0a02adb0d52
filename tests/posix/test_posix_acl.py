"""POSIX ACLs through the mount, enforced as on ext4, proven as other users (issue 41).

ACLs are set as root with setxattr of the Linux xattr format (master/acl.py builds the
values), so these run without the acl tools; the setfacl/getfacl round trip skips with
a reason when they are absent (Makefile APT_PKGS installs them).  Each access is made in
a child that dropped to an unprivileged uid/gid/groups (``as_user``, in the test's directory: ``u``).
"""
from __future__ import annotations

import errno
import functools
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from curvine_py.master import acl
from curvine_py.master.acl import GROUP, GROUP_OBJ, MASK, OTHER, UNDEFINED_ID, USER, USER_OBJ, Acl, Entry

pytestmark = pytest.mark.timeout(120)

U1, U2, U3 = 1000, 1001, 1002     # unprivileged users; only ACL entries name U1 and U2
G_SHARED = 2000
ERR = "errno"
AsUser = Callable[..., Any]


def E(code: int) -> tuple[str, int]:
    return (ERR, code)


def acl_of(user: int = 7, users: dict[int, int] | None = None, group: int = 0,
           groups: dict[int, int] | None = None, mask: int | None = 7, other: int = 0) -> bytes:
    """An ACL's xattr value: u::user, u:<uid>:perm..., g::group, g:<gid>:perm..., m::mask, o::other."""
    e = [Entry(USER_OBJ, user, UNDEFINED_ID)]
    e += [Entry(USER, p, u) for u, p in sorted((users or {}).items())]
    e.append(Entry(GROUP_OBJ, group, UNDEFINED_ID))
    e += [Entry(GROUP, p, g) for g, p in sorted((groups or {}).items())]
    if mask is not None:
        e.append(Entry(MASK, mask, UNDEFINED_ID))
    e.append(Entry(OTHER, other, UNDEFINED_ID))
    return Acl(tuple(e)).to_bytes()


def read_file(name: str) -> bytes:
    with open(name, "rb") as f:
        return f.read()


def write_file(name: str, data: bytes = b"w") -> int:
    fd = os.open(name, os.O_WRONLY)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


def run(path: str) -> int:
    return subprocess.run([path], check=False).returncode


def create(name: str, mode: int) -> int:
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
    return stat.S_IMODE(os.stat(name).st_mode)


def mkdir(name: str, mode: int) -> int:
    os.mkdir(name, mode)
    return stat.S_IMODE(os.stat(name).st_mode)


def mode_of(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def stored(p: Path, name: str = acl.ACCESS) -> Acl | None:
    return acl.parse(os.getxattr(p, name))


@pytest.fixture
def u(d: Path, as_user: AsUser) -> AsUser:
    """as_user in the test's directory: paths are relative to it (pytest's tmp dirs above
    it are 0700, which the users could not search)."""
    return functools.partial(as_user, cwd=d)


@pytest.fixture
def f(d: Path) -> Path:
    """A root-owned file 0600 holding b"data"."""
    p = d / "f"
    p.write_bytes(b"data")
    os.chmod(p, 0o600)
    return p


def test_named_user_entries_allow_and_deny(f: Path, u: AsUser) -> None:
    assert u(read_file, "f", uid=U1) == E(errno.EACCES)
    os.setxattr(f, acl.ACCESS, acl_of(6, {U1: 6, U2: 0}, mask=6, other=4))
    assert mode_of(f) == 0o664, "the mode shows owner, mask, other"
    assert u(read_file, "f", uid=U1) == b"data"
    assert u(write_file, "f", uid=U1) == 1
    assert u(read_file, "f", uid=U2) == E(errno.EACCES), "u:U2:--- beats other's r"
    assert u(read_file, "f", uid=U3) == b"wata"
    assert u(write_file, "f", uid=U3) == E(errno.EACCES)


def test_group_entries_allow_and_deny(f: Path, u: AsUser) -> None:
    os.setxattr(f, acl.ACCESS, acl_of(6, group=0, groups={G_SHARED: 4}, mask=6, other=0))
    assert u(read_file, "f", uid=U2, groups=[G_SHARED]) == b"data"
    assert u(write_file, "f", uid=U2, groups=[G_SHARED]) == E(errno.EACCES)
    assert u(read_file, "f", uid=U2) == E(errno.EACCES)
    os.chown(f, 0, G_SHARED)   # the owning group's entry (g::---) now matches too: any match that grants
    assert u(read_file, "f", uid=U2, gid=G_SHARED) == b"data"


def test_the_mask_limits_and_chmod_sets_it(f: Path, u: AsUser) -> None:
    os.setxattr(f, acl.ACCESS, acl_of(6, {U1: 7}, groups={G_SHARED: 6}, mask=4, other=0))
    assert mode_of(f) == 0o640
    assert u(read_file, "f", uid=U1) == b"data"
    assert u(write_file, "f", uid=U1) == E(errno.EACCES), "masked to r--"
    assert u(write_file, "f", uid=U2, groups=[G_SHARED]) == E(errno.EACCES)
    os.chmod(f, 0o660)   # chmod's group bits are the mask's
    got = stored(f)
    assert got is not None and got.perm(MASK) == 6 and got.perm(USER) == 7 and got.perm(GROUP_OBJ) == 0
    assert u(write_file, "f", uid=U1) == 1
    assert u(write_file, "f", uid=U2, groups=[G_SHARED]) == 1
    os.chmod(f, 0o600)
    assert u(read_file, "f", uid=U1) == E(errno.EACCES), "mask ---"


def test_execute_and_search_through_entries(d: Path, u: AsUser) -> None:
    sub = d / "private"
    sub.mkdir(mode=0o700)
    (sub / "x").write_bytes(b"#!/bin/sh\nexit 7\n")
    os.chmod(sub / "x", 0o700)
    assert u(os.stat, "private/x", uid=U1) == E(errno.EACCES)
    os.setxattr(sub, acl.ACCESS, acl_of(7, {U1: 1}, mask=1))
    os.setxattr(sub / "x", acl.ACCESS, acl_of(7, {U1: 5, U2: 4}, mask=5))
    assert u(run, "private/x", uid=U1) == 7
    assert u(run, "private/x", uid=U2) == E(errno.EACCES)   # not even searchable for U2
    assert u(os.listdir, "private", uid=U1) == E(errno.EACCES), "--x: search, no listing"
    os.chmod(sub, 0o711)   # the mask (and the mode) let anyone search: U2 may, by other's x
    assert u(run, "private/x", uid=U2) == E(errno.EACCES), "r-- of its entry: no exec"


def test_an_acl_set_after_lookups_were_cached_is_enforced(d: Path, u: AsUser) -> None:
    """The mount checks cached lookups against a directory's mode itself: an ACL on the
    directory (its mode unchanged) must end that (master/schema.py perms_set, _looked_up)."""
    sub = d / "open"
    sub.mkdir(mode=0o711)
    (sub / "g").write_bytes(b"g")
    os.chmod(sub / "g", 0o644)
    for _ in range(2):   # the second lookup may come from the mount's cache
        assert u(read_file, "open/g", uid=U2) == b"g"
    os.setxattr(sub, acl.ACCESS, acl_of(7, {U2: 0}, group=1, mask=1, other=1))
    assert mode_of(sub) == 0o711
    for _ in range(2):
        assert u(read_file, "open/g", uid=U2) == E(errno.EACCES)
        assert u(read_file, "open/g", uid=U1) == b"g"


def test_default_acls_are_inherited(d: Path, u: AsUser) -> None:
    top = d / "shared"
    top.mkdir()
    os.chmod(top, 0o777)
    default = acl_of(7, {U2: 7}, group=5, mask=7, other=5)
    os.setxattr(top, acl.DEFAULT, default)
    assert u(create, "shared/file", 0o640, uid=U1, umask=0) == 0o640
    got = stored(top / "file")
    assert got is not None and (got.perm(USER_OBJ), got.perm(USER), got.perm(MASK), got.perm(OTHER)) == (6, 7, 4, 0)
    assert u(read_file, "shared/file", uid=U2) == b""
    assert u(write_file, "shared/file", uid=U2) == E(errno.EACCES), "the mask came from the mode"
    with pytest.raises(OSError) as e:
        os.getxattr(top / "file", acl.DEFAULT)
    assert e.value.errno == errno.ENODATA, "a file gets no default ACL"
    assert u(mkdir, "shared/dir", 0o770, uid=U1, umask=0) == 0o770
    assert os.getxattr(top / "dir", acl.DEFAULT) == default, "a directory inherits the default ACL itself"
    assert u(create, "shared/dir/deeper", 0o666, uid=U1, umask=0) == 0o664
    assert u(write_file, "shared/dir/deeper", uid=U2) == 1
    assert u(create, "shared/dir/x", 0o666, uid=U3, umask=0) == E(errno.EACCES), "o:: of dir is ---"


def test_malformed_acls_are_einval_and_other_system_xattrs_unsupported(f: Path) -> None:
    good = acl_of(6, {U1: 4}, mask=4)
    for bad in (good[:-3], good[:4] + good[12:], acl_of(6, {U1: 4}, mask=None)):
        with pytest.raises(OSError) as e:
            os.setxattr(f, acl.ACCESS, bad)
        assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        os.setxattr(f, acl.DEFAULT, good)
    assert e.value.errno == errno.EACCES, "a default ACL on a file"
    with pytest.raises(OSError) as e:
        os.setxattr(f, "system.curvine_test", b"x")
    assert e.value.errno == errno.EOPNOTSUPP
    assert acl.ACCESS not in os.listxattr(f)


def test_only_the_owner_sets_an_acl(d: Path, u: AsUser) -> None:
    p = d / "mine"
    p.write_bytes(b"")
    os.chown(p, U1, U1)
    assert u(os.setxattr, "mine", acl.ACCESS, acl_of(6, {U1: 6}, mask=6), uid=U2) == E(errno.EPERM)
    assert u(os.setxattr, "mine", acl.ACCESS, acl_of(6, {U2: 6}, mask=6), uid=U1) is None
    assert u(write_file, "mine", uid=U2) == 1


def test_setfacl_getfacl_round_trip(f: Path, d: Path, u: AsUser) -> None:
    if shutil.which("setfacl") is None or shutil.which("getfacl") is None:
        pytest.skip("setfacl/getfacl are not installed (the Debian package acl: Makefile APT_PKGS)")
    os.chmod(f, 0o644)
    subprocess.run(["setfacl", "-m", f"u:{U1}:rw,g:{G_SHARED}:r,u:nobody:---", str(f)], check=True)
    shown = subprocess.run(["getfacl", "-n", "--omit-header", str(f)], check=True, capture_output=True,
                           text=True).stdout.split()
    assert {f"user:{U1}:rw-", f"group:{G_SHARED}:r--", "user:65534:---", "mask::rw-", "other::r--"} <= set(shown)
    assert u(read_file, "f", uid=65534, gid=65534) == E(errno.EACCES), "u:nobody:--- is enforced"
    assert u(write_file, "f", uid=U1) == 1
    subprocess.run(["setfacl", "-m", "m::r", str(f)], check=True)
    assert mode_of(f) == 0o644 and u(write_file, "f", uid=U1) == E(errno.EACCES)
    subprocess.run(["setfacl", "-b", str(f)], check=True)
    assert acl.ACCESS not in os.listxattr(f) and u(read_file, "f", uid=65534, gid=65534) == b"wata"
    top = d / "dflt"
    top.mkdir(mode=0o755)
    subprocess.run(["setfacl", "-d", "-m", f"u:{U1}:rwx", str(top)], check=True)
    (top / "new").write_bytes(b"")
    shown = subprocess.run(["getfacl", "-n", "--omit-header", str(top / "new")], check=True, capture_output=True,
                           text=True).stdout.split()
    assert f"user:{U1}:rwx" in shown and any(s.startswith("mask::") for s in shown)




def test_a_default_acl_replaces_the_umask(d: Path, u: AsUser) -> None:
    """POSIX.1e and ext4: with a default ACL the umask is not applied (0666 under umask
    022 gives 0664, mask rw-): the mount asks the kernel for FUSE_DONT_MASK (the mode
    arrives unmasked, the umask beside it) and the master applies the umask only where
    the directory has no default ACL."""
    top = d / "shared"
    top.mkdir()
    os.chmod(top, 0o777)
    os.setxattr(top, acl.DEFAULT, acl_of(7, {U2: 7}, group=5, mask=7, other=5))
    assert u(create, "shared/file", 0o666, uid=U1, umask=0o022) == 0o664
    plain = d / "plain"   # no default ACL: the umask is applied, by the master now
    plain.mkdir()
    os.chmod(plain, 0o777)
    assert u(create, "plain/file", 0o666, uid=U1, umask=0o027) == 0o640
