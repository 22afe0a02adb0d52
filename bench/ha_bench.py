#!/usr/bin/env python3
"""Three masters vs one (docs/ha.md): metadata ops/s through the SDK and through the
mount, the LMCache write and read through the mount, and the failover time of a killed
leader, in one run on this machine.

    .venv/bin/python bench/ha_bench.py [--meta-files 2000] [--meta-clients 4] [--kv-files 16] [--kills 10]
                                       [--tls] [--small] [--json]

Each cluster (1 master, then 3) has two workers and a mount, on loopback with free ports.
Metadata: bench/sdk_bench.py's clients (each its own process and directory: create,
stat, rename, unlink) and cv bench's meta workload through the mount (one thread, the
same four ops).  The mount's stat row stats the files it has just made, so the ones
made within the kernel's entry timeout (1 s) are answered by the kernel: with creates
slower on three masters fewer are, and the row falls although no stat reaches a master
(the mount answers the rest from its cache session's leases).  So one more row,
``mount_stat_cold``: files made, the kernel's timeouts waited out, then each stat is a
FUSE lookup.  KV: cv bench's kvcache workload through the mount (14 MiB chunks:
x.tmp, header, payload, close, rename; then a stat and a whole read of each).
Failover: a client creates a directory every 20 ms; the leader gets a SIGKILL; the time
from the kill to the first create that succeeds after it is one sample; the killed
master is restarted and rejoins before the next kill.  Every figure of the three
masters is printed beside the single master's, with their ratio.  With --tls a third
cluster runs: three masters with mutual TLS on every channel but block data (tls.data
off, the default), the Raft port included; its figures come with their ratio to the
plain three masters'.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import typing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sdk_bench import meta_bench  # noqa: E402  (a sibling script, not a package)

from curvine_py.cli.bench.workloads import Plan, kv_read, kv_write, meta_ops  # noqa: E402
from curvine_py.cli import output  # noqa: E402
from curvine_py.common import config as cfgmod  # noqa: E402
from curvine_py.cluster.local import LocalCluster, fuse_available  # noqa: E402
from curvine_py.sdk import Client  # noqa: E402

OPS = ("create", "stat", "rename", "unlink")
PROBE_EVERY_S = 0.02


def sdk(cluster: LocalCluster) -> Client:
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, cluster.config_path)
    cfg.client.master = cluster.master_address
    return Client(master=cluster.master_address, config=cfg)


def metadata(cluster: LocalCluster, mount: Path | None, clients: int, files: int) -> dict[str, float]:
    """ops/s of each op through the SDK (clients processes) and through the mount."""
    out = {f"sdk_{k}": v for k, v in meta_bench(cluster.master_address, cluster.secret, clients, files,
                                                              str(cluster.config_path)).items()}
    if mount is not None:
        out.update({f"mount_{k}": v for k, v in meta_ops(mount, Plan(workloads=["meta"], meta_files=files)).items()})
        out["mount_stat_cold_per_s"] = stat_cold(mount, files, cluster)
    return out


def stat_cold(mount: Path, files: int, cluster: LocalCluster) -> float:
    """stat/s through the mount of files made before the kernel's entry and attribute
    timeouts ran out: every stat is a FUSE lookup, whatever the creates' speed."""
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, cluster.config_path)
    d = mount / "ha-stat-cold"
    d.mkdir()
    names = [d / f"f{i:06d}" for i in range(files)]
    for name in names:
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    time.sleep(max(cfg.fuse.entry_timeout_s, cfg.fuse.attr_timeout_s) + 0.2)
    start = time.perf_counter()
    for name in names:
        os.stat(name)
    rate = files / max(time.perf_counter() - start, 1e-9)
    for name in names:
        os.unlink(name)
    d.rmdir()
    return rate


def kvcache(mount: Path, files: int) -> dict[str, float]:
    """GB/s and per-chunk p50 of the LMCache write and read through the mount."""
    plan = Plan(workloads=["kvcache"], files=files)
    figures = {**kv_write(mount, plan), **kv_read(mount, plan)}
    return {f"kv_{k}": figures[k] for k in ("write_GBps", "write_p50_ms", "read_GBps", "read_p50_ms")}


