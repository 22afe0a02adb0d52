"""Names through the kernel mount: directories, rename(2)/renameat2, links, special files,
xattrs, attributes and times, statfs, locks, name limits; each error with its exact errno."""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


def raises_errno(code: int, fn, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    assert info.value.errno == code, f"expected {errno.errorcode[code]}, got {info.value!r}"


def renameat2(src: Path, dst: Path, flags: int) -> None:
    libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if libc.renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(src))


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def utimensat(path: Path, atime: tuple[int, int], mtime: tuple[int, int]) -> None:
    times = (Timespec * 2)(Timespec(*atime), Timespec(*mtime))
    libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
    if libc.utimensat(AT_FDCWD, os.fsencode(path), times, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(path))


# ---------------------------------------------------------------- directories


def test_mkdir_and_rmdir(d: Path) -> None:
    os.mkdir(d / "a", 0o750)
    st = os.stat(d / "a")
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o750 & ~0o022 and st.st_nlink == 2
    assert os.stat(d).st_nlink == 3           # '.', its name in the parent, a/..
    raises_errno(errno.EEXIST, os.mkdir, d / "a")
    raises_errno(errno.ENOENT, os.mkdir, d / "x" / "y")
    os.rmdir(d / "a")
    assert not (d / "a").exists()
    assert os.stat(d).st_nlink == 2
    raises_errno(errno.ENOENT, os.rmdir, d / "a")


def test_rmdir_errors(d: Path) -> None:
    os.makedirs(d / "full" / "sub")
    raises_errno(errno.ENOTEMPTY, os.rmdir, d / "full")
    (d / "f").write_bytes(b"")
    raises_errno(errno.ENOTDIR, os.rmdir, d / "f")
    raises_errno(errno.EINVAL, os.rmdir, f"{d}/full/sub/.")     # (pathlib would drop the '.')
    raises_errno(errno.ENOTEMPTY, os.rmdir, f"{d}/full/sub/..")
    raises_errno(errno.EISDIR, os.unlink, d / "full")


def test_readdir_lists_dot_dotdot_and_every_entry(d: Path) -> None:
    names = {f"f{i:03d}" for i in range(150)} | {"dir"}
    for n in names - {"dir"}:
        (d / n).write_bytes(b"")
    os.mkdir(d / "dir")
    assert set(os.listdir(d)) == names
    with os.scandir(d) as it:
        kinds = {e.name: e.is_dir() for e in it}
    assert kinds["dir"] and not kinds["f000"]
    out = subprocess.run(["ls", "-a", str(d)], capture_output=True, text=True, check=True).stdout.split()
    assert out.count(".") == 1 and out.count("..") == 1 and set(out) - {".", ".."} == names
    # '..' of a subdirectory is the parent, '.' is itself
    assert os.stat(d / "dir" / "..").st_ino == os.stat(d).st_ino
    assert os.stat(d / "dir" / ".").st_ino == os.stat(d / "dir").st_ino


def test_readdir_offsets_stay_stable_while_entries_change(d: Path) -> None:
    """telldir/seekdir positions survive creates and deletes; no surviving entry is skipped
    or listed twice while the directory changes under an open stream (GNU rm -r relies on it)."""
    n = 300
    for i in range(n):
        (d / f"e{i:04d}").write_bytes(b"")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        seen: list[str] = []
        removed: set[str] = set()
        with os.scandir(fd) as it:
            for k, e in enumerate(it):
                seen.append(e.name)
                if k == 10:
                    # delete entries not yet read and ones already read, add new ones
                    for i in list(range(0, 5)) + list(range(200, 220)):
                        os.unlink(d / f"e{i:04d}")
                        removed.add(f"e{i:04d}")
                    for i in range(10):
                        (d / f"new{i}").write_bytes(b"")
    finally:
        os.close(fd)
    assert len(seen) == len(set(seen)), "an entry was returned twice"
    survivors = {f"e{i:04d}" for i in range(n)} - removed
    assert survivors <= set(seen), f"skipped: {sorted(survivors - set(seen))[:5]}"


