"""Close-to-open consistency between two mounts of one pool (two "nodes").

A file written and closed (or renamed into place) through mount A is visible with its
full contents through mount B within 1 second; a name B looked up while it was missing
shows up within 1 second of its creation through A (no sticky negative entries).
"""
from __future__ import annotations

import errno
import mmap
import os
import time
from pathlib import Path
from typing import Callable, TypeVar

import pytest

from tests.posix.conftest import Mount, block_ids, wait_deleted

pytestmark = pytest.mark.timeout(120)

VISIBLE_WITHIN_S = 1.0
T = TypeVar("T")


@pytest.fixture
def ab(mounted, second_mount, request: pytest.FixtureRequest) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """The same fresh directory seen through mount A and through mount B."""
    name = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:60] + "-" + os.urandom(3).hex()
    (mounted.path / name).mkdir()
    b = second_mount.path / name
    deadline = time.monotonic() + 5
    while not b.is_dir():
        assert time.monotonic() < deadline, "directory made through A never appeared through B"
        time.sleep(0.02)
    return mounted.path / name, b


def within(seconds: float, probe: Callable[[], T], ok: Callable[[T], bool]) -> tuple[T, float]:
    """Poll probe until ok(result) or the time is up; returns (last result, seconds taken)."""
    start = time.monotonic()
    while True:
        try:
            got: T = probe()
        except OSError as e:
            got = e  # type: ignore[assignment]
        took = time.monotonic() - start
        if ok(got) or took > seconds:
            return got, took
        time.sleep(0.01)


