#!/usr/bin/env python3
"""LMCache's own concurrency through our mounts, beside a local directory (issue 20).

`cv bench kvcache --writers N --readers N` as LMCache's put and retrieve pools drive a
filesystem: every chunk opened with its header first, then the payloads on N threads;
every chunk opened first, then read whole.  On 4 network-namespace hosts: master on 0,
workers on 1 and 2, the writer mount on host 1, fresh reader mounts on host 2 (a replica
is local: short-circuit or FUSE passthrough) and on host 3 (no worker: the network), two
reader processes in a row on host 3 (the second one used to hang).  Settings: the defaults
(16 MiB blocks since 2026-12-07; 4 MiB before) and docs/config.md's KV settings (16 MiB blocks on the writer, direct-I/O
reads), and 16 MiB blocks read through default mounts (kvdir: a KV directory's chunks,
`--settings defaults,kv,kvdir`), for 14 MiB and 32 MiB chunks.  The same runs go against
a local directory of the same disk (the peer: what the disk and page cache give these
threads).  Every byte is
verified; a phase past --timeout is reported as a hang, and the run goes on.  Needs root.

    .venv/bin/python bench/kv_concurrency.py [--small] [--json] [--files 128] [--writers 32]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

from curvine_py.cli import output
from curvine_py.testing.netcluster import NetCluster
from curvine_py.testing.testhosts import Hosts, HostsError

MiB = 1 << 20
SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "defaults": ((), ()),
    "kv": (("--client-block-size", str(16 * MiB)), ("--fuse-direct-io-reads", "true")),
    # a KV directory read through default mounts (`cv fs mkdir --kv`): one-block chunks,
    # buffered reads of 128 KiB (issue 43: 96 readers on a host with no replica)
    "kvdir": (("--client-block-size", str(16 * MiB)), ()),
}
READS = (("replica here", 2), ("no replica", 3), ("no replica, 2nd process", 3))
Row = dict[str, typing.Any]


def bench(directory: Path, timeout: float, *args: str) -> Row:
    """One `cv bench` phase in a fresh process: its kvcache figures, or {"error": line}."""
    argv = [sys.executable, "-m", "curvine_py.cli.main", "bench", str(directory), "--workloads", "kvcache",
            "--json", "--timeout", str(timeout), *args]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=3 * timeout + 60)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer in {3 * timeout + 60:.0f} s"}
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()] or [f"exit status {r.returncode}"]
        return {"error": lines[-1].removeprefix("cv: ")}
    return typing.cast(Row, json.loads(r.stdout)["kvcache"])


def run_case(w: Path, readers: dict[str, Path], size: int, a: argparse.Namespace) -> Row:
    """Write the chunks through w, read them through each reader path; the figures."""
    w.mkdir()
    row: Row = {"write": bench(w, a.timeout, "--phase", "write", "--files", str(a.files), "--file-size",
                               str(size), "--writers", str(a.writers), "--readers", str(a.readers))}
    for name, r in readers.items():
        row[name] = bench(r, a.timeout, "--phase", "read") if "error" not in row["write"] else {"error": "not written"}
    shutil.rmtree(w, ignore_errors=True)
    return row


def run_curvine(hosts: Hosts, base: Path, setting: str, sizes: list[int], a: argparse.Namespace) -> dict[int, Row]:
    wflags, rflags = SETTINGS[setting]
    cluster = NetCluster(hosts, base / f"cluster-{setting}").start()
    try:
        w = cluster.mount(1, base / f"{setting}-w", *wflags)
        out = {}
        for size in sizes:
            name = f"kv{size // MiB}"
            # fresh reader mounts per size: nothing cached from an earlier run serves it
            fresh = {host: cluster.mount(host, base / f"{setting}-r{host}-{name}", *rflags) for host in (2, 3)}
            out[size] = run_case(w / name, {label: fresh[host] / name for label, host in READS}, size, a)
            for mp in fresh.values():
                cluster.unmount(mp)
        cluster.unmount(w)
        return out
    finally:
        cluster.stop()


def run_local(base: Path, sizes: list[int], a: argparse.Namespace) -> dict[int, Row]:
    out = {}
    for size in sizes:
        d = base / "local" / f"kv{size // MiB}"
        d.parent.mkdir(exist_ok=True)
        out[size] = run_case(d, {label: d for label, _ in READS}, size, a)
    return out


def cell(fig: Row, key: str) -> str:
    if "error" in fig:
        return "HANG" if "stopped answering" in fig["error"] else "FAIL"
    return f"{fig[key]:.3f}" if key.endswith("GBps") else f"{fig[key]:.0f}"


def table(results: dict[str, dict[int, Row]]) -> str:
    rows = []
    for system, by_size in results.items():
        for size, row in by_size.items():
            local = results.get("local", {}).get(size)
            for phase, fig in row.items():
                key = "write_GBps" if phase == "write" else "read_GBps"
                ratio = ""
                if local is not None and system != "local" and "error" not in fig and "error" not in local[phase]:
                    ratio = f"{fig[key] / max(local[phase][key], 1e-9):.2f}"
                p99 = "write_p99_ms" if phase == "write" else "read_p99_ms"
                rows.append((system, f"{size // MiB} MiB", phase, cell(fig, key), cell(fig, p99), ratio))
    return output.table(rows, headers=("system", "chunk", "phase", "GB/s", "p99 ms", "÷ local"), right={3, 4, 5})


def errors(results: dict[str, dict[int, Row]]) -> list[str]:
    return [f"{system} {size // MiB} MiB {phase}: {fig['error']}" for system, by_size in results.items()
            for size, row in by_size.items() for phase, fig in row.items() if "error" in fig]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=128, help="chunks per run: all open at once when read (128)")
    p.add_argument("--writers", type=int, default=32, help="threads writing (32: LMCache's put pool)")
    p.add_argument("--readers", type=int, default=128, help="threads reading (128: every chunk at once)")
    p.add_argument("--sizes", default="14,32", help="chunk sizes in MiB (14: Qwen2.5-7B, 32: Llama-3.1-8B)")
    p.add_argument("--settings", default="defaults,kv", help="curvine mount settings: defaults,kv,kvdir")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per phase before it counts as a hang")
    p.add_argument("--small", action="store_true", help="8 chunks of 2 MiB, 4 threads: a smoke run")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    sizes = [int(s) * MiB for s in a.sizes.split(",")]
    if a.small:
        a.files, a.writers, a.readers, sizes, a.timeout = 8, 4, 8, [2 * MiB], 60.0
    base = Path(tempfile.mkdtemp(prefix="kvconc-"))
    results: dict[str, dict[int, Row]] = {}
    try:
        with Hosts(4) as hosts:
            for setting in a.settings.split(","):
                results[f"curvine {setting}"] = run_curvine(hosts, base, setting, sizes, a)
        results["local"] = run_local(base, sizes, a)
    except HostsError as e:
        print(f"kv_concurrency: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if a.json:
        print(json.dumps({s: {str(k): v for k, v in r.items()} for s, r in results.items()}, indent=1))
    else:
        print(f"{a.files} chunks, {a.writers} writer threads, {a.readers} reader threads; every byte verified")
        print(table(results))
    for line in errors(results):
        print(f"kv_concurrency: {line}", file=sys.stderr)
    return 1 if errors(results) else 0


if __name__ == "__main__":
    sys.exit(main())
