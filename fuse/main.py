"""The mount daemon: ``cv mount MOUNTPOINT`` ends up here.

Forks into the background before any thread, gRPC channel or trio loop exists (none
of them survive a fork), reports success or the first error back to the parent
through a pipe, mounts with pyfuse3, and unmounts cleanly on SIGTERM/SIGINT after
flushing every open file.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import signal
import sys
import typing
from pathlib import Path

from curvine_py.common import config, metrics
from curvine_py.common.errors import ConfigError, CurvineError
from curvine_py.common.mounttable import detach, is_mounted
from curvine_py.cluster.processes import pid_alive
from curvine_py.pb.methods import Master

if typing.TYPE_CHECKING:
    from curvine_py.client.cachesession import CacheSession
    from curvine_py.client.core import ClientCore
    from curvine_py.client.vfs import VFS
    from curvine_py.fuse.notify import KernelNotifier
    from curvine_py.fuse.ops import CurvineOps

log = logging.getLogger("curvine.fuse")
RUN_DIR = Path(os.environ.get("CURVINE_RUN_DIR", "/run/curvine"))
# A stop signal ends the FUSE loop; the requests it was serving get this long to finish
# before they are cut off (answered EIO: fuse/ops.py _fs_errors), so one that waits on an
# unreachable master (a lookup, a getattr: up to client.retry_s) cannot hold the unmount,
# and a process touching the mount meanwhile gets an error, not a hang.  The flush of the
# open files comes after the unmount and is not bounded by this.
STOP_GRACE_S = 1.0


def state_paths(mountpoint: str) -> tuple[Path, Path]:
    """(pid file, log file) of the daemon serving mountpoint."""
    key = os.path.realpath(mountpoint).strip("/").replace("/", "_") or "root"
    return RUN_DIR / f"mount-{key}.pid", RUN_DIR / f"mount-{key}.log"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cv mount", description="mount the curvine-py pool with FUSE")
    p.add_argument("mountpoint")
    p.add_argument("--master", help="master address host:port")
    p.add_argument("--foreground", "-f", action="store_true", help="stay in the foreground")
    p.add_argument("--log-file", help="daemon log (default under /run/curvine)")
    p.add_argument("--debug", action="store_true")
    p.add_argument("--subdir", default="/", metavar="PATH", help="the pool directory to mount as the root (default /)")
    config.add_flags(p, ["client", "fuse", "tls"])
    return p


def check_mountpoint(path: str) -> None:
    if not os.path.isdir(path):
        raise CurvineError(errno.ENOTDIR if os.path.exists(path) else errno.ENOENT, "mount point is not a directory",
                           path)
    if os.path.ismount(path):
        raise CurvineError(errno.EBUSY, "something is already mounted here", path)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cfg = config.load(args)
        if args.master:
            cfg.client.master = args.master
        check_mountpoint(args.mountpoint)
    except (ConfigError, CurvineError) as e:
        print(f"cv mount: {e}", file=sys.stderr)
        return 2
    pid_file, default_log = state_paths(args.mountpoint)
    log_file = args.log_file or str(default_log)
    if args.foreground:
        _setup_logging(None, args.debug)
        _exit(serve(cfg, args.mountpoint, pid_file, None, args.subdir))
    return _daemonize(cfg, args.mountpoint, pid_file, log_file, args.debug, args.subdir)


def _exit(code: int) -> typing.NoReturn:
    """End the daemon once serve() is done, as the background one does (os._exit): an I/O
    thread stuck on a hung worker (a read the watchdog gave up) must not keep a daemon that
    has unmounted alive until its socket times out (the interpreter joins those threads)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _setup_logging(log_file: str | None, debug: bool, force: bool = False) -> None:
    """force: the daemon's own logging, replacing what the process it forked from set up
    (`cv mount` runs this module in the CLI's process, whose logging keeps WARNING and up
    on its terminal: the daemon's log file stayed empty)."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, filename=log_file,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=force)


def _daemonize(cfg: config.Config, mountpoint: str, pid_file: Path, log_file: str, debug: bool,
               subdir: str = "/") -> int:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(wfd)
        with os.fdopen(rfd, "rb") as r:
            msg = r.read().decode(errors="replace")
        if msg.startswith("ok"):
            print(f"mounted curvine at {mountpoint} (pid {msg.split()[1]}, log {log_file})")
            return 0
        print(f"cv mount: {mountpoint}: {msg or 'the mount daemon exited during start; see ' + log_file}",
              file=sys.stderr)
        return 1
    os.close(rfd)
    os.setsid()
    if os.fork():
        os._exit(0)
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    _setup_logging(None, debug, force=True)
    code = serve(cfg, mountpoint, pid_file, wfd, subdir)
    os._exit(code)


def _notify(wfd: int | None, msg: str) -> None:
    if wfd is None:
        return
    try:
        os.write(wfd, msg.encode())
        os.close(wfd)
    except OSError:
        pass


def serve(cfg: config.Config, mountpoint: str, pid_file: Path, ready_fd: int | None, subdir: str = "/") -> int:
    """Mount and serve until unmounted or signalled; returns the exit code.
    subdir: the pool directory that is the mount's root (the VFS maps the root inode to it)."""
    import trio

    stopping = _Stopping()   # from now on a stop signal is kept, never fatal
    mounted = _mount(cfg, mountpoint, ready_fd, subdir)
    if mounted is None:
        return 1
    served = _serve_metrics(cfg, mounted.ops)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{os.getpid()}\n{mounted.real}\n")
    log.info("mounted %s (master %s)", mountpoint, cfg.client.master)
    code = 0
    try:
        trio.run(_loop, cfg, mountpoint, mounted, stopping, ready_fd)
    except BaseException:
        log.exception("mount loop failed")
        code = 1
    finally:
        _unmount(mounted, mountpoint)
        if served is not None:
            served.close()
        try:
            pid_file.unlink()
        except FileNotFoundError:
            pass
        log.info("unmounted %s", mountpoint)
    return code


