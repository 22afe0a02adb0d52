#!/usr/bin/env python3
"""Metadata at scale (issue 39, section 3): create and stat rates with 10^4, 10^5 and 10^6
files in the master, through the SDK and through a mount, with the master's RSS, meta.db,
the cold start of a master and the catch-up of a wiped follower at each size.

    .venv/bin/python bench/meta_scale.py [--sizes 10000,100000,1000000] [--via sdk,mount]
        [--clients 4] [--per-dir 1000] [--window 10000] [--stat-sample 5000] [--repeats 3]
        [--follower-max 100000 | --no-follower] [--retry-cache-s S] [--events-retention-s S]
        [--keep] [--dir DIR] [--json]
    .venv/bin/python bench/meta_scale.py --lmcache-files 2000 [--retry-cache-s S] [--events-retention-s S]

Each --via gets its own local cluster (1 master, 1 worker; with `mount`, the cluster's
FUSE mount), and the namespace grows in it from one size to the next:

- Files are created by --clients processes (each its own SDK client, or its own process
  working in the mount), 1,000 per directory (--per-dir, as a KV cache fills a
  directory), named as LMCache names its chunks (`model@1@0@<16 hex>@bfloat16.data`,
  the hex a hash of the file's number, so names arrive in no order).  SDK: `Client.touch`
  (the parent's ResolvePath, then Mknod); mount: open(O_CREAT) and close.
- create/s at a size: the last --window files that bring the namespace to it, in
  --repeats rounds (all clients started together in each; the median round's rate).
  The files before are the fill, timed too (fill/s, in --json) with a progress line
  every --round files on stderr.  At the first size the window is at most its second
  half: the first files of a new cluster are its warm-up.
- stat/s: --repeats rounds of --stat-sample files drawn at random from the whole
  namespace (no file twice); the median round's rate.  SDK: `Client.stat` (one
  ResolvePath).  Mount: through a *fresh* mount of the same cluster (`cv mount`,
  unmounted after), so the kernel has none of the names: each client opens the sampled
  files' directories first (untimed) and stats each name relative to its directory's
  fd, so every stat is one FUSE LOOKUP of a name the kernel has never seen, whatever
  the number of directories.
- The master's RSS (/proc/<pid>/status VmRSS, and its anonymous part: the file part is
  mostly meta.db mapped by each serving thread's reader) and meta.db (and -wal) then.
- Cold start: the master stopped (SIGTERM) and started again; the time from the start
  of its interpreter to its first answered call (a framed ResolvePath of the last file
  made, polled every 10 ms), and its RSS then.
- meta.db per file: the pages each table and index holds (SQLite's dbstat), divided by
  the files, with the retry cache (master.retry_cache_s, --retry-cache-s) and the event
  feed's window (--events-retention-s) as they are right after the creates; with
  --retry-cache-s, also at rest: once both were pruned (wait for it: give short ones).
- Follower catch-up: a third cluster of 3 masters (docs/ha.md) filled by the SDK clients
  to each size up to --follower-max (default 10^5: filling a group to 10^6 would take
  over an hour on a 2-core machine; raise it to measure there); one follower is
  stopped, its directory wiped, and it is started again: the time until its applied
  index reaches the leader's commit index (log replay, or the snapshot past
  master.snapshot_entries).  The group's own create and stat rates are rows of the table.

--lmcache-files N measures only meta.db at rest for N files written the way LMCache's
fs:// connector writes its chunks (62-character names; `.tmp` put, rename to `.data`, read
once; 2 workers, so two replicas and a block each): bytes per file by table and index.

The table has a row per way and size: rates with their ratio to the first size's (the
issue's target: at 10^6 within 20% of 10^4, i.e. a ratio >= 0.8), RSS, meta.db, and the
start or catch-up time.
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import typing
from pathlib import Path

from curvine_py.cli import output
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.common import config as cfgmod

ROOT = "scale"          # the directory every file is created under, at the root of the pool
POLL_S = 0.01
SMALL_TABLE = 64 << 10   # a table or index never bigger than this is one of "the rest" in show_store


# ---------------------------------------------------------------------- names
def file_name(i: int) -> str:
    """File i's name: an LMCache chunk name whose hash part is a hash of i."""
    return f"model@1@0@{hashlib.blake2b(i.to_bytes(8, 'little'), digest_size=8).hexdigest()}@bfloat16.data"


