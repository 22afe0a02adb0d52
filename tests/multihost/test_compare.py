"""`bench/compare --small`: ours, MooseFS and a local directory on namespace hosts, one table.

Runs the real script (real hosts, real daemons, real mounts) at a tiny size, in both
layouts of the reader (a worker's host, and a host with no worker).  Timings are never
asserted; what is asserted is that every system produced every figure (so every read was
verified byte for byte by `cv bench`), warm and cold, and that nothing is left mounted or
running afterwards.  The FUSE request size is whatever the kernel allows
(`fs.fuse.max_pages_limit`: 1 MiB at 256 pages, 4 MiB at 1024), left as it is, except
in the test of the remote layout with 4 MiB requests, which raises that host-wide
setting to 1024 pages for its run and restores it after.  Skipped, with the reason,
when not root or when MooseFS cannot be installed.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from curvine_py.testing import moosefs
from curvine_py.testing.testhosts import unavailable_reason

COMPARE = Path(__file__).resolve().parents[2] / "bench" / "compare"
MAX_PAGES = Path("/proc/sys/fs/fuse/max_pages_limit")   # Linux 6.13+
# deploy/build-pyfuse3.sh's stamp: its libfuse asks the kernel for up to 1024 pages (4 MiB)
LIBFUSE_1024 = Path(sys.prefix) / "opt" / "libfuse" / ".max-pages-1024"
pytestmark = [pytest.mark.multihost, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def compare_ready() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    why = moosefs.install()
    if why:
        pytest.skip(f"MooseFS unavailable: {why}")


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(str(path))]


def test_compare_small_reports_every_figure_for_every_system(compare_ready: None, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(COMPARE), "--small", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["systems"]) == {"curvine", "moosefs", "local"} and out["errors"] == []
    for system, result in out["systems"].items():
        kv, seq = result["kvcache"], result["seq"]
        for temp in ("warm", "cold"):
            assert kv["read"][temp]["read_GBps"] > 0, (system, temp)
            assert seq["read"][temp]["read_GBps"] > 0, (system, temp)
        assert kv["write_GBps"] > 0 and seq["write_GBps"] > 0
        assert result["meta"]["create_per_s"] > 0
    rows = {(row["workload"], row["metric"]): row for row in out["table"]}
    row = rows[("kvcache", "read GB/s (cold)")]
    assert all(row[s] != "-" for s in ("curvine", "moosefs", "local", "curvine/moosefs"))
    assert_remote_layout(out, rows)
    assert list(tmp_path.iterdir()) == [] and mounts_under(tmp_path) == []


def assert_remote_reads(system: str, result: dict[str, typing.Any]) -> None:
    """One system's remote reader read the KV chunks and the sequential file, warm and
    cold, serially and from 8 threads at once (cv bench verified every byte)."""
    concurrent = result["concurrent"]["kvcache"]["read"]
    for temp in ("warm", "cold"):
        assert result["kvcache"]["read"][temp]["read_GBps"] > 0, (system, temp)
        assert result["seq"]["read"][temp]["read_GBps"] > 0, (system, temp)
        assert concurrent[temp]["read_threads"] == 8 and concurrent[temp]["read_GBps"] > 0, (system, temp)


def assert_remote_layout(out: dict[str, typing.Any], rows: dict[tuple[str, str], dict[str, str]]) -> None:
    """The default `--layout both`: the reader on host 3 (no worker) read every KV chunk
    and the sequential file, warm and cold, serially and (`--readers 8`) from 8 threads
    at once, through fresh mounts; every byte verified by `cv bench` (a wrong byte fails
    the run), the ratio against MooseFS in the same layout."""
    assert set(out["remote"]) == {"curvine", "moosefs"} and out["readers"] == 8
    for system, result in out["remote"].items():
        assert_remote_reads(system, result)
        assert "meta" not in result     # the same writer and master as the local layout's
    for workload, metric in (("kvcache (remote reader)", "read GB/s (warm)"),
                             ("seq (remote reader)", "read GB/s (cold)"),
                             ("kvcache (remote reader, 8 threads)", "read p99 ms (cold)")):
        row = rows[(workload, metric)]
        assert row["curvine"] != "-" and row["moosefs"] != "-" and row["curvine/moosefs"] != "-", row
        assert row["local"] == "-", row          # a local directory has no remote reader
    assert not any(w.startswith(("kvcache (remote", "seq (remote")) and "write" in m for w, m in rows)


def test_compare_table_and_usage_error(compare_ready: None, tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, str(COMPARE), "--systems", "curvine,nfs"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.startswith("compare: --systems"), bad.stderr
    bad = subprocess.run([sys.executable, str(COMPARE), "--readers", "0"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and bad.stderr.strip() == "compare: --readers must be positive", bad.stderr
    bad = subprocess.run([sys.executable, str(COMPARE), "--set", "FUSE_DIRECT_IO=true"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.strip() == "compare: --set FUSE_DIRECT_IO=true: expected " \
        "CURVINE_KEY=VALUE", bad.stderr
    r = subprocess.run([sys.executable, str(COMPARE), "--small", "--systems", "local",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[2].split()
    assert header == ["workload", "metric", "curvine", "moosefs", "local", "curvine/moosefs"]
    assert "kvcache   read GB/s (warm)" in r.stdout
    assert os.listdir(tmp_path) == []


def test_the_fuse_limit_column(compare_ready: None, tmp_path: Path) -> None:
    """`--systems fuse`: two pyfuse3 passthrough mounts of one local directory (a writer's and
    a fresh reader's); every figure is there (every byte verified), nothing stays mounted."""
    r = subprocess.run([sys.executable, str(COMPARE), "--small", "--json", "--systems", "fuse",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    result = out["systems"]["fuse"]
    assert out["errors"] == [] and result["kvcache"]["write_GBps"] > 0
    for temp in ("warm", "cold"):
        assert result["kvcache"]["read"][temp]["read_GBps"] > 0 and result["seq"]["read"][temp]["read_GBps"] > 0
    assert all(result["meta"][f"{op}_per_s"] > 0 for op in ("create", "stat", "rename", "unlink"))
    assert list(tmp_path.iterdir()) == [] and mounts_under(tmp_path) == []


@contextlib.contextmanager
def fuse_max_pages(pages: int) -> typing.Iterator[None]:
    """fs.fuse.max_pages_limit set to pages for the with block (mounts made inside it get
    requests of up to that many pages), the old value restored after, also on failure."""
    old = MAX_PAGES.read_text()
    MAX_PAGES.write_text(f"{pages}\n")
    try:
        yield
    finally:
        MAX_PAGES.write_text(old)


def test_remote_layout_with_4_mib_fuse_requests(compare_ready: None, tmp_path: Path) -> None:
    """The remote layout (the reader on host 3, no worker: every byte over the network)
    with the kernel allowing 4 MiB FUSE requests: ours with its defaults (page-cache reads,
    whose read-ahead sends up to 4 MiB per request) and with the KV settings (16 MiB
    blocks, direct-I/O reads: a 4 MiB read(2) of the sequential file is one request, and a
    KV chunk's rest after its first 4 KiB is requests of 4 MiB that start inside a block);
    every byte read verified by `cv bench`, serially and from 8 threads, warm and cold."""
    if not MAX_PAGES.exists():
        pytest.skip("this kernel has no fs.fuse.max_pages_limit (Linux < 6.13): FUSE requests stay at 1 MiB")
    if not LIBFUSE_1024.exists():
        pytest.skip("libfuse was not built by deploy/build-pyfuse3.sh with 1024 pages: requests stay at 1 MiB")
    before = MAX_PAGES.read_text()
    with fuse_max_pages(1024):
        r = subprocess.run([sys.executable, str(COMPARE), "--small", "--json", "--layout", "remote",
                            "--systems", "curvine,curvine-kv", "--dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=170)
    assert MAX_PAGES.read_text() == before
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["errors"] == [] and set(out["remote"]) == {"curvine", "curvine-kv"}
    for system, result in out["remote"].items():
        assert_remote_reads(system, result)
    assert list(tmp_path.iterdir()) == [] and mounts_under(tmp_path) == []


def test_tls_beside_plain(compare_ready: None, tmp_path: Path) -> None:
    """`--systems curvine-kv,curvine-kv-tls`: the same KV setup with mutual TLS on every
    channel, every byte verified, and the TLS/plain ratio column of the cost table."""
    r = subprocess.run([sys.executable, str(COMPARE), "--small", "--json", "--layout", "local",
                        "--systems", "curvine-kv,curvine-kv-tls", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["errors"] == [] and set(out["systems"]) == {"curvine-kv", "curvine-kv-tls"}
    assert out["systems"]["curvine-kv-tls"]["kvcache"]["write_GBps"] > 0
    assert any(row.get("curvine-kv-tls/curvine-kv") not in (None, "-") for row in out["table"])
    assert list(tmp_path.iterdir()) == [] and mounts_under(tmp_path) == []