def test_rm_rf_of_a_large_tree(d: Path) -> None:
    for i in range(5):
        sub = d / "t" / f"s{i}"
        sub.mkdir(parents=True)
        for j in range(60):
            (sub / f"f{j}").write_bytes(b"x")
    subprocess.run(["rm", "-rf", str(d / "t")], check=True, timeout=60)
    assert not (d / "t").exists()


# ---------------------------------------------------------------- unlink and rename


def test_unlink(d: Path) -> None:
    (d / "f").write_bytes(b"data")
    os.unlink(d / "f")
    assert not (d / "f").exists()
    raises_errno(errno.ENOENT, os.unlink, d / "f")
    raises_errno(errno.ENOENT, os.stat, d / "f")


def test_unlinked_file_stays_readable_through_an_open_descriptor(d: Path) -> None:
    (d / "f").write_bytes(b"still here" * 1000)
    fd = os.open(d / "f", os.O_RDONLY)
    try:
        os.unlink(d / "f")
        assert os.pread(fd, 10, 0) == b"still here"
        assert os.fstat(fd).st_size == 10000
    finally:
        os.close(fd)
    assert os.listdir(d) == []


def test_unlink_and_rename_beside_open_files(d: Path) -> None:
    """With files open in the mount, an unlink or rename names them to the master as ones
    to keep (one call): the others go at once, the open one is hidden and stays readable."""
    for n in ("open", "b", "c", "dst"):
        (d / n).write_bytes(n.encode() * 100)
    fd = os.open(d / "open", os.O_RDONLY)
    try:
        os.unlink(d / "b")
        os.rename(d / "c", d / "dst")
        assert sorted(os.listdir(d)) == ["dst", "open"]
        assert (d / "dst").read_bytes() == b"c" * 100
        os.rename(d / "dst", d / "open")   # replaces the open file: hidden, not dropped
        assert sorted(os.listdir(d)) == ["open"]
        assert (d / "open").read_bytes() == b"c" * 100
        assert os.pread(fd, 8, 0) == b"openopen" and os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)
    assert os.listdir(d) == ["open"]


def test_unlink_of_an_open_file_removes_its_name_at_once(d: Path) -> None:
    """As on ext4 (not NFS's .nfsXXXX): the name is gone from listings while the file is
    still open, and its directory can be removed."""
    os.mkdir(d / "sub")
    (d / "sub" / "f").write_bytes(b"x" * 1000)
    fd = os.open(d / "sub" / "f", os.O_RDONLY)
    try:
        os.unlink(d / "sub" / "f")
        assert os.listdir(d / "sub") == []
        os.rmdir(d / "sub")
        assert os.pread(fd, 3, 0) == b"xxx"
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)
    assert os.listdir(d) == []


def test_rename_within_and_across_directories(d: Path) -> None:
    os.mkdir(d / "a")
    os.mkdir(d / "b")
    (d / "a" / "f").write_bytes(b"1")
    ino = os.stat(d / "a" / "f").st_ino
    os.rename(d / "a" / "f", d / "a" / "g")
    assert os.listdir(d / "a") == ["g"] and os.stat(d / "a" / "g").st_ino == ino
    os.rename(d / "a" / "g", d / "b" / "h")
    assert os.listdir(d / "a") == [] and (d / "b" / "h").read_bytes() == b"1"
    os.mkdir(d / "a" / "sub")
    os.rename(d / "a" / "sub", d / "b" / "sub")
    assert os.stat(d / "a").st_nlink == 2 and os.stat(d / "b").st_nlink == 3
    assert os.stat(d / "b" / "sub" / "..").st_ino == os.stat(d / "b").st_ino
    raises_errno(errno.ENOENT, os.rename, d / "missing", d / "x")


def test_rename_over_an_existing_file_replaces_it(d: Path) -> None:
    (d / "src").write_bytes(b"new")
    (d / "dst").write_bytes(b"old contents")
    os.rename(d / "src", d / "dst")
    assert (d / "dst").read_bytes() == b"new" and not (d / "src").exists()
    assert sorted(os.listdir(d)) == ["dst"]