def dir_name(i: int, per_dir: int) -> str:
    return f"d{i // per_dir:05d}"


def rel_path(i: int, per_dir: int) -> str:
    return f"{dir_name(i, per_dir)}/{file_name(i)}"


# ---------------------------------------------------------------------- client processes
def _sdk_client(config_path: str, master: str) -> typing.Any:
    from curvine_py.sdk import Client
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, config_path)
    cfg.client.master = master
    return Client(master=master, config=cfg)


def _worker(kind: str, config_path: str, master: str, per_dir: int, inbox: typing.Any, outbox: typing.Any,
            barrier: typing.Any) -> None:
    """One client process: runs ("create", root, lo, hi) and ("stat", root, indices) until None.

    root: the pool path of ROOT (sdk) or its path in a mount (mount).  Answers (elapsed s,
    error or None); everything before the barrier is untimed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    client = _sdk_client(config_path, master) if kind == "sdk" else None
    while True:
        cmd = inbox.get()
        if cmd is None:
            break
        fds: dict[str, int] = {}
        try:
            op, root = cmd[0], cmd[1]
            if op == "create":
                paths = [f"{root}/{rel_path(i, per_dir)}" for i in range(cmd[2], cmd[3])]
                barrier.wait(timeout=600)
                t = time.perf_counter()
                if client is not None:
                    for p in paths:
                        client.touch(p)
                else:
                    for p in paths:
                        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
            else:
                if client is not None:
                    paths = [f"{root}/{rel_path(i, per_dir)}" for i in cmd[2]]
                    barrier.wait(timeout=600)
                    t = time.perf_counter()
                    for p in paths:
                        client.stat(p)
                else:
                    names = []
                    for i in cmd[2]:
                        d = dir_name(i, per_dir)
                        if d not in fds:
                            fds[d] = os.open(f"{root}/{d}", os.O_RDONLY | os.O_DIRECTORY)
                        names.append((file_name(i), fds[d]))
                    barrier.wait(timeout=600)
                    t = time.perf_counter()
                    for name, fd in names:
                        os.stat(name, dir_fd=fd)
            outbox.put((time.perf_counter() - t, None))
        except BaseException as e:  # noqa: BLE001  (reported to the coordinator, which fails the run)
            barrier.abort()
            outbox.put((0.0, f"{type(e).__name__}: {e}"))
        finally:
            for fd in fds.values():
                os.close(fd)
    if client is not None:
        client.close()


class Clients:
    """--clients processes of one kind, each with its own SDK client (or none: mount)."""

    def __init__(self, kind: str, n: int, cluster: LocalCluster, per_dir: int) -> None:
        # spawned, not forked: this process runs gRPC clients (not fork-safe; bench/sdk_bench.py)
        ctx = mp.get_context("spawn")
        self.n = n
        self.barrier = ctx.Barrier(n + 1)
        self.outbox: typing.Any = ctx.Queue()
        self.inboxes: list[typing.Any] = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=_worker, daemon=True,
                                  args=(kind, str(cluster.config_path), cluster.master_address, per_dir,
                                        q, self.outbox, self.barrier)) for q in self.inboxes]
        for p in self.procs:
            p.start()

    def run(self, cmds: list[tuple[typing.Any, ...]]) -> float:
        """One command per client, started together; the slowest one's seconds."""
        for q, cmd in zip(self.inboxes, cmds):
            q.put(cmd)
        try:
            self.barrier.wait(timeout=600)
        except Exception:   # a client failed before it got there: its error follows
            pass
        got = [self.outbox.get(timeout=7200) for _ in cmds]
        errors = [e for _, e in got if e]
        if errors:
            raise RuntimeError(f"{len(errors)} client(s) failed, first: {errors[0]}")
        return max(s for s, _ in got)

    def create(self, root: str, lo: int, hi: int) -> float:
        cuts = [lo + (hi - lo) * k // self.n for k in range(self.n + 1)]
        return self.run([("create", root, cuts[k], cuts[k + 1]) for k in range(self.n)])

    def stat(self, root: str, indices: list[int]) -> float:
        return self.run([("stat", root, indices[k::self.n]) for k in range(self.n)])

    def close(self) -> None:
        for q in self.inboxes:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


# ---------------------------------------------------------------------- the master
def rss(pid: int, prefix: str) -> dict[str, float]:
    """A process's VmRSS and its parts: RssAnon (its heap: Python objects, SQLite's page
    caches) and RssFile (file pages mapped: the readers' mmap of meta.db, counted once per
    mapping, and the interpreter's libraries)."""
    fields = {"VmRSS:": "rss_bytes", "RssAnon:": "rss_anon_bytes", "RssFile:": "rss_file_bytes"}
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0] + ":"
            if key in fields:
                out[prefix + fields[key]] = float(int(line.split()[1]) * 1024)
    return out


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def framed(cluster: LocalCluster, i: int) -> typing.Any:
    from curvine_py.client.framedclient import FramedClient
    return FramedClient(cluster.master_ip(i), cluster.master_ports(i).frame, cluster.secret)


