"""`cv mount` and `cv umount`: the pool as a POSIX filesystem (the daemon is curvine_py.fuse).

`cv mount` hands over to the mount daemon's own main in this process (it forks before
any thread or gRPC channel exists, so nothing here may create the Client first);
`cv umount` flushes and unmounts through the daemon, or detaches a mount whose daemon died.
"""
from __future__ import annotations

import argparse

from curvine_py.cli import EXIT_FAIL, CliError, Context


def cmd_mount(ctx: Context) -> int:
    try:
        from curvine_py.fuse import main as fuse_main
    except ImportError as e:  # pyfuse3 missing: the package was installed without [fuse]
        raise CliError(f"mounting is not available: {e} (install curvine-py[fuse])") from None
    a = ctx.args
    argv = [a.mountpoint]
    if getattr(a, "master", None):
        argv += ["--master", a.master]
    if getattr(a, "config", None):
        argv += ["--config", a.config]
    if a.foreground:
        argv.append("--foreground")
    if a.log_file:
        argv += ["--log-file", a.log_file]
    if a.direct_io:
        argv += ["--fuse-direct-io", "true"]
    if a.subdir:
        argv += ["--subdir", a.subdir]
    return fuse_main.main(argv)


def cmd_umount(ctx: Context) -> int:
    from curvine_py.fuse import main as fuse_main
    code = fuse_main.umount(ctx.args.mountpoint, timeout=ctx.args.timeout)
    return code if code == 0 else EXIT_FAIL


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv mount` and `cv umount`."""
    p = sub.add_parser("mount", parents=[common], help="mount the pool at MOUNTPOINT (FUSE)",
                       description="Mount the curvine-py pool; runs in the background unless --foreground.")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--foreground", "-f", action="store_true", help="stay in the foreground (logs to stderr)")
    p.add_argument("--log-file", metavar="FILE", help="daemon log (default /run/curvine/mount-<path>.log)")
    p.add_argument("--direct-io", action="store_true", help="bypass the kernel page cache for file data")
    p.add_argument("--subdir", metavar="PATH", help="mount this pool directory as the root (default: the pool's root)")
    p.set_defaults(func=cmd_mount)
    p = sub.add_parser("umount", parents=[common], help="flush and unmount MOUNTPOINT",
                       description="Flush open files and unmount; detaches a mount whose daemon died.")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the daemon (default 30)")
    p.set_defaults(func=cmd_umount)