def test_rename_over_directories(d: Path) -> None:
    os.mkdir(d / "src")
    (d / "src" / "keep").write_bytes(b"k")
    os.mkdir(d / "empty")
    os.rename(d / "src", d / "empty")                     # over an empty directory
    assert os.listdir(d / "empty") == ["keep"]
    os.mkdir(d / "other")
    raises_errno(errno.ENOTEMPTY, os.rename, d / "other", d / "empty")
    (d / "file").write_bytes(b"")
    raises_errno(errno.ENOTDIR, os.rename, d / "other", d / "file")
    raises_errno(errno.EISDIR, os.rename, d / "file", d / "other")
    raises_errno(errno.EINVAL, os.rename, d / "empty", d / "empty" / "inside")
    assert os.stat(d).st_nlink == 2 + 2                  # empty, other


def test_rename_to_itself_and_between_hard_links_is_a_no_op(d: Path) -> None:
    (d / "f").write_bytes(b"x")
    os.rename(d / "f", d / "f")
    os.link(d / "f", d / "g")
    os.rename(d / "f", d / "g")   # same inode: POSIX says do nothing
    assert sorted(os.listdir(d)) == ["f", "g"] and os.stat(d / "f").st_nlink == 2


def test_renameat2_noreplace(d: Path) -> None:
    (d / "a").write_bytes(b"a")
    (d / "b").write_bytes(b"b")
    raises_errno(errno.EEXIST, renameat2, d / "a", d / "b", RENAME_NOREPLACE)
    assert (d / "a").read_bytes() == b"a" and (d / "b").read_bytes() == b"b"
    renameat2(d / "a", d / "c", RENAME_NOREPLACE)
    assert sorted(os.listdir(d)) == ["b", "c"]


def test_renameat2_exchange(d: Path) -> None:
    (d / "a").write_bytes(b"file a")
    os.mkdir(d / "sub")
    (d / "sub" / "inner").write_bytes(b"")
    renameat2(d / "a", d / "sub", RENAME_EXCHANGE)
    assert (d / "sub").read_bytes() == b"file a"
    assert os.listdir(d / "a") == ["inner"]
    raises_errno(errno.ENOENT, renameat2, d / "a", d / "missing", RENAME_EXCHANGE)
    os.mkdir(d / "x")
    renameat2(d / "a", d / "x" , RENAME_EXCHANGE)   # two directories
    assert os.listdir(d / "x") == ["inner"] and os.listdir(d / "a") == []
    raises_errno(errno.EINVAL, renameat2, d / "a", d / "sub", RENAME_EXCHANGE | RENAME_NOREPLACE)


def test_lmcache_tmp_then_rename_pattern(d: Path) -> None:
    payload = os.urandom(3 << 20)
    tmp, final = d / "m@1@0@abc@bf16.data.tmp", d / "m@1@0@abc@bf16.data"
    with open(tmp, "wb") as f:
        f.write(payload[:28])
        f.write(payload[28:])
    os.rename(tmp, final)
    assert os.stat(final).st_size == len(payload)
    with open(final, "rb") as f:
        assert f.read(4096) == payload[:4096]
        assert f.read() == payload[4096:]


# ---------------------------------------------------------------- links


def test_hard_links_share_the_inode_and_count(d: Path) -> None:
    (d / "a").write_bytes(b"shared")
    os.mkdir(d / "sub")
    os.link(d / "a", d / "b")
    os.link(d / "a", d / "sub" / "c")
    for n in ("a", "b", "sub/c"):
        st = os.stat(d / n)
        assert st.st_nlink == 3 and st.st_ino == os.stat(d / "a").st_ino
    with open(d / "b", "r+b") as f:
        f.write(b"SH")
    assert (d / "sub" / "c").read_bytes() == b"SHared"
    os.unlink(d / "a")
    assert os.stat(d / "b").st_nlink == 2 and os.stat(d / "sub" / "c").st_nlink == 2
    os.unlink(d / "sub" / "c")
    assert os.stat(d / "b").st_nlink == 1 and (d / "b").read_bytes() == b"SHared"
    raises_errno(errno.EEXIST, os.link, d / "b", d / "b")
    raises_errno(errno.EPERM, os.link, d / "sub", d / "sublink")
    raises_errno(errno.ENOENT, os.link, d / "missing", d / "x")


