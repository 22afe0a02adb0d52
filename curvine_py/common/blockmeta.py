"""The block meta sidecar format (``<block>.meta``), shared by the worker that writes it
and the short-circuit client that verifies local block files with it.

The byte layout is in docs/worker.md ("Meta file format"): a fixed head, one xxh3_64
per chunk (the head records the chunk size: CHUNK for files written now, 1 MiB for
files written before session 20, both read), and an xxh3_64 of everything before it
(the file checks itself).
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import xxhash

MiB = 1 << 20
CHUNK = 128 << 10                 # checksum granularity of block files written now
LEGACY_CHUNK = MiB                # what sidecars and WRITE_COMMITs carrying no chunk size mean

META_MAGIC = b"CVBM"
META_VERSION = 1
_META_HEAD = struct.Struct("<4sHHQIIQ")   # magic, version, flags, length, chunk, nchunks, xxh3
_U64 = struct.Struct("<Q")


def block_file(data_dir: str, block_id: int) -> str:
    """Where a committed block's file lives under a worker data dir (its sidecar is
    this + ".meta"): ``blocks/<xx>/<id>``, xx = the low byte of xxh3(id, 8 bytes LE)
    in hex.  The worker writes there and the short-circuit client looks there first."""
    sub = xxhash.xxh3_64_intdigest(block_id.to_bytes(8, "little")) & 0xFF
    return os.path.join(data_dir, "blocks", f"{sub:02x}", str(block_id))


def mapped_chunk_sums(buf: mmap.mmap, lo: int, hi: int, chunk: int = CHUNK) -> list[int]:
    """xxh3 of each chunk of buf[lo:hi], hashed where it lies (no copy); every view of
    buf is let go before returning, so the map can be closed."""
    with memoryview(buf) as view:
        return [xxhash.xxh3_64_intdigest(view[i:min(i + chunk, hi)]) for i in range(lo, hi, chunk)]


def file_chunk_sums(fd: int, length: int, chunk: int = CHUNK) -> list[int]:
    """xxh3 of each chunk of the first `length` bytes of the open file fd, hashed from
    its page-cache pages by mmap (a short file raises, as SIGBUS would not be caught)."""
    if length == 0:
        return []
    if os.fstat(fd).st_size < length:
        raise ValueError(f"file holds fewer than {length} bytes")
    with mmap.mmap(fd, length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ) as m:
        return mapped_chunk_sums(m, 0, length, chunk)


class BlockHasher:
    """The checksums a block's meta file holds, computed as its bytes stream by in order:
    the xxh3_64 of the whole block and of every chunk.  The worker's writer and the
    short-circuit writing client (client/localwrite.py) both use it."""

    def __init__(self, chunk: int = CHUNK) -> None:
        self.chunk_size = chunk
        self._whole = xxhash.xxh3_64()
        self._chunk = xxhash.xxh3_64()
        self._fill = 0
        self._sums: list[int] = []

    def update(self, view: memoryview) -> None:
        self._whole.update(view)
        pos = 0
        while pos < len(view):
            take = min(self.chunk_size - self._fill, len(view) - pos)
            self._chunk.update(view[pos:pos + take])
            self._fill += take
            pos += take
            if self._fill == self.chunk_size:
                self._sums.append(self._chunk.intdigest())
                self._chunk.reset()
                self._fill = 0

    @property
    def checksum(self) -> int:
        return self._whole.intdigest()

    def chunk_sums(self) -> list[int]:
        """One sum per chunk, the last (partial) one included."""
        return self._sums + ([self._chunk.intdigest()] if self._fill else [])


@dataclass(frozen=True)
class BlockMeta:
    """Contents of a block's sidecar file."""
    length: int
    checksum: int
    chunk_sums: tuple[int, ...]
    chunk_size: int = CHUNK

    def encode(self) -> bytes:
        body = _META_HEAD.pack(META_MAGIC, META_VERSION, 0, self.length, self.chunk_size,
                               len(self.chunk_sums), self.checksum)
        body += struct.pack(f"<{len(self.chunk_sums)}Q", *self.chunk_sums)
        return body + _U64.pack(xxhash.xxh3_64_intdigest(body))

    @classmethod
    def decode(cls, raw: bytes) -> "BlockMeta":
        """Parse and self-check a meta file; ValueError when it is not a valid one."""
        if len(raw) < _META_HEAD.size + _U64.size:
            raise ValueError("meta file too short")
        magic, version, _flags, length, chunk, n, checksum = _META_HEAD.unpack_from(raw)
        if magic != META_MAGIC or version != META_VERSION or chunk <= 0:
            raise ValueError("not a block meta file")
        end = _META_HEAD.size + 8 * n
        if len(raw) != end + _U64.size or n != -(-length // chunk):
            raise ValueError("meta file has the wrong size")
        if _U64.unpack_from(raw, end)[0] != xxhash.xxh3_64_intdigest(raw[:end]):
            raise ValueError("meta file checksum mismatch")
        return cls(length, checksum, struct.unpack_from(f"<{n}Q", raw, _META_HEAD.size), chunk)
