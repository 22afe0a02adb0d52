#!/usr/bin/env python3
"""A parquet file read with pyarrow three ways: fsspec ``curvine://``, the FUSE mount, a local file.

Writes one --size parquet file (8 float64 columns of random numbers: incompressible, so the
file is about --size; row groups of --row-group) on the local disk under --dir, starts a
local cluster (1 master + 2 workers, a mount, every setting its default), copies the file in
through the SDK, then reads it whole with ``pyarrow.parquet.read_table``:
- local: the file on the local disk (pyarrow's own filesystem);
- mount: the same bytes through the FUSE mount (pyarrow's own filesystem on the mount point);
- fsspec: ``curvine:///...`` through curvine_py/sdk/fsspec.py (pyarrow wraps fsspec
  filesystems in its FSSpecHandler: every read a Python call into the SDK).
Each is read cold (the kernel's caches and the mount's block copies dropped first: needs
root, else "warm" twice and said so) and then warm (again at once), the three in turn, for
--rounds rounds (the machine may be shared: a change of its load meets them alike); every
read's row count and column sums are checked against the local file's.  Prints the median
MB/s (10^6 bytes of the file per second) per case and each one's ratio to the local file's.  Without a FUSE mount (no
root, no /dev/fuse, no pyfuse3) the mount row is left out, with the reason.

    .venv/bin/python bench/fsspec_parquet.py [--size 1GiB] [--row-group 64MiB] [--rounds 3] [--dir D] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curvine_py.cli.bench.workloads import drop_caches
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.common.config import parse_size
from curvine_py.sdk.fsspec import CurvineFileSystem

COLUMNS = 8
ROW_BYTES = COLUMNS * 8
REMOTE = "/bench/table.parquet"


def write_parquet(path: Path, size: int, row_group: int) -> None:
    """size bytes of random float64 rows, one row group per batch (memory: one batch)."""
    rng = np.random.default_rng(0)
    rows_left, per_group = max(1, size // ROW_BYTES), max(1, row_group // ROW_BYTES)
    schema = pa.schema([(f"c{i}", pa.float64()) for i in range(COLUMNS)])
    with pq.ParquetWriter(path, schema) as w:
        while rows_left:
            n = min(per_group, rows_left)
            w.write_table(pa.table({f"c{i}": rng.random(n) for i in range(COLUMNS)}, schema=schema),
                          row_group_size=n)
            rows_left -= n


def signature(table: pa.Table) -> tuple[int, tuple[float, ...]]:
    """What a read must give back: the row count and every column's sum."""
    return table.num_rows, tuple(round(pc.sum(table[c]).as_py(), 3) for c in table.column_names)


def timed_read(read: Callable[[], pa.Table], want: tuple[Any, ...]) -> float:
    """Seconds of one read, its table checked."""
    t0 = time.perf_counter()
    table = read()
    wall = time.perf_counter() - t0
    got = signature(table)
    del table
    if got != want:
        raise SystemExit(f"wrong table read: {got} != {want}")
    return wall


def one_round(readers: dict[str, tuple[Callable[[], pa.Table], tuple[Path, ...]]], want: tuple[Any, ...],
              walls: dict[str, dict[str, list[float]]]) -> bool:
    """Each reader once cold (the kernel's caches and the mount's copies dropped first) and
    once warm (again at once), in turn; False when the caches could not be dropped."""
    dropped = True
    for name, (read, dirs) in readers.items():
        dropped = drop_caches(*dirs) and dropped
        walls[name]["cold"].append(timed_read(read, want))
        walls[name]["warm"].append(timed_read(read, want))
    return dropped


def figures(walls: dict[str, list[float]], nbytes: int) -> dict[str, Any]:
    """Median MB/s of each phase, and every round's."""
    out: dict[str, Any] = {}
    for phase, w in walls.items():
        out[f"{phase}_MBps"] = nbytes / statistics.median(w) / 1e6
        out[f"{phase}_rounds_MBps"] = [round(nbytes / x / 1e6, 1) for x in w]
    return out


