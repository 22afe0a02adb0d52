"""`cv cluster start|stop|status`: a whole cluster on this machine, for trying things out.

The process management itself is curvine_py.cluster.local (shared with the tests); this
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

from curvine_py.cluster import local as lc
from curvine_py.cli import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, Context
from curvine_py.cli import output
from curvine_py.common import config as cfgmod
from curvine_py.client.metagroup import MasterGroup
from curvine_py.common.errors import ConfigError
from curvine_py.common.tls import Tls
from curvine_py.sdk.results import MasterInfo

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


def _tls_of(config_path: str | None) -> "Tls | None":
    """The cluster's client TLS (None when off or unreadable: status still shows the processes)."""
    try:
        return lc.daemon_tls(config_path) if config_path else None
    except (ConfigError, OSError):
        return None


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


def recorded_masters(directory: str | Path) -> int | None:
    """How many masters D/curvine.toml was written for (its client.master list), None
    without one: the toml is never rewritten, so a cluster keeps its number of masters."""
    path = Path(directory) / lc.CONFIG_FILE
    if not path.exists():
        return None
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, path)
    return max(1, len(cfgmod.addresses(cfg.client.master)))


def process_rows(procs: typing.Sequence[lc.ProcessRecord],
                 roles: typing.Mapping[str, str] | None = None) -> list[tuple[object, ...]]:
    """One row per process; roles (a master's address -> leader, follower, ...) is
    shown beside a live master's state."""
    rows: list[tuple[object, ...]] = []
    for p in procs:
        where = p.address + (f" (data {p.data_address})" if p.data_address else "")
        state = "alive" if p.is_alive() else "dead"
        if p.role == "master" and state == "alive" and roles and p.address in roles:
            state += f", {roles[p.address]}"
        rows.append((p.name, where, p.metrics.rpartition(":")[2] or "-", p.pid, state, _rel(p.log)))
    return rows


def _masters_text(n: int) -> str:
    return "1 master" if n == 1 else f"{n} masters (Raft)"


def print_started(cluster: lc.LocalCluster, foreground: bool) -> None:
    print(f"started a cluster in {cluster.dir}: {_masters_text(cluster.n_masters)}, "
          f"{cluster.n_workers} worker(s)")
    print(output.table(process_rows(cluster.processes),
                       headers=("NAME", "ADDRESS", "METRICS", "PID", "STATE", "LOG"), right={2, 3}))
    cfg = _rel(str(cluster.config_path))
    hint = "" if cfg == ".curvine/curvine.toml" else f"--config {cfg} "   # found from this directory
    whose = "the master's address" if cluster.n_masters == 1 else "every master's address"
    print(f"use it: cv {hint}fs ls /   (elsewhere: cv --config {cluster.config_path} ..., "
          f"which holds {whose} and the cluster secret)")
    if foreground:
        print("running in the foreground; Ctrl-C stops the cluster")
    else:
        print(f"stop it: cv cluster stop --dir {_rel(str(cluster.dir))}")
    sys.stdout.flush()


def cmd_start(ctx: Context) -> int:
    a = ctx.args
    directory = Path(a.dir)
    recorded = recorded_masters(directory)
    masters = a.masters if a.masters is not None else recorded or 1
    if recorded is not None and masters != recorded:
        return fail_cluster(lc.ClusterError(
            f"{directory} was set up for {_masters_text(recorded)} ({directory / lc.CONFIG_FILE}); "
            f"start it with --masters {recorded}, or use another --dir"))
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
                              capacity=capacity, masters=masters, base_port=base_port, mount=a.mount,
                              die_with_parent=a.foreground, tls=a.tls)
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
                if p.role == "master" and not _majority_alive(cluster):
                    code = EXIT_FAIL   # nothing works without it (them): shut the rest down
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


