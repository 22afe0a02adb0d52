#!/usr/bin/env python3
"""Which S3 library for the UFS data path: ranged GETs into a preallocated buffer.

Starts SeaweedFS on loopback (curvine_py.testing.s3servers), uploads one --size object
(256 MiB), then for each library reads the whole object as ranged GETs of 4 MiB and
16 MiB blocks, serially and from 4 threads (each thread its own reused buffer), and
prints MB/s and the process's CPU seconds per GB (time.process_time: every thread of
this process, the libraries' own runtime threads included; SeaweedFS is another
process and not counted).  Best of --runs passes per cell.

Libraries, each in its best way to fill a caller's buffer:
- boto3: get_object(Range=...) and StreamingBody.readinto (no intermediate bytes);
- opendal: Operator.read(offset, size) -> bytes, copied into the buffer
  ("opendal-file": Operator.open(offset, size) + readinto, the no-intermediate variant);
- obstore: get_range -> a Rust-owned Bytes (buffer protocol), copied into the buffer.

    .venv/bin/python bench/ufs_libs.py [--size 256MiB] [--runs 2] [--json]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import threading
import time
import typing

from curvine_py.common.config import parse_size
from curvine_py.testing.s3servers import SeaweedServer

MiB = 1 << 20
BUCKET = "bench"
KEY = "object.bin"
Reader = typing.Callable[[int, memoryview], int]


def boto3_reader(s3: SeaweedServer) -> Reader:
    client = _boto3(s3)

    def read(offset: int, into: memoryview) -> int:
        body = client.get_object(Bucket=BUCKET, Key=KEY,
                                 Range=f"bytes={offset}-{offset + len(into) - 1}")["Body"]
        n = 0
        while n < len(into):
            got = body.readinto(into[n:])
            if not got:
                break
            n += got
        body.close()
        return n
    return read


def _boto3(s3: SeaweedServer) -> typing.Any:
    from botocore.config import Config
    import boto3
    return boto3.client("s3", endpoint_url=s3.endpoint, region_name=s3.region,
                        aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key,
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16))


def _opendal(s3: SeaweedServer) -> typing.Any:
    import opendal
    return opendal.Operator("s3", bucket=BUCKET, endpoint=s3.endpoint, region=s3.region,
                            access_key_id=s3.access_key, secret_access_key=s3.secret_key,
                            root="/")


def opendal_reader(s3: SeaweedServer) -> Reader:
    op = _opendal(s3)

    def read(offset: int, into: memoryview) -> int:
        data = op.read(KEY, offset=offset, size=len(into))
        into[:len(data)] = data
        return len(data)
    return read


def opendal_file_reader(s3: SeaweedServer) -> Reader:
    op = _opendal(s3)

    def read(offset: int, into: memoryview) -> int:
        with op.open(KEY, "rb", offset=offset, size=len(into)) as f:   # as curvine_py/ufs/s3.py
            n = 0
            while n < len(into):
                got = f.readinto(into[n:])
                if not got:
                    break
                n += got
            return n
    return read


def obstore_reader(s3: SeaweedServer) -> Reader:
    from obstore.store import S3Store
    import obstore
    store = S3Store(BUCKET, endpoint=s3.endpoint, region=s3.region, access_key_id=s3.access_key,
                    secret_access_key=s3.secret_key, virtual_hosted_style_request=False,
                    client_options={"allow_http": True, "timeout": "60s"})

    def read(offset: int, into: memoryview) -> int:
        data = memoryview(obstore.get_range(store, KEY, start=offset, length=len(into)))
        into[:len(data)] = data
        return len(data)
    return read


LIBRARIES: dict[str, typing.Callable[[SeaweedServer], Reader]] = {
    "boto3": boto3_reader, "opendal": opendal_reader, "opendal-file": opendal_file_reader,
    "obstore": obstore_reader,
}


def one_pass(read: Reader, size: int, block: int, threads: int) -> tuple[float, float]:
    """Read the whole object in block-sized ranges; (MB/s, CPU s per GB)."""
    local = threading.local()

    def fetch(offset: int) -> int:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = memoryview(bytearray(block))
            buf[:] = b"\0" * block   # touch it: fresh pages must not count as reading
        want = min(block, size - offset)
        n = read(offset, buf[:want])
        assert n == want, (offset, n, want)
        return n

    offsets = range(0, size, block)
    cpu0, t0 = time.process_time(), time.perf_counter()
    if threads == 1:
        total = sum(fetch(o) for o in offsets)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(fetch, offsets))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return total / wall / 1e6, cpu / (total / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--libs", default=",".join(LIBRARIES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    unknown = set(args.libs.split(",")) - set(LIBRARIES)
    if unknown:
        ap.error(f"--libs: unknown {', '.join(sorted(unknown))} (known: {', '.join(LIBRARIES)})")
    size = parse_size(args.size)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    rows = []
    with SeaweedServer() as s3:
        s3.make_bucket(BUCKET)
        _boto3(s3).upload_fileobj(_Random(size), BUCKET, KEY)
        for lib in args.libs.split(","):
            try:
                read = LIBRARIES[lib](s3)
            except ImportError as e:   # obstore is not a dependency: measured where installed
                print(f"skipped {lib}: {e} (pip install it to compare)", file=sys.stderr)
                continue
            read(0, memoryview(bytearray(MiB)))   # warm: connection, credentials
            for block in (4 * MiB, 16 * MiB):
                for threads in (1, 4):
                    best = max((one_pass(read, size, block, threads) for _ in range(args.runs)),
                               key=lambda r: r[0])
                    rows.append(dict(lib=lib, block_MiB=block // MiB, threads=threads,
                                     MBps=round(best[0]), cpu_s_per_GB=round(best[1], 2)))
                    if not args.json:
                        r = rows[-1]
                        print(f"{lib:13} {r['block_MiB']:3} MiB x{threads}  {r['MBps']:6} MB/s  "
                              f"{r['cpu_s_per_GB']:5.2f} CPU-s/GB", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps(rows, indent=1))


class _Random:
    """A file-like source of size pseudo-random bytes (no 256 MiB bytes in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.chunk = os.urandom(MiB)

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return (self.chunk * (n // MiB + 1))[:n]


if __name__ == "__main__":
    main()