def measure(base: Path, local: Path, rounds: int, res: dict[str, Any]) -> None:
    """The local file's, the mount's and fsspec's reads, rounds times each in turn, on one
    fresh cluster holding a copy of the file."""
    nbytes, want = res["file_bytes"], (res["rows"], tuple(res["sums"]))
    why_no_mount = mount_unavailable()
    mnt = base / "mnt"
    c = LocalCluster(base / "cluster", workers=2, mount=None if why_no_mount else str(mnt),
                     die_with_parent=True, extra_master_flags=("--master-heartbeat-ms", "200")).start()
    try:
        fs = CurvineFileSystem(config=str(c.config_path), skip_instance_cache=True)
        try:
            fs.put_file(str(local), REMOTE)
            readers: dict[str, tuple[Callable[[], pa.Table], tuple[Path, ...]]] = {
                "local": (lambda: pq.read_table(local), ())}
            if why_no_mount:
                res["mount"] = {"skipped": why_no_mount}
            else:
                readers["mount"] = (lambda: pq.read_table(str(mnt / REMOTE.lstrip("/"))), (mnt,))
            readers["fsspec"] = (lambda: pq.read_table(REMOTE, filesystem=fs), ())
            walls: dict[str, dict[str, list[float]]] = {n: {"cold": [], "warm": []} for n in readers}
            dropped = all([one_round(readers, want, walls) for _ in range(rounds)])
        finally:
            fs.close()
    finally:
        c.stop()
        shutil.rmtree(base / "cluster", ignore_errors=True)
    res["caches_dropped"] = dropped
    for name, w in walls.items():
        res[name] = figures(w, nbytes)


def mount_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mounting needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not fuse_available():
        return "pyfuse3 is not installed: no FUSE mount here"
    return None


def report(res: dict[str, Any], size: str) -> None:
    print(f"pyarrow.parquet.read_table of a {size} parquet file ({res['file_bytes'] / 1e6:.1f} MB, "
          f"{res['rows']:,} rows x {COLUMNS} float64)")
    print(f"{'':<8}{'cold MB/s':>11}{'vs local':>10}{'warm MB/s':>11}{'vs local':>10}")
    for name in ("local", "mount", "fsspec"):
        r = res.get(name, {})
        if "skipped" in r:
            print(f"{name:<8}  skipped: {r['skipped']}")
            continue
        print(f"{name:<8}{r['cold_MBps']:>11.0f}{r['cold_MBps'] / res['local']['cold_MBps']:>10.2f}"
              f"{r['warm_MBps']:>11.0f}{r['warm_MBps'] / res['local']['warm_MBps']:>10.2f}")
    if "fsspec_over_mount" in res:
        over = res["fsspec_over_mount"]
        print(f"fsspec / mount: cold {over['cold']:.2f}, warm {over['warm']:.2f}")
    print(f"(medians of {res['rounds']} rounds; each round reads local, mount, fsspec in turn, cold then warm)")
    if not res["caches_dropped"]:
        print("(caches could not be dropped: not root; every 'cold' read is warm)")


def ratios(res: dict[str, Any]) -> None:
    """Each reader's MB/s over local's (and fsspec's over the mount's), cold and warm."""
    def over(a: str, b: str) -> dict[str, float]:
        return {p: res[a][f"{p}_MBps"] / res[b][f"{p}_MBps"] for p in ("cold", "warm")}
    for name in ("mount", "fsspec"):
        if "cold_MBps" in res.get(name, {}):
            res[f"{name}_over_local"] = over(name, "local")
    if "cold_MBps" in res.get("mount", {}):
        res["fsspec_over_mount"] = over("fsspec", "mount")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB", help="parquet file size (about)")
    ap.add_argument("--row-group", default="64MiB", help="bytes per row group")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every read (medians are printed)")
    ap.add_argument("--dir", default=None, help="where the cluster and the local file live (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fsspec-parquet-", dir=args.dir))
    res: dict[str, Any] = {}
    try:
        local = base / "table.parquet"
        write_parquet(local, parse_size(args.size), parse_size(args.row_group))
        nbytes = local.stat().st_size
        rows, sums = signature(pq.read_table(local))
        res.update(file_bytes=nbytes, rows=rows, sums=list(sums), rounds=args.rounds)
        measure(base, local, args.rounds, res)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ratios(res)
    if args.json:
        print(json.dumps(res))
    else:
        report(res, args.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
