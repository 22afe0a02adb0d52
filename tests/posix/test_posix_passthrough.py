"""FUSE passthrough (fuse/passthrough.py): a mount on a worker's host answers the open of
a one-block file with that block's local file, and the kernel reads it without asking
the mount.  The mount here is "on worker 0's host" and makes 16 MiB blocks, so a KV
chunk is one block with a replica beside it.

That the kernel holds the block file is seen the way the worker sees it: a write lease
on the file (worker/blockstore.unshared) is refused while anyone has it open."""
from __future__ import annotations

import errno
import mmap
import os
import time
from pathlib import Path

import pytest

from pyfuse3_features import needs_passthrough

from curvine_py.common import config as cfgmod
from curvine_py.worker.blockstore import unshared
from tests.posix.conftest import block_ids, wait_deleted

pytestmark = [pytest.mark.timeout(180), needs_passthrough]   # the patched pyfuse3 (deploy/build-pyfuse3.sh)

MiB = 1 << 20
BS = 16 * MiB
KV = 14 * MiB + 28   # an LMCache chunk: 28-byte header + 14 MiB tensor
MOUNT_FLAGS = ("--client-host", f"{cfgmod.host_identity('')}-w0", "--client-block-size", str(BS))


def block_files(cluster_dir: Path, worker: int) -> list[Path]:
    return [p for p in (cluster_dir / f"worker{worker}" / "data" / "blocks").glob("*/*")
            if not p.name.endswith(".meta")]


def local_copy(mounted, data: bytes) -> Path:
    """Worker 0's block file holding exactly data (the file's one block)."""
    found = [p for p in block_files(mounted.cluster.dir, 0) if p.stat().st_size == len(data)
             and p.read_bytes() == data]
    assert len(found) == 1, f"{len(found)} block files of worker 0 hold the data"
    return found[0]


def held(path: Path) -> bool:
    """Does anyone but us have the file open (the kernel's backing file, a reader)?

    A block file that is gone (an earlier test's unlink, deleted by the worker between
    the listing and this open) is held by nobody."""
    try:
        with unshared(str(path)) as alone:
            return not alone
    except FileNotFoundError:
        return False


def let_go(path: Path, timeout: float = 10.0) -> bool:
    """Wait until nobody holds path (a release reaches the mount just after close)."""
    deadline = time.monotonic() + timeout
    while held(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def write_kv(p: Path, data: bytes) -> None:
    tmp = p.with_suffix(".tmp")
    with open(tmp, "wb", buffering=0) as f:
        f.write(data[:28])
        f.write(data[28:])
    os.rename(tmp, p)


def test_a_one_block_file_is_read_by_the_kernel(d: Path, mounted) -> None:
    data = os.urandom(KV)
    write_kv(d / "c.data", data)
    block = local_copy(mounted, data)
    assert not held(block)
    with open(d / "c.data", "rb", buffering=0) as f:
        buf = bytearray(KV)
        got = f.readinto(memoryview(buf)[:4096])
        got += f.readinto(memoryview(buf)[4096:])
        assert got == KV and bytes(buf) == data
        assert held(block), "the block file is not the open's backing file"
        with open(d / "c.data", "rb") as g:           # a second open shares it
            assert g.read() == data
        assert f.read(1) == b""
    assert let_go(block), "the backing file outlived the last close"
    assert mounted.alive()


def test_mmap_of_a_passthrough_file(d: Path, mounted) -> None:
    data = os.urandom(3 * MiB + 17)
    (d / "m").write_bytes(data)
    with open(d / "m", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert held(local_copy(mounted, data))
        assert m[:] == data


def test_a_write_open_while_the_kernel_reads_is_refused_then_allowed(d: Path, mounted) -> None:
    data = os.urandom(2 * MiB)
    (d / "f").write_bytes(data)
    block = local_copy(mounted, data)
    with open(d / "f", "rb") as f:
        assert f.read(10) == data[:10] and held(block)
        with pytest.raises(OSError) as e:
            open(d / "f", "r+b")
        assert e.value.errno == errno.ETXTBSY
        assert f.read() == data[10:]
    assert let_go(block)
    with open(d / "f", "r+b") as w:
        w.write(b"new")
    assert (d / "f").read_bytes() == b"new" + data[3:]


def test_files_of_several_blocks_or_with_a_writer_here_are_read_by_the_mount(d: Path, mounted) -> None:
    big = os.urandom(BS + 5 * MiB)             # two blocks: no single file holds it
    (d / "big").write_bytes(big)
    with open(d / "big", "rb") as f:
        assert f.read() == big
        assert not any(held(p) for p in block_files(mounted.cluster.dir, 0))
    with open(d / "w", "wb") as w:             # written here and still open: the mount's bytes
        w.write(b"x" * 1000)
        w.flush()
        with open(d / "w", "rb") as r:
            assert r.read() == b"x" * 1000


def test_a_reader_keeps_its_version_while_another_mount_rewrites_the_file(d: Path, mounted,
                                                                          second_mount) -> None:
    """The rewritten file's old block is deleted by its workers while the kernel still
    reads it: the worker must not recycle (overwrite) that file for new blocks."""
    old, new = os.urandom(KV), os.urandom(KV)
    write_kv(d / "c.data", old)
    old_ids = block_ids(mounted, d / "c.data")
    other = second_mount.path / d.name
    f = open(d / "c.data", "rb", buffering=0)
    try:
        head = f.read(MiB)
        (other / "c.data").write_bytes(new)            # same inode, new block, old one freed
        for i in range(6):                              # new blocks that would reuse freed files
            (other / f"x{i}").write_bytes(os.urandom(KV))
        wait_deleted(mounted, old_ids)                  # the workers delete the old block meanwhile
        rest = f.read()
    finally:
        f.close()
    assert head + rest == old
    deadline = time.monotonic() + 10
    while (d / "c.data").read_bytes() != new:           # a new open sees the new version
        assert time.monotonic() < deadline, "the rewritten file never showed through this mount"
        time.sleep(0.1)


def test_a_corrupt_local_copy_is_not_handed_to_the_kernel(d: Path, mounted) -> None:
    data = os.urandom(4 * MiB)
    (d / "bad").write_bytes(data)
    block = local_copy(mounted, data)
    with open(block, "r+b") as f:                       # a flipped byte on worker 0's disk
        f.seek(MiB + 7)
        f.write(bytes([data[MiB + 7] ^ 0xFF]))
    with open(d / "bad", "rb") as f:
        assert f.read() == data                         # from the other replica, verified
        assert not block.exists() or not held(block)    # (worker 0 drops the copy once it sees it)