def test_symlinks_and_readlink(d: Path) -> None:
    (d / "target").write_bytes(b"through the link")
    os.symlink("target", d / "rel")
    os.symlink(str(d / "target"), d / "abs")
    os.symlink("nowhere/at/all", d / "dangling")
    assert os.readlink(d / "rel") == "target"
    assert os.readlink(d / "abs") == str(d / "target")
    assert (d / "rel").read_bytes() == b"through the link" == (d / "abs").read_bytes()
    st = os.lstat(d / "rel")
    assert stat.S_ISLNK(st.st_mode) and st.st_size == len("target")
    raises_errno(errno.ENOENT, os.stat, d / "dangling")
    raises_errno(errno.EINVAL, os.readlink, d / "target")
    raises_errno(errno.EEXIST, os.symlink, "x", d / "rel")
    os.symlink("loop2", d / "loop1")
    os.symlink("loop1", d / "loop2")
    raises_errno(errno.ELOOP, os.stat, d / "loop1")
    long_target = "x" * 4000
    os.symlink(long_target, d / "long")
    assert os.readlink(d / "long") == long_target
    os.mkdir(d / "dir")
    os.symlink("dir", d / "dirlink")
    (d / "dirlink" / "inner").write_bytes(b"i")
    assert os.listdir(d / "dir") == ["inner"]


# ---------------------------------------------------------------- special files


def test_mknod_fifo_socket_and_device_nodes(d: Path) -> None:
    os.mkfifo(d / "fifo", 0o640)
    assert stat.S_ISFIFO(os.stat(d / "fifo").st_mode)
    os.mknod(d / "chr", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    st = os.stat(d / "chr")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    os.mknod(d / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 42))
    st = os.stat(d / "blk")
    assert stat.S_ISBLK(st.st_mode) and os.major(st.st_rdev) == 7 and os.minor(st.st_rdev) == 42
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "sock"))
    assert stat.S_ISSOCK(os.stat(d / "sock").st_mode)
    os.mknod(d / "reg", 0o644 | stat.S_IFREG)
    assert stat.S_ISREG(os.stat(d / "reg").st_mode) and os.stat(d / "reg").st_size == 0
    raises_errno(errno.EEXIST, os.mkfifo, d / "fifo")


def test_fifo_on_the_mount_carries_data(d: Path) -> None:
    os.mkfifo(d / "fifo")
    pid = os.fork()
    if pid == 0:
        try:
            with open(d / "fifo", "wb") as f:
                f.write(b"through the pipe")
        finally:
            os._exit(0)
    with open(d / "fifo", "rb") as f:
        assert f.read() == b"through the pipe"
    os.waitpid(pid, 0)


# ---------------------------------------------------------------- xattrs


def test_user_and_trusted_xattrs(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"")
    os.setxattr(p, "user.color", b"blue")
    os.setxattr(p, "user.empty", b"")
    os.setxattr(p, "trusted.secret", b"\x00\x01binary")
    assert os.getxattr(p, "user.color") == b"blue"
    assert os.getxattr(p, "user.empty") == b""
    assert os.getxattr(p, "trusted.secret") == b"\x00\x01binary"
    assert set(os.listxattr(p)) == {"user.color", "user.empty", "trusted.secret"}
    os.setxattr(p, "user.color", b"red")
    assert os.getxattr(p, "user.color") == b"red"
    raises_errno(errno.ENODATA, os.getxattr, p, "user.missing")
    os.removexattr(p, "user.color")
    raises_errno(errno.ENODATA, os.getxattr, p, "user.color")
    raises_errno(errno.ENODATA, os.removexattr, p, "user.color")
    os.mkdir(d / "dir")
    os.setxattr(d / "dir", "user.k", b"v")
    assert os.getxattr(d / "dir", "user.k") == b"v"


