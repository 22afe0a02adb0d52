#!/usr/bin/env python3
"""LMCache's lookup through a mount with no replica on its host: 32 stats in a row, timed.

Starts a local cluster (1 master + 2 workers, a mount) per setting, all at once, with
short-circuit off in the mount so that no replica counts as local (every block is remote
to it, as for a reader on a host with no worker; tests/integration/test_staging.py does
the same).  The settings' rounds alternate (a change of the machine's load meets them
alike).  Each round writes `--files` fresh chunk files through the SDK (one block each), drops the
kernel's caches and the mount's copies (`cv bench --drop-caches`), then, as LMCache's
retrieve does, stats every chunk in order (the lookup, timed as a whole), then opens and
reads each whole (the read, timed as a whole; it is where fetch_ahead pays off), right
after the lookup or `--gap-ms` later (vLLM's scheduler asks LMCache's lookup, its worker
reads a step later).

Settings (`--settings`, default all):
- defaults: fetch_ahead off (nothing fetched at lookups).
- ahead: fuse.fetch_ahead on (client/mount/fetchahead.py: a pool buffer per lookup).
- kv: the KV mount settings of bench/compare: direct_io_reads, fetch_ahead, stage_remote
  (client/mount/staging.py: the lookup stages the block for the kernel).

    .venv/bin/python bench/kv_lookup.py [--rounds 20] [--files 32] [--size 2MiB] [--gap-ms 0]
        [--settings defaults,ahead,kv] [--json]

``--replica-host`` measures bench/compare's local layout instead: network-namespace hosts,
the master on host 0, workers on hosts 1 and 2, the chunks written once (from host 1),
then per round and setting a fresh reader mount on host 2 (it holds a replica of every
block, as bench/compare's reader): the 32 stats warm (servers' caches warm, the mount
fresh: its first stat brings the directory's listing), the prompt (the first 8 chunks:
open + whole read, plus their stats' time, as `cv bench`'s prompt_ms), then, after
drop_caches, the same cold; each with its first stat's share (the master's Lookup).

    .venv/bin/python bench/kv_lookup.py --replica-host [--rounds 8] [--size 14MiB]

Needs root (a FUSE mount, drop_caches).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import typing
from pathlib import Path

from curvine_py.cli.bench.workloads import drop_caches
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.common import config as cfgmod
from curvine_py.sdk import Client

SETTINGS = {
    "defaults": {},
    "ahead": {"CURVINE_FUSE_FETCH_AHEAD": "true"},
    "kv": {"CURVINE_FUSE_DIRECT_IO_READS": "true", "CURVINE_FUSE_FETCH_AHEAD": "true",
           "CURVINE_FUSE_STAGE_REMOTE": "true"},
}
# the same as mount flags (bench/compare's KV_READER_FLAGS for kv)
FRESH_FLAGS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "ahead": ("--fuse-fetch-ahead", "true"),
    "kv": ("--fuse-direct-io-reads", "true", "--fuse-fetch-ahead", "true", "--fuse-stage-remote", "true"),
}
# bench/compare's reader mount idles through cv bench's write phase before its reads: its
# start's work (the checker process, the workers' addresses) is over by then
MOUNTED_IDLE_S = 2.0
PROMPT_FILES = 8   # a 1,925-token prompt's chunks (cv bench's prompt_ms)
SETTLE_S = 0.3     # after the writes and the drop, before the lookup


def sdk(cluster: LocalCluster) -> Client:
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, cluster.config_path)
    cfg.client.master = cluster.master_address
    return Client(master=cluster.master_address, config=cfg)


def one_round(client: Client, mnt: Path, r: int, files: int, size: int, gap_s: float = 0.0) -> tuple[float, float]:
    """(lookup ms, read ms) of one round over fresh chunk files, gap_s between them."""
    names = [f"model@1@0@{r:04x}{i:04x}@bfloat16.data" for i in range(files)]
    for i, name in enumerate(names):
        client.put_bytes(f"/kv/{name}", os.urandom(size - i))
    drop_caches(mnt)
    time.sleep(SETTLE_S)
    paths = [mnt / "kv" / n for n in names]
    t = time.perf_counter()
    sizes = [os.stat(p).st_size for p in paths]
    lookup = time.perf_counter() - t
    time.sleep(gap_s)
    buf = memoryview(bytearray(size))
    t = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            got = f.readinto(buf[:4096]) or 0
            while got < size:
                n = f.readinto(buf[got:])
                if not n:
                    break
                got += n
    read = time.perf_counter() - t
    assert sizes == [size - i for i in range(files)], sizes
    return lookup * 1e3, read * 1e3


def p90(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def start(setting: str, work: Path) -> tuple[LocalCluster, Path]:
    mnt = work / f"mnt-{setting}"
    env = {"CURVINE_CLIENT_SHORT_CIRCUIT": "false", **SETTINGS[setting]}
    cluster = LocalCluster(work / f"cluster-{setting}", workers=2, mount=str(mnt), die_with_parent=True,
                           extra_master_flags=("--master-heartbeat-ms", "200"), env=env)
    return cluster.start(timeout=60), mnt


def measure(settings: list[str], work: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every setting's cluster at once, their rounds alternated (round r of each setting
    one after the other), so that a change of this machine's load meets them all alike."""
    clusters: dict[str, tuple[LocalCluster, Path]] = {}
    try:
        for setting in settings:
            clusters[setting] = start(setting, work)
        clients = {setting: sdk(c) for setting, (c, _mnt) in clusters.items()}
        lookups: dict[str, list[float]] = {s: [] for s in settings}
        reads: dict[str, list[float]] = {s: [] for s in settings}
        try:
            for setting, client in clients.items():
                client.mkdir("/kv")
                one_round(client, clusters[setting][1], 0xFFFF, args.files, args.size)   # warm-up, not counted
            for r in range(args.rounds):
                for setting, client in clients.items():
                    lk, rd = one_round(client, clusters[setting][1], r, args.files, args.size, args.gap_ms / 1e3)
                    lookups[setting].append(lk)
                    reads[setting].append(rd)
        finally:
            for client in clients.values():
                client.close()
        out = {}
        for setting, (cluster, _mnt) in clusters.items():
            log = Path(next(p.log for p in cluster.processes if p.name == "fuse"))
            lk, rd = lookups[setting], reads[setting]
            out[setting] = {"lookup_median_ms": statistics.median(lk), "lookup_p90_ms": p90(lk),
                            "read_median_ms": statistics.median(rd), "read_p90_ms": p90(rd)}
            if "not staged" in log.read_text():
                out[setting]["staging_unavailable"] = 1.0
        return out
    finally:
        for cluster, _mnt in clusters.values():
            cluster.stop()


