"""Ownership and permissions through the mount, exactly as on ext4, proven as other users.

Each check runs in a forked child that dropped to an unprivileged uid/gid
(setgroups + setresgid + setresuid) after entering the test directory, and reports
its result or errno through a pipe (``as_user`` fixture).
"""
from __future__ import annotations

import errno
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

pytestmark = pytest.mark.timeout(120)

U1, U2 = 1000, 1001          # two unprivileged users (groups 1000, 1001)
G_SHARED = 2000              # a group U1 is a supplementary member of
ERR = "errno"


def E(code: int) -> tuple[str, int]:
    return (ERR, code)


def st_mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def create(name: str, data: bytes = b"", mode: int = 0o644) -> tuple[int, int, int]:
    fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
    try:
        os.write(fd, data)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def write_at(name: str, data: bytes, flags: int = os.O_WRONLY) -> int:
    fd = os.open(name, flags)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


def read_file(name: str) -> bytes:
    with open(name, "rb") as f:
        return f.read()


def stat_ids(name: str) -> tuple[int, int, int]:
    st = os.stat(name)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def mkdir_ids(name: str, mode: int = 0o777) -> tuple[int, int, int]:
    os.mkdir(name, mode)
    return stat_ids(name)


AsUser = Callable[..., Any]


# ---------------------------------------------------------------- ownership of new inodes


def test_new_files_get_the_callers_uid_and_gid(d: Path, as_user: AsUser) -> None:
    assert as_user(create, "f", b"x", 0o666, uid=U1, cwd=d, umask=0o022) == (U1, U1, 0o644)
    assert as_user(mkdir_ids, "sub", 0o777, uid=U1, cwd=d, umask=0o027) == (U1, U1, 0o750)
    assert as_user(create, "g", b"", 0o600, uid=U2, gid=G_SHARED, cwd=d) == (U2, G_SHARED, 0o600)
    st = os.lstat(d / "f")
    assert (st.st_uid, st.st_gid) == (U1, U1)
    as_user(os.symlink, "f", "l", uid=U1, cwd=d)
    assert (os.lstat(d / "l").st_uid, os.lstat(d / "l").st_gid) == (U1, U1)
    as_user(os.mkfifo, "p", uid=U1, cwd=d)
    assert (os.stat(d / "p").st_uid, os.stat(d / "p").st_gid) == (U1, U1)


def test_setgid_directory_passes_on_its_group(d: Path, as_user: AsUser) -> None:
    os.mkdir(d / "sg")
    os.chown(d / "sg", 0, G_SHARED)
    os.chmod(d / "sg", 0o2777)
    assert as_user(create, "sg/f", b"", 0o644, uid=U1, cwd=d) == (U1, G_SHARED, 0o644)
    uid, gid, mode = as_user(mkdir_ids, "sg/sub", 0o777, uid=U1, cwd=d, umask=0)
    assert (uid, gid) == (U1, G_SHARED) and mode & stat.S_ISGID, "subdirectories inherit setgid"
    assert as_user(create, "sg/sub/deep", b"", 0o644, uid=U2, cwd=d) == (U2, G_SHARED, 0o644)
    # a setgid bit asked for by a non-member of the inherited group is dropped
    assert as_user(create, "sg/sgidfile", b"", 0o2755, uid=U2, cwd=d) == (U2, G_SHARED, 0o0755)
    assert as_user(create, "sg/member", b"", 0o2755, uid=U1, groups=[G_SHARED], cwd=d) == (U1, G_SHARED, 0o2755)


# ---------------------------------------------------------------- access checks


