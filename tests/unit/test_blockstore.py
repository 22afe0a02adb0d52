"""Block files: commit, checksums, restart scan, capacity, tiers, recycling."""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import subprocess
import sys
import time

import pytest
import xxhash

from curvine_py.common.blockmeta import BlockHasher
from curvine_py.common.errors import ConfigError, CurvineError
from curvine_py.worker.blockstore import (CHUNK, TIER_INDEX, BlockMeta, BlockStore,
                                          parse_dir_spec, unshared)
from curvine_py.worker.ioengine import IoEngine

MiB = 1 << 20


@pytest.fixture(scope="module")
def engine(io_engine: IoEngine) -> IoEngine:
    """Every test here runs on both disk I/O engines (tests/conftest.py: io_engine)."""
    return io_engine


def make(engine, *specs, **kw) -> BlockStore:
    return BlockStore(list(specs), engine, reserve=0, **kw)


def put(store: BlockStore, block_id: int, data: bytes, piece: int = MiB, **kw):
    w = store.create(block_id, **kw)
    for i in range(0, len(data), piece):
        w.append(data[i:i + piece])
    return w.commit(len(data), xxhash.xxh3_64_intdigest(data))


def staging_files(store: BlockStore) -> list[str]:
    return [n for d in store.dirs for n in os.listdir(d.staging_dir)]


# ---------------------------------------------------------------- specs and meta

def test_parse_dir_spec():
    assert parse_dir_spec("[SSD:100GB]/data1") == ("SSD", 100 << 30, "/data1")
    assert parse_dir_spec("[mem]/dev/shm/x") == ("MEM", None, "/dev/shm/x")
    assert parse_dir_spec("/plain/path") == ("DISK", None, "/plain/path")
    assert parse_dir_spec("[HDD:8MiB] rel/dir") == ("HDD", 8 << 20, "rel/dir")
    for bad in ("[NVME]/x", "[SSD:lots]/x", "[SSD:0]/x", "", "[SSD"):
        with pytest.raises(ConfigError):
            parse_dir_spec(bad)


def test_meta_roundtrip_and_self_check():
    meta = BlockMeta(3 * MiB + 5, 1234, (1, 2, 3, 4), chunk_size=MiB)   # a sidecar written before session 20
    raw = meta.encode()
    assert BlockMeta.decode(raw) == meta
    now = BlockMeta(MiB + 5, 1234, tuple(range(9)))                         # 128 KiB chunks
    assert now.chunk_size == CHUNK == 128 << 10 and BlockMeta.decode(now.encode()) == now
    for broken in (raw[:-1], raw[:10], b"XXXX" + raw[4:], raw[:20] + bytes([raw[20] ^ 1]) + raw[21:]):
        with pytest.raises(ValueError):
            BlockMeta.decode(broken)
    with pytest.raises(ValueError):   # chunk count inconsistent with the length
        BlockMeta.decode(BlockMeta(5 * MiB, 1, (1,)).encode())


# ---------------------------------------------------------------- write and read

@pytest.mark.parametrize("size,piece", [(0, MiB), (1, MiB), (4 * MiB, MiB), (3 * MiB + 777, 300_000),
                                        (2 * MiB, 4 * MiB)])
