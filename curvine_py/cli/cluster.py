"""`cv cluster start|stop|status`: a whole cluster on this machine, for trying things out.

The process management itself is curvine_py.localcluster (shared with the tests); this
module turns flags into a LocalCluster, reports progress and failures, and in
``--foreground`` mode stays up until SIGINT/SIGTERM, then stops the daemons in order.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
import typing
from pathlib import Path

from curvine_py import localcluster as lc
from curvine_py.cli import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, Context
from curvine_py.cli import output
from curvine_py.common import config as cfgmod

DEFAULT_DIR = ".curvine"
EXIT_NOT_RUNNING = 3  # `status` of a directory with no cluster (the LSB init-script code)


def fail_cluster(e: lc.ClusterError) -> int:
    """One `cv: ...` line, then the supporting detail (a log tail) indented."""
    lines = [f"cv: {e}"] + [f"    {line}" for line in e.detail.splitlines()]
    sys.stderr.write("\n".join(lines) + "\n")
    return EXIT_FAIL


def _secret_of(config_path: str | None) -> str:
    """The cluster's secret ("" when unreadable: status still works, without the report)."""
    try:
        return lc.daemon_secret(config_path) if config_path else ""
    except (OSError, cfgmod.ConfigError):
        return ""


def _rel(path: str) -> str:
    """A path relative to the cwd when that is shorter (status lines stay narrow)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if len(rel) < len(path) else path


def layout_defaults(directory: str | Path) -> tuple[int, int | None, int | None]:
    """(master port, worker base port, capacity) recorded in D/curvine.toml, or defaults.

    Lets a second `cv cluster start` on the same directory come back on the same ports
    (which `cv --config D/curvine.toml` clients rely on) without repeating the flags.
    """
    path = Path(directory) / lc.CONFIG_FILE
    if not path.exists():
        return lc.DEFAULT_MASTER_PORT, None, None
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, path)
    capacity = None
    m = re.match(r"^\[\w+:([^\]]+)\]", cfg.worker.dirs[0]) if cfg.worker.dirs else None
    if m:
        capacity = cfgmod.parse_size(m.group(1))
    return cfg.master.port, cfg.worker.rpc_port, capacity


def process_rows(procs: typing.Sequence[lc.ProcessRecord]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for p in procs:
        where = p.address + (f" (data {p.data_address})" if p.data_address else "")
        rows.append((p.name, where, p.metrics.rpartition(":")[2] or "-", p.pid, "alive" if p.is_alive() else "dead",
                     _rel(p.log)))
    return rows


def print_started(cluster: lc.LocalCluster, foreground: bool) -> None:
    print(f"started a cluster in {cluster.dir}: 1 master, {cluster.n_workers} worker(s)")
    print(output.table(process_rows(cluster.processes),
                       headers=("NAME", "ADDRESS", "METRICS", "PID", "STATE", "LOG"), right={2, 3}))
    cfg = _rel(str(cluster.config_path))
    hint = "" if cfg == ".curvine/curvine.toml" else f"--config {cfg} "   # found from this directory
    print(f"use it: cv {hint}fs ls /   (elsewhere: cv --config {cluster.config_path} ..., "
          "which holds the master's address and the cluster secret)")
    if foreground:
        print("running in the foreground; Ctrl-C stops the cluster")
    else:
        print(f"stop it: cv cluster stop --dir {_rel(str(cluster.dir))}")
    sys.stdout.flush()


def cmd_start(ctx: Context) -> int:
    a = ctx.args
    directory = Path(a.dir)
    master_port, base_port, capacity = layout_defaults(directory)
    if a.master_port is not None:
        master_port, base_port = a.master_port, None
    if a.base_port is not None:
        base_port = a.base_port
    if a.capacity is not None:
        capacity = cfgmod.parse_size(a.capacity)
    if a.mount and not lc.fuse_available():
        sys.stderr.write("cv: note: mounting is not available yet (curvine_py.fuse.main is not "
                         "installed); starting without a mount\n")
    cluster = lc.LocalCluster(directory, workers=a.workers, master_port=master_port,
                              capacity=capacity, base_port=base_port, mount=a.mount,
                              die_with_parent=a.foreground)
    if a.foreground:
        cluster.launcher_pid = os.getpid()
    # SIGTERM (and a closed terminal in the foreground) take the same path as Ctrl-C:
    # KeyboardInterrupt, which start() answers by stopping what it started.
    handled = [signal.SIGTERM] + ([signal.SIGHUP] if a.foreground else [])
    for sig in handled:
        signal.signal(sig, signal.default_int_handler)
    if a.foreground:
        return run_foreground(cluster, a.timeout)
    try:
        cluster.start(timeout=a.timeout)
    except lc.ClusterError as e:
        return fail_cluster(e)
    print_started(cluster, foreground=False)
    return EXIT_OK


def run_foreground(cluster: lc.LocalCluster, timeout: float) -> int:
    """Start, then watch the daemons until a signal; report deaths; stop on the way out.

    Start-up sits inside the same try as the watch loop, so a signal arriving at any
    moment, even right after the ready message, still ends in an ordered stop.
    """
    code = EXIT_INTERRUPTED
    started = False
    reported: set[int] = set()
    try:
        cluster.start(timeout=timeout)
        started, code = True, EXIT_OK
        print_started(cluster, foreground=True)
        while True:
            time.sleep(0.5)
            for p in cluster.processes:
                if p.pid in reported or p.is_alive():
                    continue
                reported.add(p.pid)
                fail_cluster(lc.ClusterError(
                    f"{p.name} (pid {p.pid}) exited with code {p.exit_code()}; "
                    f"last lines of {p.log}:", lc.log_tail(p.log)))
                if p.role == "master":  # nothing works without it: shut the rest down
                    code = EXIT_FAIL
                    raise KeyboardInterrupt
    except lc.ClusterError as e:  # start-up failed and has already stopped what it started
        return fail_cluster(e)
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C (or make forwarding one) must not cut the ordered stop short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if started:
            print("\nstopping the cluster ...", flush=True)
        cluster.stop()
        if started:
            print(f"stopped the cluster in {cluster.dir}", flush=True)
    return code


def cmd_stop(ctx: Context) -> int:
    directory = Path(ctx.args.dir).absolute()
    try:
        stopped = lc.stop_dir(directory, timeout=ctx.args.timeout)
    except lc.ClusterError as e:
        return fail_cluster(e)
    if stopped is None:
        print(f"no cluster is running in {directory}")
    elif not stopped:
        print(f"the cluster in {directory} was not running (removed its stale cluster.json)")
    else:
        print(f"stopped the cluster in {directory} ({', '.join(p.name for p in stopped)})")
    return EXIT_OK


def cmd_status(ctx: Context) -> int:
    directory = Path(ctx.args.dir).absolute()
    try:
        state = lc.read_state(directory)
    except lc.ClusterError as e:
        return fail_cluster(e)
    if state is None:
        if ctx.args.json:
            output.print_json({"dir": str(directory), "running": False, "processes": []})
        else:
            print(f"no cluster is running in {directory}")
        return EXIT_NOT_RUNNING
    procs: list[lc.ProcessRecord] = state["processes"]
    alive = [p.is_alive() for p in procs]
    master = next((p for p in procs if p.role == "master"), None)
    rep = (lc.query_report(state["master"], secret=_secret_of(state.get("config")))
           if master is not None and master.is_alive() else None)
    live = sum(1 for w in rep.workers if w.state.lower() == "live") if rep is not None else None
    if ctx.args.json:
        output.print_json({
            "dir": str(directory), "running": any(alive), "master": state.get("master"),
            "mount": state.get("mount"), "config": state.get("config"), "live_workers": live,
            "processes": [{"role": p.role, "name": p.name, "pid": p.pid, "address": p.address,
                           "data_address": p.data_address or None, "host": p.host or None,
                           "metrics": p.metrics or None, "log": p.log, "alive": ok} for p, ok in zip(procs, alive)]})
    else:
        print(f"cluster in {directory}: {sum(alive)} of {len(procs)} process(es) alive"
              + (f", master reports {live} live worker(s)" if live is not None else ""))
        print(output.table(process_rows(procs), headers=("NAME", "ADDRESS", "METRICS", "PID", "STATE", "LOG"),
                           right={2, 3}))
    return EXIT_OK if all(alive) else EXIT_FAIL


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv cluster` and its commands."""
    cl = sub.add_parser("cluster", parents=[common], help="run a local cluster (start/stop/status)",
                        description="A master and workers as local processes, for trying out.")
    cmds = cl.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    dir_help = f"cluster directory (default ./{DEFAULT_DIR})"

    p = cmds.add_parser("start", parents=[common], help="start 1 master and N workers",
                        description="Start 1 master and N workers (and a mount) on this machine.")
    p.add_argument("--dir", default=DEFAULT_DIR, help=dir_help)
    p.add_argument("--workers", type=positive_int, default=lc.DEFAULT_WORKERS,
                   help=f"number of workers (default {lc.DEFAULT_WORKERS})")
    p.add_argument("--mount", metavar="M", help="also mount the filesystem at M")
    p.add_argument("--foreground", action="store_true",
                   help="keep running until SIGINT/SIGTERM, then stop the cluster")
    p.add_argument("--capacity", metavar="SIZE", help="capacity of each worker's data dir (e.g. 1GiB)")
    p.add_argument("--master-port", type=port, metavar="P",
                   help=f"master port (default {lc.DEFAULT_MASTER_PORT}, or the one in DIR/curvine.toml)")
    p.add_argument("--base-port", type=port, metavar="P",
                   help="worker i uses ports P+2i (rpc) and P+2i+1 (data); default master port + 2")
    p.add_argument("--timeout", type=float, default=lc.START_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait for the workers to register (default {lc.START_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_start)

    p = cmds.add_parser("stop", parents=[common], help="stop the cluster recorded in DIR",
                        description="SIGTERM every process, SIGKILL after --timeout seconds.")
    p.add_argument("--dir", default=DEFAULT_DIR, help=dir_help)
    p.add_argument("--timeout", type=float, default=lc.STOP_TIMEOUT_S, metavar="S",
                   help=f"seconds before SIGKILL (default {lc.STOP_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_stop)

    p = cmds.add_parser("status", parents=[common], help="show the processes of the cluster in DIR",
                        description="Each process with its role, address, pid, alive/dead.")
    p.add_argument("--dir", default=DEFAULT_DIR, help=dir_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
