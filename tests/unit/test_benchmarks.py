"""The pieces of `cv bench` that decide whether a read is right, and how figures are shown."""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from curvine_py.cli.bench import workloads as bm
from curvine_py.cli.bench import figures, format_value


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 5000), index=st.integers(0, 10_000))
def test_digest_is_that_of_the_filled_content(length: int, index: int) -> None:
    p = bm.Pattern(seed=index * 7 + length, length=length)
    buf = bytearray(length)
    p.fill(memoryview(buf), index)
    header = bm.kv_header(index, length + bm.HEADER_SIZE, p.seed)
    assert p.digest(header, index, length) == xxhash.xxh3_64_intdigest(header + buf)
    assert p.expected(header, index, length) == header + buf
    assert sorted(buf) == sorted(p.base)          # a rotation: the same bytes, moved


def test_files_differ_beyond_their_header() -> None:
    p = bm.Pattern(seed=1, length=1 << 16)
    a, b = bytearray(1 << 16), bytearray(1 << 16)
    p.fill(memoryview(a), 0)
    p.fill(memoryview(b), 1)
    assert a != b and sum(x != y for x, y in zip(a, b)) > (1 << 15)


@settings(max_examples=50, deadline=None)
@given(data=st.binary(min_size=1, max_size=3000), at=st.integers(0, 2999))
def test_first_difference_finds_the_changed_byte(data: bytes, at: int) -> None:
    at %= len(data)
    changed = bytearray(data)
    changed[at] ^= 0x01
    assert bm.first_difference(memoryview(changed), data) == at
    assert bm.first_difference(memoryview(data), data) == len(data)


def test_percentiles_are_nearest_rank() -> None:
    times = [i / 1000 for i in range(1, 101)]      # 1..100 ms
    assert bm.percentile_ms(times, 0.50) == 50.0
    assert bm.percentile_ms(times, 0.99) == 99.0
    assert bm.percentile_ms([0.005], 0.99) == 5.0
    assert bm.percentile_ms([], 0.5) == 0.0


def test_figures_rows_and_formats() -> None:
    result = {"kvcache": {"write_GBps": 1.25, "read": {
                  "warm": {"read_GBps": 2.0, "prompt_ms": 55.5, "prompt_files": 8},
                  "cold": {"read_GBps": 1.0, "prompt_ms": 90.0, "prompt_files": 8}}},
              "meta": {"create_per_s": 1234.4}}
    rows = figures(result)
    assert rows == [("kvcache", "write GB/s", 1.25),
                    ("kvcache", "read GB/s (warm)", 2.0), ("kvcache", "read GB/s (cold)", 1.0),
                    ("kvcache", "1,925-token prompt read ms (8 files) (warm)", 55.5),
                    ("kvcache", "1,925-token prompt read ms (8 files) (cold)", 90.0),
                    ("meta", "create/s", 1234.4)]
    assert [format_value(m, v) for _, m, v in rows] == ["1.250", "2.000", "1.000", "55.5", "90.0", "1,234"]
    seq = figures({"seq": {"read": {"cold": {"read_GBps": 1.5, "random_per_s": 901.7, "random_p50_ms": 0.81}}}})
    assert [(m, format_value(m, v)) for _, m, v in seq] == [
        ("read GB/s (cold)", "1.500"), ("random 128 KiB reads/s (cold)", "902"),
        ("random 128 KiB read p50 ms (cold)", "0.8")]


def test_random_reads_check_every_byte_and_leave_the_sequential_read_uncached(tmp_path: Path) -> None:
    plan = bm.new_plan(["seq"], 1, 1 << 20, 8 << 20, 1, random_reads=50)
    bm.seq_write(tmp_path, plan)
    figs = bm.seq_random_read(tmp_path, plan)
    assert figs["random_per_s"] > 0 and 0 < figs["random_p50_ms"] <= figs["random_p99_ms"]
    assert bm.seq_random_read(tmp_path, dataclasses.replace(plan, random_reads=0)) == {}
    seq = tmp_path / bm.SEQ_FILE
    with open(seq, "r+b") as f:      # one byte changed in every 128 KiB: the first random read fails
        for off in range(1000, plan.seq_size, bm.RANDOM_IO):
            f.seek(off)
            old = f.read(1)
            f.seek(off)
            f.write(bytes([old[0] ^ 0x10]))
    with pytest.raises(bm.WrongData, match=r"wrong bytes at offset \d+") as e:
        bm.seq_random_read(tmp_path, plan)
    assert int(str(e.value).split("offset ")[1].split()[0]) % bm.RANDOM_IO == 1000


def test_lmcache_pools_on_a_local_directory_open_every_chunk_first(tmp_path: Path) -> None:
    """--writers/--readers: with more chunks than threads every chunk is open (its header
    written) before any payload goes, and the read-back is verified."""
    plan = bm.new_plan(["kvcache"], files=12, file_size=100_000, seq_size=4096, meta_files=1,
                       writers=3, readers=12)
    figs = bm.write_phase(tmp_path, plan)["kvcache"]
    assert figs["write_threads"] == 3
    read = bm.read_phase(tmp_path)["kvcache"]
    assert read["read_threads"] == 12 and read["read_GBps"] > 0
    victim = next((tmp_path / bm.KV_DIR).iterdir())
    with open(victim, "r+b") as f:
        f.seek(50_000)
        f.write(b"\0")
    with pytest.raises(bm.WrongData):
        bm.read_phase(tmp_path)


def test_a_pool_that_stops_answering_is_reported_not_waited_for() -> None:
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(bm.Stalled, match="0 of 3 files done"):
        bm.run_staged([(lambda: never.wait(30),)] * 3, threads=2, timeout_s=0.5, what="kvcache write")
    assert time.monotonic() - started < 5
    never.set()
