"""Target: the block meta sidecar (curvine_py/common/blockmeta.py ``BlockMeta.decode``),
which the worker reads at start-up and the short-circuit client before trusting a local
block file.

Checks: any bytes decode to a BlockMeta or raise ValueError (nothing else); what decodes
re-encodes to a sidecar that decodes to the same BlockMeta; a valid sidecar built from the
input with one byte changed never decodes to anything else than it did (the file checks
itself)."""
from __future__ import annotations

from curvine_py.common.blockmeta import BlockMeta
from fuzz.draw import Draw
from fuzz.harness import MAX_INPUT, Finding, run


def fuzz_one(data: bytes) -> None:
    data = data[:MAX_INPUT]
    _decode_raw(data)
    _flip_one_byte(Draw(data))


def _decode_raw(data: bytes) -> None:
    try:
        meta = BlockMeta.decode(data)
    except ValueError:
        return
    if BlockMeta.decode(meta.encode()) != meta:
        raise Finding(f"{meta} does not survive encode/decode")


def _flip_one_byte(draw: Draw) -> None:
    chunk = draw.choice((128 << 10, 1 << 20, 4096, 1, draw.uint(4) or 1))
    nchunks = draw.byte() % 9
    length = max(0, (nchunks - 1) * chunk + 1 + draw.uint(4) % chunk) if nchunks else 0
    sums = tuple(draw.uint(8) for _ in range(-(-length // chunk)))
    meta = BlockMeta(length, draw.uint(8), sums, chunk)
    raw = bytearray(meta.encode())
    if BlockMeta.decode(bytes(raw)) != meta:
        raise Finding(f"{meta} does not survive encode/decode")
    at, xor = draw.uint(2) % len(raw), draw.byte() or 1
    raw[at] ^= xor
    try:
        changed = BlockMeta.decode(bytes(raw))
    except ValueError:
        return
    raise Finding(f"byte {at} of a sidecar changed (^{xor:#x}) and it still decoded: {changed}")


def main() -> None:
    run(fuzz_one)


if __name__ == "__main__":
    main()