@dataclasses.dataclass
class _Mounted:
    """What serve() runs: the client, its VFS and the pyfuse3 operations over it, with the
    mount's real path (resolved before init: after it the path is served by us)."""
    core: ClientCore
    vfs: VFS
    ops: CurvineOps
    real: str
    session: CacheSession | None = None   # the metadata cache's session (fuse.metadata_cache)
    notifier: KernelNotifier | None = None   # tells the kernel what the session's pushes took
    detached: bool = False   # the watchdog found the mount gone: nothing of ours to unmount


def _mount(cfg: config.Config, mountpoint: str, ready_fd: int | None, subdir: str) -> _Mounted | None:
    """Reach the master, resolve subdir and mount; None (the reason logged and sent to the
    waiting parent) when any of them fails: nothing is left mounted then."""
    import pyfuse3

    from curvine_py.client.asyncmeta import AsyncMeta
    from curvine_py.client.mount.policy import MountOpens
    from curvine_py.client.vfs import VFS
    from curvine_py.fuse.ops import CurvineOps

    core = _reach_master(cfg, ready_fd)
    if core is None:
        return None
    real = os.path.realpath(mountpoint)
    session = None
    if cfg.fuse.metadata_cache:   # before the VFS, which takes the cache from the client
        from curvine_py.client.cachesession import CacheSession
        from curvine_py.client.metacache import MetaCache
        core.meta.cache = MetaCache()
        session = CacheSession(core.meta, core.meta.cache)
    try:
        vfs = VFS(core, subdir, MountOpens(core))
    except CurvineError as e:   # the subdir is missing or not a directory: say so, mount nothing
        log.error("--subdir %s: %s", subdir, e.strerror)
        _notify(ready_fd, f"--subdir {subdir}: {e.strerror} in the pool")
        core.close()
        return None
    ops = CurvineOps(vfs, cfg.fuse, AsyncMeta(core.meta))
    # default_permissions (pyfuse3's default) has the kernel check access itself, from the
    # mode bits; FUSE_POSIX_ACL makes that check use the inodes' ACLs too (it reads them
    # with getxattr, cached until the name is revalidated), as the master does
    # (docs/posix.md "ACLs").  Without it a named user's entry would be refused by the kernel.
    ops.enable_acl = True
    from curvine_py.fuse.watchdog import ensure_fusectl
    ensure_fusectl()   # the stop's last resort (_unmount) and the watchdog's detach abort through it
    options = set(pyfuse3.default_options) | {"fsname=curvine", "subtype=curvine", "allow_other"}
    try:
        pyfuse3.init(ops, mountpoint, options)
    except RuntimeError as e:
        log.error("mount failed: %s", e)
        _notify(ready_fd, f"mount failed: {e}")
        return None
    if session is None:
        return _Mounted(core, vfs, ops, real)
    if not cfg.fuse.kernel_invalidation:
        return _Mounted(core, vfs, ops, real, session.start())
    # after init (the kernel's session exists) and before the cache session's first push
    from curvine_py.fuse.notify import KernelNotifier
    notifier = KernelNotifier(vfs.root_ino).start()
    session.on_push = notifier.pushed
    session.cache.on_refused = notifier.refused
    session.cache.on_end = notifier.refused
    return _Mounted(core, vfs, ops, real, session.start(), notifier)


