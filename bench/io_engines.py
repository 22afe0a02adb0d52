#!/usr/bin/env python3
"""The worker's two disk I/O engines side by side: io_uring and the thread pool.

Each round starts a local cluster (1 master + 2 workers + a mount, as ``cv cluster start
--mount`` does, data under --dir) with ``worker.io_engine = uring``, checks with ``cv
report --json`` that both workers really run it, runs ``cv bench MOUNT --workloads
kvcache,seq`` on the mount and bench/sdk_bench.py against the cluster, stops it, then
does the same with ``threads``; the next round starts with the other engine, so machine
noise hits both.  Prints one table, metric | uring | threads | uring/threads, medians over
--rounds (``ms`` rows: lower is better; ``worker CPU`` rows: the two workers' user+system
seconds per GB the bench wrote; ``load average`` rows: the machine's 1-minute load when each
cluster started and stopped, the noise the figures carry).  Where io_uring does not work (the worker's own probe
fails) it says so in one line and measures threads only.

As the default setup, the mount and the SDK are clients on worker 0's host: they read and
write worker 0's replicas themselves (short-circuit), so the engines move only worker 1's
copies; ``--remote-client`` makes them clients of another host (every byte over TCP to a
worker, both copies through the workers' engines).

Everything it starts (clusters, mounts, bench processes, the temp dir) is stopped and
removed at the end, also on failure, Ctrl-C or SIGTERM.

    .venv/bin/python bench/io_engines.py [--rounds 2] [--small] [--remote-client] [--json]
        [--dir D] [--files 32] [--file-size 14MiB] [--seq-size 1GiB] [--sdk-runs 5]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from curvine_py.cli import output
from curvine_py.cli.bench import figures as cv_bench_rows
from curvine_py.common.config import parse_size
from curvine_py.common.mounttable import is_mounted
from curvine_py.cluster.local import ClusterError, LocalCluster, fuse_available

ENGINES = ("uring", "threads")
BENCH = Path(__file__).resolve().parent
# Seconds one bench process may take (--small: a smoke run, normally ~1 s a step).
STEP_TIMEOUT_S, SMALL_STEP_TIMEOUT_S = 900.0, 45.0
# sdk_bench's figures in the table (raw-socket figures stay in the JSON: no engine in them)
SDK_METRICS = ("kv_put_GBps", "kv_put_median_GBps", "kv_get_GBps", "kv_get_median_GBps",
               "kv_get_into_GBps", "kv_get_into_ms", "seq_write_GBps", "seq_read_GBps",
               "create_per_s", "stat_per_s", "rename_per_s", "unlink_per_s")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"io_engines: {msg}", file=sys.stderr, flush=True)


class Stop(Exception):
    """SIGTERM: unwind through every finally (clusters stopped, temp dir removed)."""


def _on_sigterm(signum: int, frame: types.FrameType | None) -> None:
    raise Stop(f"signal {signum}")


@contextlib.contextmanager
def signals_held() -> Any:
    """Ctrl-C and SIGTERM wait until a cleanup step is done (then they are delivered)."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------- children

RUNNING: list[subprocess.Popen[str]] = []   # bench processes in flight (each its own group)


class StepTimeout(RuntimeError):
    """A bench process did not finish in its time (it was killed, with its group)."""


def run(argv: list[str], env: dict[str, str], what: str, timeout: float) -> str:
    """stdout of argv; it runs in a process group of its own, killed whole if we stop."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    RUNNING.append(p)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StepTimeout(f"{what}: did not finish in {timeout:.0f} s") from None
    finally:
        kill_group(p)
        RUNNING.remove(p)
    if p.returncode != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        raise RuntimeError(f"{what}: exit status {p.returncode}: {lines[-1] if lines else ''}\n"
                           + "\n".join(lines[-30:]))
    return out


def kill_group(p: subprocess.Popen[str]) -> None:
    """Stop p and whatever it started (its process group: cv bench's reader, sdk_bench's
    metadata clients); SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)
        try:
            p.wait(timeout=wait)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)   # the group's leftovers, if any
            return
        except subprocess.TimeoutExpired:
            continue


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])   # utime, stime
    return total / CLK_TCK


# ---------------------------------------------------------------- one cluster

def uring_problem(base: Path) -> str | None:
    """None when io_uring works here (the worker's own probe, in a child process), else why."""
    from curvine_py.worker.ioengine import liburing_installed
    if not liburing_installed():
        return "the liburing package is not installed"
    from curvine_py.worker.uringprobe import probe_uring
    probe_dir = base / "probe"
    probe_dir.mkdir()
    try:
        result = probe_uring(str(probe_dir))
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    return None if result.ok else result.reason


