"""`cv bench` through real mounts: written through one mount, read through a fresh second one.

Small sizes; timings are never asserted.  What is asserted: every figure is there, the
reader's every byte was checked (a byte changed through the mount after the write phase
makes the read phase fail with one line naming the file and the offset), and the bench
leaves nothing behind on the mount.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from curvine_py.cli.bench import workloads as bm

CV = str(Path(sys.executable).parent / "cv")
SMALL = ("--files", "3", "--file-size", "1MiB", "--seq-size", "8MiB", "--meta-files", "30")
pytestmark = pytest.mark.timeout(120)


def cv_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CV, "bench", *args], capture_output=True, text=True, timeout=100)


def test_bench_writes_through_one_mount_and_reads_through_another(d: Path, second_mount: object) -> None:
    other = Path(second_mount.path) / d.name
    r = cv_bench(str(d), *SMALL, "--reader-dir", str(other), "--drop-caches", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["reader_dir"] == str(other)
    assert out["kvcache"]["read"]["warm"]["read_GBps"] > 0
    assert out["kvcache"]["read"]["cold"]["read_GBps"] > 0
    assert out["seq"]["read"]["cold"]["read_GBps"] > 0
    assert out["meta"]["unlink_per_s"] > 0
    assert list(d.iterdir()) == []


def test_a_byte_changed_through_the_mount_fails_the_read(d: Path, second_mount: object) -> None:
    w = cv_bench(str(d), *SMALL, "--workloads", "kvcache", "--phase", "write")
    assert w.returncode == 0, w.stderr
    victim = d / bm.KV_DIR / f"{bm.kv_name(2)}.data"
    offset = 500_000                                   # in the payload, past the first 4 KiB read
    with open(victim, "r+b") as f:
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([old ^ 0xFF]))
    other = Path(second_mount.path) / d.name
    r = cv_bench(str(other), "--phase", "read")
    assert r.returncode == 1, r.stdout
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"{other / bm.KV_DIR / victim.name}: wrong bytes at offset {offset}" in r.stderr, r.stderr