def poll(what: str, fn: typing.Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if fn():
                return
        except Exception:   # not listening yet, not ready, not a leader yet
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_S)


def cold_start(cluster: LocalCluster, path: str) -> dict[str, float]:
    """Stop the (single) master, start it again: seconds to its first answered call, a
    ResolvePath of path (not Report: it counts every inode and block)."""
    from curvine_py.pb import curvine_pb2 as pb
    from curvine_py.pb.methods import Master
    t = time.monotonic()
    cluster.kill_master(0, signal.SIGTERM)
    stop_s = time.monotonic() - t
    client = framed(cluster, 0)
    try:
        t = time.monotonic()
        cluster.restart_master(0, wait=False)
        request = pb.PathRequest(caller=pb.Caller(uid=0, gid=0), path=path, follow_symlinks=True)
        poll("the restarted master to answer", lambda: client.call(Master.ResolvePath, request, 1.0).attr.ino > 0, 600)
        start_s = time.monotonic() - t
    finally:
        client.close()
    mem = rss(cluster.masters[0].pid, "restarted_master_")
    cluster.wait_ready(timeout=120)
    return {"stop_s": stop_s, "cold_start_s": start_s, **mem}


def follower_catchup(cluster: LocalCluster) -> dict[str, float]:
    """Stop a follower, wipe its directory, start it: seconds until it has applied the
    leader's commit index."""
    from curvine_py.pb import curvine_pb2 as pb
    from curvine_py.pb.methods import Master
    leader = cluster.leader_index(timeout=60)
    f = next(i for i in range(cluster.n_masters) if i != leader)
    cluster.kill_master(f, signal.SIGTERM)
    shutil.rmtree(cluster.meta_dir(f))
    cluster.meta_dir(f).mkdir()
    status = cluster.master_status(leader, timeout=5)
    if status is None:
        raise RuntimeError("the leader does not answer MasterStatus")
    target = status.commit_index
    client = framed(cluster, f)
    seen: dict[str, float] = {}
    try:
        t = time.monotonic()
        cluster.restart_master(f, wait=False)

        def caught_up() -> bool:
            r = client.call(Master.MasterStatus, pb.Empty(), 1.0)
            now = time.monotonic() - t
            seen.setdefault("answer_s", now)
            if r.leader:
                seen.setdefault("joined_s", now)
            return bool(r.applied_index >= target)
        poll(f"master{f} to apply up to index {target}", caught_up, 1800)
        done = time.monotonic() - t
    finally:
        client.close()
    mem = rss(cluster.masters[f].pid, "follower_")
    cluster.wait_ready(timeout=120)
    return {"follower_catchup_s": done, "follower_answer_s": seen.get("answer_s", done),
            "follower_joined_s": seen.get("joined_s", done), "follower_log_index": float(target),
            **mem,
            "follower_meta_db_bytes": file_size(cluster.meta_dir(f) / "meta.db")}


