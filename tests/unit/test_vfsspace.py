"""client/vfsspace.py against a byte-by-byte model: SEEK_DATA/SEEK_HOLE over a block map,
and what each fallocate mode does to a file's size and bytes."""
from __future__ import annotations

import errno
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from curvine_py.client import vfsspace
from curvine_py.common.errors import CurvineError

BS = 8


def model_seek(present: set[int], size: int, offset: int, whence: int) -> int | None:
    """The first byte at or after offset that is data (a byte of a present slot) or a hole
    (any other byte, or the end); None: ENXIO."""
    if offset >= size:
        return None
    for at in range(offset, size):
        if (at // BS in present) == (whence == os.SEEK_DATA):
            return at
    return None if whence == os.SEEK_DATA else size


@given(st.sets(st.integers(0, 9)), st.integers(1, 80), st.integers(0, 90),
       st.sampled_from([os.SEEK_DATA, os.SEEK_HOLE]))
def test_seek_matches_the_model(present: set[int], size: int, offset: int, whence: int) -> None:
    want = model_seek(present, size, offset, whence)
    if want is None:
        with pytest.raises(CurvineError) as e:
            vfsspace.seek_data(present, size, BS, offset, whence)
        assert e.value.errno == errno.ENXIO
    else:
        assert vfsspace.seek_data(present, size, BS, offset, whence) == want


@given(st.sampled_from(vfsspace.SUPPORTED), st.integers(0, 60), st.integers(1, 60), st.integers(0, 60))
def test_fallocation_matches_the_model(mode: int, offset: int, length: int, size: int) -> None:
    """Bytes: the file as a list, zeroed range and growth applied as Linux does."""
    f = vfsspace.fallocation(mode, offset, length, size)
    end = offset + length
    assert f.size == (size if mode & vfsspace.KEEP_SIZE else max(size, end))
    zeroed = set(range(f.zero_start, f.zero_end))
    if mode & (vfsspace.PUNCH_HOLE | vfsspace.ZERO_RANGE):
        assert zeroed == set(range(offset, min(end, size)))   # past the old size it reads zeros anyway
    else:
        assert not zeroed


@pytest.mark.parametrize("mode", [vfsspace.PUNCH_HOLE, 0x08, 0x20, 0x40, vfsspace.ZERO_RANGE | vfsspace.PUNCH_HOLE])
def test_other_modes_are_not_supported(mode: int) -> None:
    with pytest.raises(CurvineError) as e:
        vfsspace.fallocation(mode, 0, 10, 100)
    assert e.value.errno == errno.EOPNOTSUPP


def test_pieces_stay_inside_blocks() -> None:
    assert list(vfsspace.pieces(5, 30, BS, 4)) == [(5, 3), (8, 4), (12, 4), (16, 4), (20, 4), (24, 4), (28, 2)]


@given(st.integers(0, 60), st.integers(1, 60), st.integers(0, 60))
def test_whole_slots_are_the_slots_a_zeroed_range_covers_whole(start: int, length: int, size: int) -> None:
    """A slot's bytes are [i*BS, min((i+1)*BS, size)): whole_slots names exactly those inside
    [start, start+length) (a slot reaching the file's end is covered up to the size)."""
    end = start + length
    want = [i for i in range(-(-size // BS))
            if start <= i * BS and min((i + 1) * BS, size) <= end]
    assert list(vfsspace.whole_slots(start, end, size, BS)) == want


def test_allocated_counts_the_bytes_of_present_slots() -> None:
    assert vfsspace.allocated({0, 2}, 2 * BS + 3, BS) == BS + 3      # the last slot up to the size
    assert vfsspace.allocated(set(), 10 * BS, BS) == 0                # all holes (a truncate-up)
    assert vfsspace.allocated({5}, 2 * BS, BS) == 0                   # past the size (truncated away)
