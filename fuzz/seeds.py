"""Write the hand-made seeds of every target's corpus (fuzz/corpus/<target>/seed-*):
``python -m fuzz.seeds``.  Each is a small input a target decodes into a request that
works (a block written and read back, the root looked up, a volume made), from which the
fuzzer's mutations start; the rest of each corpus is what fuzzing runs found and
``libFuzzer -merge=1`` kept (inputs that reached new code)."""
from __future__ import annotations

import random
from pathlib import Path

import xxhash
from google.protobuf.message import Message

from curvine_py.common import config, frames
from curvine_py.common import metaframes as mf
from curvine_py.common.blockmeta import CHUNK, BlockMeta
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import data_pb2, methods

CORPUS = Path(__file__).resolve().parent / "corpus"
Op = data_pb2.Op


def data_channel() -> dict[str, bytes]:
    block = bytes(range(256)) * 16
    write = (frames.header_bytes(data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=7, length=len(block)))
             + frames.header_bytes(data_pb2.DataHeader(op=Op.WRITE_DATA, payload_len=len(block))) + block
             + frames.header_bytes(data_pb2.DataHeader(op=Op.WRITE_COMMIT, length=len(block),
                                                       checksum=xxhash.xxh3_64_intdigest(block))))
    read = frames.header_bytes(data_pb2.DataHeader(op=Op.READ, block_id=7, offset=0, length=len(block)))
    return {"write-read": write + read, "read-missing": read.replace(b"\x07", b"\x09", 1),
            "bad-length": b"\xff\xff\xff\xff", "frames": b"\x01" + random.Random(1).randbytes(200)}


def meta_channel() -> dict[str, bytes]:
    caller = pb.Caller(uid=0, gid=0)
    calls: list[tuple[int, Message]] = [(methods.Master.GetAttr.id, pb.InodeRequest(caller=caller, ino=1)),
             (methods.Master.ReadDir.id, pb.ReadDirRequest(caller=caller, ino=1, limit=10)),
             (methods.Master.Lookup.id, pb.LookupRequest(caller=caller, parent=1, name="a")),
             (methods.Master.StatFs.id, pb.Empty())]
    frames_ = b"".join(mf.request_frame(i + 1, mid, req.SerializeToString()) for i, (mid, req) in enumerate(calls))
    return {"calls": frames_, "short": frames_[:7], "built": b"\x01" + random.Random(2).randbytes(300)}


def blockmeta_sidecar() -> dict[str, bytes]:
    empty = BlockMeta(0, xxhash.xxh3_64_intdigest(b""), ())
    three = BlockMeta(2 * CHUNK + 5, 12345, (1, 2, 3))
    return {"empty": empty.encode(), "three-chunks": three.encode(), "legacy": BlockMeta(10, 1, (9,), 1 << 20).encode()}


def config_parse() -> dict[str, bytes]:
    full = config.to_toml(config.Config()).encode()
    env = bytes([1, 4, 1, 3]) + b"\x054MiB\x00" * 4
    return {"full-file": b"\x00" + full, "one-key": b"\x00[master]\nblock_size = \"4MiB\"\n", "env": env,
            "size": b"\x02\x061.5GiB"}


def master_handlers() -> dict[str, bytes]:
    rng = random.Random(3)
    return {f"method-{m.name}": bytes([m.id]) + rng.randbytes(120) for m in methods.METHODS}


def csi_requests() -> dict[str, bytes]:
    rng = random.Random(4)
    return {f"call-{i}": bytes([i]) + rng.randbytes(160) for i in range(12)}


SEEDS = {f.__name__: f for f in (data_channel, meta_channel, blockmeta_sidecar, config_parse, master_handlers,
                                 csi_requests)}


def main() -> None:
    for target, make in SEEDS.items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in make().items():
            (folder / f"seed-{name}").write_bytes(data)


if __name__ == "__main__":
    main()
