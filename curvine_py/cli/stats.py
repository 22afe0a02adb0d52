"""`cv stats`: a live view of one daemon's Prometheus metrics, as `juicefs stats` gives.

It scrapes the daemon's /metrics (the same names a Prometheus server and the Grafana
dashboard use, docs/metrics.md) every ``--interval`` seconds and prints one row of rates
per interval: requests/s, bytes/s, mean and p99 latency over the interval and, for a
mount, the lookup hit rate (the KV cache's L2 hit rate under LMCache's ``fs://``).  The
daemon is found from a mount point (the root's ``user.curvine.metrics`` xattr, which the
mount answers itself), from ``--master`` (the master's Report names its metrics port), or
from ``--metrics HOST:PORT`` for any daemon, a worker included.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import time
import typing
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from curvine_py.cli import EXIT_OK, CliError, Context, host_port, output

METRICS_XATTR = "user.curvine.metrics"   # fuse/ops.py answers it on the mount's root
SCRAPE_TIMEOUT_S = 5.0
HEADER_EVERY = 20   # rows between repeated headers, as vmstat does
Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    """One scrape: every sample by (name, sorted labels), and when it was taken."""
    at: float
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)
    role: str = ""

    def total(self, name: str, **match: str) -> float:
        """The sum of name's samples whose labels include match."""
        return sum(v for (n, labels), v in self.samples.items()
                   if n == name and all((k, val) in labels for k, val in match.items()))

    def buckets(self, name: str) -> dict[float, float]:
        """A histogram's cumulative bucket counts summed over its other labels: {le: count}."""
        out: dict[float, float] = {}
        for (n, labels), v in self.samples.items():
            if n == f"{name}_bucket":
                le = float(dict(labels)["le"])
                out[le] = out.get(le, 0.0) + v
        return out


def scrape(address: str) -> Scrape:
    """GET http://address/metrics and parse it (prometheus_client's text parser)."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CliError(f"{address}: cannot read its metrics: {reason}") from None
    s = Scrape(time.monotonic())
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            s.samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
            if sample.name == "curvine_build_info":
                s.role = sample.labels.get("role", "")
    return s


# ---------------------------------------------------------------------- rates
def increase(a: Scrape, b: Scrape, name: str, **match: str) -> float:
    """How much a counter grew between two scrapes (a daemon restarted meanwhile counts from 0)."""
    d = b.total(name, **match) - a.total(name, **match)
    return d if d >= 0 else b.total(name, **match)


def rate(a: Scrape, b: Scrape, name: str, **match: str) -> float:
    """Per-second increase of a counter between two scrapes."""
    return increase(a, b, name, **match) / max(b.at - a.at, 1e-9)


def mean(a: Scrape, b: Scrape, hist: str) -> float | None:
    """Mean of a histogram's observations between the scrapes (None: none)."""
    n = increase(a, b, f"{hist}_count")
    return increase(a, b, f"{hist}_sum") / n if n > 0 else None


def mean_ms(a: Scrape, b: Scrape, hist: str) -> float | None:
    """mean() of a histogram in seconds, in ms."""
    m = mean(a, b, hist)
    return None if m is None else m * 1000


def quantile_ms(a: Scrape, b: Scrape, hist: str, q: float) -> float | None:
    """The q-quantile of the observations between the scrapes, in ms: the upper bound of
    the bucket it falls in (what Prometheus' histogram_quantile interpolates within)."""
    before, after = a.buckets(hist), b.buckets(hist)
    counts = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    if not counts or counts[-1][1] <= 0:
        return None
    want = q * counts[-1][1]
    for le, c in counts:
        if c >= want:
            return le * 1000 if math.isfinite(le) else math.inf
    return None


def hit_rate(a: Scrape, b: Scrape) -> float | None:
    """Lookups that found their name, of all lookups between the scrapes (None: none)."""
    hits = increase(a, b, "curvine_fuse_lookups_total", result="hit")
    misses = increase(a, b, "curvine_fuse_lookups_total", result="miss")
    return hits / (hits + misses) if hits + misses > 0 else None


# ---------------------------------------------------------------------- views
Column = tuple[str, typing.Callable[[Scrape, Scrape], float | None], str]   # header, value, format

