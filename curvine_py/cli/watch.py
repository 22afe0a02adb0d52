"""`cv fs watch DIR`: a directory's events as they happen (the event feed, Client.watch).

One line per event, flushed at once so a pipe sees it live: position, kind, name (a
rename within the directory as `old -> new`), size and the hosts holding the whole file
(for replica_added / replica_lost: the host);
with --json one JSON object per line (JSON Lines), for a router or a script.  --since N
resumes after position N (the last one printed); the position stays valid across a
master failover.  A position older than the retention window, or a watcher the master
cut off for not reading, ends it with one line and exit 1.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import typing

from curvine_py.cli import CliError, Context, output
from curvine_py.cli.paths import remote
from curvine_py.sdk.watch import PositionTooOld, WatchCutOff, WatchEvent


def cmd_watch(ctx: Context) -> int:
    path = remote(ctx.args.path)
    count = ctx.args.count
    if count is not None and count < 1:
        raise CliError(f"--count {count}: give at least 1")
    if ctx.args.since is not None and ctx.args.since < 0:
        raise CliError(f"--since {ctx.args.since}: a position is >= 0")
    seen = 0
    try:
        kinds = [k for k in ctx.args.kinds.split(",") if k] if ctx.args.kinds else None
        with ctx.client.watch(path, since=ctx.args.since, kinds=kinds) as events:
            for e in events:
                _print(e, ctx.args.json)
                seen += 1
                if count is not None and seen >= count:
                    break
    except (PositionTooOld, WatchCutOff) as e:
        raise CliError(f"{path}: {e.strerror}") from None
    return 0


def _print(e: WatchEvent, as_json: bool) -> None:
    if as_json:
        line = json.dumps({**dataclasses.asdict(e), "hosts": list(e.hosts)}, ensure_ascii=False)
    else:
        name = f"{e.from_name} -> {e.name}" if e.from_name else e.name
        size = output.format_size(e.size) if e.kind == "created" else "-"
        hosts = e.host if e.kind.startswith("replica") else ",".join(e.hosts) or "-"
        line = f"{e.position}\t{e.kind}\t{name}\t{size}\t{hosts}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def register(add: typing.Callable[..., typing.Any]) -> None:
    """Add `cv fs watch` through fs.register's `add`."""
    p = add("watch", cmd_watch, "print a directory's events (created, removed, evicted, replica_added, "
                                "replica_lost) as they happen", json_flag=True)
    p.add_argument("path", metavar="DIR")
    p.add_argument("--since", type=int, metavar="N", help="resume after position N (default: from now on)")
    p.add_argument("--count", type=int, metavar="N", help="exit after N events")
    p.add_argument("--kinds", metavar="K,K", help="only these kinds (created, removed, evicted, replica_added, "
                                                  "replica_lost); --since positions still count every event")
