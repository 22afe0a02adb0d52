"""`cv bench [DIR]`: the KV-cache, sequential and metadata workloads on any directory.

Like `juicefs bench`, it measures whatever DIR is (our mount, a local disk, another
filesystem); it needs no cluster.  The read phase always runs in a fresh process (this
same command with ``--phase read``), so nothing the writer process cached can serve it;
with ``--reader-dir`` that process reads through a second mount, and ``--reader-prefix``
runs it under another command (e.g. ``nsenter --net=/var/run/netns/h2``: another host).
The workloads themselves are in curvine_py.cli.bench.workloads.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import typing
from pathlib import Path

from curvine_py.cli.bench import workloads as bm
from curvine_py.cli import EXIT_OK, CliError, Context, UsageError
from curvine_py.cli import output
from curvine_py.common.config import parse_size
from curvine_py.common.errors import ConfigError

Result = dict[str, typing.Any]
READER_TIMEOUT_S = 3600.0

# (workload, metric label, key in the workload's figures, where: "write" or "read")
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("kvcache", "write GB/s", "write_GBps", "write"),
    ("kvcache", "write p50 ms", "write_p50_ms", "write"),
    ("kvcache", "write p99 ms", "write_p99_ms", "write"),
    ("kvcache", "read GB/s", "read_GBps", "read"),
    ("kvcache", "read p50 ms", "read_p50_ms", "read"),
    ("kvcache", "read p99 ms", "read_p99_ms", "read"),
    ("kvcache", "lookup ms (a stat per file)", "lookup_ms", "read"),
    ("kvcache", "1,925-token prompt read ms", "prompt_ms", "read"),
    ("seq", "write GB/s", "write_GBps", "write"),
    ("seq", "read GB/s", "read_GBps", "read"),
    ("seq", "random 128 KiB reads/s", "random_per_s", "read"),
    ("seq", "random 128 KiB read p50 ms", "random_p50_ms", "read"),
    ("seq", "random 128 KiB read p99 ms", "random_p99_ms", "read"),
    ("meta", "create/s", "create_per_s", "write"),
    ("meta", "stat/s", "stat_per_s", "write"),
    ("meta", "rename/s", "rename_per_s", "write"),
    ("meta", "unlink/s", "unlink_per_s", "write"),
)


def figures(result: Result) -> list[tuple[str, str, float]]:
    """A result flattened to (workload, metric, value) rows, reads once per temperature.

    bench/compare builds its side-by-side table from the same rows.
    """
    rows = []
    for workload, label, key, where in METRICS:
        w = result.get(workload)
        if not w:
            continue
        if where == "write":
            if key in w:
                rows.append((workload, label, float(w[key])))
            continue
        for temp, r in w.get("read", {}).items():
            if key in r:
                name = label
                if key == "prompt_ms":
                    name = f"{label} ({r['prompt_files']} files)"
                rows.append((workload, f"{name} ({temp})", float(r[key])))
    return rows


def format_value(metric: str, value: float) -> str:
    if metric.split(" (", 1)[0].endswith("/s") and "GB" not in metric:
        return f"{value:,.0f}"
    if " ms" in metric:
        return f"{value:.1f}"
    return f"{value:.3f}"


# ---------------------------------------------------------------- phases


def run_reader(directory: Path, prefix: typing.Sequence[str], timeout_s: float = READER_TIMEOUT_S) -> Result:
    """The read phase in a fresh process (under prefix); its one error line becomes ours."""
    argv = [*prefix, sys.executable, "-m", "curvine_py.cli.main", "bench", str(directory),
            "--phase", "read", "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as e:
        raise CliError(f"--reader-prefix: cannot run {argv[0]!r}: {e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise CliError(f"{directory}: the read phase did not finish in {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        reason = lines[-1].removeprefix("cv: ") if lines else f"exit status {proc.returncode}"
        raise CliError(f"read phase: {reason}")
    return typing.cast(Result, json.loads(proc.stdout))


def merge_reads(result: Result, reads: Result, temp: str) -> None:
    for workload, figs in reads.items():
        if workload in bm.WORKLOADS:
            result.setdefault(workload, {}).setdefault("read", {})[temp] = figs


def run_all(args: argparse.Namespace, plan: bm.Plan) -> Result:
    """Write in this process, read warm (and cold) in fresh ones, clean up unless --keep."""
    base = Path(args.dir)
    if not base.is_dir():
        raise FileNotFoundError(2, "not a directory", str(base))
    reader_base = Path(args.reader_dir) if args.reader_dir else base
    name = f"cv-bench-{plan.seed & 0xFFFFFFFF:08x}"
    work, reader_work = base / name, reader_base / name
    prefix = shlex.split(args.reader_prefix or "")
    result: Result = {"dir": str(base), "reader_dir": str(reader_base), "plan": vars(plan).copy(),
                      "loadavg_1m": os.getloadavg()[0]}   # how busy the machine was: noise
    try:
        for workload, figs in bm.write_phase(work, plan).items():
            result[workload] = figs
        if {"kvcache", "seq"} & set(plan.workloads):
            merge_reads(result, run_reader(reader_work, prefix, plan.timeout_s * 2 + 60), "warm")
            if args.drop_caches:
                if bm.drop_caches(base, reader_base):
                    merge_reads(result, run_reader(reader_work, prefix, plan.timeout_s * 2 + 60), "cold")
                else:
                    print("cv: bench: not permitted to drop the page cache (needs root): "
                          "no cold read", file=sys.stderr)
    finally:
        if not args.keep:
            bm.remove_data(work)
    return result


def cmd_bench(ctx: Context) -> int:
    a = ctx.args
    directory = Path(a.dir)
    try:
        if a.phase == "read":
            result: Result = dict(bm.read_phase(directory, workload_list(a.workloads)))
        else:
            plan = make_plan(a)
            if a.phase == "write":
                result = {"dir": str(directory), "plan": vars(plan).copy(), **bm.write_phase(directory, plan)}
            else:
                result = run_all(a, plan)
    except bm.WrongData as e:
        raise CliError(f"wrong data: {e}") from None
    except bm.Stalled as e:
        raise CliError(str(e)) from None
    if a.json:
        output.print_json(result)
    else:
        print(output.table([(w, m, format_value(m, v)) for w, m, v in figures_of(result)],
                           headers=("workload", "metric", "value"), right={2}))
    return EXIT_OK


def figures_of(result: Result) -> list[tuple[str, str, float]]:
    """figures() also for a bare read phase (its reads are not yet under "read")."""
    if any("read_GBps" in v for v in result.values() if isinstance(v, dict)):
        wrapped: Result = {}
        merge_reads(wrapped, {k: v for k, v in result.items() if isinstance(v, dict)}, "warm")
        return figures(wrapped)
    return figures(result)


def workload_list(text: str) -> list[str]:
    workloads = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in bm.WORKLOADS]
    if unknown or not workloads:
        raise UsageError(f"--workloads: unknown {', '.join(unknown) or '(none)'} "
                         f"(choose from {','.join(bm.WORKLOADS)})")
    return workloads


def make_plan(a: argparse.Namespace) -> bm.Plan:
    workloads = workload_list(a.workloads)
    try:
        return bm.new_plan(workloads, a.files, parse_size(a.file_size), parse_size(a.seq_size),
                           a.meta_files, a.writers, a.readers, a.timeout, a.random_reads)
    except (ValueError, ConfigError) as e:
        raise UsageError(str(e)) from None


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv bench`."""
    p = sub.add_parser(
        "bench", parents=[common], help="benchmark a directory (KV cache, sequential, metadata)",
        description="Run the LMCache fs:// KV-cache pattern, a sequential write/read and metadata "
                    "operations on DIR (any filesystem); every byte read is verified.")
    p.add_argument("dir", metavar="DIR", nargs="?", default=".",
                   help="directory to benchmark (default: the current one); with --phase, the "
                        "work directory itself")
    p.add_argument("--workloads", default=",".join(bm.WORKLOADS),
                   help="comma-separated: kvcache,seq,meta (default: all)")
    p.add_argument("--files", type=int, default=32, help="kvcache: number of chunk files (default 32)")
    p.add_argument("--file-size", default="14MiB", help="kvcache: size of a chunk file incl. its "
                                                         "28-byte header (default 14MiB)")
    p.add_argument("--writers", type=int, default=1,
                   help="kvcache: threads writing chunks at once, as LMCache's put pool: every chunk "
                        "opened with its header first, then the payloads (default 1: one at a time)")
    p.add_argument("--readers", type=int, default=1,
                   help="kvcache: threads reading chunks at once, as LMCache's retrieve: every chunk "
                        "opened first, then read whole (default 1)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="kvcache with --writers/--readers: seconds a phase may take before it counts "
                        "as a hang and the bench fails (default 600)")
    p.add_argument("--seq-size", default="1GiB", help="seq: file size, 4 MiB requests (default 1GiB)")
    p.add_argument("--random-reads", type=int, default=300,
                   help="seq: 128 KiB reads at random aligned offsets of the file, one at a time and "
                        "each verified, before its sequential read (default 300; 0: none)")
    p.add_argument("--meta-files", type=int, default=5000, help="meta: number of files (default 5000)")
    p.add_argument("--reader-dir", metavar="DIR",
                   help="read through this directory instead (DIR seen through another mount)")
    p.add_argument("--reader-prefix", metavar="CMD",
                   help="run the read process under this command, e.g. "
                        "'nsenter --net=/var/run/netns/h2'")
    p.add_argument("--drop-caches", action="store_true",
                   help="also read cold: sync and drop the page cache (and a curvine mount's own "
                        "block copies) before a second read (root)")
    p.add_argument("--phase", choices=("all", "write", "read"), default="all",
                   help="write: only write DIR (kept); read: only read and verify what a write "
                        "phase left in DIR (default: all, in a temporary subdirectory)")
    p.add_argument("--keep", action="store_true", help="leave the written files behind")
    p.add_argument("--json", action="store_true", help="all figures as JSON")
    p.set_defaults(func=cmd_bench)