def _majority_alive(cluster: lc.LocalCluster) -> bool:
    """Whether the masters can still serve: the one is alive, or a majority of several."""
    alive = sum(1 for m in cluster.masters if m.is_alive())
    return 2 * alive > len(cluster.masters)


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
            output.print_json({"dir": str(directory), "running": False, "processes": [], "masters": []})
        else:
            print(f"no cluster is running in {directory}")
        return EXIT_NOT_RUNNING
    procs: list[lc.ProcessRecord] = state["processes"]
    alive = [p.is_alive() for p in procs]
    masters = [p for p in procs if p.role == "master"]
    secret, tls = _secret_of(state.get("config")), _tls_of(state.get("config"))
    infos = _master_infos(masters, secret, tls)
    rep = (lc.query_report(",".join(m.address for m in masters), secret=secret, tls=tls)
           if any(m.is_alive() for m in masters) else None)
    live = sum(1 for w in rep.workers if w.state.lower() == "live") if rep is not None else None
    if ctx.args.json:
        output.print_json({
            "dir": str(directory), "running": any(alive), "master": state.get("master"),
            "mount": state.get("mount"), "config": state.get("config"), "live_workers": live,
            "leader": next((i.address for i in infos.values() if i.role == "leader"), None),
            "masters": [master_json(m, infos.get(m.address)) for m in masters],
            "processes": [{"role": p.role, "name": p.name, "pid": p.pid, "address": p.address,
                           "data_address": p.data_address or None, "host": p.host or None,
                           "raft_address": p.raft or None,
                           "metrics": p.metrics or None, "log": p.log, "alive": ok} for p, ok in zip(procs, alive)]})
    else:
        print(f"cluster in {directory}: {sum(alive)} of {len(procs)} process(es) alive"
              + (f", master reports {live} live worker(s)" if live is not None else ""))
        roles = {a: i.role for a, i in infos.items()} if len(masters) > 1 else None
        print(output.table(process_rows(procs, roles), headers=("NAME", "ADDRESS", "METRICS", "PID", "STATE", "LOG"),
                           right={2, 3}))
    return EXIT_OK if all(alive) else EXIT_FAIL


def _master_infos(masters: typing.Sequence[lc.ProcessRecord], secret: str,
                  tls: "Tls | None") -> dict[str, MasterInfo]:
    """Each live master's own status by its address (none asked of a dead one)."""
    live = [m.address for m in masters if m.is_alive()]
    if not live:
        return {}
    with MasterGroup(live, secret, tls) as group:
        return {i.address: i for i in group.infos()}


def master_json(p: lc.ProcessRecord, info: MasterInfo | None) -> dict[str, typing.Any]:
    """One master process: where it listens, its pid, and its role as it reports it
    ("dead" when the process is gone, "unreachable" when it runs but does not answer)."""
    role = info.role if info is not None else "dead" if not p.is_alive() else "unreachable"
    return {"name": p.name, "address": p.address, "raft_address": p.raft or None, "pid": p.pid,
            "alive": p.is_alive(), "role": role, "term": info.term if info else None,
            "applied_index": info.applied_index if info else None, "log": p.log}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def master_count(text: str) -> int:
    """--masters: 1, or an odd number for a Raft group (an even one has no majority to
    spare: 2 masters stop when either dies, as 1 does)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1 or value % 2 == 0:
        why = ": Raft needs a majority of the masters" if value > 0 else ""
        raise argparse.ArgumentTypeError(f"must be odd (1, 3 or 5), not {value}{why}")
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

    p = cmds.add_parser("start", parents=[common], help="start 1 master (or 3 with Raft) and N workers",
                        description="Start 1 master (or 3, 5 replicating by Raft) and N workers (and a "
                                    "mount) on this machine.")
    p.add_argument("--dir", default=DEFAULT_DIR, help=dir_help)
    p.add_argument("--masters", type=master_count, metavar="N",
                   help="number of masters: 1 (default), or 3 or 5 replicating by Raft (docs/ha.md); "
                        "default the number DIR was first started with")
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
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=lc.DEFAULT_TLS,
                   help="mutual TLS on every channel of a new cluster: a CA and certificates under "
                        f"DIR/tls (default {'on' if lc.DEFAULT_TLS else 'off'}; an existing DIR keeps "
                        "its [tls] settings; docs/security.md)")
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
