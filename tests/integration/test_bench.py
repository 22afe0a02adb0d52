"""`cv bench` as a subprocess on a local directory: it runs, verifies, and fails loudly.

Timings are never asserted (the machine is shared); what is asserted is that every
workload reports its figures, that nothing is left behind, and that a read returning
other bytes than those written ends in one error line naming the file and the offset.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from curvine_py.cli.bench import workloads as bm

CV = str(Path(sys.executable).parent / "cv")
SMALL = ("--files", "3", "--file-size", "1MiB", "--seq-size", "8MiB", "--meta-files", "50")
pytestmark = pytest.mark.timeout(120)


def cv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CV, "bench", *args], capture_output=True, text=True, timeout=100)


def test_all_workloads_report_figures_and_clean_up(tmp_path: Path) -> None:
    r = cv(str(tmp_path), *SMALL, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    kv = out["kvcache"]
    assert kv["write_GBps"] > 0 and kv["read"]["warm"]["read_GBps"] > 0
    assert kv["read"]["warm"]["prompt_files"] == 3      # fewer files than a prompt: all of them
    assert out["seq"]["write_GBps"] > 0 and out["seq"]["read"]["warm"]["read_GBps"] > 0
    assert out["seq"]["read"]["warm"]["random_per_s"] > 0
    assert set(out["meta"]) == {"create_per_s", "stat_per_s", "rename_per_s", "unlink_per_s"}
    assert list(tmp_path.iterdir()) == []


def test_table_and_cold_read(tmp_path: Path) -> None:
    r = cv(str(tmp_path), *SMALL, "--workloads", "kvcache", "--drop-caches")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["workload", "metric", "value"]
    metrics = [ln for ln in lines if ln.startswith("kvcache")]
    assert any("read GB/s (warm)" in ln for ln in metrics)
    if os.geteuid() == 0:
        assert any("read GB/s (cold)" in ln for ln in metrics)
    else:
        assert "needs root" in r.stderr
    assert not any(ln.startswith(("seq", "meta")) for ln in lines)


def test_keep_then_read_phase_through_another_path(tmp_path: Path) -> None:
    """--keep leaves a readable tree; --reader-dir reads it under another name (a bind
    of the same directory stands in for a second mount)."""
    r = cv(str(tmp_path), *SMALL, "--workloads", "kvcache,seq", "--keep", "--json",
           "--reader-dir", str(tmp_path / ".." / tmp_path.name))
    assert r.returncode == 0, r.stderr
    (work,) = tmp_path.iterdir()
    assert (work / bm.MANIFEST).exists() and len(list((work / bm.KV_DIR).iterdir())) == 3
    again = cv(str(work), "--phase", "read", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["kvcache"]["read_GBps"] > 0


@pytest.mark.parametrize("offset", [0, bm.HEADER_SIZE + 5, 1_000_000])
def test_a_wrong_byte_fails_loudly(tmp_path: Path, offset: int) -> None:
    w = cv(str(tmp_path), *SMALL, "--workloads", "kvcache", "--phase", "write")
    assert w.returncode == 0, w.stderr
    victim = tmp_path / bm.KV_DIR / f"{bm.kv_name(1)}.data"
    with open(victim, "r+b") as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0x40]))
    r = cv(str(tmp_path), "--phase", "read")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"{victim}: wrong bytes at offset {offset}" in r.stderr


def test_a_wrong_size_and_a_wrong_seq_request_fail(tmp_path: Path) -> None:
    w = cv(str(tmp_path), *SMALL, "--workloads", "kvcache,seq", "--phase", "write", "--random-reads", "0")
    assert w.returncode == 0, w.stderr
    seq = tmp_path / bm.SEQ_FILE
    with open(seq, "r+b") as f:     # swap two 4 MiB requests: each is intact, the order is not
        first, second = f.read(bm.SEQ_REQUEST), f.read(bm.SEQ_REQUEST)
        f.seek(0)
        f.write(second + first)
    r = cv(str(tmp_path), "--phase", "read", "--workloads", "seq")
    assert r.returncode == 1 and "wrong bytes at offset 0 " in r.stderr, r.stderr
    chunk = tmp_path / bm.KV_DIR / f"{bm.kv_name(2)}.data"
    with open(chunk, "ab") as f:
        f.write(b"x")
    r = cv(str(tmp_path), "--phase", "read", "--workloads", "kvcache")
    assert r.returncode == 1 and "size 1048577, expected 1048576" in r.stderr, r.stderr
    os.truncate(chunk, 1000)
    r = cv(str(tmp_path), "--phase", "read")
    assert r.returncode == 1 and "size 1000, expected 1048576" in r.stderr, r.stderr


def test_read_errors_of_the_fresh_reader_reach_the_writer(tmp_path: Path) -> None:
    """In the default phase the read runs in a subprocess; its error line becomes ours."""
    r = cv(str(tmp_path), *SMALL, "--workloads", "kvcache", "--reader-dir", str(tmp_path / "nowhere"))
    assert r.returncode == 1
    assert r.stderr.startswith("cv: read phase: ") and "cv-bench.json" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []          # the written files were still removed


@pytest.mark.parametrize("args, message", [
    (("--workloads", "kvcache,nope"), "unknown nope"),
    (("--file-size", "20"), "must exceed the 28-byte header"),
    (("--seq-size", "12345"), "multiple of 4 KiB"),
    (("--file-size", "lots"), "not a size"),
    (("--random-reads", "-1"), "must not be negative"),
])
def test_usage_errors(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    r = cv(str(tmp_path), *args)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_missing_directory(tmp_path: Path) -> None:
    r = cv(str(tmp_path / "absent"), *SMALL)
    assert r.returncode == 1 and "absent: not a directory" in r.stderr, r.stderr
