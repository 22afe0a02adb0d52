"""DirtyBlock's records of acknowledged writes (client/dirtyblock.py) against a model.

Whatever the writes (in order, anywhere, over each other, a truncate between), the
records cover exactly the bytes written, and verify() passes the buffer they left and
names the range of any byte changed behind the writer's back; a byte outside every
record (a hole) may be anything.
"""
from __future__ import annotations

import random

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from curvine_py.client.dirtyblock import DirtyBlock, merge_ranges
from curvine_py.common.buffers import BufferPool

BS = 256 << 10
pool = BufferPool(BS, 4)

writes = st.lists(st.one_of(
    st.tuples(st.just("w"), st.integers(0, BS - 1), st.integers(1, 70_000), st.integers(0, 2**31)),
    st.tuples(st.just("clip"), st.integers(0, BS), st.just(0), st.just(0))), min_size=1, max_size=12)


def apply(ops: list[tuple[str, int, int, int]]) -> tuple[DirtyBlock, bytearray, list[list[int]]]:
    """The block after ops, the model of its bytes, and the ranges written (merged)."""
    db = DirtyBlock(pool, pool.acquire())
    model, written = bytearray(BS), []
    for op, at, n, seed in ops:
        if op == "clip":
            db.clip(at)
            written = [[a, min(b, at)] for a, b in written if a < at]
            continue
        n = min(n, BS - at)
        data = random.Random(seed).randbytes(n)
        db.write(at, memoryview(data))
        model[at:at + n] = data
        written = merge_ranges(written + [[at, at + n]])
    return db, model, written


@settings(max_examples=300, deadline=None)
@given(ops=writes)
def test_records_cover_the_writes_and_pass_what_they_left(ops: list[tuple[str, int, int, int]]) -> None:
    db, model, written = apply(ops)
    try:
        assert merge_ranges([list(r) for r in db.records()]) == written
        length = max((b for _, b in written), default=0)
        data = db.view[:length]
        verdict = db.verify(data, xxhash.xxh3_64_intdigest(data))
        assert verdict.ok, verdict
        assert all(data[a:b] == model[a:b] for a, b in written)   # (outside them: whatever the buffer held)
    finally:
        db.release()


@settings(max_examples=300, deadline=None)
@given(ops=writes, where=st.integers(0, BS - 1))
def test_a_byte_changed_in_a_write_is_named_lost(ops: list[tuple[str, int, int, int]], where: int) -> None:
    db, _, written = apply(ops)
    try:
        length = max((b for _, b in written), default=0)
        data = db.view[:length]
        inside = any(a <= where < b for a, b in written)
        if where < length:
            data[where] ^= 0x5A
        verdict = db.verify(data, xxhash.xxh3_64_intdigest(data))
        if inside:
            assert any(a <= where < b for a, b in verdict.lost), (where, verdict)
        else:
            assert verdict.ok
    finally:
        db.release()


def test_in_order_writes_cost_no_hash_at_verify() -> None:
    """The KV chunk's block: the records are the running hash, compared to the workers'."""
    db = DirtyBlock(pool, pool.acquire())
    try:
        data = random.Random(1).randbytes(BS)
        cuts = [0, 28, 28 + 65536, 100_000, BS]   # a header, then pieces, in order
        for a, b in zip(cuts, cuts[1:]):
            db.write(a, memoryview(data)[a:b])
        assert db.in_order(BS)
        right = xxhash.xxh3_64_intdigest(data)
        assert db.verify(db.view[:BS], right).ok
        wrong = db.verify(db.view[:BS], right ^ 1)   # the bytes that went out were other bytes
        assert wrong.resend and not wrong.lost
        db.view[5] ^= 1                             # and now the buffer lost them too
        lost = db.verify(db.view[:BS], right ^ 1)
        assert lost.lost == [(0, BS)] and not lost.resend
    finally:
        db.release()


def test_bytes_past_the_shipped_length_are_lost() -> None:
    """A write acknowledged beyond the length a block was shipped at is not in it."""
    db = DirtyBlock(pool, pool.acquire())
    try:
        db.write(0, memoryview(b"a" * 1000))
        db.write(5000, memoryview(b"b" * 10))
        data = db.view[:3000]
        verdict = db.verify(data, xxhash.xxh3_64_intdigest(data))
        assert verdict.lost == [(5000, 5010)]
    finally:
        db.release()