def client_env(cluster: LocalCluster, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURVINE_")}
    env.update(CURVINE_CONF=str(cluster.config_path), CURVINE_CLUSTER_SECRET=cluster.secret, **extra)
    return env


def check_engine(cluster: LocalCluster, engine: str, env: dict[str, str]) -> None:
    rep = json.loads(run([sys.executable, "-m", "curvine_py.cli.main", "report", "--json"], env,
                         "cv report --json", timeout=120))
    got = [w.get("io_engine", "") for w in rep["workers"]]
    if got != [engine] * cluster.n_workers:
        raise RuntimeError(f"asked for worker.io_engine = {engine}, cv report --json says {got}")


def one_cluster(base: Path, engine: str, args: argparse.Namespace, sizes: dict[str, Any]) -> dict[str, float]:
    """Start a cluster on engine, run both benches on it, stop it; the figures by metric."""
    d = base / f"{engine}-{time.monotonic_ns()}"
    mnt = d / "mnt"
    extra = {"CURVINE_CLIENT_HOST": "io-engines-bench-client"} if args.remote_client else {}
    cluster = LocalCluster(d / "cluster", workers=2, master_port=None, mount=str(mnt) if sizes["mount"] else None,
                           die_with_parent=True,
                           env={"CURVINE_WORKER_IO_ENGINE": engine, "CURVINE_RUN_DIR": str(d / "run"), **extra})
    figs: dict[str, float] = {"load average (1 min) at the start": os.getloadavg()[0]}   # noise
    try:
        t = time.monotonic()
        cluster.start()
        log(f"{engine}: cluster up in {time.monotonic() - t:.1f} s")
        env = client_env(cluster, extra)
        check_engine(cluster, engine, env)
        workers = [w.pid for w in cluster.workers if w.pid]
        if sizes["mount"]:
            if not is_mounted(str(mnt)):
                raise RuntimeError(f"the cluster's mount at {mnt} is not there")
            cpu0 = cpu_seconds(workers)
            res = json.loads(run([sys.executable, "-m", "curvine_py.cli.main", "bench", str(mnt),
                                  "--workloads", "kvcache,seq", "--json", *sizes["cv_bench"]], env,
                                 f"cv bench on the {engine} cluster", sizes["timeout"]))
            cpu = cpu_seconds(workers) - cpu0
            for workload, metric, value in cv_bench_rows(res):
                figs[f"mount {workload} {metric}"] = value
            figs["mount worker CPU s/GB written"] = cpu / (sizes["cv_bench_bytes"] / 1e9)
            log(f"{engine}: cv bench done (kvcache write {res['kvcache']['write_GBps']:.3f} GB/s, "
                f"seq write {res['seq']['write_GBps']:.3f} GB/s)")
        # sdk_bench forks its metadata clients after its own gRPC client ran (gRPC is not
        # fork-safe: seen once here, under load, a forked client hung creating its channel);
        # a timed-out run is killed and run once more, and the retry is counted.
        argv = [sys.executable, str(BENCH / "sdk_bench.py"), "--master", cluster.master_address,
                "--json", *sizes["sdk_bench"]]
        for attempt in (1, 2):
            cpu0 = cpu_seconds(workers)
            try:
                sdk = json.loads(run(argv, env, f"sdk_bench.py on the {engine} cluster", sizes["timeout"]))
                break
            except StepTimeout as e:
                if attempt == 2:
                    raise
                log(f"{e}: killed, once more")
                figs["sdk_bench retries"] = 1
        cpu = cpu_seconds(workers) - cpu0
        for key, value in sdk.items():
            figs[f"sdk {key}"] = value
        figs["sdk worker CPU s/GB written"] = cpu / (sizes["sdk_bytes"] / 1e9)
        log(f"{engine}: sdk_bench done (kv put {sdk['kv_put_GBps']:.3f} GB/s, "
            f"seq write {sdk['seq_write_GBps']:.3f} GB/s)")
        figs["load average (1 min) at the end"] = os.getloadavg()[0]
        return figs
    finally:
        with signals_held():
            cluster.stop()
            shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- main

def plan_sizes(args: argparse.Namespace) -> dict[str, Any]:
    if args.small:
        files, file_size, seq, runs = 2, 1 << 20, 4 << 20, 1
        sdk = ["--runs", "1", "--kv-size", "1MiB", "--seq-size", "4MiB", "--meta-files", "20",
               "--meta-clients", "1"]
    else:
        files, file_size, seq, runs = args.files, parse_size(args.file_size), parse_size(args.seq_size), args.sdk_runs
        sdk = ["--runs", str(runs), "--seq-size", str(seq)]
    kv = 1 << 20 if args.small else 103_000_000
    return {"timeout": SMALL_STEP_TIMEOUT_S if args.small else STEP_TIMEOUT_S,
            "files": files, "file_size": file_size, "seq_size": seq, "sdk_runs": runs,
            "cv_bench": ["--files", str(files), "--file-size", str(file_size), "--seq-size", str(seq)],
            "cv_bench_bytes": files * file_size + seq,
            "sdk_bench": sdk,
            # what sdk_bench writes: the KV object runs times, the sequential file runs // 2 times
            "sdk_bytes": kv * runs + seq * max(1, runs // 2)}


def table_rows(rounds: list[dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """One row per metric: the median over rounds of each engine, and their ratio."""
    names: list[str] = []
    for r in rounds:
        for figs in r.values():
            names += [n for n in figs if n not in names]
    names.sort(key=lambda n: n.startswith("load"))   # the noise rows last
    rows = []
    for name in names:
        if name.startswith("sdk ") and name[4:] not in SDK_METRICS and "CPU" not in name:
            continue
        med = {e: statistics.median(v) if (v := [r[e][name] for r in rounds if name in r.get(e, {})]) else None
               for e in ENGINES}
        ratio = med["uring"] / med["threads"] if med["uring"] is not None and med["threads"] else None
        rows.append({"metric": name, **med, "uring/threads": ratio})
    return rows


def fmt(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if metric.endswith(("/s", "_per_s")) and "GB" not in metric:
        return f"{v:,.0f}"
    if " ms" in metric or metric.endswith("_ms"):
        return f"{v:.1f}"
    if "CPU" in metric or metric.startswith("load"):
        return f"{v:.2f}"
    return f"{v:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="clusters per engine, alternated (default 2)")
    ap.add_argument("--small", action="store_true", help="the smallest sizes (the smoke test)")
    ap.add_argument("--files", type=int, default=32, help="cv bench kvcache: chunk files (default 32)")
    ap.add_argument("--file-size", default="14MiB", help="cv bench kvcache: chunk size (default 14MiB)")
    ap.add_argument("--seq-size", default="1GiB", help="cv bench and sdk_bench: sequential file (default 1GiB)")
    ap.add_argument("--sdk-runs", type=int, default=5, help="sdk_bench --runs (default 5)")
    ap.add_argument("--remote-client", action="store_true",
                    help="the mount and the SDK on another host: no short-circuit, every copy via a worker")
    ap.add_argument("--dir", help="where the clusters live (default: a temp dir under the current dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    sizes = plan_sizes(args)
    sizes["mount"] = (fuse_available() and importlib.util.find_spec("pyfuse3") is not None
                      and os.geteuid() == 0 and os.path.exists("/dev/fuse"))
    signal.signal(signal.SIGTERM, _on_sigterm)
    base = Path(tempfile.mkdtemp(prefix="io-engines-", dir=args.dir or ".")).absolute()
    result: dict[str, Any] = {"loadavg_1m_start": os.getloadavg()[0], "rounds": args.rounds,
                              "remote_client": args.remote_client,
                              "sizes": {k: v for k, v in sizes.items() if not isinstance(v, list)}}
    try:
        if not sizes["mount"]:
            log("no FUSE mount here (needs root, /dev/fuse and pyfuse3): cv bench skipped, sdk_bench only")
        why = uring_problem(base)
        engines = list(ENGINES) if why is None else ["threads"]
        if why is not None:
            log(f"io_uring does not work here ({why}): measuring threads only")
            result["uring_unavailable"] = why
        rounds: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            log(f"round {r + 1}/{args.rounds}: {', '.join(order)} (load {os.getloadavg()[0]:.2f})")
            rounds.append({e: one_cluster(base, e, args, sizes) for e in order})
        result["loadavg_1m_end"] = os.getloadavg()[0]
        result["per_round"] = rounds
        result["table"] = table_rows(rounds)
    except KeyboardInterrupt:
        log("interrupted: stopping and removing what it started")
        return 130
    except Stop as e:
        log(f"stopped by {e}: stopping and removing what it started")
        return 143
    except (ClusterError, RuntimeError, OSError) as e:
        detail = getattr(e, "detail", "")
        log(f"failed: {e}" + (f"\n{detail}" if detail else ""))
        return 1
    finally:
        with signals_held():
            for p in list(RUNNING):
                kill_group(p)
            shutil.rmtree(base, ignore_errors=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if args.json:
        output.print_json(result)
        return 0
    print(output.table([(row["metric"], *(fmt(row["metric"], row[e]) for e in ENGINES),
                         "-" if row["uring/threads"] is None else f"{row['uring/threads']:.2f}")
                        for row in result["table"]],
                       headers=("metric", "uring", "threads", "uring/threads"), right={1, 2, 3}))
    note = f"medians of {args.rounds} round(s); load average {result['loadavg_1m_start']:.2f} at the start, " \
           f"{result['loadavg_1m_end']:.2f} at the end"
    if "uring_unavailable" in result:
        note += f"; uring not measured: io_uring does not work here ({result['uring_unavailable']})"
    print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