MOUNT: list[Column] = [
    ("ops/s", lambda a, b: rate(a, b, "curvine_fuse_op_duration_seconds_count"), "n"),
    ("avg_ms", lambda a, b: mean_ms(a, b, "curvine_fuse_op_duration_seconds"), "ms"),
    ("p99_ms", lambda a, b: quantile_ms(a, b, "curvine_fuse_op_duration_seconds", 0.99), "ms"),
    ("read", lambda a, b: rate(a, b, "curvine_fuse_read_bytes_total"), "bytes"),
    ("write", lambda a, b: rate(a, b, "curvine_fuse_written_bytes_total"), "bytes"),
    ("lookup/s", lambda a, b: rate(a, b, "curvine_fuse_lookups_total"), "n"),
    ("hit%", lambda a, b: _pct(hit_rate(a, b)), "pct"),
    ("meta/s", lambda a, b: rate(a, b, "curvine_client_meta_rpc_duration_seconds_count"), "n"),
    ("meta_ms", lambda a, b: mean_ms(a, b, "curvine_client_meta_rpc_duration_seconds"), "ms"),
    ("remote", lambda a, b: rate(a, b, "curvine_client_read_bytes_total", source="remote"), "bytes"),
    ("local", lambda a, b: rate(a, b, "curvine_client_read_bytes_total", source="short_circuit"), "bytes"),
    ("passthru/s", lambda a, b: rate(a, b, "curvine_client_reads_total", source="passthrough"), "n"),
    ("open", lambda a, b: b.total("curvine_client_open_files"), "n"),
    ("dirty", lambda a, b: b.total("curvine_client_dirty_bytes"), "size"),
    ("staged", lambda a, b: b.total("curvine_client_staged_bytes"), "size"),
]
MASTER: list[Column] = [
    ("rpc/s", lambda a, b: rate(a, b, "curvine_master_rpc_duration_seconds_count"), "n"),
    ("avg_ms", lambda a, b: mean_ms(a, b, "curvine_master_rpc_duration_seconds"), "ms"),
    ("p99_ms", lambda a, b: quantile_ms(a, b, "curvine_master_rpc_duration_seconds", 0.99), "ms"),
    ("commit/s", lambda a, b: rate(a, b, "curvine_master_journal_commit_duration_seconds_count"), "n"),
    ("commit_ms", lambda a, b: mean_ms(a, b, "curvine_master_journal_commit_duration_seconds"), "ms"),
    ("batch", lambda a, b: mean(a, b, "curvine_master_journal_batch_records"), "n"),
    ("files", lambda a, b: b.total("curvine_master_files"), "n"),
    ("blocks", lambda a, b: b.total("curvine_master_blocks"), "n"),
    ("under", lambda a, b: b.total("curvine_master_under_replicated_blocks"), "n"),
    ("live", lambda a, b: b.total("curvine_master_workers", state="live"), "n"),
    ("evict/s", lambda a, b: rate(a, b, "curvine_master_evictions_total"), "n"),
    ("used", lambda a, b: b.total("curvine_master_used_bytes"), "size"),
]
WORKER: list[Column] = [
    ("reads/s", lambda a, b: rate(a, b, "curvine_worker_block_reads_total"), "n"),
    ("read", lambda a, b: rate(a, b, "curvine_worker_read_bytes_total"), "bytes"),
    ("read_ms", lambda a, b: mean_ms(a, b, "curvine_worker_block_read_duration_seconds"), "ms"),
    ("writes/s", lambda a, b: rate(a, b, "curvine_worker_block_writes_total"), "n"),
    ("write", lambda a, b: rate(a, b, "curvine_worker_write_bytes_total"), "bytes"),
    ("write_ms", lambda a, b: mean_ms(a, b, "curvine_worker_block_write_duration_seconds"), "ms"),
    ("chain", lambda a, b: rate(a, b, "curvine_worker_chain_forward_bytes_total"), "bytes"),
    ("cksum_err", lambda a, b: b.total("curvine_worker_checksum_failures_total"), "n"),
    ("used", lambda a, b: b.total("curvine_worker_used_bytes"), "size"),
]
VIEWS = {"mount": MOUNT, "master": MASTER, "worker": WORKER}


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _cell(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "bytes":
        return f"{output.format_size(int(value))}/s"
    if kind == "size":
        return output.format_size(int(value))
    if kind == "ms":
        return "inf" if math.isinf(value) else f"{value:.2f}"
    if kind == "pct":
        return f"{value:.1f}"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def sample(view: list[Column], a: Scrape, b: Scrape) -> dict[str, float | None]:
    """One interval's figures by column header (the --json form)."""
    return {header: value(a, b) for header, value, _ in view}


# ---------------------------------------------------------------------- targets
def target_of(ctx: Context) -> str:
    """host:port of the daemon to watch: --metrics, else the mount point, else the master
    (``--master`` alone: the configured one; ``--master HOST:PORT``: that one)."""
    a = ctx.args
    if a.metrics:
        return a.metrics
    if a.mountpoint:
        return _mount_metrics(a.mountpoint)
    if getattr(a, "master", None) is None:
        raise CliError("name what to watch: a MOUNTPOINT, --master, or --metrics HOST:PORT")
    rep = ctx.client.report()   # the leader's, in a group of masters: its metrics are the ones that move
    leader = next((m.address for m in rep.masters if m.role == "leader"), ctx.config.client.master.split(",")[0])
    if not rep.metrics_port:
        raise CliError(f"master {leader}: its metrics are off (master.metrics_port = 0)")
    return f"{leader.strip().rpartition(':')[0]}:{rep.metrics_port}"


def _mount_metrics(path: str) -> str:
    """The metrics address of the mount path is in (the mount answers it on its root only)."""
    if not os.path.exists(path):
        raise CliError(f"{path}: no such directory")
    root = os.path.realpath(path)
    while not os.path.ismount(root):
        root = os.path.dirname(root)
    try:
        return os.getxattr(root, METRICS_XATTR).decode()
    except OSError:
        raise CliError(f"{path}: not in a curvine mount, or its metrics are off (fuse.metrics_port = 0)") from None


def cmd_stats(ctx: Context) -> int:
    a = ctx.args
    if a.interval <= 0:
        raise CliError(f"--interval must be positive, not {a.interval:g}")
    address = target_of(ctx)
    prev = scrape(address)
    view = VIEWS.get(prev.role)
    if view is None:
        raise CliError(f"{address}: not a curvine daemon's metrics (no curvine_build_info role)")
    if a.json:
        time.sleep(a.interval)
        cur = scrape(address)
        output.print_json({"address": address, "role": prev.role, "interval_s": round(cur.at - prev.at, 3),
                           **sample(view, prev, cur)})
        return EXIT_OK
    print(f"{prev.role} {address}, every {a.interval:g} s (Ctrl-C stops)", flush=True)
    rows = 0
    while a.count == 0 or rows < a.count:
        time.sleep(a.interval)
        cur = scrape(address)
        if rows % HEADER_EVERY == 0:
            print(" ".join(f"{h:>10}" for h, _, _ in view))
        print(" ".join(f"{_cell(v(prev, cur), kind):>10}" for _, v, kind in view), flush=True)
        prev, rows = cur, rows + 1
    return EXIT_OK


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv stats`."""
    # conflict_handler="resolve": this --master replaces the shared one, so that it can
    # also stand alone (`cv stats --master` watches the configured master).  Resolving
    # edits the parent's action objects, so it is done on a copy of the shared options.
    p = sub.add_parser("stats", parents=[copy.deepcopy(common)], conflict_handler="resolve",
                       help="live metrics of a mount, the master or a worker",
                       description="Rates of one daemon's Prometheus metrics, one row per interval "
                                   "(docs/metrics.md): the mount at MOUNTPOINT, the master, or any daemon.")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?", help="a curvine mount point")
    p.add_argument("--master", metavar="HOST:PORT", nargs="?", const="", default=argparse.SUPPRESS,
                   type=lambda t: t and host_port(t),
                   help="watch the master (alone: the one of $CURVINE_MASTER or the config)")
    p.add_argument("--metrics", metavar="HOST:PORT", type=host_port,
                   help="watch the daemon serving /metrics there (e.g. a worker; `cv report --json` lists them)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between rows (default 1)")
    p.add_argument("--count", type=int, default=0, help="stop after N rows (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="print one sample (one interval) as JSON and exit")
    p.set_defaults(func=cmd_stats)