class Prober:
    """Creates a directory every PROBE_EVERY_S and remembers when each create succeeded."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.ok: list[float] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                self.client.mkdir(f"/ha-probe/p{i}")
                self.ok.append(time.monotonic())
            except OSError as e:
                self.errors.append(e)
            i += 1
            time.sleep(PROBE_EVERY_S)

    def first_after(self, t0: float, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [t for t in self.ok if t > t0]
            if later:
                return later[0] - t0
            time.sleep(0.01)
        raise RuntimeError(f"no create succeeded within {timeout:.0f} s of the kill")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=120)


def failover(cluster: LocalCluster, kills: int) -> dict[str, float]:
    """Leader SIGKILL to the first successful create, kills times."""
    c = sdk(cluster)
    c.mkdir("/ha-probe", exist_ok=True)
    probe = Prober(c)
    samples: list[float] = []
    try:
        for _ in range(kills):
            time.sleep(0.5)
            leader = cluster.leader_index()
            t0 = time.monotonic()
            cluster.kill_master(leader, signal.SIGKILL)
            samples.append(probe.first_after(t0))
            cluster.restart_master(leader)
    finally:
        probe.close()
        c.close()
    if probe.errors:
        raise RuntimeError(f"{len(probe.errors)} probe creates failed, first: {probe.errors[0]}")
    return {"failover_min_s": min(samples), "failover_median_s": statistics.median(samples),
            "failover_max_s": max(samples), "failover_kills": float(len(samples))}


def run_one(masters: int, root: Path, args: argparse.Namespace, tls: bool = False) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix=f"ha{masters}-", dir=root))
    mount = work / "mnt" if fuse_available() else None
    cluster = LocalCluster(work / "cluster", workers=2, masters=masters, mount=str(mount) if mount else None,
                           die_with_parent=True, tls=tls)
    try:
        cluster.start()
        out = metadata(cluster, mount, args.meta_clients, args.meta_files)
        if mount is not None and args.kv_files:
            out.update(kvcache(mount, args.kv_files))
        if masters > 1:
            out.update(failover(cluster, args.kills))
        return out
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meta-files", type=int, default=2000, help="files per metadata client, and through the mount")
    ap.add_argument("--meta-clients", type=int, default=4)
    ap.add_argument("--kv-files", type=int, default=16, help="14 MiB KV chunks written and read through the mount")
    ap.add_argument("--kills", type=int, default=10, help="leader kills for the failover figures")
    ap.add_argument("--tls", action="store_true", help="also three masters with TLS (the Raft port included)")
    ap.add_argument("--small", action="store_true", help="a quick run: 50 files, 2 clients, 2 KV chunks, 1 kill")
    ap.add_argument("--dir", help="where the clusters live (default: a temp dir under the current dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.small:
        args.meta_files, args.meta_clients, args.kv_files, args.kills = 50, 2, 2, 1
    if args.meta_files < 1 or args.meta_clients < 1 or args.kills < 1 or args.kv_files < 0:
        ap.error("--meta-files, --meta-clients and --kills must be positive, --kv-files not negative")
    root = Path(args.dir or ".").absolute()
    one = run_one(1, root, args)
    three = run_one(3, root, args)
    out: dict[str, typing.Any] = {}
    for key, value in one.items():
        out[f"{key}_1_master"] = value
        out[f"{key}_3_masters"] = three[key]
        out[f"{key}_ratio"] = three[key] / value if value else 0.0
    out.update({k: v for k, v in three.items() if k.startswith("failover")})
    if args.tls:
        secured = run_one(3, root, args, tls=True)
        for key, value in secured.items():
            out[f"{key}_3_masters_tls"] = value
            out[f"{key}_tls_ratio"] = value / three[key] if three[key] else 0.0
    output.print_figures(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
