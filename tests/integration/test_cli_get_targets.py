"""`cv fs get` never destroys what it writes to (issue 42, item 2), as `cp` behaves.

A regular file or a new name: a hidden temporary name renamed into place.  A device, a
FIFO: opened and written in place (renaming over `/dev/full` once made it a regular file).
A socket: refused in one line.  A symlink: followed.  A directory: the source's name
inside it.  `-`: standard output.  The devices are made with mknod in a temporary
directory, never the system's own.
"""
from __future__ import annotations

import os
import socket
import stat
import threading
import typing
from pathlib import Path

import pytest

from tests.integration.test_cli import cv, ok, one_error_line, rdir  # noqa: F401  (fixtures)

MiB = 1 << 20


@pytest.fixture
def remote_file(cv: typing.Any, rdir: str, tmp_path: Path) -> tuple[str, bytes]:  # noqa: F811
    data = os.urandom(5 * MiB + 7)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    ok(cv("fs", "put", "-q", str(src), f"{rdir}/f.bin"))
    src.unlink()
    return f"{rdir}/f.bin", data


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if ".cv-get-" in p.name)


def test_a_null_device_is_written_in_place(cv: typing.Any, remote_file: tuple[str, bytes],  # noqa: F811
                                           tmp_path: Path) -> None:
    dev = tmp_path / "null"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    ok(cv("fs", "get", "-q", remote_file[0], str(dev)))
    assert stat.S_ISCHR(os.lstat(dev).st_mode) and os.lstat(dev).st_rdev == os.makedev(1, 3)
    assert leftovers(tmp_path) == []


def test_a_full_device_fails_in_one_line_and_stays_a_device(cv: typing.Any,  # noqa: F811
                                                            remote_file: tuple[str, bytes], tmp_path: Path) -> None:
    dev = tmp_path / "full"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    err = one_error_line(cv("fs", "get", "-q", remote_file[0], str(dev)))
    assert "No space left on device" in err and str(dev) in err
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert leftovers(tmp_path) == []


def test_a_fifo_is_written_in_place(cv: typing.Any, remote_file: tuple[str, bytes], tmp_path: Path) -> None:  # noqa: F811
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = bytearray()

    def drain() -> None:
        with open(fifo, "rb") as f:
            while chunk := f.read(1 << 16):
                got.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    ok(cv("fs", "get", "-q", remote_file[0], str(fifo)))
    reader.join(30)
    assert bytes(got) == remote_file[1]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_socket_is_refused_in_one_line(cv: typing.Any, remote_file: tuple[str, bytes],  # noqa: F811
                                         tmp_path: Path) -> None:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        err = one_error_line(cv("fs", "get", "-q", remote_file[0], str(path)))
        assert str(path) in err
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_a_symlink_is_followed(cv: typing.Any, remote_file: tuple[str, bytes], tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "real.bin"
    target.write_bytes(b"old")
    link = tmp_path / "link"
    link.symlink_to(target)
    ok(cv("fs", "get", "-q", remote_file[0], str(link)))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == remote_file[1]
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "sub") == []
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "sub" / "new.bin")   # written through, as a shell's > does
    ok(cv("fs", "get", "-q", remote_file[0], str(dangling)))
    assert dangling.is_symlink() and (tmp_path / "sub" / "new.bin").read_bytes() == remote_file[1]


def test_a_directory_gets_the_source_name_and_a_file_is_replaced(cv: typing.Any,  # noqa: F811
                                                                 remote_file: tuple[str, bytes],
                                                                 tmp_path: Path) -> None:
    (tmp_path / "into").mkdir()
    ok(cv("fs", "get", "-q", remote_file[0], str(tmp_path / "into")))
    assert (tmp_path / "into" / "f.bin").read_bytes() == remote_file[1]
    old = tmp_path / "old.bin"
    old.write_bytes(b"x" * 10)
    inode = os.stat(old).st_ino
    ok(cv("fs", "get", "-q", remote_file[0], str(old)))
    assert old.read_bytes() == remote_file[1] and os.stat(old).st_ino != inode   # renamed into place
    out = cv("fs", "get", remote_file[0], "-")
    assert out.returncode == 0 and out.stdout == remote_file[1]
