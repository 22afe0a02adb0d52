"""`cv report`: the cluster as the master sees it (workers, ring, pool, replication), and
each master of a Raft group as it sees itself.

This is the operator's first look after starting or losing a node: which workers are
live, how full each is, which ring epoch placement uses, whether any block is missing a
replica, and, with several masters, which one leads and how far each is behind.
"""
from __future__ import annotations

import argparse
import typing

from curvine_py.cli import Context
from curvine_py.cli import output

if typing.TYPE_CHECKING:
    from curvine_py.sdk.results import MasterInfo, Report


def master_json(m: "MasterInfo") -> dict[str, typing.Any]:
    """One master as it reports itself; lag is null when it or every leader is unreachable."""
    return {
        "address": m.address,
        "role": m.role,                 # leader, follower, candidate or unreachable
        "term": m.term,
        "commit_index": m.commit_index,
        "applied_index": m.applied_index,
        "last_log_index": m.last_log_index,
        "lag": m.lag,                   # the leader's commit index minus this master's applied index
        "leader": m.leader or None,     # the leader's address as this master knows it
        "raft_address": m.raft_address or None,
        "pid": m.pid or None,
        "ready": m.ready,
    }


def report_json(rep: "Report") -> dict[str, typing.Any]:
    """The report with exact integers and the same worker fields `fs blocks` uses."""
    return {
        "master": rep.master_address,
        "version": rep.version,
        "ring_epoch": rep.ring_epoch,
        "capacity": rep.capacity,
        "used": rep.used,
        "files": rep.files,
        "blocks": rep.blocks,
        "under_replicated": rep.under_replicated,
        "evicted_files": rep.evicted_files,
        "evicted_bytes": rep.evicted_bytes,
        "expired_files": rep.expired_files,
        "metrics_port": rep.metrics_port,   # the master's /metrics port (0 = off)
        "masters": [master_json(m) for m in rep.masters],
        "workers": [{
            "id": w.address.worker_id,
            "host": w.address.host,
            "address": f"{w.address.ip}:{w.address.rpc_port}",
            "data_address": f"{w.address.ip}:{w.address.data_port}",
            "state": w.state,
            "capacity": w.capacity,
            "used": w.used,
            "blocks": w.blocks,
            "last_heartbeat_ms": w.last_heartbeat_ms,  # age: ms since the last heartbeat
            "io_engine": w.io_engine,   # "uring" or "threads" ("" = the worker did not say)
            "metrics": f"{w.address.ip}:{w.metrics_port}" if w.metrics_port else None,
            "dirs": [{"path": d.path, "tier": d.tier, "capacity": d.capacity, "used": d.used}
                     for d in w.dirs],
        } for w in rep.workers],
    }


def format_report(rep: "Report") -> str:
    """The human view: a summary block, then one row per worker."""
    live = sum(1 for w in rep.workers if w.state.lower() == "live")
    summary = output.table([
        ("master:", f"{rep.master_address or '-'}" + (f" (version {rep.version})" if rep.version else "")),
        ("workers:", f"{live} live of {len(rep.workers)}"),
        ("ring epoch:", rep.ring_epoch),
        ("capacity:", f"{output.format_size(rep.capacity)}, used {output.format_size(rep.used)} "
                      f"({output.format_percent(rep.used, rep.capacity)})"),
        ("files:", rep.files),
        ("blocks:", f"{rep.blocks} ({rep.under_replicated} under-replicated)"),
        ("evicted:", f"{rep.evicted_files} files ({output.format_size(rep.evicted_bytes)}), "
                     f"{rep.expired_files} expired by TTL"),
    ])
    if len(rep.masters) > 1:
        summary += "\n\n" + format_masters(rep.masters)
    if not rep.workers:
        return summary + "\n\nno workers registered"
    rows = [(w.address.worker_id, w.address.host, f"{w.address.ip}:{w.address.rpc_port}",
             w.state, output.format_size(w.capacity), output.format_size(w.used),
             output.format_percent(w.used, w.capacity), w.blocks, w.io_engine or "-",
             output.format_age_ms(w.last_heartbeat_ms))
            for w in sorted(rep.workers, key=lambda w: w.address.worker_id)]
    workers = output.table(rows, headers=("ID", "HOST", "ADDRESS", "STATE", "CAPACITY", "USED",
                                          "USE%", "BLOCKS", "IO", "HEARTBEAT"), right={0, 4, 5, 6, 7})
    return f"{summary}\n\n{workers}"


def format_masters(masters: typing.Sequence["MasterInfo"]) -> str:
    """One row per master: its role, term, commit and applied index, and lag (the
    leader's commit index minus its applied index); "-" where it did not answer."""
    rows: list[tuple[object, ...]] = []
    for m in masters:
        known = m.role != "unreachable"
        numbers = (m.term, m.commit_index, m.applied_index) if known else ("-", "-", "-")
        rows.append((m.address, m.role, *numbers, "-" if m.lag is None else m.lag))
    return output.table(rows, headers=("MASTER", "ROLE", "TERM", "COMMIT", "APPLIED", "LAG"), right={2, 3, 4, 5})


def cmd_report(ctx: Context) -> int:
    rep = ctx.client.report()
    if ctx.args.json:
        output.print_json(report_json(rep))
    else:
        print(format_report(rep))
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv report`."""
    p = sub.add_parser("report", parents=[common], help="cluster report: workers, ring, usage",
                       description="What the master knows of the cluster.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_report)