def test_write_into_a_0444_file_as_non_root_is_eacces(d: Path, as_user: AsUser) -> None:
    (d / "ro").write_bytes(b"orig")
    os.chmod(d / "ro", 0o444)
    assert as_user(write_at, "ro", b"x", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(os.truncate, "ro", 0, uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(read_file, "ro", uid=U1, cwd=d) == b"orig"
    os.chown(d / "ro", U1, U1)        # even the owner may not write a 0444 file
    assert as_user(write_at, "ro", b"x", uid=U1, cwd=d) == E(errno.EACCES)
    assert write_at(str(d / "ro"), b"R") == 1   # root may
    assert (d / "ro").read_bytes() == b"Rrig"


def test_read_and_write_bits_for_owner_group_and_others(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"data")
    os.chown(d / "f", U1, G_SHARED)
    os.chmod(d / "f", 0o640)
    assert as_user(read_file, "f", uid=U1, cwd=d) == b"data"
    assert as_user(read_file, "f", uid=U2, groups=[G_SHARED], cwd=d) == b"data"   # supplementary group
    assert as_user(read_file, "f", uid=U2, cwd=d) == E(errno.EACCES)
    assert as_user(write_at, "f", b"x", uid=U2, groups=[G_SHARED], cwd=d) == E(errno.EACCES)
    os.chmod(d / "f", 0o604)          # owner class decides even when others have more
    os.chown(d / "f", U1, U1)
    assert as_user(read_file, "f", uid=U2, cwd=d) == b"data"
    os.chmod(d / "f", 0o044)
    assert as_user(read_file, "f", uid=U1, cwd=d) == E(errno.EACCES)


def test_directory_permissions(d: Path, as_user: AsUser) -> None:
    os.mkdir(d / "closed", 0o755)
    (d / "closed" / "f").write_bytes(b"")
    assert as_user(create, "closed/new", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(os.mkdir, "closed/sub", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(os.unlink, "closed/f", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(os.rename, "closed/f", "moved", uid=U1, cwd=d) == E(errno.EACCES)
    os.chown(d / "closed" / "f", U1, U1)   # (protected_hardlinks would say EPERM for root's file)
    assert as_user(os.link, "closed/f", "closed/l", uid=U1, cwd=d) == E(errno.EACCES)
    os.chmod(d / "closed", 0o711)     # search but no read
    assert as_user(os.listdir, "closed", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(lambda: os.stat("closed/f").st_size, uid=U1, cwd=d) == 0
    os.chmod(d / "closed", 0o744)     # read but no search
    assert as_user(os.listdir, "closed", uid=U1, cwd=d) == ["f"]
    assert as_user(os.stat, "closed/f", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(read_file, "closed/f", uid=U1, cwd=d) == E(errno.EACCES)


def test_moving_a_directory_to_another_parent_needs_write_on_it(d: Path, as_user: AsUser) -> None:
    os.mkdir(d / "dir", 0o555)        # '..' must be rewritten, so w on the moved directory
    os.mkdir(d / "to", 0o777)
    os.chown(d / "dir", U1, U1)
    assert as_user(os.rename, "dir", "to/dir", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(os.rename, "dir", "dir2", uid=U1, cwd=d) is None   # same parent: allowed


# ---------------------------------------------------------------- sticky directories


def test_sticky_directory_unlink_and_rename_by_another_user_is_eperm(d: Path, as_user: AsUser) -> None:
    os.chmod(d, 0o1777)
    assert as_user(create, "mine", uid=U1, cwd=d)[0] == U1
    assert as_user(os.unlink, "mine", uid=U2, cwd=d) == E(errno.EPERM)
    assert as_user(os.rename, "mine", "stolen", uid=U2, cwd=d) == E(errno.EPERM)
    as_user(create, "theirs", uid=U2, cwd=d)
    assert as_user(os.rename, "theirs", "mine", uid=U2, cwd=d) == E(errno.EPERM)   # over U1's file
    assert as_user(mkdir_ids, "d1", uid=U1, cwd=d)[0] == U1
    assert as_user(os.rmdir, "d1", uid=U2, cwd=d) == E(errno.EPERM)
    assert (d / "mine").exists() and (d / "d1").is_dir()
    assert as_user(os.unlink, "mine", uid=U1, cwd=d) is None      # the owner may
    as_user(create, "x", uid=U2, cwd=d)
    os.chown(d, U1, U1)                                            # the directory's owner may
    assert as_user(os.unlink, "x", uid=U1, cwd=d) is None
    os.chown(d, 0, 0)
    assert os.unlink(d / "theirs") is None                         # root may


# ---------------------------------------------------------------- setuid / setgid clearing


def test_write_by_a_non_owner_clears_setuid_and_setgid(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"abc")
    os.chmod(d / "f", 0o6777)
    assert as_user(write_at, "f", b"X", uid=U1, cwd=d) == 1
    assert (d / "f").read_bytes() == b"Xbc"
    assert st_mode(d / "f") == 0o0777


def test_write_by_the_owner_clears_setuid(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"abc")
    os.chown(d / "f", U1, U1)
    os.chmod(d / "f", 0o4755)
    assert as_user(write_at, "f", b"X", uid=U1, cwd=d) == 1
    assert st_mode(d / "f") == 0o0755


def test_setgid_without_group_exec_survives_a_write(d: Path, as_user: AsUser) -> None:
    """S_ISGID without S_IXGRP marks mandatory locking, not privilege: a write keeps it."""
    (d / "f").write_bytes(b"abc")
    os.chmod(d / "f", 0o2666)
    assert as_user(write_at, "f", b"X", uid=U1, cwd=d) == 1
    assert st_mode(d / "f") == 0o2666


def test_write_by_root_keeps_setuid(d: Path) -> None:
    (d / "f").write_bytes(b"abc")
    os.chmod(d / "f", 0o4755)
    write_at(str(d / "f"), b"X")
    assert st_mode(d / "f") == 0o4755


def test_truncate_by_a_non_owner_clears_setuid(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"abc")
    os.chmod(d / "f", 0o4777)
    assert as_user(os.truncate, "f", 1, uid=U1, cwd=d) is None
    assert os.stat(d / "f").st_size == 1 and st_mode(d / "f") == 0o0777


def test_chown_and_chmod_by_non_owners_are_eperm(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"")
    os.chown(d / "f", U1, U1)
    os.chmod(d / "f", 0o666)
    assert as_user(os.chmod, "f", 0o777, uid=U2, cwd=d) == E(errno.EPERM)
    assert as_user(os.chown, "f", U2, -1, uid=U2, cwd=d) == E(errno.EPERM)
    assert as_user(os.chown, "f", U2, -1, uid=U1, cwd=d) == E(errno.EPERM)      # give away: root only
    assert as_user(os.chown, "f", -1, U2, uid=U1, cwd=d) == E(errno.EPERM)      # not U1's group
    assert as_user(os.chown, "f", -1, G_SHARED, uid=U1, groups=[G_SHARED], cwd=d) is None
    assert os.stat(d / "f").st_gid == G_SHARED
    assert as_user(os.chmod, "f", 0o600, uid=U1, cwd=d) is None
    assert st_mode(d / "f") == 0o600


def test_chown_of_group_by_owner_clears_setuid_and_setgid(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"")
    os.chown(d / "f", U1, U1)
    os.chmod(d / "f", 0o6755)
    assert as_user(os.chown, "f", -1, G_SHARED, uid=U1, groups=[G_SHARED], cwd=d) is None
    assert st_mode(d / "f") == 0o0755


def test_chmod_setgid_by_owner_outside_the_group_drops_the_bit(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"")
    os.chown(d / "f", U1, G_SHARED)
    assert as_user(os.chmod, "f", 0o2755, uid=U1, cwd=d) is None
    assert st_mode(d / "f") == 0o0755
    assert as_user(os.chmod, "f", 0o2755, uid=U1, groups=[G_SHARED], cwd=d) is None
    assert st_mode(d / "f") == 0o2755


# ---------------------------------------------------------------- times and xattrs as others


def _touch_now(name: str) -> None:
    os.utime(name, None)


def test_utimes_rules_for_other_users(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"")
    os.chmod(d / "f", 0o666)
    assert as_user(lambda: os.utime("f", ns=(1, 2)), uid=U1, cwd=d) == E(errno.EPERM)   # explicit: owner only
    before = time.time_ns()
    assert as_user(_touch_now, "f", uid=U1, cwd=d) is None                   # NOW: write access is enough
    assert os.stat(d / "f").st_mtime_ns >= before - 50_000_000
    os.chmod(d / "f", 0o644)
    assert as_user(_touch_now, "f", uid=U1, cwd=d) == E(errno.EACCES)
    os.chown(d / "f", U1, U1)
    assert as_user(lambda: os.utime("f", ns=(3, 4)), uid=U1, cwd=d) is None
    assert os.stat(d / "f").st_mtime_ns == 4


def test_owner_sets_explicit_recent_times_exactly(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"")
    os.chown(d / "f", U1, U1)
    t = time.time_ns() - 30_000_000 + 7
    assert as_user(lambda: os.utime("f", ns=(t, t)), uid=U1, cwd=d) is None
    assert os.stat(d / "f").st_mtime_ns == t and os.stat(d / "f").st_atime_ns == t


def test_xattr_permissions(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"")
    os.chmod(d / "f", 0o644)
    os.setxattr(d / "f", "user.a", b"1")
    os.setxattr(d / "f", "trusted.t", b"2")
    assert as_user(os.getxattr, "f", "user.a", uid=U1, cwd=d) == b"1"
    assert as_user(os.setxattr, "f", "user.a", b"x", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(os.removexattr, "f", "user.a", uid=U1, cwd=d) == E(errno.EACCES)
    assert as_user(os.setxattr, "f", "trusted.t", b"x", uid=U1, cwd=d) == E(errno.EPERM)
    got = as_user(os.getxattr, "f", "trusted.t", uid=U1, cwd=d)
    assert got in (E(errno.EPERM), E(errno.ENODATA)), got   # ext4 answers ENODATA
    assert as_user(os.listxattr, "f", uid=U1, cwd=d) == ["user.a"]   # trusted.* hidden from non-root
    os.chmod(d / "f", 0o600)
    assert as_user(os.getxattr, "f", "user.a", uid=U1, cwd=d) == E(errno.EACCES)


def test_device_nodes_need_privilege(d: Path, as_user: AsUser) -> None:
    assert as_user(os.mknod, "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3), uid=U1, cwd=d) == E(errno.EPERM)
    assert as_user(os.mknod, "fifo", stat.S_IFIFO | 0o600, 0, uid=U1, cwd=d) is None
    assert stat.S_ISFIFO(os.stat(d / "fifo").st_mode) and os.stat(d / "fifo").st_uid == U1


def test_root_may_do_anything_but_execute_a_file_without_x(d: Path) -> None:
    (d / "f").write_bytes(b"#!/bin/sh\nexit 0\n")
    os.chmod(d / "f", 0o000)
    assert (d / "f").read_bytes().startswith(b"#!")
    assert not os.access(d / "f", os.X_OK)
    with pytest.raises(PermissionError):
        subprocess.run([str(d / "f")], timeout=30)
    os.chmod(d / "f", 0o100)
    assert subprocess.run([str(d / "f")], timeout=30).returncode == 0


def test_access_syscall_reflects_permissions(d: Path, as_user: AsUser) -> None:
    (d / "f").write_bytes(b"")
    os.chmod(d / "f", 0o604)
    assert as_user(os.access, "f", os.R_OK, uid=U1, cwd=d) is True
    assert as_user(os.access, "f", os.W_OK, uid=U1, cwd=d) is False

