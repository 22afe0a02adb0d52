#!/usr/bin/env python3
"""LMCache's own L2 benchmark (`lmcache bench l2`, verified) on three L2 tiers, one run.

- plugin: our native adapter (curvine_py.kv.lmcache) through LMCache's `plugin` type,
  on a worker's host (a replica is local: the SDK reads its block files directly);
- fs on mount: LMCache's built-in `fs` adapter on a mount of the same pool (default mount
  settings; the mount's host identity is that worker's host too);
- fs on ext4: the `fs` adapter on a local directory (the physical limit here).

One local cluster (1 master, 2 workers, a mount) serves the first two.  With
`--no-replica` the cluster runs on network-namespace hosts (master on host 0, workers on
1 and 2) and LMCache (and the mount) on host 3, which holds no replica: every block
crosses the network (curvine_py/testing/testhosts.py).

`--engine-tokens 1925,8192` adds LMCache's in-process engine (tests/kvclients/
lmcache_driver.py: LMCache's own chunking, memory objects and connectors, a CPU KV
connector for vLLM's GPU kernels): a prompt stored by one process and looked up and
retrieved by a fresh one, every byte checked, through the pool's remote storage plugin
(curvine_py.kv.lmcache_connector), `fs://` on the mount and `fs://` on ext4.  For each key
count (`--keys`, default 8 and 32; 14 MiB per key as Qwen2.5-7B's chunks) each tier runs
`lmcache bench l2 --no-skip-verify --lookup-max-hit-rate 1.0`, the tiers in turn, `--repeat`
times (alternated: a change of the shared machine's load meets every tier alike); a
tier's figures are the median over its runs of the benchmark's own p50 over `--rounds`
rounds: store MB/s, lookup ms, load ms, each also as a ratio to the ext4 run.  Each tier's directory is emptied after
its run.  Needs root (the mount) and the LMCache venv (`make lmcache-deps`).

    .venv/bin/python bench/kv_native.py [--keys 8,32] [--data-size-kb 14336] [--rounds 3]
        [--repeat 1] [--tiers plugin,...] [--engine-tokens 1925,8192] [--no-replica] [--dir DIR] [--json]

The adapter's lookup (issue 43: <= 1 ms at 8 and at 256 keys) alone, quickly:
`--tiers plugin --keys 8,256 --data-size-kb 64 --rounds 20 --repeat 3`.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from curvine_py.cluster.local import LocalCluster
from curvine_py.common import config as cfgmod
from curvine_py.testing.netcluster import NetCluster
from curvine_py.testing.testhosts import Hosts, HostsError

ROOT = Path(__file__).resolve().parents[1]
LMCACHE = ROOT / ".venv" / "lmcache" / "bin" / "lmcache"
ENGINE_DRIVER = ROOT / "tests" / "kvclients" / "lmcache_driver.py"
TIERS = ("fs on ext4", "fs on mount", "plugin")
RUN_TIMEOUT_S = 600


Run = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass
class Place:
    """Where LMCache runs: its cluster's config, its host identity, its mount, how to start it."""
    config: Path
    host: str
    mnt: Path
    run: Run


def spec(tier: str, place: Place, local: Path, base: str) -> str:
    if tier == "plugin":
        params = {"config": str(place.config), "base_path": base, "host": place.host}
        return json.dumps({"type": "plugin", "module_path": "curvine_py.kv.lmcache", "class_name": "CurvineL2Adapter",
                           "config_class_name": "CurvineL2AdapterConfig", "adapter_params": params})
    directory = (place.mnt if tier == "fs on mount" else local) / base.strip("/")
    return json.dumps({"type": "fs", "base_path": str(directory)})


