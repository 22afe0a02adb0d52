"""The whole-file check before a block file is handed to the kernel (FUSE passthrough):
every chunk's xxh3, the two halves hashed on two threads, must equal the sidecar's."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from curvine_py.client.shortcircuit import ShortCircuit
from curvine_py.common.blockmeta import CHUNK, BlockHasher, BlockMeta


def meta_of(data: bytes) -> BlockMeta:
    h = BlockHasher()
    h.update(memoryview(data))
    return BlockMeta(len(data), h.checksum, tuple(h.chunk_sums()))


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5, 14 * CHUNK + 28])
def test_chunk_sums_match_the_writers(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "b").write_bytes(data)
    meta = meta_of(data)
    sc = ShortCircuit("here")
    fd = os.open(tmp_path / "b", os.O_RDONLY)
    try:
        assert sc._chunk_sums(fd, meta) == list(meta.chunk_sums)
    finally:
        os.close(fd)
        sc.close()


@pytest.mark.parametrize("where", [7, CHUNK + 3, 3 * CHUNK + 1])   # in the helper's half and in ours
def test_a_flipped_byte_is_seen_in_either_half(tmp_path: Path, where: int) -> None:
    data = bytearray(os.urandom(3 * CHUNK + 5))
    meta = meta_of(bytes(data))
    data[where] ^= 0xFF
    (tmp_path / "b").write_bytes(data)
    sc = ShortCircuit("here")
    fd = os.open(tmp_path / "b", os.O_RDONLY)
    try:
        sums = sc._chunk_sums(fd, meta)
        assert sums != list(meta.chunk_sums)
        assert [i for i, (a, b) in enumerate(zip(sums, meta.chunk_sums)) if a != b] == [where // CHUNK]
    finally:
        os.close(fd)
        sc.close()