@pytest.mark.parametrize("read_io", ["pread", "uring"])
def test_write_commit_read_back(engine, tmp_path, size, piece, read_io):
    store = make(engine, f"[SSD]{tmp_path}/d", read_io=read_io)
    data = os.urandom(size)
    entry = put(store, 7, data, piece)
    assert (entry.length, entry.checksum) == (size, xxhash.xxh3_64_intdigest(data))
    assert len(entry.chunk_sums) == -(-size // CHUNK)
    assert store.read_range(7) == data
    for off, n in ((0, 10), (CHUNK - 3, 10), (1, CHUNK * 2), (size, 5), (size // 2, None)):
        if off <= size:
            want = data[off:] if n is None else data[off:off + n]
            assert store.read_range(7, off, n) == want
    assert staging_files(store) == []
    assert os.path.exists(entry.path) and os.path.exists(entry.path + ".meta")


def test_read_errors(engine, tmp_path):
    store = make(engine, str(tmp_path / "d"))
    put(store, 1, b"abc")
    with pytest.raises(CurvineError) as e:
        store.open_reader(2)
    assert e.value.errno == errno.ENOENT
    with pytest.raises(CurvineError) as e:
        store.open_reader(1, offset=4)
    assert e.value.errno == errno.EINVAL
    assert store.read_range(1, 3) == b""


def test_checksum_mismatch_on_commit_discards(engine, tmp_path):
    store = make(engine, f"[SSD:64MiB]{tmp_path}/d")
    w = store.create(9)
    w.append(b"x" * 1000)
    with pytest.raises(CurvineError) as e:
        w.commit(1000, 12345)
    assert e.value.errno == errno.EBADMSG
    w2 = store.create(10)
    w2.append(b"y" * 10)
    with pytest.raises(CurvineError) as e:
        w2.commit(11, xxhash.xxh3_64_intdigest(b"y" * 10))
    assert e.value.errno == errno.EBADMSG
    assert 9 not in store and 10 not in store
    assert staging_files(store) == []
    assert store.dir_usage()[0][3] == 0   # reservations released


@pytest.mark.parametrize("read_io", ["pread", "uring"])
def test_flipped_byte_on_disk_is_detected_and_block_dropped(engine, tmp_path, read_io):
    store = make(engine, str(tmp_path / "d"), read_io=read_io)
    data = os.urandom(3 * MiB)
    entry = put(store, 5, data)
    store.drain_changes()
    with open(entry.path, "r+b") as f:
        f.seek(2 * MiB + 100)
        b = f.read(1)
        f.seek(2 * MiB + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    assert store.read_range(5, 0, 2 * MiB) == data[:2 * MiB]   # untouched chunks still verify
    with pytest.raises(CurvineError) as e:
        store.read_range(5, 2 * MiB, 10)
    assert e.value.errno == errno.EBADMSG
    assert 5 not in store
    assert store.drain_changes() == ([], [5])
    assert not os.path.exists(entry.path)


@pytest.mark.parametrize("read_io", ["pread", "uring"])
def test_truncated_file_is_corrupt(engine, tmp_path, read_io):
    store = make(engine, str(tmp_path / "d"), read_io=read_io)
    entry = put(store, 5, os.urandom(2 * MiB))
    os.truncate(entry.path, MiB + 1)
    with pytest.raises(CurvineError) as e:
        store.read_range(5)
    assert e.value.errno == errno.EBADMSG
    assert 5 not in store


# ---------------------------------------------------------------- restart

def test_index_reload_and_staging_cleanup(engine, tmp_path):
    spec = f"[SSD:1GiB]{tmp_path}/d"
    store = make(engine, spec)
    blobs = {i: os.urandom(i * 100_000 + 1) for i in range(1, 6)}
    for i, data in blobs.items():
        put(store, i, data)
    w = store.create(99)          # a write in progress when the process "crashes"
    w.append(b"partial")
    w.flush()
    assert staging_files(store)
    again = make(engine, spec)
    assert staging_files(again) == []
    assert sorted(e.block_id for e in again.snapshot()) == sorted(blobs)
    for i, data in blobs.items():
        e = again.get(i)
        assert (e.length, e.checksum) == (len(data), xxhash.xxh3_64_intdigest(data))
        assert again.read_range(i) == data
    assert again.dir_usage()[0][3] == sum(map(len, blobs.values()))


def test_blocks_with_1_MiB_chunk_sidecars_reload_and_read_by_them(engine, tmp_path):
    """A data dir written before session 20 (1 MiB checksum chunks) is read by a worker of
    now: each block verified by the chunk size its sidecar records; a bad byte still found."""
    spec = f"[SSD:1GiB]{tmp_path}/d"
    store = make(engine, spec)
    data = os.urandom(3 * MiB + 4321)
    entry = put(store, 5, data)
    legacy = BlockHasher(MiB)
    legacy.update(memoryview(data))
    with open(entry.path + ".meta", "wb") as f:
        f.write(BlockMeta(len(data), legacy.checksum, tuple(legacy.chunk_sums()), MiB).encode())
    again = make(engine, spec)
    e = again.get(5)
    assert e is not None and e.chunk_size == MiB and len(e.chunk_sums) == 4
    for off, n in ((0, None), (MiB - 10, 20), (2 * MiB + 5, 128 << 10), (3 * MiB, 4321)):
        assert again.read_range(5, off, n) == data[off:None if n is None else off + n]
    with open(e.path, "r+b") as f:
        f.seek(2 * MiB + 7)
        f.write(bytes([data[2 * MiB + 7] ^ 1]))
    with pytest.raises(CurvineError) as err:
        again.read_range(5, 2 * MiB + 500_000, 10)   # in the bad byte's 1 MiB chunk, past its 128 KiB one
    assert err.value.errno == errno.EBADMSG


def test_scan_drops_uncommitted_and_broken_blocks(engine, tmp_path):
    spec = str(tmp_path / "d")
    store = make(engine, spec)
    good = put(store, 1, b"good" * 1000)
    half = put(store, 2, b"half" * 1000)
    os.unlink(half.path + ".meta")          # crash between the data and the meta rename
    short = put(store, 3, b"short" * 1000)
    os.truncate(short.path, 10)             # data file does not match its meta
    bad = put(store, 4, b"bad" * 1000)
    with open(bad.path + ".meta", "r+b") as f:
        f.write(b"JUNK")
    orphan_meta = put(store, 5, b"m" * 10)
    os.unlink(orphan_meta.path)
    again = make(engine, spec, reuse_files=False)
    assert [e.block_id for e in again.snapshot()] == [1]
    assert again.read_range(1) == b"good" * 1000
    for e in (half, short, bad, orphan_meta):
        assert not os.path.exists(e.path) and not os.path.exists(e.path + ".meta")
    assert good.path == again.get(1).path


# ---------------------------------------------------------------- capacity and tiers

def test_enospc_with_tiny_capacity(engine, tmp_path):
    store = make(engine, f"[SSD:8MiB]{tmp_path}/d")
    put(store, 1, os.urandom(4 * MiB))
    put(store, 2, os.urandom(4 * MiB))
    with pytest.raises(CurvineError) as e:
        store.create(3)
    assert e.value.errno == errno.ENOSPC
    store.delete(1)
    put(store, 3, os.urandom(4 * MiB))
    assert store.dir_usage()[0][2:] == (8 * MiB, 8 * MiB)


def test_enospc_when_a_block_outgrows_its_reservation(engine, tmp_path):
    store = make(engine, f"[SSD:6MiB]{tmp_path}/d")
    w = store.create(1, size_hint=MiB)
    w.append(os.urandom(4 * MiB))           # grows the reservation to 5 MiB
    with pytest.raises(CurvineError) as e:
        w.append(os.urandom(2 * MiB))
    assert e.value.errno == errno.ENOSPC
    w.abort()
    assert store.dir_usage()[0][3] == 0


def test_tier_preference_and_most_free_space(engine, tmp_path):
    store = make(engine, f"[MEM:32MiB]{tmp_path}/mem", f"[SSD:64MiB]{tmp_path}/ssd")
    assert put(store, 1, b"m", tier=TIER_INDEX["MEM"]).dir.tier == "MEM"
    assert put(store, 2, b"s").dir.tier == "SSD"              # no preference: most room
    assert put(store, 3, b"s", tier=TIER_INDEX["SSD"]).dir.tier == "SSD"
    for i in range(4, 11):                                    # fill MEM: 28 MiB reserved
        store.create(i, tier=TIER_INDEX["MEM"])
    assert store.create(11, tier=TIER_INDEX["MEM"]).dir.tier == "SSD"   # falls back


# ---------------------------------------------------------------- delete, recycle, reports

def test_delete_recycles_files(engine, tmp_path):
    store = make(engine, str(tmp_path / "d"))
    big = os.urandom(3 * MiB)
    put(store, 1, big)
    assert store.delete(1) and not store.delete(1)
    assert len(store.dirs[0].free_files) == 1
    small = os.urandom(MiB + 3)              # reuses the bigger file: must be truncated
    e = put(store, 2, small)
    assert store.dirs[0].free_files == []
    assert os.path.getsize(e.path) == len(small)
    assert store.read_range(2) == small
    again = make(engine, str(tmp_path / "d"))
    assert again.read_range(2) == small


def test_a_block_file_open_elsewhere_is_not_recycled(engine, tmp_path):
    """A mount's FUSE passthrough (or a short-circuit reader in another process) may hold a
    deleted block's file open: recycling would overwrite the bytes it reads, so such a
    file is only unlinked, and its reader keeps the old bytes."""
    store = make(engine, str(tmp_path / "d"))
    old = os.urandom(2 * MiB)
    path = put(store, 1, old).path
    reader = subprocess.Popen([sys.executable, "-c",
                               "import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True); "
                               "sys.stdin.read(); sys.stdout.buffer.write(f.read())", path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert reader.stdout is not None and reader.stdout.readline() == b"open\n"
        assert store.delete(1)
        assert store.dirs[0].free_files == [] and not os.path.exists(path)
        for i in range(2, 5):                      # new blocks: none lands in the reader's file
            put(store, i, os.urandom(2 * MiB))
        out, _ = reader.communicate(b"", timeout=30)
    finally:
        reader.kill()
        reader.wait()
    assert out == old
    put(store, 5, os.urandom(MiB))
    assert store.delete(5) and len(store.dirs[0].free_files) == 1   # nobody holds it: recycled


def test_unshared_sees_other_openers_and_holds_them_off(tmp_path):
    """unshared() is True only with no other open of the file, and an open that comes
    while the body runs waits for it (no SIGIO reaches the worker either)."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with unshared(str(path)) as alone:
        assert alone
    with open(path, "rb"):
        with unshared(str(path)) as alone:
            assert not alone
    opener = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.readline(); "
                               "print('go', flush=True); t = time.monotonic(); "
                               "open(sys.argv[1], 'rb'); print(time.monotonic() - t)", str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert opener.stdin is not None and opener.stdout is not None
    try:
        with unshared(str(path)) as alone:
            opener.stdin.write("\n")
            opener.stdin.flush()
            assert opener.stdout.readline() == "go\n"
            time.sleep(0.4)
        waited = float(opener.stdout.readline())
    finally:
        opener.kill()
        opener.wait()
    assert alone and waited >= 0.2               # it waited for the lease to be let go


def test_recycled_files_survive_a_restart(engine, tmp_path):
    """A restarted worker adopts the free files its predecessor kept; the files it
    recycles itself must not take (and overwrite) their names, or two free-list entries
    would share one file and the second block created on it fails with ENOENT."""
    first = make(engine, str(tmp_path / "d"))
    for i in range(1, 11):
        put(first, i, os.urandom(1000))
    for i in range(1, 6):
        first.delete(i)
    second = make(engine, str(tmp_path / "d"))     # adopts 5 free files
    for i in range(6, 11):
        second.delete(i)                         # recycles 5 more
    for i in range(11, 16):                      # churn: the newest free files are reused...
        put(second, i, os.urandom(1000))
    for i in range(11, 16):                      # ...and freed again under new names
        second.delete(i)
    free = second.dirs[0].free_files
    assert len({path for path, _ in free}) == len(free) == 10
    for i in range(11, 31):          # takes every free file, then new ones
        data = os.urandom(2000)
        put(second, i, data)
        assert second.read_range(i) == data


def test_rewrite_same_block_id(engine, tmp_path):
    store = make(engine, str(tmp_path / "d"))
    put(store, 1, b"first" * 100)
    put(store, 1, b"second")
    assert store.read_range(1) == b"second"
    assert store.dir_usage()[0][3] == 6
    assert make(engine, str(tmp_path / "d")).read_range(1) == b"second"


def test_change_log(engine, tmp_path):
    store = make(engine, str(tmp_path / "d"))
    put(store, 1, b"a")
    put(store, 2, b"b")
    store.delete(1)
    added, removed = store.drain_changes()
    assert [e.block_id for e in added] == [2] and removed == [1]
    assert store.drain_changes() == ([], [])
    store.requeue_changes(added, removed)     # a heartbeat failed
    put(store, 3, b"c")
    added2, removed2 = store.drain_changes()
    assert sorted(e.block_id for e in added2) == [2, 3] and removed2 == [1]
    assert store.snapshot()[0].block_id in (2, 3)


def test_early_closed_readers_return_buffers(engine, tmp_path):
    store = make(engine, str(tmp_path / "d"), read_buffers=4)
    put(store, 1, os.urandom(3 * MiB))
    for _ in range(50):
        with store.open_reader(1) as r:
            next(iter(r))
    with store.open_reader(1, MiB, MiB) as r:
        assert sum(len(p) for p in r) == MiB
    assert store.get(1).readers == 0


# ---------------------------------------------------------------- O_DIRECT block files

def aligned_put(store: BlockStore, block_id: int, data: bytes, piece: int = MiB):
    """Append from page-aligned pooled-style buffers, as the data server does."""
    w = store.create(block_id)
    keep = []
    for i in range(0, len(data), piece):
        chunk = data[i:i + piece]
        m = mmap.mmap(-1, piece)
        m[:len(chunk)] = chunk
        keep.append(m)
        w.append(memoryview(m)[:len(chunk)])
    return w.commit(len(data), xxhash.xxh3_64_intdigest(data)), w


def cached(path: str) -> int:
    """How many of the file's pages are in the page cache (mincore: looks without reading)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = (ctypes.c_ubyte * (-(-size // mmap.PAGESIZE)))()
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
        return sum(b & 1 for b in vec)
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [4 * MiB, 3 * MiB + 777, 5000, 100])
@pytest.mark.parametrize("read_io", ["pread", "uring"])
def test_direct_writes_skip_the_page_cache_and_read_back(engine, tmp_path, size, read_io):
    store = make(engine, f"[SSD]{tmp_path}/d", direct_io=True, read_io=read_io)
    assert store.dirs[0].direct            # ext4 under pytest's tmp_path takes O_DIRECT
    data = os.urandom(size)
    entry, w = aligned_put(store, 7, data)
    assert w.direct                         # every piece went direct, the tail padded
    assert os.path.getsize(entry.path) == size
    if size >= 4096:
        assert not cached(entry.path)
    assert store.read_range(7) == data
    for off, n in ((0, 10), (CHUNK - 3, 10), (1, CHUNK * 2), (size // 2, None)):
        if off <= size:
            want = data[off:] if n is None else data[off:off + n]
            assert store.read_range(7, off, n) == want
    if size >= 4096 and read_io == "pread":
        assert not cached(entry.path)       # misses are read O_DIRECT, not into the cache


def test_a_small_read_reads_only_the_chunks_it_touches(engine, tmp_path):
    """A small read costs the chunks under it (one or two), not a read step's MiB; a
    whole-block read goes by read steps of whole chunks, the last one short."""
    store = make(engine, f"[SSD]{tmp_path}/d")
    data = os.urandom(4 * MiB + 5)
    put(store, 9, data)
    steps = {}
    for off, n in ((5 * CHUNK + 10, CHUNK // 2), (CHUNK - 4096, CHUNK // 2), (0, None), (4 * MiB, 5)):
        with store.open_reader(9, off, n) as r:
            steps[off] = r._steps()
            assert b"".join(bytes(p) for p in r) == data[off:None if n is None else off + n]
    assert steps[5 * CHUNK + 10] == [(5 * CHUNK, CHUNK)]
    assert steps[CHUNK - 4096] == [(0, 2 * CHUNK)]
    assert steps[0] == [(i * MiB, MiB) for i in range(4)] + [(4 * MiB, 5)]
    assert steps[4 * MiB] == [(4 * MiB, 5)]


def test_direct_write_falls_back_to_buffered_on_unaligned_pieces(engine, tmp_path):
    store = make(engine, f"[SSD]{tmp_path}/d", direct_io=True)
    data = os.urandom(3 * MiB + 777)
    entry, w = aligned_put(store, 1, data, piece=300_000)   # the first piece leaves a tail
    assert not w.direct
    assert store.read_range(1) == data
    put(store, 2, data, piece=MiB)                           # bytes objects: not aligned memory
    assert store.read_range(2) == data


def test_direct_write_into_a_longer_recycled_file(engine, tmp_path):
    store = make(engine, f"[SSD]{tmp_path}/d", direct_io=True)
    aligned_put(store, 1, os.urandom(4 * MiB))
    store.delete(1)
    assert store.dirs[0].free_files
    small = os.urandom(5000)
    entry, w = aligned_put(store, 2, small)
    assert w.initial_size == 4 * MiB and w.direct
    assert os.path.getsize(entry.path) == 5000
    assert store.read_range(2) == small
    store2 = make(engine, f"[SSD]{tmp_path}/d", direct_io=True)   # a restart reads the meta back
    assert store2.read_range(2) == small


def test_an_empty_piece_keeps_a_block_direct(engine, tmp_path):
    store = make(engine, f"[SSD]{tmp_path}/d", direct_io=True)
    w = store.create(3)
    w.append(b"")                         # e.g. a zero-length data frame
    m = mmap.mmap(-1, MiB)
    m[:] = os.urandom(MiB)
    w.append(memoryview(m))
    assert w.direct
    entry = w.commit(MiB, xxhash.xxh3_64_intdigest(m))
    assert store.read_range(3) == m[:] and entry.length == MiB


def test_a_restart_reads_direct_blocks_direct(engine, tmp_path):
    store = make(engine, f"[SSD]{tmp_path}/d", direct_io=True)
    data = os.urandom(2 * MiB)
    entry, _ = aligned_put(store, 4, data)
    again = make(engine, f"[SSD]{tmp_path}/d", direct_io=True)
    adopted = again.get(4)
    assert adopted is not None and not adopted.cached
    assert again.read_range(4) == data
    assert not cached(adopted.path)       # read O_DIRECT, as before the restart