def store_pages(path: Path) -> dict[str, typing.Any]:
    """meta.db as its master holds it (read beside it, read-only, through the WAL): the
    bytes of pages in use, the bytes of each table's and index's pages (dbstat), and the
    rows of the retry cache and of the event feed."""
    import sqlite3
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        pages, free, size = conn.execute("SELECT (SELECT page_count FROM pragma_page_count),"
                                         " (SELECT freelist_count FROM pragma_freelist_count),"
                                         " (SELECT page_size FROM pragma_page_size)").fetchone()
        by_name = {name: int(b) for name, b in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")}
        oplog, events = conn.execute("SELECT (SELECT count(*) FROM oplog), (SELECT count(*) FROM events)").fetchone()
    finally:
        conn.close()
    return {"used_bytes": (pages - free) * size, "free_bytes": free * size, "by_name": by_name,
            "oplog_rows": int(oplog), "event_rows": int(events)}


def at_rest(path: Path, timeout: float, events: bool) -> dict[str, typing.Any]:
    """store_pages once the retry cache (and with events, the event feed) was pruned (no row left)."""
    def pruned() -> bool:
        got = store_pages(path)
        return bool(got["oplog_rows"] == 0 and (got["event_rows"] == 0 or not events))
    poll("the retry cache (and the events) to be pruned", pruned, timeout)
    return store_pages(path)


# ---------------------------------------------------------------------- LMCache's files at rest
LMCACHE_NAME_LEN = 62    # a chunk's name as LMCache's fs:// connector writes it (issue 39 section 2)
LMCACHE_BYTES = 4096     # each file's bytes: one block, like a 14 MiB chunk under a 16 MiB block size


def lmcache_name(i: int) -> str:
    """File i's final name: `<model>@<world>@<rank>@<hash>@<dtype>.data`, 62 characters."""
    digest = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=17).hexdigest()[:33]
    name = f"Qwen2.5-7B@1@0@{digest}@bfloat16.data"
    assert len(name) == LMCACHE_NAME_LEN
    return name


def reads_and_replicas(path: Path) -> tuple[int, int]:
    """Files whose last read the master wrote down (the inodes' last_read_ms column, or the
    reads table of a store before it: the same run measures either) and event_hosts' rows
    (a file's replicas as the feed announced them)."""
    import sqlite3
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(inodes)")]
        sql = ("SELECT count(*) FROM inodes WHERE last_read_ms != 1 << 40" if "last_read_ms" in cols
               else "SELECT count(*) FROM reads")
        return int(conn.execute(sql).fetchone()[0]), int(conn.execute("SELECT count(*) FROM event_hosts").fetchone()[0])
    finally:
        conn.close()


def lmcache_files(n: int, work: Path, args: argparse.Namespace) -> dict[str, typing.Any]:
    """n files written as LMCache writes its chunks, through the SDK, into a cluster of 2
    workers (2 replicas): put `<name>.tmp`, rename to `<name>.data`, read it once.  meta.db
    at rest: once the retry cache and the events were pruned (1 s each unless given), the
    reads written down (every master.reads_flush_s) and both replicas announced
    (event_hosts).  Returns the store before and at rest (by table, store_pages)."""
    retry_s = args.retry_cache_s if args.retry_cache_s is not None else 1.0
    events_s = args.events_retention_s if args.events_retention_s is not None else 1.0
    flags = ["--master-retry-cache-s", str(retry_s), "--master-events-retention-s", str(events_s)]
    cluster = LocalCluster(work / "lmcache", workers=2, die_with_parent=True, extra_master_flags=flags)
    cluster.start(timeout=120)
    client = _sdk_client(str(cluster.config_path), cluster.master_address)
    try:
        db = cluster.meta_dir(0) / "meta.db"
        client.mkdir("/kv")
        wait = retry_s + events_s + 60
        before = at_rest(db, wait, True)
        payload = b"k" * LMCACHE_BYTES
        t = time.monotonic()
        for i in range(n):
            name = f"/kv/{lmcache_name(i)}"
            client.put_bytes(name[:-len(".data")] + ".tmp", payload)
            client.rename(name[:-len(".data")] + ".tmp", name)
            if client.get_bytes(name) != payload:
                raise RuntimeError(f"{name} read back wrong")
            if (i + 1) % 500 == 0:
                progress("lmcache", f"{i + 1:,} files ({(i + 1) / (time.monotonic() - t):,.0f}/s)")

        def settled() -> bool:
            reads, replicas = reads_and_replicas(db)
            return reads >= n and replicas >= 2 * n
        poll("the reads and the replicas to be written down", settled, wait)
        after = at_rest(db, wait, True)
        return {"via": "lmcache", "files": float(n), "store_before": before, "store_at_rest": after}
    finally:
        client.close()
        cluster.stop()