def bench_l2(run: Run, l2_spec: str, keys: int, size_kb: int, rounds: int, work: Path) -> dict[str, float]:
    """One `lmcache bench l2` run: store MB/s, lookup ms, load ms (p50 of its rounds)."""
    out = work / "bench-l2.json"
    argv = [str(LMCACHE), "bench", "l2", "--l2-adapter", l2_spec, "--num-keys", str(keys),
            "--data-size-kb", str(size_kb), "--rounds", str(rounds), "--no-skip-verify",
            "--lookup-max-hit-rate", "1.0", "--format", "json", "--output", str(out), "-q"]
    env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1"}
    proc = run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=work, env=env)
    try:
        if proc.returncode != 0:   # a failed verification too
            raise RuntimeError(f"lmcache bench l2 exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
        ops = {op["operation"]: op for op in _ops(json.loads(out.read_text()))}
    finally:
        out.unlink(missing_ok=True)
    for name in ("Store", "Lookup", "Load"):
        op = ops[name]
        if op["total_success"] != op["total_keys"]:
            raise RuntimeError(f"{name}: {op['total_success']} of {op['total_keys']} keys")
    return {"store_MBps": ops["Store"]["throughput_avg_mbps"], "lookup_ms": ops["Lookup"]["duration_p50_ms"],
            "load_ms": ops["Load"]["duration_p50_ms"], "load_GBps": ops["Load"]["throughput_avg_mbps"] / 1000}


def _ops(report: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for key, value in report.items():
        if isinstance(value, dict):
            found += [value] if key.startswith("op_") else _ops(value)
    return found


@contextlib.contextmanager
def replica_host(work: Path) -> Iterator[Place]:
    """A local cluster; LMCache and the mount with worker 0's host identity (a replica here)."""
    mnt = work / "mnt"
    host = f"{cfgmod.host_identity('')}-w0"   # LocalCluster.worker_host(0)
    cluster = LocalCluster(work / "cluster", workers=2, mount=str(mnt), die_with_parent=True,
                           extra_master_flags=("--master-heartbeat-ms", "200"), env={"CURVINE_CLIENT_HOST": host})
    cluster.start(timeout=60)
    try:
        yield Place(cluster.config_path, host, mnt, subprocess.run)
    finally:
        cluster.stop()


@contextlib.contextmanager
def no_replica_host(work: Path) -> Iterator[Place]:
    """Network-namespace hosts: master on 0, workers on 1 and 2, LMCache and the mount on 3."""
    with Hosts(4) as hosts:
        cluster = NetCluster(hosts, work / "cluster").start()
        try:
            mnt = cluster.mount(3, work / "mnt")
            yield Place(cluster.config_path, hosts[3].name, mnt, hosts[3].run)
        finally:
            cluster.stop()


def measure(args: argparse.Namespace, work: Path) -> dict[str, dict[str, dict[str, float]]]:
    local = work / "ext4"
    results: dict[str, dict[str, dict[str, float]]] = {}
    with (no_replica_host if args.no_replica else replica_host)(work) as place:
        try:
            for keys in args.keys:
                runs: dict[str, list[dict[str, float]]] = {tier: [] for tier in args.tiers}
                for r, (i, tier) in itertools.product(range(args.repeat), enumerate(args.tiers)):
                    base = f"kvbench/{keys}-{r}-{i}"
                    try:
                        runs[tier].append(bench_l2(place.run, spec(tier, place, local, f"/{base}"), keys,
                                                   args.data_size_kb, args.rounds, work))
                    finally:   # each tier's chunks go before the next tier's run
                        shutil.rmtree((local if tier == "fs on ext4" else place.mnt) / base, ignore_errors=True)
                row = results[f"{keys} keys"] = {tier: {k: statistics.median(x[k] for x in got) for k in got[0]}
                                                 for tier, got in runs.items()}
                ratios(row)
            if args.engine_tokens:
                results["engine"] = engine_runs(args, place, local, work)
        finally:
            shutil.rmtree(place.mnt / "kvbench", ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
    return results


def engine_runs(args: argparse.Namespace, place: Place, local: Path, work: Path) -> dict[str, dict[str, float]]:
    """Each prompt size through each tier's connector: store s, then a fresh process's
    lookup and retrieve ms (medians over --repeat, tiers alternated), retrieve / ext4's."""
    out: dict[str, dict[str, float]] = {}
    for tokens in args.engine_tokens:
        runs: dict[str, list[dict[str, float]]] = {tier: [] for tier in TIERS}
        for r, (i, tier) in itertools.product(range(args.repeat), enumerate(TIERS)):
            base = f"kvbench/engine-{tokens}-{r}-{i}"
            where = (local if tier == "fs on ext4" else place.mnt) / base
            plugin = ("--curvine", json.dumps({"base_path": f"/{base}", "config": str(place.config),
                                               "host": place.host})) if tier == "plugin" else ()
            common = ("--dir", str(where), "--tokens", str(tokens), "--seed", str(tokens + r), "--cpu-gb",
                      f"{cpu_gb(tokens):.2f}")
            try:
                stored = drive_engine(place.run, work, "put", *plugin, *common)
                fetched = drive_engine(place.run, work, "get", *plugin, *common)
                runs[tier].append({"store_s": stored["store_s"], "lookup_ms": fetched["lookup_s"] * 1e3,
                                   "retrieve_ms": fetched["retrieve_s"] * 1e3})
            finally:
                shutil.rmtree(where, ignore_errors=True)
        for tier, figs in runs.items():
            out[f"{tokens} tokens, {tier}"] = {k: statistics.median(x[k] for x in figs) for k in figs[0]}
        ext4 = out[f"{tokens} tokens, fs on ext4"]["retrieve_ms"]
        for tier in TIERS:
            out[f"{tokens} tokens, {tier}"]["retrieve_vs_ext4"] = out[f"{tokens} tokens, {tier}"]["retrieve_ms"] / ext4
    return out


def cpu_gb(tokens: int) -> float:
    """LMCache's local CPU buffer for a prompt (the driver's model: 14 MiB per 256-token
    chunk), with a quarter to spare; at least 1 GB (32,768 tokens need 1.75 GiB)."""
    return max(1.0, tokens / 256 * 14 / 1024 * 1.25)


def drive_engine(run: Run, work: Path, *args: str) -> dict[str, Any]:
    """One LMCache engine process (byte-exact or it fails): its JSON."""
    python = LMCACHE.parent / "python"
    proc = run([str(python), str(ENGINE_DRIVER), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
               cwd=work, env={**os.environ, "LMCACHE_DISABLE_BANNER": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"lmcache engine {args[0]} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return typing.cast(dict[str, Any], json.loads(lines[-1]))


def ratios(row: dict[str, dict[str, float]]) -> None:
    ext4 = row.get("fs on ext4")
    if ext4 is None:   # --tiers without it: no ratios
        return
    for tier in [t for t in TIERS[1:] if t in row]:
        r = row[tier]
        r["store_vs_ext4"] = r["store_MBps"] / ext4["store_MBps"]
        r["lookup_vs_ext4"] = r["lookup_ms"] / ext4["lookup_ms"]
        r["load_vs_ext4"] = r["load_ms"] / ext4["load_ms"]


def table(results: dict[str, dict[str, dict[str, float]]], size_kb: int) -> str:
    lines = [f"lmcache bench l2, {size_kb} KiB per key, verified (ratios: / fs on ext4; load and lookup: lower is "
             "better)",
             f"{'keys':<9}{'tier':<13}{'store MB/s':>11}{'x ext4':>8}{'lookup ms':>11}{'x ext4':>8}"
             f"{'load ms':>10}{'x ext4':>8}{'load GB/s':>11}"]
    for keys, row in results.items():
        if keys == "engine":
            continue
        for tier, r in row.items():
            lines.append(f"{keys:<9}{tier:<13}{r['store_MBps']:>11.0f}{r.get('store_vs_ext4', 1.0):>8.2f}"
                         f"{r['lookup_ms']:>11.2f}{r.get('lookup_vs_ext4', 1.0):>8.2f}{r['load_ms']:>10.1f}"
                         f"{r.get('load_vs_ext4', 1.0):>8.2f}{r['load_GBps']:>11.2f}")
    if "engine" in results:
        lines += ["", "LMCache's engine: a prompt stored, then looked up and retrieved by a fresh process, verified",
                  f"{'prompt, tier':<28}{'store s':>9}{'lookup ms':>11}{'retrieve ms':>13}{'x ext4':>8}"]
        for name, r in results["engine"].items():
            lines.append(f"{name:<28}{r['store_s']:>9.2f}{r['lookup_ms']:>11.1f}{r['retrieve_ms']:>13.1f}"
                         f"{r['retrieve_vs_ext4']:>8.2f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32],
                    help="key counts, comma-separated (each a run per tier)")
    ap.add_argument("--data-size-kb", type=int, default=14336, help="per key (14336: Qwen2.5-7B's 256-token chunk)")
    ap.add_argument("--rounds", type=int, default=3, help="the benchmark's measured rounds per run")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tier, alternated; medians reported")
    ap.add_argument("--engine-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[],
                    help="also LMCache's in-process engine with prompts of these token counts")
    ap.add_argument("--no-replica", action="store_true",
                    help="LMCache on a network-namespace host without a worker (needs root)")
    ap.add_argument("--tiers", type=lambda s: [t.strip() for t in s.split(",")], default=list(TIERS),
                    help=f"the tiers of the lmcache bench l2 runs, comma-separated (default: {','.join(TIERS)}); "
                         "e.g. 'plugin' alone to time the adapter's lookup")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not LMCACHE.exists():
        print(f"kv_native: LMCache is not installed ({LMCACHE}: make lmcache-deps)", file=sys.stderr)
        return 2
    if not args.tiers or set(args.tiers) - set(TIERS):
        print(f"kv_native: --tiers takes some of {', '.join(TIERS)}", file=sys.stderr)
        return 2
    if any(k < 1 for k in args.keys) or min(args.data_size_kb, args.rounds, args.repeat) < 1:
        print("kv_native: --keys, --data-size-kb, --rounds and --repeat must be positive", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kv_native-", dir=args.dir))
    try:
        results = measure(args, work)
    except HostsError as e:
        print(f"kv_native: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    where = "LMCache on a host with no replica" if args.no_replica else "LMCache on a replica's host"
    print(json.dumps(results, indent=1) if args.json else f"{where}\n" + table(results, args.data_size_kb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
