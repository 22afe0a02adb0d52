"""fallocate(2), lseek's SEEK_DATA/SEEK_HOLE and O_TMPFILE through the mount (issue 41;
docs/posix.md "Space"): the handlers deploy/pyfuse3.patch adds to pyfuse3, onto the VFS
(client/vfsspace.py, VFS.tmpfile).  A zeroed range reads as zeros through this mount at
once and through another mount after the close; a hole is reported where the file's block
map has no block; an O_TMPFILE file has no name until a linkat gives it one.  And the KV
stacks' own file patterns that use them (Dynamo KVBM's disk tier, vLLM's fs offload).
(One module, so one cluster start, for the operations the patch's last handlers brought.)
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat
import time
from pathlib import Path

import pyfuse3
import pytest

from tests.posix.conftest import Mount

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(pyfuse3, "locks_enabled"), reason="stock pyfuse3: no such handlers")]

MiB = 1 << 20
BS = 4 * MiB   # the pool's default block size (master.block_size)
KEEP_SIZE, PUNCH_HOLE, COLLAPSE_RANGE, ZERO_RANGE, INSERT_RANGE = 0x01, 0x02, 0x08, 0x10, 0x20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
AT_FDCWD, AT_SYMLINK_FOLLOW = -100, 0x400


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2) with any mode (os.posix_fallocate has mode 0 only)."""
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def pattern(n: int, seed: int = 1) -> bytes:
    return (bytes(range(seed, seed + 251)) * (n // 251 + 1))[:n]


def test_modes_change_size_and_bytes_as_on_ext4(mounted: Mount, second_mount: Mount) -> None:
    name = f"falloc-{os.urandom(3).hex()}"
    a, b = mounted.path / name, second_mount.path / name
    data = pattern(3 * BS)
    a.write_bytes(data)
    assert b.read_bytes() == data                             # the other mount has read (and cached) it
    want = bytearray(data)
    fd = os.open(a, os.O_RDWR)
    try:
        fallocate(fd, 0, 0, 100)                              # inside the file: nothing changes
        fallocate(fd, KEEP_SIZE, 3 * BS, 5 * MiB)             # past the end, size kept
        assert os.fstat(fd).st_size == 3 * BS
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 1000, 2 * BS + 5000)   # a part of block 0, all of 1, a part of 2
        want[1000:2 * BS + 6000] = bytes(2 * BS + 5000)
        fallocate(fd, ZERO_RANGE | KEEP_SIZE, 2 * BS + 10007, 100)
        want[2 * BS + 10007:2 * BS + 10107] = bytes(100)
        fallocate(fd, ZERO_RANGE, 3 * BS - 10, 30)            # across the end: grows by 20
        want[3 * BS - 10:] = bytes(10)
        want += bytes(20)
        assert os.fstat(fd).st_size == len(want)
        assert os.pread(fd, len(want) + 10, 0) == bytes(want)   # this mount, before the close
        fallocate(fd, 0, len(want), MiB)                      # mode 0 past the end: grows, reads zeros
        want += bytes(MiB)
        assert os.fstat(fd).st_size == len(want)
        for mode in (PUNCH_HOLE, COLLAPSE_RANGE, INSERT_RANGE):   # punch needs KEEP_SIZE (Linux's rule)
            with pytest.raises(OSError) as e:
                fallocate(fd, mode, 0, BS)
            assert e.value.errno == errno.EOPNOTSUPP, mode
        with pytest.raises(OSError) as e:
            fallocate(fd, 0, 0, 0)
        assert e.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    assert a.read_bytes() == bytes(want)
    assert b.read_bytes() == bytes(want)                      # another mount, after the close
    ro = os.open(a, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            fallocate(ro, 0, 0, 10)
        assert e.value.errno == errno.EBADF
    finally:
        os.close(ro)


def test_seek_data_and_hole_follow_the_block_map(mounted: Mount, second_mount: Mount) -> None:
    """A sparse file: data in blocks 1 and 3 of 5 (the tail of the size a hole)."""
    name = f"sparse-{os.urandom(3).hex()}"
    a, b = mounted.path / name, second_mount.path / name
    fd = os.open(a, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"x" * 10, BS + 5)
        os.pwrite(fd, b"y" * 10, 3 * BS)
        os.ftruncate(fd, 5 * BS)
        # while this mount writes it: its writer's map
        assert os.lseek(fd, 0, os.SEEK_DATA) == BS
        assert os.lseek(fd, BS + 100, os.SEEK_HOLE) == 2 * BS
        assert os.lseek(fd, 2 * BS, os.SEEK_DATA) == 3 * BS
        assert os.lseek(fd, 3 * BS, os.SEEK_HOLE) == 4 * BS
        with pytest.raises(OSError) as e:
            os.lseek(fd, 4 * BS, os.SEEK_DATA)                # only a hole follows
        assert e.value.errno == errno.ENXIO
    finally:
        os.close(fd)
    fd = os.open(b, os.O_RDONLY)                               # another mount: the committed map
    try:
        assert [os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, BS, os.SEEK_HOLE)] == [BS, 2 * BS]
        assert os.lseek(fd, 4 * BS - 1, os.SEEK_HOLE) == 4 * BS
        assert os.lseek(fd, 0, os.SEEK_HOLE) == 0
        with pytest.raises(OSError) as e:
            os.lseek(fd, 5 * BS, os.SEEK_HOLE)                # at the end
        assert e.value.errno == errno.ENXIO
        assert os.pread(fd, 20, BS) == bytes(5) + b"x" * 10 + bytes(5)
    finally:
        os.close(fd)
    # a punch over a hole leaves it a hole (no block of zeros is written there)
    fd = os.open(a, os.O_RDWR)
    try:
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 0, BS)
        fallocate(fd, ZERO_RANGE | KEEP_SIZE, 4 * BS, BS)
        assert os.lseek(fd, 0, os.SEEK_DATA) == BS
        with pytest.raises(OSError) as e:
            os.lseek(fd, 4 * BS, os.SEEK_DATA)
        assert e.value.errno == errno.ENXIO
    finally:
        os.close(fd)


