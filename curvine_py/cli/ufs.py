"""`cv ufs mount|ls|umount` and `cv load`: the cache in front of S3 and NAS (`cv fs free` is in fs.py).

docs/ufs.md describes the model; these commands are thin over ``Client.ufs``
(curvine_py/sdk/ufsadmin.py).  A bad URI, an unknown option, a missing bucket or wrong
credentials come back from the master as one line and mount nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing

from curvine_py.cli import Context, UsageError, output
from curvine_py.cli.paths import on_path, remote
from curvine_py.common.errors import CurvineError
from curvine_py.common.policy import parse_ttl

if typing.TYPE_CHECKING:
    from curvine_py.sdk.ufsadmin import LoadJobStatus


def _options(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"-o {pair!r}: use KEY=VALUE")
        out[key.strip()] = value
    return out


def _seconds(text: str, what: str) -> float:
    try:
        return float(parse_ttl(text))
    except CurvineError as e:
        raise UsageError(f"{what}: {e.strerror}") from None


def cmd_mount(ctx: Context) -> int:
    a = ctx.args
    ttl = _seconds(a.metadata_ttl, "--metadata-ttl") if a.metadata_ttl else None
    data_ttl = _seconds(a.ttl, "--ttl") if a.ttl else 0
    path = remote(a.path)
    with on_path(path):
        m = ctx.client.ufs.mount(a.uri, path, _options(a.option), a.write_mode, ttl, data_ttl)
    shown = output.format_duration(m.metadata_ttl_s)
    print(f"mounted {m.uri} at {m.path} (write {m.write_mode}, metadata ttl {shown})")
    return 0


def cmd_ls(ctx: Context) -> int:
    mounts = ctx.client.ufs.mounts()
    if ctx.args.json:
        output.print_json([dataclasses.asdict(m) for m in mounts])
        return 0
    if not mounts:
        print("no UFS mounts")
        return 0
    rows = [(m.path, m.uri, m.write_mode, output.format_duration(m.metadata_ttl_s),
             output.format_duration(m.ttl_s) if m.ttl_s else "-",
             ",".join(f"{k}={v}" for k, v in sorted(m.options.items())) or "-") for m in mounts]
    print(output.table(rows, headers=("PATH", "UFS", "WRITE", "META TTL", "TTL", "OPTIONS")))
    return 0


def cmd_umount(ctx: Context) -> int:
    path = remote(ctx.args.path)
    with on_path(path):
        ctx.client.ufs.umount(path, ctx.args.force)
    print(f"unmounted {path} (the UFS is untouched)")
    return 0


def cmd_load(ctx: Context) -> int:
    a = ctx.args
    if a.status:
        return _status(ctx)
    if not a.path:
        raise UsageError("cv load: give a PATH (or --status)")
    path = remote(a.path)
    with on_path(path):
        job = ctx.client.ufs.load(path, a.recursive)
    if not a.wait:
        print(f"load job {job.job_id} started for {path} (cv load --status shows its progress)")
        return 0
    job = _follow(ctx, job, a.quiet)
    print(f"load job {job.job_id}: {job.state}, {job.files} files, "
          f"{output.format_size(job.loaded_bytes)} of {output.format_size(job.total_bytes)} cached")
    return 0 if job.state == "done" else 1


def _follow(ctx: Context, job: "LoadJobStatus", quiet: bool) -> "LoadJobStatus":
    """Poll the job to its end, with a progress bar on a terminal."""
    bar = None
    if not quiet and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(desc=f"load {job.path}", unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                   leave=False, dynamic_ncols=True)
    try:
        while True:
            job = ctx.client.ufs.jobs(job.job_id)[0]
            if bar is not None:
                bar.total = job.total_bytes
                bar.n = job.loaded_bytes
                bar.refresh()
            if not job.running:
                return job
            time.sleep(0.2)
    finally:
        if bar is not None:
            bar.close()


def _status(ctx: Context) -> int:
    jobs = ctx.client.ufs.jobs()
    if ctx.args.json:
        output.print_json([dataclasses.asdict(j) for j in jobs])
        return 0
    if not jobs:
        print("no load jobs")
        return 0
    rows = [(j.job_id, j.path, j.state, j.files, output.format_size(j.loaded_bytes),
             output.format_size(j.total_bytes), output.format_percent(j.loaded_bytes, j.total_bytes),
             j.failed_blocks) for j in jobs]
    print(output.table(rows, headers=("JOB", "PATH", "STATE", "FILES", "CACHED", "TOTAL", "DONE", "FAILED"),
                       right={0, 3, 4, 5, 6, 7}))
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv ufs` and `cv load`."""
    ufs = sub.add_parser("ufs", parents=[common], help="UFS mounts: S3 or NAS under a pool directory",
                         description="Mount an object store or a shared directory under a pool directory.")
    cmds = ufs.add_subparsers(dest="ufs_command", metavar="COMMAND", required=True)
    p = cmds.add_parser("mount", parents=[common], help="mount UFS_URI at PATH")
    p.add_argument("uri", metavar="UFS_URI", help="s3://bucket[/prefix] or file:///dir (seen by every worker)")
    p.add_argument("path", metavar="PATH", help="pool directory (made if missing; else it must be empty)")
    p.add_argument("-o", dest="option", action="append", default=[], metavar="KEY=VALUE",
                   help="UFS option (endpoint_url, region, access_key_id, secret_access_key, ...)")
    p.add_argument("--write-mode", choices=("through", "back"), default="through",
                   help="through: close returns once the UFS has the file; back: once the pool has it")
    p.add_argument("--metadata-ttl", metavar="DURATION",
                   help="how long listings are trusted (default ufs.metadata_ttl_s)")
    p.add_argument("--ttl", metavar="DURATION", help="cached data expires after this (default: never)")
    p.set_defaults(func=cmd_mount)
    p = cmds.add_parser("ls", parents=[common], help="list UFS mounts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_ls)
    p = cmds.add_parser("umount", parents=[common], help="remove a UFS mount (drops its cache, not the UFS)")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--force", action="store_true", help="also drop files not uploaded yet (they are lost)")
    p.set_defaults(func=cmd_umount)

    p = sub.add_parser("load", parents=[common], help="cache a UFS file or tree ahead of use",
                       description="Cache a file (or a tree with -r) from its UFS, as a job the master tracks.")
    p.add_argument("path", metavar="PATH", nargs="?")
    p.add_argument("-r", "--recursive", action="store_true", help="load a directory tree")
    p.add_argument("--wait", action="store_true", help="wait for the job to end (a progress bar on a terminal)")
    p.add_argument("--status", action="store_true", help="list load jobs and their progress")
    p.add_argument("--json", action="store_true", help="machine-readable --status")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_load)