class Fresh(typing.NamedTuple):
    """One fresh reader mount's figures (ms)."""
    warm: float          # the 32 stats
    warm_first: float    # of which the first (its Lookup brings the listing)
    prompt: float        # the first PROMPT_FILES chunks' stats + opens + whole reads
    cold: float
    cold_first: float
    cold_prompt: float


def _stats(paths: list[Path]) -> list[float]:
    """Each path's stat time (s), in order."""
    out = []
    for p in paths:
        t = time.perf_counter()
        os.stat(p)
        out.append(time.perf_counter() - t)
    return out


def _reads(paths: list[Path], buf: memoryview) -> list[float]:
    """Each path's open + 4 KiB + the rest + close (s), as LMCache reads a chunk."""
    out = []
    for p in paths:
        t = time.perf_counter()
        with open(p, "rb", buffering=0) as f:
            got = f.readinto(buf[:4096]) or 0
            while got and (n := f.readinto(buf[got:])):
                got += n
        out.append(time.perf_counter() - t)
    return out


def fresh_round(mnt: Path, names: list[str], buf: memoryview) -> Fresh:
    """Warm then cold lookups and prompt reads through a fresh mount at mnt."""
    time.sleep(MOUNTED_IDLE_S)
    os.stat(mnt / "manifest")   # (cv bench loads its manifest first: the root's listing)
    paths = [mnt / "kv" / n for n in names]
    ws = _stats(paths)
    wr = _reads(paths, buf)
    drop_caches(mnt)
    time.sleep(SETTLE_S)
    os.stat(mnt / "manifest")
    cs = _stats(paths)
    cr = _reads(paths, buf)
    k = PROMPT_FILES
    return Fresh(sum(ws) * 1e3, ws[0] * 1e3, (sum(ws[:k]) + sum(wr[:k])) * 1e3,
                 sum(cs) * 1e3, cs[0] * 1e3, (sum(cs[:k]) + sum(cr[:k])) * 1e3)


def measure_fresh(settings: list[str], work: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """bench/compare's local layout: one cluster on namespace hosts, the chunks written
    once, then per round each setting's fresh reader mount on host 2 (alternated)."""
    from curvine_py.testing.netcluster import NetCluster
    from curvine_py.testing.testhosts import Hosts
    names = [f"model@1@0@{i:016x}@bfloat16.data" for i in range(args.files)]
    got: dict[str, list[Fresh]] = {s: [] for s in settings}
    with Hosts(3, prefix="kvl") as hosts:
        cluster = NetCluster(hosts, work / "cluster", master_hosts=(0,), worker_hosts=(1, 2))
        try:
            cluster.start()
            with cluster.client(1) as client:
                client.mkdir("/kv")
                client.put_bytes("/manifest", b"{}")
                for i, name in enumerate(names):
                    client.put_bytes(f"/kv/{name}", os.urandom(args.size - i))
            buf = memoryview(bytearray(args.size))
            for r in range(args.rounds + 1):   # round 0: warm-up, not counted
                for setting in settings:
                    mnt = cluster.mount(2, work / f"mnt-{setting}-{r}", *FRESH_FLAGS[setting])
                    try:
                        f = fresh_round(mnt, names, buf)
                    finally:
                        cluster.unmount(mnt)
                    if r:
                        got[setting].append(f)
        finally:
            cluster.stop()
    return {s: {f"{field}_median_ms": statistics.median(getattr(f, field) for f in fs) for field in Fresh._fields}
            for s, fs in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--size", type=cfgmod.parse_size, default=2 << 20, help="bytes per chunk (one block: <= 4 MiB)")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="between the lookup and the read (LMCache looks up in the scheduler, reads later)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--replica-host", action="store_true",
                    help="bench/compare's local layout: a fresh reader mount per round on a replica's host")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not fuse_available() or os.geteuid() != 0:
        print("needs root and FUSE", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kv-lookup-"))
    try:
        run = measure_fresh if args.replica_host else measure
        results = run(args.settings.split(","), work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for setting, f in results.items():
        if args.replica_host:
            print(f"{setting:9} " + "  ".join(f"{k[:-10]} {v:6.2f}" for k, v in f.items()) + "  (medians, ms)")
            continue
        print(f"{setting:9} lookup of {args.files}: median {f['lookup_median_ms']:6.1f} ms  "
              f"p90 {f['lookup_p90_ms']:6.1f} ms   read: median {f['read_median_ms']:6.1f} ms  "
              f"p90 {f['read_p90_ms']:6.1f} ms" + ("  (staging unavailable)" if "staging_unavailable" in f else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