def _reach_master(cfg: config.Config, ready_fd: int | None) -> ClientCore | None:
    """The client, once the master answered (within 10 s at most): an unreachable master
    fails the mount now, not at the first ls."""
    from curvine_py.client.core import ClientCore
    from curvine_py.pb import curvine_pb2 as pb

    try:
        core = ClientCore(cfg)
        retry_s = core.meta.cfg.retry_s      # (core.meta.cfg is cfg.client: restore the value itself)
        core.meta.cfg.retry_s = min(retry_s, 10.0)
        try:
            core.meta.call(Master.StatFs, pb.Empty())
        finally:
            core.meta.cfg.retry_s = retry_s
    except CurvineError as e:
        log.error("cannot reach master %s: %s", cfg.client.master, e)
        _notify(ready_fd, f"cannot reach master {cfg.client.master}: {e.strerror}")
        return None
    return core


class _Stopping:
    """SIGTERM/SIGINT, from the handlers' install (before the loop) to the daemon's exit.

    A stop signal that arrives while the trio loop does not listen (before it starts, or
    re-delivered by trio when the loop ends, or during the flush after it) must neither kill
    the daemon half-way through unmounting (the mount would be left dead: ENOTCONN) nor be
    lost: it is recorded and acted on by the loop.  On the loop, a stop ends pyfuse3's
    session and gives the requests in flight STOP_GRACE_S (the `serving` scope); those still
    running then are answered EIO (fuse/ops.py), so the kernel drops their locks.
    on_stop: called at the stop, before the session ends (the kernel notifier's close)."""

    def __init__(self) -> None:
        import trio
        self.asked: list[int] = []
        self.serving = trio.CancelScope()
        self.on_stop: list[typing.Callable[[], None]] = []
        signal.signal(signal.SIGTERM, self._outside_loop)
        signal.signal(signal.SIGINT, self._outside_loop)

    def _outside_loop(self, signum: int, frame: object) -> None:
        self.asked.append(signum)
        log.info("signal %d: unmounting (already under way)", signum)

    def _stop_serving(self) -> None:
        import pyfuse3
        import trio
        for fn in self.on_stop:
            fn()
        pyfuse3.terminate()
        self.serving.deadline = min(self.serving.deadline, trio.current_time() + STOP_GRACE_S)

    async def listen(self) -> None:
        """Listen for the daemon's whole life: returning after the first signal would make
        trio re-deliver a second one (Ctrl-C twice, a service manager signalling the whole
        group) with the default action, killing the daemon before it unmounted."""
        import trio
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
            if self.asked:
                self._stop_serving()
            async for sig in sigs:
                log.info("signal %d: unmounting%s", sig, " (already under way)" if self.asked else "")
                self.asked.append(sig)
                self._stop_serving()


async def _loop(cfg: config.Config, mountpoint: str, m: _Mounted, stopping: _Stopping, ready_fd: int | None) -> None:
    """The mount's trio loop: pyfuse3's session, the signal listener, the watchdog and the
    read-ahead tuning, until a stop signal or a detached mount ends the session."""
    import pyfuse3
    import trio

    from curvine_py.fuse import readahead
    from curvine_py.fuse.watchdog import MountCheck, Requests, watch

    mount = MountCheck.find(m.real)   # by device number: the watchdog notices a detached mount
    if m.notifier is not None:
        stopping.on_stop.append(m.notifier.close)
    async with trio.open_nursery() as nursery:
        def on_detach() -> None:   # the watchdog found the mount gone (its connection aborted)
            m.detached = True
            pyfuse3.terminate()
            nursery.cancel_scope.cancel()   # every request still waiting, too
        nursery.start_soon(stopping.listen)
        nursery.start_soon(watch, m.ops.requests or Requests(0), m.vfs, mount, on_detach, m.ops._hop_limits)
        if mount is not None:
            answered = readahead.init_answered(m.ops)   # (before pyfuse3.main: the INIT is its first request)
            nursery.start_soon(readahead.apply_after, answered, mount.dev, mountpoint, cfg.fuse.read_ahead_kb)
        _notify(ready_fd, f"ok {os.getpid()}")
        if not stopping.asked:
            try:
                with stopping.serving:
                    await pyfuse3.main()
                if stopping.serving.cancel_called:   # (the cut-off requests catch it: answered EIO)
                    log.warning("stopping: requests still in flight %g s after the signal were "
                                "cut off (answered EIO)", STOP_GRACE_S)
            except Exception as e:   # (an ExceptionGroup too) a session loop reading the aborted connection
                if not m.detached:
                    raise
                log.info("FUSE loop ended on the aborted connection: %r", e)
        nursery.cancel_scope.cancel()