def test_xattr_create_and_replace_flags(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"")
    os.setxattr(p, "user.a", b"1", os.XATTR_CREATE)
    raises_errno(errno.EEXIST, os.setxattr, p, "user.a", b"2", os.XATTR_CREATE)
    raises_errno(errno.ENODATA, os.setxattr, p, "user.b", b"2", os.XATTR_REPLACE)
    os.setxattr(p, "user.a", b"3", os.XATTR_REPLACE)
    assert os.getxattr(p, "user.a") == b"3"


def test_xattr_on_a_symlink_and_size_limits(d: Path) -> None:
    os.symlink("nowhere", d / "l")
    raises_errno(errno.EPERM, os.setxattr, d / "l", "user.x", b"v", follow_symlinks=False)
    (d / "f").write_bytes(b"")
    big = b"v" * 65536
    os.setxattr(d / "f", "user.big", big)
    assert os.getxattr(d / "f", "user.big") == big
    raises_errno(errno.E2BIG, os.setxattr, d / "f", "user.toobig", b"v" * 65537)
    raises_errno(errno.ERANGE, os.setxattr, d / "f", "user." + "n" * 251, b"v")
    raises_errno(errno.EOPNOTSUPP, os.setxattr, d / "f", "bogus.ns", b"v")


# ---------------------------------------------------------------- attributes and times


def test_chmod(d: Path) -> None:
    (d / "f").write_bytes(b"")
    os.chmod(d / "f", 0o4751)
    assert stat.S_IMODE(os.stat(d / "f").st_mode) == 0o4751
    os.chmod(d / "f", 0o000)
    assert stat.S_IMODE(os.stat(d / "f").st_mode) == 0
    os.mkdir(d / "dir")
    os.chmod(d / "dir", 0o1777)
    assert stat.S_IMODE(os.stat(d / "dir").st_mode) == 0o1777
    raises_errno(errno.ENOENT, os.chmod, d / "missing", 0o644)


def test_chown_by_root(d: Path) -> None:
    (d / "f").write_bytes(b"")
    os.chown(d / "f", 1234, 5678)
    st = os.stat(d / "f")
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.chown(d / "f", -1, 42)
    st = os.stat(d / "f")
    assert (st.st_uid, st.st_gid) == (1234, 42)
    os.symlink("f", d / "l")
    os.lchown(d / "l", 99, 98)
    assert (os.lstat(d / "l").st_uid, os.lstat(d / "l").st_gid) == (99, 98)
    assert os.stat(d / "f").st_uid == 1234


def test_chown_by_root_clears_setuid_and_setgid(d: Path) -> None:
    """On ext4 chown(2) of a regular file drops S_ISUID and (with group x) S_ISGID, even for root."""
    (d / "f").write_bytes(b"")
    os.chmod(d / "f", 0o6755)
    os.chown(d / "f", 1000, 1000)
    assert stat.S_IMODE(os.stat(d / "f").st_mode) == 0o0755
    os.mkdir(d / "dir")
    os.chmod(d / "dir", 0o2775)
    os.chown(d / "dir", 1000, 1000)      # directories keep setgid
    assert stat.S_IMODE(os.stat(d / "dir").st_mode) == 0o2775