def slot_blocks(mount: Mount, path: Path) -> dict[int, int]:
    """Slot -> block id of a file, as the master holds its block map."""
    from curvine_py.sdk import Client
    from tests.conftest import client_config
    with Client(master=mount.cluster.master_address, config=client_config(mount.cluster)) as client:
        reply = client.meta.block_locations(os.stat(path).st_ino)
        return {b.offset // BS: b.block_id for b in reply.blocks}


def blocks_on_disk(mount: Mount) -> set[int]:
    """Ids of the committed block files in every worker's data dir (not staging, not free)."""
    return {int(p.name) for p in mount.cluster.dir.glob("worker*/data/**/*") if p.is_file()
            and p.name.isdigit() and "staging" not in p.parts and "free" not in p.parts}


def settled(fn, want: object, within_s: float = 10.0) -> object:  # type: ignore[no-untyped-def]
    """fn() once it returns want (the kernel's attribute cache of another mount, or the
    workers' deletes, catch up within seconds); else its last answer, for the assert."""
    deadline = time.monotonic() + within_s
    got = fn()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.2)
        got = fn()
    return got


def test_a_punched_whole_block_is_freed_and_st_blocks_counts_what_exists(mounted: Mount,
                                                                         second_mount: Mount) -> None:
    """PUNCH_HOLE over block 1 and ZERO_RANGE over block 2 (and parts of its neighbours):
    both slots become holes, their blocks are deleted on the workers, st_blocks counts
    the two blocks left, on both mounts; the bytes read as ext4's."""
    name = f"punch-{os.urandom(3).hex()}"
    a, b = mounted.path / name, second_mount.path / name
    data = pattern(4 * BS, seed=3)
    a.write_bytes(data)
    assert settled(lambda: os.stat(b).st_blocks, 4 * BS // 512) == 4 * BS // 512
    before = slot_blocks(mounted, a)
    assert sorted(before) == [0, 1, 2, 3] and set(before.values()) <= blocks_on_disk(mounted)
    want = bytearray(data)
    fd = os.open(a, os.O_RDWR)
    try:
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, BS, BS)
        fallocate(fd, ZERO_RANGE | KEEP_SIZE, 2 * BS - 10, BS + 20)   # block 2 whole, 10 bytes of 3
        want[BS:3 * BS + 10] = bytes(2 * BS + 10)
        assert [os.lseek(fd, BS, os.SEEK_HOLE), os.lseek(fd, BS, os.SEEK_DATA)] == [BS, 3 * BS]
        assert os.pread(fd, 2 * BS + 20, BS - 5) == bytes(want[BS - 5:3 * BS + 15])
    finally:
        os.close(fd)
    assert b.read_bytes() == bytes(want)
    assert settled(lambda: os.stat(b).st_blocks, 2 * BS // 512) == 2 * BS // 512
    assert settled(lambda: os.stat(a).st_blocks, 2 * BS // 512) == 2 * BS // 512
    after = slot_blocks(mounted, a)
    assert sorted(after) == [0, 3] and after[0] == before[0]   # block 3 rewritten (its zeroed head)
    gone = {before[1], before[2], before[3]}
    assert settled(lambda: gone & blocks_on_disk(mounted), set()) == set()   # deleted on the workers
    assert before[0] in blocks_on_disk(mounted)


def test_a_sparse_file_shows_only_its_blocks_to_du_and_cp(mounted: Mount, second_mount: Mount) -> None:
    """A 2 GiB file made by truncate holds no block: st_blocks 0, du 0 (its apparent size
    2 GiB); a few bytes in its middle make one block (4 MiB: the pool's allocation unit);
    cp --sparse=always copies it to a file of the same blocks (it finds the data with
    SEEK_DATA, skips the rest)."""
    import subprocess
    name = f"sparse2g-{os.urandom(3).hex()}"
    a, b = mounted.path / name, second_mount.path / name
    size, at = 2 << 30, (1 << 30) + 5

    def du(path: Path, *flags: str) -> int:
        out = subprocess.run(["du", "-B1", *flags, str(path)], capture_output=True, text=True, timeout=30, check=True)
        return int(out.stdout.split()[0])
    with open(a, "wb") as f:
        f.truncate(size)
    assert (os.stat(a).st_size, os.stat(a).st_blocks) == (size, 0)
    assert (du(a), du(a, "--apparent-size")) == (0, size)
    assert slot_blocks(mounted, a) == {}
    fd = os.open(a, os.O_WRONLY)
    try:
        os.pwrite(fd, b"data!", at)
    finally:
        os.close(fd)
    assert settled(lambda: os.stat(b).st_blocks, BS // 512) == BS // 512
    assert du(b) == BS
    copy = mounted.path / f"{name}.copy"
    subprocess.run(["cp", "--sparse=always", str(a), str(copy)], check=True, timeout=60)
    st = os.stat(second_mount.path / copy.name)
    assert (st.st_size, settled(lambda: os.stat(second_mount.path / copy.name).st_blocks, BS // 512)) == \
        (size, BS // 512)
    assert sorted(slot_blocks(mounted, copy)) == [at // BS]
    fd = os.open(second_mount.path / copy.name, os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_DATA) == (at // BS) * BS
        assert os.pread(fd, 7, at - 1) == b"\0data!\0"
    finally:
        os.close(fd)
    assert du(copy) == BS


def link_fd(fd: int, to: Path) -> None:
    """linkat(AT_FDCWD, "/proc/self/fd/FD", AT_FDCWD, to, AT_SYMLINK_FOLLOW), as open(2)'s
    manual names it for O_TMPFILE (os.link calls link(2), which does not follow the fd's link)."""
    if _libc.linkat(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), AT_FDCWD, bytes(to), AT_SYMLINK_FOLLOW) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(to))


def test_a_tmpfile_has_no_name_until_linkat_gives_it_one(mounted: Mount, second_mount: Mount) -> None:
    name = f"tmpf-{os.urandom(3).hex()}"
    d, other = mounted.path / name, second_mount.path / name
    d.mkdir()
    data = os.urandom(5 * (1 << 20) + 7)   # two blocks
    old = os.umask(0o022)
    try:
        fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o664)
    finally:
        os.umask(old)
    try:
        os.write(fd, data)
        st = os.fstat(fd)
        assert st.st_nlink == 0 and stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
        assert os.listdir(d) == []
        assert os.pread(fd, 10, 0) == data[:10]
        link_fd(fd, d / "named")
        assert os.fstat(fd).st_nlink == 1
    finally:
        os.close(fd)
    assert os.listdir(d) == ["named"] and os.stat(d / "named").st_nlink == 1
    assert (d / "named").read_bytes() == data
    assert (other / "named").read_bytes() == data             # another mount, after the close

    fd = os.open(d, os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)   # never to be linked
    try:
        os.write(fd, b"gone")
        with pytest.raises(OSError) as e:
            link_fd(fd, d / "never")
        assert e.value.errno == errno.ENOENT
    finally:
        os.close(fd)
    fd = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o600)        # closed unlinked: gone
    os.write(fd, b"gone too")
    assert len(tmp_names(mounted)) == 1                        # kept under a hidden name while open...
    os.close(fd)
    assert sorted(os.listdir(d)) == ["named"]
    assert sorted(os.listdir(other)) == ["named"]
    deadline = time.monotonic() + 5                            # ...and removed at its RELEASE (just after)
    while tmp_names(mounted):
        assert time.monotonic() < deadline, tmp_names(mounted)
        time.sleep(0.05)


def tmp_names(mount: Mount) -> list[str]:
    """The hidden names of O_TMPFILE files in the pool's trash directory, as the master
    lists them (listings through the VFS leave hidden names out)."""
    from curvine_py.client.vfs import TRASH_NAME
    from curvine_py.pb import curvine_pb2 as pb
    from curvine_py.pb.methods import Master
    from curvine_py.sdk import Client
    from tests.conftest import client_config
    with Client(master=mount.cluster.master_address, config=client_config(mount.cluster)) as client:
        trash = client.meta.resolve("/" + TRASH_NAME).ino
        reply = client.meta.call(Master.ReadDir, pb.ReadDirRequest(caller=client.meta.caller(), ino=trash, limit=1000))
        return [e.name for e in reply.entries if "tmp" in e.name]


def test_dynamo_kvbm_disk_tier_pattern(mounted: Mount) -> None:
    """Dynamo KVBM's disk tier, as its source does it: mkostemp, O_DIRECT set by fcntl, the
    whole region fallocated (mode 0), the file unlinked while open, then pwrite and pread
    of aligned pages at offsets from several threads."""
    import fcntl
    import mmap
    import tempfile
    from concurrent.futures import ThreadPoolExecutor
    page, pages = 64 * 1024, 96                             # 6 MiB: two blocks
    fd, path = tempfile.mkstemp(dir=mounted.path, prefix="kvbm-")
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        os.posix_fallocate(fd, 0, page * pages)
        assert os.fstat(fd).st_size == page * pages
        os.unlink(path)
        assert os.fstat(fd).st_nlink == 0

        def put(i: int) -> None:
            buf = mmap.mmap(-1, page)                       # page-aligned, as O_DIRECT wants
            buf.write((i + 1).to_bytes(4, "little") * (page // 4))
            assert os.pwrite(fd, buf, i * page) == page

        def get(i: int) -> bool:
            buf = mmap.mmap(-1, page)
            assert os.preadv(fd, [buf], i * page) == page
            return bytes(buf) == (i + 1).to_bytes(4, "little") * (page // 4)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(put, range(0, pages, 2)))          # every other page: the rest stays zeros
            assert all(pool.map(get, range(0, pages, 2)))
        assert os.pread(fd, page, page) == bytes(page)
    finally:
        os.close(fd)
    assert not os.path.exists(path)


def test_vllm_fs_offload_pattern(mounted: Mount, second_mount: Mount) -> None:
    """vLLM's fs offload tier: per key a hashed three-level directory, an O_EXCL temp file
    written O_DIRECT (buffered when O_DIRECT is refused), os.replace into place,
    os.path.exists per key from another mount, readv into a memoryview; a short file is
    seen short (readv returns fewer bytes), never served as whole."""
    import hashlib
    import mmap
    root, other = mounted.path / f"vllm-{os.urandom(3).hex()}", second_mount.path
    size = 2 * MiB + 4096
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(6)]

    def where(base: Path, key: str) -> Path:
        return base / key[:2] / key[2:4] / key[4:6] / f"{key}.bin"
    for i, key in enumerate(keys[:4]):
        p = where(root, key)
        p.parent.mkdir(parents=True, exist_ok=True)
        buf = mmap.mmap(-1, size)
        buf.write((i + 7).to_bytes(4, "little") * (size // 4))
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
        except OSError as e:
            assert e.errno == errno.EINVAL
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            assert os.write(fd, buf) == size
        finally:
            os.close(fd)
        os.replace(tmp, p)
    theirs = other / root.name
    assert [os.path.exists(where(theirs, k)) for k in keys] == [True] * 4 + [False] * 2
    for i, key in enumerate(keys[:4]):
        into = memoryview(bytearray(size))
        fd = os.open(where(theirs, key), os.O_RDONLY)
        try:
            assert os.readv(fd, [into]) == size
        finally:
            os.close(fd)
        assert into[:8] == (i + 7).to_bytes(4, "little") * 2 and into[-4:] == (i + 7).to_bytes(4, "little")
    os.truncate(where(root, keys[0]), size - 100)             # a short chunk: readv says so
    fd = os.open(where(theirs, keys[0]), os.O_RDONLY)
    try:
        assert os.readv(fd, [memoryview(bytearray(size))]) == size - 100
    finally:
        os.close(fd)