def _unmount(m: _Mounted, mountpoint: str) -> None:
    """Unmount first, then flush: once the loop has stopped nobody serves the mount, and a
    flush can wait long for an unreachable master; a process touching the mount in that
    time must get an error at once, not hang."""
    import pyfuse3
    if m.notifier is not None and not m.notifier.stop():   # before close: after it, no session to go to
        _abort_stuck(m)
    try:
        pyfuse3.close(unmount=not m.detached)   # detached: nothing of ours is mounted there now
    except Exception as e:
        log.warning("unmount %s: %s", mountpoint, e)
    if m.session is not None:
        m.session.stop()
    m.vfs.close()
    m.core.close()


def _abort_stuck(m: _Mounted) -> None:
    """A notification still in the kernel after the stop answered every request it served
    waits on one the kernel holds unread (it came after the loop stopped reading), and its
    write keeps /dev/fuse open, so closing it would not end the connection: only an abort
    ends both (fusectl, mounted at start when we run as root: watchdog.ensure_fusectl)."""
    from curvine_py.fuse.notify import STOP_WAIT_S
    from curvine_py.fuse.watchdog import MountCheck
    stuck = MountCheck.find(m.real)
    if stuck is not None:
        stuck.abort()
    if m.notifier is not None and not m.notifier.idle(STOP_WAIT_S):
        log.warning("the kernel invalidation is still stuck after the abort: the daemon's exit may wait for "
                    "the connection's end")


def _serve_metrics(cfg: config.Config, ops: typing.Any) -> metrics.MetricsServer | None:
    """/metrics of this mount on fuse.metrics_port (another mount has it: an ephemeral
    port); its address is what the root's user.curvine.metrics xattr answers."""
    from curvine_py.client import metrics as cmetrics
    from curvine_py.client.metrics import ClientCollector
    try:
        served = metrics.serve("mount", cfg.fuse.metrics_bind, cfg.fuse.metrics_port,
                               [ClientCollector(ops.vfs)], fallback=True)
    except (ConfigError, OSError) as e:   # a mount without metrics still serves its files
        log.warning("metrics off: %s", e)
        return None
    if served is not None:
        cmetrics.on = True   # the client core counts from now on (client/metrics.py)
        host = cfg.fuse.metrics_bind if cfg.fuse.metrics_bind not in ("", "0.0.0.0", "::") else "127.0.0.1"
        ops.metrics_address = f"{host}:{served.port}"
    return served


def umount(mountpoint: str, timeout: float = 30.0) -> int:
    """Flush and unmount; a mount whose daemon died is detected, reported and cleaned up."""
    import subprocess
    import time

    pid_file, _ = state_paths(mountpoint)
    pid = None
    if pid_file.exists():
        try:
            pid = int(pid_file.read_text().split()[0])
        except (ValueError, IndexError):
            pid = None
    if pid is not None and pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid):
            print(f"cv umount: {mountpoint}: daemon {pid} did not exit in {timeout:.0f} s", file=sys.stderr)
            return 1
        if not is_mounted(mountpoint):
            print(f"unmounted {mountpoint}")
            return 0
        # it died without unmounting: detach below
    if not is_mounted(mountpoint):
        print(f"cv umount: {mountpoint}: not mounted", file=sys.stderr)
        return 1
    if (pid is not None and not pid_alive(pid)) or _daemon_dead(mountpoint):   # its pid file names a dead one
        print(f"cv umount: {mountpoint}: the mount daemon is gone (died?); detaching the stale mount",
              file=sys.stderr)
        detach(mountpoint)
    else:  # a live daemon we have no pid file for (another run dir): a plain unmount ends it
        r = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"cv umount: {mountpoint}: {r.stderr.strip() or 'unmount failed'}", file=sys.stderr)
            return 1
        print(f"unmounted {mountpoint}")
    if pid_file.exists():
        pid_file.unlink()
    return 0 if not is_mounted(mountpoint) else 1


def _daemon_dead(mountpoint: str) -> bool:
    """A FUSE mount whose daemon died answers ENOTCONN ('Transport endpoint is not connected')."""
    try:
        os.stat(mountpoint)
        return False
    except OSError as e:
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)


if __name__ == "__main__":
    sys.exit(main())