def show_lmcache(row: dict[str, typing.Any]) -> str:
    """meta.db's bytes per file at rest, by table and index (the largest first), above the
    store before the files."""
    n = row["files"]
    before, after = row["store_before"], row["store_at_rest"]
    grown = {k: b - before["by_name"].get(k, 0) for k, b in after["by_name"].items()}
    cells = [(k.replace("sqlite_autoindex_", "pk:"), f"{b / n:.1f}")
             for k, b in sorted(grown.items(), key=lambda kv: -kv[1]) if b]
    cells.append(("in use", f"{(after['used_bytes'] - before['used_bytes']) / n:.1f}"))
    return (f"LMCache's files at rest: {int(n):,} files, {LMCACHE_NAME_LEN}-character names, .tmp put, rename,"
            f" read, 2 replicas\n" + output.table(cells, headers=("table / index", "B/file"), right={1}))


# ---------------------------------------------------------------------- a mount for stats
class FreshMount:
    """A second mount of the cluster (`cv mount`), which has looked up nothing yet."""

    def __init__(self, cluster: LocalCluster, where: Path) -> None:
        self.path = where
        self.env = {**os.environ, "CURVINE_RUN_DIR": str(where.parent / "run"),
                    "CURVINE_CLUSTER_SECRET": cluster.secret}
        self.env.pop("CURVINE_CONF", None)
        self.cv = str(Path(sys.executable).with_name("cv"))
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run([self.cv, "--config", str(cluster.config_path), "mount", str(where),
                        "--master", cluster.master_address], check=True, env=self.env, capture_output=True)

    def close(self) -> None:
        subprocess.run([self.cv, "umount", str(self.path)], env=self.env, capture_output=True)


# ---------------------------------------------------------------------- one way, every size
def progress(via: str, msg: str) -> None:
    load = os.getloadavg()[0]   # the machine is shared: a busy minute shows here
    print(f"[{time.strftime('%H:%M:%S')} load {load:.1f}] {via}: {msg}", file=sys.stderr, flush=True)


