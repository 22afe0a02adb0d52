"""Every script under bench/ runs as shipped: a subprocess at its smallest sizes exits 0,
prints its figures and leaves nothing behind.

Figures are never compared with anything (the machine is shared); what is asserted is that
each one is there and positive.  bench/compare needs root, network namespaces and MooseFS:
its real runs are tests/multihost/test_compare.py's; here it only has to start.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyfuse3_features import HAVE_PYFUSE3

from curvine_py.testing.testhosts import unavailable_reason
from tests.conftest import uring_probe

BENCH = Path(__file__).resolve().parents[2] / "bench"
pytestmark = pytest.mark.timeout(150)

# Each script's smoke run: its smallest sizes (--dir is added for those that take one).
SMOKE: dict[str, tuple[str, ...]] = {
    "sdk_bench.py": ("--runs", "1", "--kv-size", "1MiB", "--seq-size", "4MiB", "--meta-files", "20",
                     "--meta-clients", "1", "--json"),
    "replication_bench.py": ("--blocks", "2", "--rounds", "1"),
    "shortcircuit_bench.py": ("--runs", "1", "--size", "1000000", "--json"),
    "meta_rpc_bench.py": ("--calls", "20", "--rounds", "1", "--threads", "1"),
    "worker_bench.py": ("--total", "8MiB", "--rounds", "1"),
    "mount_bench.py": ("--files", "2", "--size", str(1 << 20), "--meta", "20", "--dd-mib", "4", "--json"),
    "eviction_bench.py": ("--capacity", "32MiB", "--files", "2", "--size", "1MiB", "--runs", "1", "--json"),
    "io_engines.py": ("--small", "--rounds", "1", "--json"),
    "kv_concurrency.py": ("--small", "--json"),
    "metrics_cost.py": ("--files", "2", "--size", "1MiB", "--meta", "20", "--rounds", "1", "--json"),
    "random_reads.py": ("--size", "64MiB", "--reads", "20", "--json"),
    "ufs_libs.py": ("--size", "16MiB", "--runs", "1", "--libs", "opendal,boto3", "--json"),
    # --quick is 64 MiB and 4 KV chunks; 2 MiB objects and one 14 MiB chunk run every phase too
    "ufs_bench.py": ("--quick", "--size", "16MiB", "--kv-chunks", "1", "--json"),
    "ha_bench.py": ("--small", "--json", "--tls"),
    "kv_lookup.py": ("--rounds", "1", "--files", "2", "--size", "1MiB", "--settings", "ahead", "--json"),
    "meta_scale.py": ("--sizes", "20,40", "--via", "sdk", "--no-follower", "--clients", "2",
                      "--stat-sample", "10", "--round", "20", "--retry-cache-s", "1", "--events-retention-s", "1"),
    "fsspec_parquet.py": ("--size", "4MiB", "--row-group", "1MiB", "--rounds", "1", "--json"),
    "kv_native.py": ("--keys", "2", "--data-size-kb", "1024", "--rounds", "1", "--json"),
    "journal_cpu.py": ("--files", "20", "--rounds", "1"),
    "event_feed_size.py": ("--chunks", "20"),
    "listing_cost.py": ("--files", "4", "--calls", "20", "--rounds", "1"),
}
# under the system temp dir, removed after
NO_DIR = {"meta_rpc_bench.py", "kv_concurrency.py", "ufs_libs.py", "kv_lookup.py", "listing_cost.py"}
MOUNTS = {"mount_bench.py", "eviction_bench.py", "kv_concurrency.py", "metrics_cost.py", "random_reads.py",
          "ufs_bench.py", "kv_lookup.py", "kv_native.py"}
NETNS = {"kv_concurrency.py"}           # network-namespace hosts (curvine_py/testing/testhosts.py)
LMCACHE = {"kv_native.py"}              # real LMCache in its venv (make lmcache-deps)
LMCACHE_BIN = BENCH.parent / ".venv" / "lmcache" / "bin" / "lmcache"
COVERED_ELSEWHERE = {"compare": "tests/multihost/test_compare.py"}


def mount_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mounting needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not HAVE_PYFUSE3:
        return "pyfuse3 is not installed: no FUSE mount here"
    return None


def run(script: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CURVINE_CONF", "CURVINE_MASTER",
                                                             "CURVINE_CLUSTER_SECRET")}
    argv = [sys.executable, str(BENCH / script), *extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=130, cwd=tmp, env=env)
    assert r.returncode == 0, f"{script} exited {r.returncode}:\n{r.stderr[-3000:]}"
    return r


def positive(figures: dict[str, Any], *names: str) -> None:
    for name in names:
        assert figures[name] > 0, (name, figures)


def test_every_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCH.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert scripts == set(SMOKE) | set(COVERED_ELSEWHERE)


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_script_runs_at_its_smallest_size(script: str, tmp_path: Path) -> None:
    if script in MOUNTS and (why := mount_unavailable()):
        pytest.skip(why)
    if script in NETNS and (why := unavailable_reason()):
        pytest.skip(why)
    if script in LMCACHE and not LMCACHE_BIN.exists():
        pytest.skip(f"real LMCache is not installed ({LMCACHE_BIN}: make lmcache-deps)")
    work = tmp_path / "work"
    work.mkdir()
    extra = () if script in NO_DIR else ("--dir", str(work))
    out = run(script, tmp_path, *SMOKE[script], *extra).stdout
    check_figures(script, out)
    assert list(work.iterdir()) == [], f"{script} left {list(work.iterdir())} behind"
    assert [p.name for p in tmp_path.iterdir()] == ["work"], f"{script} left files in its cwd"
    assert not mounts_under(tmp_path), f"{script} left mounts behind: {mounts_under(tmp_path)}"


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == str(path) or p.startswith(f"{path}/")]


def check_figures(script: str, out: str) -> None:
    if script == "sdk_bench.py":
        positive(json.loads(out), "raw_socket_send_GBps", "kv_put_GBps", "kv_get_GBps", "kv_get_into_GBps",
                 "seq_write_GBps", "seq_read_GBps", "create_per_s", "stat_per_s", "rename_per_s", "unlink_per_s")
    elif script == "shortcircuit_bench.py":
        positive(json.loads(out), "local_dir_GBps", "short_circuit_GBps", "network_GBps")
    elif script == "mount_bench.py":
        res = json.loads(out)
        for k in ("local", "curvine", "curvine_cold"):
            positive(res[k], "write_GBps", "read_GBps")
        for k in ("local_meta", "curvine_meta"):
            positive(res[k], "create_per_s", "stat_per_s", "rename_per_s", "unlink_per_s")
        positive(res["disk"], "dd_write_GiBps", "dd_read_cold_GiBps")
    elif script == "eviction_bench.py":
        res = json.loads(out)
        positive(res, "empty_GBps", "full_GBps")
        assert res["runs"][0]["evicted_files"] > 0, res
    elif script == "replication_bench.py":
        rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()[1:]}
        assert set(rows) == {"chain", "fan-out"} and all(float(v[0]) > 0 for v in rows.values()), out
    elif script == "meta_rpc_bench.py":
        rows = [ln for ln in out.splitlines() if ln.startswith(("GetAttr", "Lookup", "Create+Unlink"))]
        assert len(rows) == 3 and all(ln.rstrip().endswith("x") for ln in rows), out
    elif script == "io_engines.py":
        check_io_engines(json.loads(out))
    elif script == "kv_concurrency.py":
        res = json.loads(out)
        assert set(res) == {"curvine defaults", "curvine kv", "local"}, res
        for system, by_size in res.items():
            for row in by_size.values():
                assert set(row) == {"write", "replica here", "no replica", "no replica, 2nd process"}, row
                for phase, figs in row.items():
                    assert "error" not in figs, (system, phase, figs)
                    positive(figs, "write_GBps" if phase == "write" else "read_GBps")
    elif script == "metrics_cost.py":
        res = json.loads(out)
        for mode in ("on", "off"):
            positive(res["median"][mode], "write_GBps", "read_GBps", "stat_per_s", "create_per_s")
        positive(res["on_over_off"], "write_GBps", "read_GBps")
    elif script == "random_reads.py":
        res = json.loads(out)
        assert set(res) == {"local disk", "curvine, replica here", "curvine, over the network"}, res
        for figs in res.values():
            positive(figs, "iops", "MiBps", "p50_ms")
    elif script == "ufs_libs.py":
        rows = json.loads(out[out.index("["):])   # (a load-average line comes first)
        assert {r["lib"] for r in rows} == {"opendal", "boto3"}, rows
        for row in rows:
            positive(row, "MBps")
    elif script == "ufs_bench.py":
        positive(json.loads(out), "peer_x1_MBps", "cold_MBps", "warm_disk_MBps", "load_MBps", "kv_pool_GBps",
                 "kv_back_GBps")
    elif script == "ha_bench.py":
        res = json.loads(out)
        ops = ("create", "stat", "rename", "unlink")
        via = ("sdk", "mount") if mount_unavailable() is None else ("sdk",)
        positive(res, *(f"{v}_{op}_per_s_{n}" for v in via for op in ops for n in ("1_master", "3_masters")))
        if mount_unavailable() is None:
            positive(res, *(f"kv_{f}_{n}" for f in ("write_GBps", "read_GBps") for n in ("1_master", "3_masters")),
                     *(f"mount_stat_cold_per_s_{n}" for n in ("1_master", "3_masters")))
        positive(res, "failover_min_s", "failover_median_s", "failover_max_s")
        assert res["failover_kills"] == 1, res
        positive(res, *(f"sdk_{op}_per_s_{n}" for op in ops for n in ("3_masters_tls", "tls_ratio")),
                 "failover_median_s_3_masters_tls")
    elif script == "kv_lookup.py":
        positive(json.loads(out)["ahead"], "lookup_median_ms", "read_median_ms")
    elif script == "meta_scale.py":
        rows = [ln.split() for ln in out.splitlines() if ln.startswith("sdk ")]
        assert [r[1] for r in rows] == ["20", "40"], out
        for r in rows:   # via, files, create/s, its ratio, stat/s, its ratio, ...
            assert float(r[2].replace(",", "")) > 0 and float(r[4].replace(",", "")) > 0, out
            assert "start" in r, out
        at_rest = [ln.split() for ln in out.splitlines() if ln.startswith("at rest ")]
        assert [r[3] for r in at_rest] == ["20", "40"], out   # at rest, via, files, in use, the rest
        assert all(int(r[4].replace(",", "")) > 0 for r in at_rest), out
    elif script == "fsspec_parquet.py":
        res = json.loads(out)
        readers = ("local", "mount", "fsspec") if mount_unavailable() is None else ("local", "fsspec")
        for name in readers:
            positive(res[name], "cold_MBps", "warm_MBps")
        positive(res["fsspec_over_local"], "cold", "warm")
    elif script == "kv_native.py":
        res = json.loads(out)["2 keys"]
        assert set(res) == {"fs on ext4", "fs on mount", "plugin"}, res
        for figs in res.values():
            positive(figs, "store_MBps", "lookup_ms", "load_ms", "load_GBps")
        for tier in ("fs on mount", "plugin"):
            positive(res[tier], "store_vs_ext4", "lookup_vs_ext4", "load_vs_ext4")
    elif script == "event_feed_size.py":
        assert "20 chunks, 80 events" in out, out
        per_event = next(ln for ln in out.splitlines() if ln.startswith("per event: payload "))
        assert float(per_event.split()[3]) > 0, out
    elif script == "journal_cpu.py":
        rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split()[:1] and ln.split()[0] in
                ("create", "allocate", "commit", "rename", "unlink")}
        assert set(rows) == {"create", "allocate", "commit", "rename", "unlink"}, out
        for r in rows.values():   # op, CPU min, "/", median, statements, WAL pages
            assert float(r[1]) > 0 and float(r[4]) > 0 and float(r[5]) > 0, out
    elif script == "worker_bench.py":
        assert "round 0 (fresh files): write A->B" in out and " GB/s" in out, out
    elif script == "listing_cost.py":
        rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.split()[:2] and ln.split()[1] == "median"}
        assert set(rows) == {"plain", "one_block", "listing", "listing+blocks"}, out
        assert all(float(r[2]) > 0 for r in rows.values()), out
    else:
        raise AssertionError(f"no figures check for {script}")


def check_io_engines(res: dict[str, Any]) -> None:
    """Both engines measured where io_uring works (else threads only, and why), the mount's
    rows where a mount works, every figure positive."""
    probe = uring_probe()
    assert ("uring_unavailable" in res) == (not probe.ok), (res.get("uring_unavailable"), probe)
    engines = ["uring", "threads"] if probe.ok else ["threads"]
    assert [set(r) for r in res["per_round"]] == [set(engines)], res["per_round"]
    rows = {row["metric"]: row for row in res["table"]}
    wanted = ["sdk kv_put_GBps", "sdk kv_get_GBps", "sdk seq_write_GBps", "sdk seq_read_GBps",
              "sdk create_per_s"]
    if mount_unavailable() is None:
        wanted += ["mount kvcache write GB/s", "mount kvcache read GB/s (warm)", "mount seq write GB/s",
                   "mount seq read GB/s (warm)"]
    for metric in wanted:
        for engine in engines:
            assert rows[metric][engine] > 0, rows.get(metric)
        assert (rows[metric]["uring/threads"] is not None) == probe.ok, rows[metric]


def test_compare_starts(tmp_path: Path) -> None:
    """bench/compare imports and parses its flags anywhere; its runs need root, namespaces
    and MooseFS (tests/multihost/test_compare.py)."""
    r = run("compare", tmp_path, "--help")
    assert "--small" in r.stdout and "--systems" in r.stdout