def read(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def test_write_close_is_visible_on_the_other_mount(ab: tuple[Path, Path]) -> None:
    a, b = ab
    data = os.urandom(9 << 20 | 4321)
    with open(a / "f", "wb") as f:
        f.write(data)
    got, took = within(VISIBLE_WITHIN_S, lambda: read(b / "f"), lambda v: v == data)
    assert got == data, f"B sees {type(got).__name__} {len(got) if isinstance(got, bytes) else got} after {took:.2f} s"
    assert os.stat(b / "f").st_size == len(data)


def test_lmcache_tmp_rename_is_visible_on_the_other_mount(ab: tuple[Path, Path]) -> None:
    a, b = ab
    name = "qwen@1@0@00ff@bfloat16.data"
    header, payload = os.urandom(28), os.urandom(14 << 20)
    with open(a / (name + ".tmp"), "wb") as f:
        f.write(header)
        f.write(payload)
    os.rename(a / (name + ".tmp"), a / name)
    got, took = within(VISIBLE_WITHIN_S, lambda: os.stat(b / name).st_size, lambda v: v == 28 + len(payload))
    assert got == 28 + len(payload), f"B: {got!r} after {took:.2f} s"
    with open(b / name, "rb") as f:      # LMCache reads 4 KiB, then the rest in one call
        first = f.read(4096)
        rest = f.read()
    assert first + rest == header + payload
    assert not (b / (name + ".tmp")).exists()


def test_negative_lookup_does_not_hide_a_new_file(ab: tuple[Path, Path]) -> None:
    a, b = ab
    for i in range(3):   # several rounds: the miss may be cached by B's kernel each time
        name = f"chunk{i}.data"
        with pytest.raises(FileNotFoundError):
            os.stat(b / name)
        with pytest.raises(FileNotFoundError):
            os.stat(b / name)
        with open(a / (name + ".tmp"), "wb") as f:
            f.write(b"k" * 1000)
        os.rename(a / (name + ".tmp"), a / name)
        got, took = within(VISIBLE_WITHIN_S, lambda: os.stat(b / name).st_size, lambda v: v == 1000)
        assert got == 1000, f"round {i}: B still reports {got!r} {took:.2f} s after the rename"
        assert read(b / name) == b"k" * 1000


def test_negative_lookup_of_a_new_directory(ab: tuple[Path, Path]) -> None:
    a, b = ab
    with pytest.raises(FileNotFoundError):
        os.listdir(b / "sub")
    os.mkdir(a / "sub")
    (a / "sub" / "x").write_bytes(b"1")
    got, took = within(VISIBLE_WITHIN_S, lambda: os.listdir(b / "sub"), lambda v: v == ["x"])
    assert got == ["x"], f"B: {got!r} after {took:.2f} s"


def test_overwrite_through_a_is_seen_by_b_after_close(ab: tuple[Path, Path]) -> None:
    """B read the old version (and may have it in its page cache); the new one must win."""
    a, b = ab
    (a / "f").write_bytes(b"old" * 100_000)
    got, _ = within(VISIBLE_WITHIN_S, lambda: read(b / "f"), lambda v: v == b"old" * 100_000)
    assert got == b"old" * 100_000
    with open(a / "f", "r+b") as f:
        f.seek(1000)
        f.write(b"NEW")
    want = b"old" * 333 + b"o" + b"NEW" + (b"old" * 100_000)[1003:]
    got, took = within(VISIBLE_WITHIN_S, lambda: read(b / "f"), lambda v: v == want)
    assert got == want, f"B still reads stale bytes {took:.2f} s after A closed"
    (a / "f").write_bytes(b"short")       # truncate + rewrite: size shrinks on B too
    got, took = within(VISIBLE_WITHIN_S, lambda: read(b / "f"), lambda v: v == b"short")
    assert got == b"short", f"B: {got[:20]!r}... ({len(got) if isinstance(got, bytes) else got}) after {took:.2f} s"


def test_unlink_and_rename_through_a_are_seen_by_b(ab: tuple[Path, Path]) -> None:
    a, b = ab
    (a / "gone").write_bytes(b"x")
    (a / "old").write_bytes(b"y")
    assert within(VISIBLE_WITHIN_S, lambda: read(b / "gone"), lambda v: v == b"x")[0] == b"x"
    assert within(VISIBLE_WITHIN_S, lambda: read(b / "old"), lambda v: v == b"y")[0] == b"y"
    os.unlink(a / "gone")
    os.rename(a / "old", a / "new")
    got, took = within(VISIBLE_WITHIN_S, lambda: os.path.exists(b / "gone"), lambda v: v is False)
    assert got is False, f"B still sees an unlinked file after {took:.2f} s"
    got, took = within(VISIBLE_WITHIN_S, lambda: read(b / "new"), lambda v: v == b"y")
    assert got == b"y"
    got, took = within(VISIBLE_WITHIN_S, lambda: os.path.exists(b / "old"), lambda v: v is False)
    assert got is False, f"B still sees the old name of a renamed file after {took:.2f} s"


def test_unflushed_writes_are_not_visible_until_close(ab: tuple[Path, Path]) -> None:
    a, b = ab
    fd = os.open(a / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"x" * 5000)
        time.sleep(0.1)
        assert os.stat(b / "f").st_size == 0         # created, but nothing committed yet
    finally:
        os.close(fd)
    got, _ = within(VISIBLE_WITHIN_S, lambda: os.stat(b / "f").st_size, lambda v: v == 5000)
    assert got == 5000


def test_a_second_node_writes_another_block_beside_the_first(ab: tuple[Path, Path]) -> None:
    """Several writers per file: while A has it open for writing, B writes it too (no
    EBUSY); their blocks merge at the master, each commit replacing only the blocks it
    wrote, and the size grows to the larger end.  A's one-byte block in a file that B made
    longer reads as that byte then zeros."""
    a, b = ab
    bs = 4 << 20
    fd = os.open(a / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"a")
        fb = os.open(b / "f", os.O_WRONLY)
        try:
            os.pwrite(fb, b"b", bs)       # B's view: an empty file; it writes the second block
        finally:
            os.close(fb)
    finally:
        os.close(fd)
    want = b"a" + bytes(bs - 1) + b"b"
    assert within(VISIBLE_WITHIN_S, lambda: read(b / "f"), lambda v: v == want)[0] == want
    with open(b / "f", "ab") as f:
        f.write(b"c")
    assert within(VISIBLE_WITHIN_S, lambda: read(a / "f"), lambda v: v == want + b"c")[0] == want + b"c"


def test_a_truncating_open_on_another_node_ends_the_creators_writes(ab: tuple[Path, Path]) -> None:
    """A new file's creator and another node's truncating open (LMCache's "wb" of one
    .tmp name from two pods): the truncation starts a new generation, the creator's
    writes, whether before or after it, are refused (ESTALE, at its close at the latest:
    the mount takes a write into memory while its lease is asked to bind), and the file is
    the other node's, whole.  A plain open for writing on another node ends nothing."""
    a, b = ab
    for written_first in (False, True):
        name = f"taken{int(written_first)}"
        fd = os.open(a / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        errors = []
        try:
            if written_first:
                os.write(fd, b"from a")
            with open(b / name, "wb") as f:
                f.write(b"from b")
            os.write(fd, b"from a")
        except OSError as e:
            errors.append(e.errno)
        try:
            os.close(fd)   # the write's bytes can never be committed: the close says so
        except OSError as e:
            errors.append(e.errno)
        assert errors and set(errors) == {errno.ESTALE}, errors
        assert within(VISIBLE_WITHIN_S, lambda: read(a / name), lambda v: v == b"from b")[0] == b"from b"

    fd = os.open(a / "kept", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"x")
        os.close(os.open(b / "kept", os.O_WRONLY))   # no EBUSY, and no truncation
        os.ftruncate(fd, 3)
    finally:
        os.close(fd)
    assert within(VISIBLE_WITHIN_S, lambda: read(b / "kept"), lambda v: v == b"x\0\0")[0] == b"x\0\0"


def test_files_created_and_closed_unwritten_are_plain_empty_files(ab: tuple[Path, Path]) -> None:
    """Their close tells the master nothing; they must still behave as empty files
    everywhere: listed, stat'ed, renamed, truncated, removed from either node."""
    a, b = ab
    names = [f"e{i}" for i in range(20)]
    for n in names:
        os.close(os.open(a / n, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    got, _ = within(VISIBLE_WITHIN_S, lambda: sorted(os.listdir(b)), lambda v: v == names)
    assert got == sorted(names)
    assert all(os.stat(b / n).st_size == 0 for n in names)
    os.truncate(b / "e0", 10)                       # another node's truncate: no EBUSY
    with open(a / "e1", "r+b") as f:                # the creator writes it later, as any file
        f.write(b"again")
    os.rename(a / "e2", a / "r2")
    os.unlink(b / "e3")
    assert within(VISIBLE_WITHIN_S, lambda: read(b / "e1"), lambda v: v == b"again")[0] == b"again"
    assert within(VISIBLE_WITHIN_S, lambda: os.stat(a / "e0").st_size, lambda v: v == 10)[0] == 10
    assert within(VISIBLE_WITHIN_S, lambda: (a / "e3").exists(), lambda v: v is False)[0] is False
    assert within(VISIBLE_WITHIN_S, lambda: (b / "r2").exists(), bool)[0] is True


def test_a_close_with_nothing_left_to_send_still_commits_and_releases(ab: tuple[Path, Path]) -> None:
    """A close that has only its commit left (a new file closed unwritten; a file whose
    blocks all landed at an fsync) is answered from the mount's event loop: it must
    still publish the size and bytes and give the write lease up at once."""
    a, b = ab
    os.close(os.open(a / "empty", os.O_CREAT | os.O_WRONLY, 0o644))
    with open(b / "empty", "ab") as f:   # not EBUSY: the lease went with the close
        f.write(b"x")
    data = os.urandom(4 * 1024 * 1024 + 5)
    fd = os.open(a / "synced", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    with open(b / "synced", "ab") as f:
        f.write(b"y")
    assert within(VISIBLE_WITHIN_S, lambda: read(a / "synced"), lambda v: v == data + b"y")[0] == data + b"y"
    assert within(VISIBLE_WITHIN_S, lambda: read(a / "empty"), lambda v: v == b"x")[0] == b"x"


def test_open_reader_on_b_survives_an_overwrite_through_a(ab: tuple[Path, Path], mounted: Mount) -> None:
    """Close-to-open lets B's open descriptor see old or new bytes, but never an error,
    also after the replaced blocks were deleted on the workers."""
    a, b = ab
    old, new = os.urandom(24 << 20), os.urandom(24 << 20)   # more blocks than B reads ahead
    (a / "f").write_bytes(old)
    old_ids = block_ids(mounted, a / "f")
    assert within(VISIBLE_WITHIN_S, lambda: os.stat(b / "f").st_size, lambda v: v == len(old))[0] == len(old)
    fd = os.open(b / "f", os.O_RDONLY | os.O_DIRECT)   # no page cache: every read reaches B's daemon
    buf = mmap.mmap(-1, 1 << 20)
    try:
        assert os.preadv(fd, [buf], 0) == 1 << 20 and buf[:] == old[:1 << 20]
        (a / "f").write_bytes(new)          # O_TRUNC + rewrite: every old block is replaced
        wait_deleted(mounted, old_ids)      # deletions of the old blocks reach the workers
        n = os.preadv(fd, [buf], 21 << 20)
        assert n == 1 << 20
        assert buf[:] in (old[21 << 20:22 << 20], new[21 << 20:22 << 20])
    finally:
        os.close(fd)
    with open(b / "f", "rb") as f:          # a new open sees the new version
        assert f.read() == new