class Run:
    """One cluster grown through the sizes by one way (sdk, mount, or sdk into 3 masters)."""

    def __init__(self, via: str, work: Path, args: argparse.Namespace) -> None:
        self.via, self.args = via, args
        self.kind = "mount" if via == "mount" else "sdk"
        self.masters = 3 if via == "sdk-3" else 1
        self.work = work / via
        self.work.mkdir(parents=True)
        self.mnt = self.work / "mnt" if self.kind == "mount" else None
        flags = [*((("--master-retry-cache-s", str(args.retry_cache_s)) if args.retry_cache_s is not None else ())),
                 *((("--master-events-retention-s", str(args.events_retention_s))
                    if args.events_retention_s is not None else ()))]
        self.cluster = LocalCluster(self.work / "cluster", workers=1, masters=self.masters,
                                    mount=str(self.mnt) if self.mnt else None, die_with_parent=True,
                                    extra_master_flags=flags)
        self.clients: Clients | None = None
        self.admin: typing.Any = None
        self.made_dirs = 0
        self.files = 0

    def __enter__(self) -> "Run":
        try:
            self.cluster.start(timeout=120)
            self.admin = _sdk_client(str(self.cluster.config_path), self.cluster.master_address)
            if self.mnt is not None:
                (self.mnt / ROOT).mkdir()
            else:
                self.admin.mkdir(f"/{ROOT}")
            self.clients = Clients(self.kind, self.args.clients, self.cluster, self.args.per_dir)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.clients is not None:
            self.clients.close()
        if self.admin is not None:
            self.admin.close()
        self.cluster.stop()

    @property
    def root(self) -> str:
        return str(self.mnt / ROOT) if self.mnt is not None else f"/{ROOT}"

    def _dirs_for(self, hi: int) -> None:
        """Make the directories files below hi need (untimed: 1 in --per-dir creates)."""
        need = (hi + self.args.per_dir - 1) // self.args.per_dir
        for d in range(self.made_dirs, need):
            name = dir_name(d * self.args.per_dir, self.args.per_dir)
            if self.mnt is not None:
                os.mkdir(self.mnt / ROOT / name)
            else:
                self.admin.mkdir(f"/{ROOT}/{name}")
        self.made_dirs = max(self.made_dirs, need)

    def create(self, hi: int, label: str, step: int) -> list[tuple[int, float]]:
        """Files self.files..hi in rounds of step files, a progress line after each; each
        round's (files, seconds)."""
        assert self.clients is not None
        lo, total, t0, rounds = self.files, 0.0, time.monotonic(), []
        while self.files < hi:
            end = min(hi, self.files + step)
            self._dirs_for(end)
            took = self.clients.create(self.root, self.files, end)
            total += took
            rounds.append((end - self.files, took))
            self.files = end
            done = self.files - lo
            left = (hi - self.files) * total / done
            progress(self.via, f"{label}: {self.files:,} files ({rounds[-1][0] / took:,.0f}/s this round, "
                               f"{done / total:,.0f}/s since {lo:,}; {output.format_duration(time.monotonic() - t0)}"
                               f" so far, {output.format_duration(left)} to {hi:,})")
        return rounds

    def stat_rates(self, samples: list[list[int]]) -> list[float]:
        """stat/s of each sample (one after the other; through the mount, one fresh mount
        for them all: no name is in two samples)."""
        assert self.clients is not None
        if self.mnt is None:
            return [len(s) / self.clients.stat(self.root, s) for s in samples]
        fresh = FreshMount(self.cluster, self.work / "stat-mnt")
        try:
            return [len(s) / self.clients.stat(str(fresh.path / ROOT), s) for s in samples]
        finally:
            fresh.close()

    def grow(self, size: int, prev: int) -> dict[str, float]:
        """Grow the namespace to size and measure there."""
        args = self.args
        # the first files a new cluster makes are its warm-up, never the timed window
        window = min(args.window, size - prev if prev else size // 2)
        out: dict[str, typing.Any] = {"files": float(size)}
        if size - window > self.files:
            fill = self.create(size - window, "fill", args.round)
            out["fill_per_s"] = sum(n for n, _ in fill) / sum(t for _, t in fill)
        rounds = self.create(size, f"the last {window:,}", -(-window // args.repeats))
        out["create_rounds_per_s"] = [n / t for n, t in rounds]
        out["create_per_s"] = statistics.median(out["create_rounds_per_s"])
        out["load_1min"] = os.getloadavg()[0]
        rng = random.Random(args.seed + size)
        each = max(1, min(args.stat_sample, size // args.repeats))
        drawn = rng.sample(range(size), each * args.repeats)
        out["stat_rounds_per_s"] = self.stat_rates([drawn[k * each:(k + 1) * each] for k in range(args.repeats)])
        out["stat_per_s"] = statistics.median(out["stat_rounds_per_s"])
        progress(self.via, f"{size:,} files: create {out['create_per_s']:,.0f}/s, stat {out['stat_per_s']:,.0f}/s")
        leader = self.cluster.leader_index(timeout=60) if self.masters > 1 else 0
        meta = self.cluster.meta_dir(leader)
        out.update(rss(self.cluster.masters[leader].pid, "master_"))
        out["meta_db_bytes"] = file_size(meta / "meta.db")
        out["meta_wal_bytes"] = file_size(meta / "meta.db-wal")
        out["store"] = store_pages(meta / "meta.db")
        if args.retry_cache_s is not None:
            wait = args.retry_cache_s + (args.events_retention_s or 0) + 60
            out["store_at_rest"] = at_rest(meta / "meta.db", wait, args.events_retention_s is not None)
            progress(self.via, f"{size:,} files at rest: {out['store_at_rest']['used_bytes'] / size:.0f} B/file")
        if self.masters == 1:
            out.update(cold_start(self.cluster, f"/{ROOT}/{rel_path(size - 1, args.per_dir)}"))
            progress(self.via, f"{size:,} files: cold start {out['cold_start_s']:.2f} s")
        else:
            out.update(follower_catchup(self.cluster))
            progress(self.via, f"{size:,} files: wiped follower caught up in {out['follower_catchup_s']:.2f} s")
        return out


def run_way(via: str, sizes: list[int], work: Path, args: argparse.Namespace) -> list[dict[str, typing.Any]]:
    rows = []
    with Run(via, work, args) as run:
        prev = 0
        for size in sizes:
            rows.append({"via": via, **run.grow(size, prev)})
            prev = size
    if not args.keep:
        shutil.rmtree(work / via, ignore_errors=True)
    return rows


# ---------------------------------------------------------------------- the table
def with_ratios(rows: list[dict[str, typing.Any]]) -> None:
    first: dict[str, dict[str, float]] = {}
    for r in rows:
        base = first.setdefault(r["via"], r)
        for k in ("create_per_s", "stat_per_s"):
            r[k.replace("_per_s", "_ratio")] = r[k] / base[k] if base[k] else 0.0


def show(rows: list[dict[str, typing.Any]]) -> str:
    base: dict[str, int] = {}
    for r in rows:
        base.setdefault(r["via"], int(r["files"]))
    labels = {"sdk": "sdk", "mount": "mount", "sdk-3": "sdk, 3 masters"}
    cells = []
    for r in rows:
        time_cell = (f"start {r['cold_start_s']:.2f} s" if "cold_start_s" in r
                     else f"catch-up {r['follower_catchup_s']:.2f} s")
        cells.append((labels[r["via"]], f"{int(r['files']):,}", f"{r['create_per_s']:,.0f}",
                      f"{r['create_ratio']:.2f}", f"{r['stat_per_s']:,.0f}", f"{r['stat_ratio']:.2f}",
                      output.format_size(r["master_rss_bytes"]), output.format_size(r["master_rss_anon_bytes"]),
                      output.format_size(r["meta_db_bytes"]),
                      f"{r['meta_db_bytes'] / r['files']:.0f}", time_cell))
    head = ("via", "files", "create/s", "vs first", "stat/s", "vs first", "master RSS", "anon", "meta.db", "B/file",
            "cold master / wiped follower")
    note = "; ".join(f"{labels[v]} first at {n:,}" for v, n in base.items())
    return (output.table(cells, headers=head, right={1, 2, 3, 4, 5, 6, 7, 8, 9}) + f"\n(vs first: {note})\n\n"
            + show_store(rows))


def show_store(rows: list[dict[str, typing.Any]]) -> str:
    """meta.db's bytes per file in use, and by table and index (the largest first), right
    after the creates (retry cache and events as they were) and at rest."""
    phases = [(r, key, label) for r in rows for key, label in (("store", "after"), ("store_at_rest", "at rest"))
              if key in r]
    totals: dict[str, int] = {}
    for r, key, _ in phases:
        for name, b in r[key]["by_name"].items():
            totals[name] = max(totals.get(name, 0), b)
    names = sorted((n for n, b in totals.items() if b > SMALL_TABLE), key=lambda n: -totals[n])

    def rest(by_name: dict[str, int]) -> int:
        return sum(b for n, b in by_name.items() if n not in names)
    cells = [(label, r["via"], f"{int(r['files']):,}", f"{r[key]['used_bytes'] / r['files']:.0f}",
              *(f"{r[key]['by_name'].get(n, 0) / r['files']:.1f}" for n in names),
              f"{rest(r[key]['by_name']) / r['files']:.1f}") for r, key, label in phases]
    head = ("meta.db B/file", "via", "files", "in use", *(n.replace("sqlite_autoindex_", "pk:") for n in names),
            "the rest")
    return output.table(cells, headers=head, right=set(range(2, len(head))))


def sizes_arg(text: str) -> list[int]:
    try:
        sizes = [int(float(s)) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of sizes: {text!r}") from None
    if not sizes or any(s <= 0 for s in sizes) or sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError("sizes must be positive and increasing")
    return sizes


def lmcache_main(args: argparse.Namespace, work: Path) -> int:
    """--lmcache-files: that run alone."""
    if args.lmcache_files < 1:
        raise SystemExit("--lmcache-files must be positive")
    try:
        row = lmcache_files(args.lmcache_files, work, args)
    finally:
        if args.keep:
            print(f"cluster kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        output.print_json(row)
    else:
        print(show_lmcache(row))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=sizes_arg, default=[10_000, 100_000, 1_000_000],
                    help="namespace sizes, increasing (default 10000,100000,1000000)")
    ap.add_argument("--via", default="sdk,mount", help="sdk, mount or both (default sdk,mount)")
    ap.add_argument("--clients", type=int, default=4, help="creating (and stat'ing) processes (default 4)")
    ap.add_argument("--per-dir", type=int, default=1000, help="files per directory (default 1000)")
    ap.add_argument("--window", type=int, default=10_000,
                    help="the last files before each size whose creation is the create rate (default 10000)")
    ap.add_argument("--stat-sample", type=int, default=5000,
                    help="files stat'ed in each of --repeats rounds at each size (default 5000)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="the window's creates and the stats are this many rounds: rates are their median (default 3)")
    ap.add_argument("--round", type=int, default=20_000, help="files between two progress lines (default 20000)")
    ap.add_argument("--follower-max", type=int, default=100_000,
                    help="largest size the 3-master group is filled to for the follower catch-up (default 100000)")
    ap.add_argument("--no-follower", action="store_true", help="no 3-master group, no follower catch-up")
    ap.add_argument("--retry-cache-s", type=float, help="the master's retry cache (master.retry_cache_s; default"
                    " its config's): given, meta.db is measured at rest too, once the cache was pruned")
    ap.add_argument("--events-retention-s", type=float,
                    help="the master's event feed window (master.events_retention_s; default its config's)")
    ap.add_argument("--lmcache-files", type=int, metavar="N",
                    help="instead: N files written as LMCache writes its chunks (2 workers; .tmp put, rename, read)"
                    " and meta.db's bytes per file at rest by table")
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--keep", action="store_true", help="keep the clusters' directories (printed)")
    ap.add_argument("--dir", help="where the clusters live (default: a temp dir under the current dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.lmcache_files is not None:
        return lmcache_main(args, Path(tempfile.mkdtemp(prefix="meta-scale-", dir=args.dir or ".")).absolute())
    ways = [v.strip() for v in args.via.split(",") if v.strip()]
    if not ways or set(ways) - {"sdk", "mount"}:
        ap.error("--via takes sdk, mount or sdk,mount")
    if min(args.clients, args.per_dir, args.window, args.stat_sample, args.round, args.repeats) < 1:
        ap.error("--clients, --per-dir, --window, --stat-sample, --round and --repeats must be positive")
    if args.sizes[0] < 2 * args.repeats:
        ap.error("the first size must hold at least two files per --repeats round")
    if "mount" in ways and not (fuse_available() and os.geteuid() == 0 and os.path.exists("/dev/fuse")):
        ap.error("--via mount needs root, /dev/fuse and pyfuse3")
    if not args.no_follower:
        ways.append("sdk-3")
    work = Path(tempfile.mkdtemp(prefix="meta-scale-", dir=args.dir or ".")).absolute()
    rows: list[dict[str, typing.Any]] = []
    try:
        for via in ways:
            sizes = [s for s in args.sizes if s <= args.follower_max] if via == "sdk-3" else args.sizes
            if sizes:
                rows += run_way(via, sizes, work, args)
    finally:
        if args.keep:
            print(f"clusters kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    with_ratios(rows)
    if args.json:
        output.print_json({"sizes": args.sizes, "clients": args.clients, "per_dir": args.per_dir,
                           "window": args.window, "stat_sample": args.stat_sample, "rows": rows})
    else:
        print(show(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