def test_utimensat_with_nanoseconds(d: Path) -> None:
    (d / "f").write_bytes(b"")
    os.utime(d / "f", ns=(1_000_000_001_123_456_789, 1_200_000_000_987_654_321))
    st = os.stat(d / "f")
    assert st.st_atime_ns == 1_000_000_001_123_456_789
    assert st.st_mtime_ns == 1_200_000_000_987_654_321
    os.utime(d / "f", ns=(5, 7))     # the epoch plus a few ns
    st = os.stat(d / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (5, 7)


def test_explicit_times_close_to_now_are_kept_exactly(d: Path) -> None:
    """cp -p / rsync -t / touch -d of a just-written file: an explicit time that happens to be
    within a fraction of a second of now is still an explicit time, kept to the nanosecond."""
    (d / "f").write_bytes(b"")
    t = time.time_ns() - 20_000_000 + 123
    os.utime(d / "f", ns=(t, t + 1))
    st = os.stat(d / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (t, t + 1)


def test_utimensat_utime_now_and_utime_omit(d: Path) -> None:
    (d / "f").write_bytes(b"")
    os.utime(d / "f", ns=(1_000_000_000_000_000_000, 1_100_000_000_000_000_000))
    before = time.time_ns()
    utimensat(d / "f", (0, UTIME_NOW), (0, UTIME_OMIT))
    after = time.time_ns()
    st = os.stat(d / "f")
    assert before - 50_000_000 <= st.st_atime_ns <= after + 50_000_000
    assert st.st_mtime_ns == 1_100_000_000_000_000_000
    utimensat(d / "f", (123, UTIME_OMIT), (456, 789))
    st = os.stat(d / "f")
    assert st.st_mtime_ns == 456_000_000_789 and before - 50_000_000 <= st.st_atime_ns <= after + 50_000_000
    os.utime(d / "f", ns=(1, 2))
    utimensat(d / "f", (0, UTIME_OMIT), (0, UTIME_NOW))
    st = os.stat(d / "f")
    assert st.st_atime_ns == 1 and st.st_mtime_ns >= before - 50_000_000


def test_times_move_on_write_create_and_rename(d: Path) -> None:
    (d / "f").write_bytes(b"x")
    os.utime(d / "f", ns=(10**18, 10**18))
    dir_before = os.stat(d).st_mtime_ns
    with open(d / "f", "ab") as f:
        f.write(b"y")
    st = os.stat(d / "f")
    assert st.st_mtime_ns > 10**18 and st.st_ctime_ns >= st.st_mtime_ns - 1_000_000_000
    time.sleep(0.01)
    (d / "g").write_bytes(b"")
    assert os.stat(d).st_mtime_ns > dir_before
    ctime = os.stat(d / "g").st_ctime_ns
    time.sleep(0.01)
    os.chmod(d / "g", 0o600)
    assert os.stat(d / "g").st_ctime_ns > ctime


def test_stat_fields(d: Path) -> None:
    (d / "f").write_bytes(b"x" * 5000)
    st = os.stat(d / "f")
    assert st.st_size == 5000 and st.st_nlink == 1 and st.st_uid == 0 and st.st_gid == 0
    assert stat.S_IMODE(st.st_mode) == 0o644
    assert st.st_blocks * 512 >= 5000
    assert os.stat(d).st_size == 4096


# ---------------------------------------------------------------- statfs, mount table


def test_statfs_and_df_show_the_pool(mounted, d: Path) -> None:  # type: ignore[no-untyped-def]
    sv = os.statvfs(mounted.path)
    assert sv.f_blocks > 0 and sv.f_bavail <= sv.f_blocks and sv.f_namemax == 255
    rep = mounted.cluster.report()
    assert rep is not None and rep.capacity > 0
    assert abs(sv.f_blocks * sv.f_frsize - rep.capacity) <= 1 << 20
    used0 = (sv.f_blocks - sv.f_bfree) * sv.f_frsize
    (d / "used").write_bytes(os.urandom(32 << 20))        # 64 MiB with its second replica
    out = subprocess.run(["df", "-T", str(mounted.path)], capture_output=True, text=True, check=True).stdout
    fields = out.splitlines()[1].split()
    assert fields[0] == "curvine" and fields[1] == "fuse.curvine"
    used = used0
    deadline = time.monotonic() + 10     # usage reaches the master with the next heartbeats
    while used < used0 + (32 << 20) and time.monotonic() < deadline:
        time.sleep(0.2)
        sv = os.statvfs(mounted.path)
        used = (sv.f_blocks - sv.f_bfree) * sv.f_frsize
    assert used >= used0 + (32 << 20), f"statfs usage {used0} -> {used} after writing 32 MiB (x2 replicas)"


def test_mount_table_shows_curvine_with_allow_other(mounted) -> None:  # type: ignore[no-untyped-def]
    with open("/proc/self/mounts") as f:
        line = next(ln for ln in f if ln.split()[1] == str(mounted.path))
    dev, _, fstype, opts = line.split()[:4]
    assert dev == "curvine" and fstype == "fuse.curvine"
    assert "allow_other" in opts.split(",")


# ---------------------------------------------------------------- locks


def _lock_in_child(path: Path, how: str) -> str:
    """In a forked child: try a non-blocking lock; return 'locked' or 'busy'."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        res = b"?"
        try:
            fd = os.open(path, os.O_RDWR)
            try:
                if how == "flock":
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                else:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
                res = b"locked"
            except OSError as e:
                res = b"busy" if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK) else b"err%d" % e.errno
        finally:
            os.write(w, res)
            os._exit(0)
    os.close(w)
    try:
        return os.read(r, 100).decode()
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_flock_excludes_other_open_files(d: Path) -> None:
    p = d / "lock"
    p.write_bytes(b"")
    fd = os.open(p, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert _lock_in_child(p, "flock") == "busy"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert _lock_in_child(p, "flock") == "locked"
        fcntl.flock(fd, fcntl.LOCK_SH)
        fd2 = os.open(p, os.O_RDONLY)
        try:
            fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)   # shared locks coexist
        finally:
            os.close(fd2)
    finally:
        os.close(fd)


def test_fcntl_record_locks_exclude_other_processes(d: Path) -> None:
    p = d / "lock"
    p.write_bytes(b"x" * 100)
    fd = os.open(p, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
        assert _lock_in_child(p, "fcntl") == "busy"
        fcntl.lockf(fd, fcntl.LOCK_UN, 10, 0)
        fcntl.lockf(fd, fcntl.LOCK_EX, 10, 50)     # another range does not conflict
        assert _lock_in_child(p, "fcntl") == "locked"
    finally:
        os.close(fd)


# ---------------------------------------------------------------- name limits


def test_name_max_is_255_bytes(d: Path) -> None:
    ok = "n" * 255
    (d / ok).write_bytes(b"max")
    assert (d / ok).read_bytes() == b"max" and ok in os.listdir(d)
    raises_errno(errno.ENAMETOOLONG, os.open, d / ("n" * 256), os.O_CREAT | os.O_WRONLY, 0o644)
    raises_errno(errno.ENAMETOOLONG, os.mkdir, d / ("n" * 256))
    raises_errno(errno.ENAMETOOLONG, os.stat, d / ("n" * 256))
    raises_errno(errno.ENAMETOOLONG, os.rename, d / ok, d / ("m" * 256))
    raises_errno(errno.ENAMETOOLONG, os.symlink, "t", d / ("s" * 256))
    utf8 = "é" * 127   # 254 bytes
    (d / utf8).write_bytes(b"")
    raises_errno(errno.ENAMETOOLONG, os.mkdir, d / ("é" * 128))   # 256 bytes


def test_path_max_is_4096_bytes(d: Path) -> None:
    # A path longer than PATH_MAX is refused by the kernel before we see it; a deep tree
    # whose total path exceeds 4096 is reachable relative to an open directory.
    raises_errno(errno.ENAMETOOLONG, os.stat, str(d) + "/" + "/".join(["a" * 200] * 21))
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    depth = 0
    try:
        for _ in range(25):                      # 25 * 201 bytes > 4096
            os.mkdir("c" * 200, dir_fd=fd)
            nfd = os.open("c" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            depth += 1
        with open(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd), "wb") as f:
            f.write(b"deep")
    finally:
        os.close(fd)
    assert depth == 25
    subprocess.run(["rm", "-rf", str(d / ("c" * 200))], check=True, timeout=60)


def test_invalid_names_and_wrong_types(d: Path) -> None:
    (d / "f").write_bytes(b"")
    raises_errno(errno.ENOTDIR, os.listdir, d / "f")
    raises_errno(errno.ENOTDIR, os.mkdir, d / "f" / "x")
    raises_errno(errno.ENOENT, os.listdir, d / "missing")
    raises_errno(errno.EEXIST, os.mkdir, d / "f")
