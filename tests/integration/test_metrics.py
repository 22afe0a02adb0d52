"""Prometheus metrics of a real local cluster and its mount: scraped before and after a
known workload (parsed by prometheus_client's parser), each counter moving by what the
workload did; names that follow Prometheus' conventions; the Grafana dashboard and
docs/metrics.md naming exactly what the daemons export; `cv stats` and
`cv cluster status --json` finding the endpoints.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import typing
from pathlib import Path

import pytest

from curvine_py.cli.stats import Scrape, scrape
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.sdk import Client

from tests.conftest import CV, FAST_MASTER_FLAGS, client_config, client_on_host
from tests.pyfuse3_features import HAVE_PYFUSE3

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "curvine.json"
DOCS = ROOT / "docs" / "metrics.md"
needs_mount = pytest.mark.skipif(not (HAVE_PYFUSE3 and fuse_available()),
                                 reason="no FUSE mount here (pyfuse3 or /dev/fuse missing)")


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[tuple[LocalCluster, Client]]:
    """A 2-worker cluster with its mount, and an SDK client of it."""
    if not (HAVE_PYFUSE3 and fuse_available()):
        pytest.skip("no FUSE mount here (pyfuse3 or /dev/fuse missing)")
    d = tmp_path_factory.mktemp("metrics")
    c = LocalCluster(d / "cluster", workers=2, mount=str(d / "mnt"), extra_master_flags=FAST_MASTER_FLAGS,
                     die_with_parent=True)
    c.start(timeout=60)
    client = Client(master=c.master_address, config=client_config(c))
    try:
        yield c, client
    finally:
        client.close()
        c.stop()


def endpoint(c: LocalCluster, name: str) -> str:
    return next(p.metrics for p in c.processes if p.name == name)


def scrape_all(c: LocalCluster) -> dict[str, Scrape]:
    return {p.name: scrape(p.metrics) for p in c.processes}


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.total(name, **labels) - before.total(name, **labels)


def workers_delta(before: dict[str, Scrape], after: dict[str, Scrape], name: str, **labels: str) -> float:
    return sum(delta(before[w], after[w], name, **labels) for w in after if w.startswith("worker"))


@needs_mount
def test_lookup_hits_and_misses_are_the_kv_hit_rate(mounted: tuple[LocalCluster, Client]) -> None:
    """Names made through the SDK (the mount never saw them) looked up once each through
    the mount: 3 that exist and 5 that do not, in a top-level directory of their own."""
    c, client = mounted
    client.mkdir("/kvhits")
    for i in range(3):
        client.put_bytes(f"/kvhits/chunk{i}", b"x" * 100)
    mnt = Path(c.mount or "")
    before = scrape(endpoint(c, "fuse"))
    assert (mnt / "kvhits").is_dir()                      # the directory: a hit in the root
    for i in range(3):
        assert (mnt / "kvhits" / f"chunk{i}").exists()    # hits
    for i in range(5):
        assert not (mnt / "kvhits" / f"absent{i}").exists()   # misses (ENOENT)
    after = scrape(endpoint(c, "fuse"))
    assert delta(before, after, "curvine_fuse_lookups_total", dir="kvhits", result="hit") == 3
    assert delta(before, after, "curvine_fuse_lookups_total", dir="kvhits", result="miss") == 5
    assert delta(before, after, "curvine_fuse_lookups_total", dir="/", result="hit") == 1
    assert delta(before, after, "curvine_fuse_op_duration_seconds_count", op="lookup") == 9
    # every label value is a top-level directory, "/", "unknown" or "other": never a file name
    dirs = {dict(labels).get("dir") for (n, labels) in after.samples if n == "curvine_fuse_lookups_total"}
    assert not any(d and d.startswith(("chunk", "absent")) for d in dirs), dirs


@needs_mount
def test_bytes_written_and_read_move_every_daemon(mounted: tuple[LocalCluster, Client]) -> None:
    """A 10 MiB file (3 blocks of 4 MiB, two replicas) written and read through the mount."""
    c, client = mounted
    size = 10 * MiB
    data = os.urandom(size)
    path = Path(c.mount or "") / "bytes.bin"
    before = scrape_all(c)
    path.write_bytes(data)
    time.sleep(0.5)   # commits are answered before this returns; blocks reach the report by heartbeat
    mid = scrape_all(c)
    assert delta(before["fuse"], mid["fuse"], "curvine_fuse_written_bytes_total") == size
    assert workers_delta(before, mid, "curvine_worker_write_bytes_total") == 2 * size
    assert workers_delta(before, mid, "curvine_worker_block_writes_total") == 2 * 3
    assert delta(before["master"], mid["master"], "curvine_master_journal_records_total", op="create") == 1
    assert delta(before["master"], mid["master"], "curvine_master_files") == 1
    assert delta(before["master"], mid["master"], "curvine_master_blocks") == 3
    assert delta(before["master"], mid["master"], "curvine_master_rpc_duration_seconds_count",
                 method="Create") == 1
    assert delta(before["fuse"], mid["fuse"], "curvine_fuse_op_duration_seconds_count", op="create") == 1
    assert delta(before["fuse"], mid["fuse"], "curvine_fuse_op_duration_seconds_count", op="write") >= size // (1 * MiB)

    subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"], check=False)
    with open(path, "rb") as f:
        assert f.read() == data
    after = scrape_all(c)
    assert delta(mid["fuse"], after["fuse"], "curvine_fuse_read_bytes_total") == size
    fetched = (delta(mid["fuse"], after["fuse"], "curvine_client_read_bytes_total", source="short_circuit")
               + delta(mid["fuse"], after["fuse"], "curvine_client_read_bytes_total", source="remote"))
    assert fetched == size   # each block fetched once, from the local replica's file or a worker
    remote = delta(mid["fuse"], after["fuse"], "curvine_client_read_bytes_total", source="remote")
    assert workers_delta(mid, after, "curvine_worker_read_bytes_total") == remote
    assert after["fuse"].total("curvine_client_open_files") == 0
    assert after["fuse"].total("curvine_client_dirty_bytes") == 0


def test_evictions_by_reason_in_a_small_pool(cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    """Files past a 48 MiB pool's watermark: the evictions counted by the master's metrics
    are those its Report counts (files and bytes)."""
    c = cluster_factory(capacity="48MiB", extra_master_flags=(
        *FAST_MASTER_FLAGS, "--master-evict-interval-s", "0.1", "--master-block-size", "1MiB"))
    cfg = client_config(c)
    cfg.client.block_size = MiB
    endpoint_ = endpoint(c, "master")
    before = scrape(endpoint_)
    with Client(master=c.master_address, config=cfg) as client:
        client.mkdir("/kv")
        for i in range(16):   # 64 MiB written into 48 MiB
            client.put_bytes(f"/kv/{i}", bytes([i]) * (4 * MiB))
        deadline = time.monotonic() + 15
        while client.report().evicted_files == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        rep = client.report()
    after = scrape(endpoint_)
    assert rep.evicted_files > 0
    assert delta(before, after, "curvine_master_evictions_total", reason="lru") == rep.evicted_files
    assert delta(before, after, "curvine_master_evicted_bytes_total", reason="lru") == rep.evicted_bytes
    assert delta(before, after, "curvine_master_journal_records_total", op="evict") >= 1
    assert after.total("curvine_master_workers", state="live") == 2
    assert after.total("curvine_master_capacity_bytes", tier="SSD") == 2 * 48 * MiB
    worker = scrape(endpoint(c, "worker0"))
    assert worker.total("curvine_worker_capacity_bytes", tier="SSD") == 48 * MiB
    assert worker.total("curvine_worker_io_engine") == 1


def fetched_by_small_reads(c: LocalCluster, client: Client, name: str, offsets: tuple[int, ...]) -> float:
    """Bytes the mount fetched (from workers or block files) for 128 KiB preads at offsets
    of a new 40 MiB file (ten 4 MiB blocks) read cold, each checked."""
    data = os.urandom(40 * MiB)
    client.put_bytes(f"/{name}", data)
    subprocess.run(["sh", "-c", "echo 1 > /proc/sys/vm/drop_caches"], check=False)
    before = scrape(endpoint(c, "fuse"))
    fd = os.open(Path(c.mount or "") / name, os.O_RDONLY)
    try:
        for off in offsets:
            assert os.pread(fd, 128 * 1024, off) == data[off:off + 128 * 1024]
    finally:
        os.close(fd)
    after = scrape(endpoint(c, "fuse"))
    return sum(delta(before, after, "curvine_client_read_bytes_total", source=s) for s in ("short_circuit", "remote"))


@needs_mount
def test_a_small_random_read_fetches_its_range_not_its_block(mounted: tuple[LocalCluster, Client]) -> None:
    """128 KiB read far into a 40 MiB file (one past the read-ahead window is not
    prefetched whole at open): the bytes fetched are that range (whatever the kernel's
    read-ahead adds, under 1 MiB), not the 4 MiB block around it."""
    fetched = fetched_by_small_reads(*mounted, "random.bin", (33 * MiB + 256 * 1024,))
    assert 128 * 1024 <= fetched <= MiB, fetched


@needs_mount
def test_a_file_read_at_random_fetches_ranges_near_its_first_reads_too(mounted: tuple[LocalCluster, Client]) -> None:
    """After two small reads far apart, small reads inside the read-ahead window (24 MiB
    around the furthest read here) are random ones too: their ranges are fetched, not
    their 4 MiB blocks and the four after them."""
    offsets = (30 * MiB + 256 * 1024, 36 * MiB + 256 * 1024, 2 * MiB + 256 * 1024, 10 * MiB + 640 * 1024)
    fetched = fetched_by_small_reads(*mounted, "scattered.bin", offsets)
    assert 4 * 128 * 1024 <= fetched <= 2 * MiB, fetched


def test_a_client_off_the_workers_hosts_writes_through_a_chain(mounted: tuple[LocalCluster, Client]) -> None:
    """An SDK client on a host with no worker sends each block to the first replica, which
    forwards it to the second: one chain forward per block, its bytes once."""
    c, _ = mounted
    size = 9 * MiB   # 3 blocks
    before = scrape_all(c)
    with client_on_host(c, "no-worker-here") as far:
        far.put_bytes("/chained.bin", os.urandom(size))
    after = scrape_all(c)
    assert workers_delta(before, after, "curvine_worker_chain_forwards_total") == 3
    assert workers_delta(before, after, "curvine_worker_chain_forward_bytes_total") == size
    assert workers_delta(before, after, "curvine_worker_write_bytes_total", via="network") == 2 * size
    assert workers_delta(before, after, "curvine_worker_block_write_duration_seconds_count") == 2 * 3


# ---------------------------------------------------------------------- names
def families(c: LocalCluster) -> dict[str, set[str]]:
    """Every curvine_* sample name each daemon role exports."""
    out: dict[str, set[str]] = {}
    for p in c.processes:
        s = scrape(p.metrics)
        out.setdefault(p.role, set()).update(n for n, _ in s.samples if n.startswith("curvine_"))
    return out


def metric_names(samples: set[str]) -> set[str]:
    """Sample names back to metric names (a histogram's _bucket/_sum/_count, a counter's _total)."""
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in samples}


@needs_mount
def test_names_follow_prometheus_conventions(mounted: tuple[LocalCluster, Client]) -> None:
    c, _ = mounted
    exported = families(c)
    assert set(exported) == {"master", "worker", "fuse"}
    for role, names in exported.items():
        assert "curvine_build_info" in names, role
        for n in metric_names(names):
            assert re.fullmatch(r"curvine_[a-z0-9_]+", n), n
            if "duration" in n:
                assert n.endswith("_seconds"), n
            assert not re.search(r"_(ms|milliseconds|kb|mb|bytes_total_bytes)$", n), n
    for p in c.processes:   # low-cardinality labels only: never a path of the namespace or a chunk
        s = scrape(p.metrics)
        keys = {k for n, labels in s.samples if n.startswith("curvine_") for k, _ in labels}
        assert keys <= {"op", "method", "result", "dir", "state", "tier", "reason", "source", "via",
                        "outcome", "engine", "le", "version", "python", "role", "access"}, keys


def documented_names() -> set[str]:
    return set(re.findall(r"`(curvine_[a-z0-9_]+)`", DOCS.read_text()))


def dashboard_names() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return {n for e in exprs for n in re.findall(r"\bcurvine_[a-z0-9_]+", e)}


@needs_mount
def test_dashboard_and_docs_name_exactly_what_is_exported(mounted: tuple[LocalCluster, Client]) -> None:
    c, _ = mounted
    exported = set().union(*families(c).values())
    missing = dashboard_names() - exported
    assert not missing, f"the Grafana dashboard uses metrics no daemon exports: {sorted(missing)}"
    metrics = metric_names(exported) | {n[:-len("_total")] for n in exported if n.endswith("_total")}
    undocumented = {n for n in metric_names(exported) if n not in documented_names()
                    and n.removesuffix("_total") not in documented_names()}
    assert not undocumented, f"docs/metrics.md lacks {sorted(undocumented)}"
    stale = {n for n in documented_names() if n not in metrics and n not in exported}
    assert not stale, f"docs/metrics.md documents metrics nothing exports: {sorted(stale)}"


# ---------------------------------------------------------------------- the CLI
@needs_mount
def test_cv_stats_and_cluster_status_find_every_endpoint(mounted: tuple[LocalCluster, Client]) -> None:
    c, _ = mounted
    env = dict(os.environ, CURVINE_CONF=str(c.config_path))
    r = subprocess.run([CV, "cluster", "status", "--dir", str(c.dir), "--json"], capture_output=True, text=True,
                       timeout=60)
    procs = json.loads(r.stdout)["processes"]
    assert {p["name"]: p["metrics"] for p in procs} == {p.name: p.metrics for p in c.processes}
    assert all(p["metrics"] for p in procs)

    out = subprocess.run([CV, "stats", c.mount or "", "--json", "--interval", "0.3"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    one = json.loads(out.stdout)
    assert one["role"] == "mount" and one["address"] == endpoint(c, "fuse")
    assert {"ops/s", "read", "write", "hit%", "meta_ms"} <= set(one)
    inside = Path(c.mount or "") / "statsdir"
    inside.mkdir(exist_ok=True)
    out = subprocess.run([CV, "stats", str(inside), "--json", "--interval", "0.1"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["address"] == endpoint(c, "fuse"), out.stderr
    out = subprocess.run([CV, "stats", "--master", "--json", "--interval", "0.3"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["role"] == "master"
    rows = subprocess.run([CV, "stats", "--metrics", endpoint(c, "worker1"), "--count", "2", "--interval", "0.2"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert rows.returncode == 0, rows.stderr
    lines = rows.stdout.splitlines()
    assert lines[0].startswith("worker ") and "reads/s" in lines[1] and len(lines) == 4, lines

    bad = subprocess.run([CV, "stats", str(c.dir)], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "not in a curvine mount" in bad.stderr
    none = subprocess.run([CV, "stats"], capture_output=True, text=True, timeout=60, env=env)
    assert none.returncode == 1 and "MOUNTPOINT" in none.stderr and "Traceback" not in none.stderr


def test_metrics_port_zero_turns_the_endpoint_off(cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    c = cluster_factory(workers=1, extra_master_flags=(*FAST_MASTER_FLAGS, "--master-metrics-port", "0"),
                        extra_worker_flags=("--worker-metrics-port", "0"))
    with Client(master=c.master_address, config=client_config(c)) as client:
        rep = client.report()
    assert rep.metrics_port == 0 and rep.workers[0].metrics_port == 0
    env = dict(os.environ, CURVINE_CONF=str(c.config_path))
    r = subprocess.run([CV, "stats", "--master", "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and "metrics are off" in r.stderr
