"""One FUSE mount daemon per (cluster, pool directory) on a node, shared by bind mounts.

Layout under the state dir (``--state-dir``, default /var/lib/curvine-csi)::

    mounts/<slug>-<hash>   the staging dir where that daemon's FUSE mount is
    run/                   the daemons' pid files (their CURVINE_RUN_DIR)
    logs/<slug>-<hash>.log each daemon's log

A published volume is a bind mount of its staging mount at the CO's target path.  The
reference count of a staging mount is the number of other mounts with its device number
in /proc/self/mountinfo: nothing is counted in memory, so a driver restarted (or killed)
with volumes published finds every one again, and the daemons, started with ``cv mount``
(which double-forks into its own session), never were its children: they go on serving.
The daemon is unmounted (``cv umount``: open files flushed) when its last bind goes.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import typing
from dataclasses import dataclass
from pathlib import Path

import grpc

from curvine_py.csi.common import Cluster, CsiError
from curvine_py.common.mounttable import MountEntry, mount_at, read_mounts
from curvine_py.csi.mounts import FUSE_TYPE, MountError, bind, remove_dir, same_device, unmount
from curvine_py.cluster.processes import pid_alive

log = logging.getLogger("curvine.csi")

MOUNT_TIMEOUT_S = 60.0      # `cv mount` returns once the daemon serves (or failed)
UMOUNT_TIMEOUT_S = 60.0     # open files are flushed first
CV = [sys.executable, "-m", "curvine_py.cli.main"]
Code = grpc.StatusCode


@dataclass(frozen=True)
class Published:
    """What the mount table says of one target path."""
    target: MountEntry
    staging: MountEntry | None   # the staging mount with the target's device (None: its daemon's mount is gone)


class StagingMounts:
    """The node's staging mounts and binds, as the mount table shows them."""

    def __init__(self, state_dir: str | Path, config_path: str | None = None) -> None:
        state = Path(state_dir)
        for sub in ("mounts", "run", "logs"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        # Real paths once, before anything is mounted below: later the staging dirs are
        # FUSE mount points, and resolving a path through a hung one would block.
        self.mounts_dir = os.path.realpath(state / "mounts")
        self.run_dir = os.path.realpath(state / "run")
        self.log_dir = os.path.realpath(state / "logs")
        self.config_path = config_path
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._daemons: set[int] = set()   # pids seen, for reap() only (never for decisions)

    # ------------------------------------------------------------------ naming
    def staging_path(self, cluster: Cluster, subdir: str) -> str:
        """The staging dir of (cluster, subdir): readable, and unique by a hash of both."""
        digest = hashlib.sha256(f"{cluster.master}\0{subdir}".encode()).hexdigest()[:12]
        slug = "".join(c if c.isalnum() or c in "-." else "_" for c in subdir.strip("/"))[:48] or "root"
        return os.path.join(self.mounts_dir, f"{slug}-{digest}")

    def is_staging(self, point: str) -> bool:
        return os.path.dirname(point) == self.mounts_dir

    @contextlib.contextmanager
    def locked(self, key: str) -> typing.Iterator[None]:
        """One publish or unpublish at a time per staging dir (the gRPC server has threads)."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            yield

    # ------------------------------------------------------------------ the mount table
    def staging_of(self, mounts: list[MountEntry], dev: str) -> MountEntry | None:
        for m in same_device(mounts, dev):
            if self.is_staging(m.point) and m.fstype == FUSE_TYPE:
                return m
        return None

    def binds_of(self, mounts: list[MountEntry], staging: MountEntry) -> list[MountEntry]:
        return [m for m in same_device(mounts, staging.dev) if not self.is_staging(m.point)]

    def published(self, target: str) -> Published | None:
        mounts = read_mounts()
        entry = mount_at(mounts, target)
        if entry is None:
            return None
        return Published(entry, self.staging_of(mounts, entry.dev))

    def daemon_pid(self, staging: str) -> int | None:
        """The live daemon serving staging, from the pid files it writes ("pid\\npath")."""
        for pid_file in Path(self.run_dir).glob("*.pid"):
            try:
                pid_text, path = pid_file.read_text().split("\n")[:2]
                pid = int(pid_text)
            except (OSError, ValueError):
                continue
            if path == staging and pid_alive(pid):
                self._daemons.add(pid)
                return pid
        return None

    def reap(self) -> None:
        """A container's PID 1 inherits the daemons when `cv mount` exits, and must reap the
        ones that ended (a zombie looks alive: `cv umount` would wait for it in vain)."""
        for pid in list(self._daemons):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:   # not our child: its own parent reaps it
                done = pid
            if done:
                self._daemons.discard(pid)

    def live_staging(self, mounts: list[MountEntry], staging: str) -> MountEntry | None:
        entry = mount_at(mounts, staging)
        if entry is None or entry.fstype != FUSE_TYPE or self.daemon_pid(staging) is None:
            return None
        return entry

    # ------------------------------------------------------------------ publish / unpublish
    def publish(self, cluster: Cluster, subdir: str, target: str, readonly: bool) -> None:
        """Bind the (cluster, subdir) staging mount at target, starting its daemon if needed."""
        staging = self.staging_path(cluster, subdir)
        with self.locked(staging):
            mounts = read_mounts()
            live = self.live_staging(mounts, staging)
            current = mount_at(mounts, target)
            if current is not None:
                self._check_republish(current, live, target, subdir, readonly)
                return
            started = live is None
            if started:
                self._start(staging, cluster, subdir, mounts)
            os.makedirs(target, exist_ok=True)
            try:
                bind(staging, target, readonly)
            except MountError as e:
                if started:
                    self._release(staging)
                raise CsiError(Code.INTERNAL, f"bind mount of {staging} at {target}: {e}") from None
        log.info("published %s at %s%s (staging %s)", subdir, target, " read-only" if readonly else "", staging)

    @staticmethod
    def _check_republish(current: MountEntry, live: MountEntry | None, target: str, subdir: str,
                         readonly: bool) -> None:
        """The spec's idempotency: the same volume, as asked, at target is OK; anything else there
        is ALREADY_EXISTS."""
        if live is None or current.dev != live.dev:
            raise CsiError(Code.ALREADY_EXISTS, f"{target} is already a mount point ({current.fstype} "
                                                f"{current.source}), not of volume {subdir}")
        if current.readonly != readonly:
            raise CsiError(Code.ALREADY_EXISTS, f"volume {subdir} is published at {target} "
                                                f"{'read-only' if current.readonly else 'read-write'}")

    def unpublish(self, target: str) -> None:
        """Unmount and remove target; stop its staging daemon when no other bind is left."""
        found = self.published(target)
        if found is None:   # not mounted (already unpublished, or never): the directory goes
            remove_dir(target)
            return
        if found.target.fstype != FUSE_TYPE:
            raise CsiError(Code.FAILED_PRECONDITION, f"{target} is a {found.target.fstype} mount of "
                                                     f"{found.target.source}, not a curvine volume: left alone")
        key = found.staging.point if found.staging is not None else target
        with self.locked(key):
            if mount_at(read_mounts(), target) is not None:
                try:
                    unmount(target)
                except MountError as e:
                    raise CsiError(Code.INTERNAL, f"umount {target}: {e}") from None
            remove_dir(target)
            if found.staging is not None:
                self._release(found.staging.point)
        log.info("unpublished %s", target)

    # ------------------------------------------------------------------ daemons
    def _start(self, staging: str, cluster: Cluster, subdir: str, mounts: list[MountEntry]) -> None:
        """`cv mount --subdir` at staging; a stale mount there (its daemon died) is detached first."""
        if mount_at(mounts, staging) is not None:
            log.warning("%s: the mount daemon is gone; detaching its stale mount", staging)
            with contextlib.suppress(MountError):
                unmount(staging)
        os.makedirs(staging, exist_ok=True)
        name = os.path.basename(staging)
        cmd = [*CV, "mount", staging, "--subdir", subdir, "--master", cluster.master,
               "--log-file", os.path.join(self.log_dir, f"{name}.log")]
        if self.config_path:
            cmd += ["--config", self.config_path]
        env = dict(os.environ, CURVINE_RUN_DIR=self.run_dir)
        if cluster.secret:   # the environment, not the command line: ps shows every argv
            env["CURVINE_CLUSTER_SECRET"] = cluster.secret
        r = _run_cv(cmd, env, MOUNT_TIMEOUT_S)
        if r is not None:
            remove_dir(staging)
            code = Code.UNAVAILABLE if "cannot reach master" in r else Code.INTERNAL
            raise CsiError(code, f"mounting {subdir} of {cluster.master}: {r}")
        log.info("mount daemon %s serves %s of %s at %s", self.daemon_pid(staging), subdir, cluster.master, staging)

    def _release(self, staging: str) -> None:
        """Stop the daemon of staging if no bind of it is left."""
        mounts = read_mounts()
        entry = mount_at(mounts, staging)
        if entry is not None and self.binds_of(mounts, entry):
            return
        if entry is not None:
            r = _run_cv([*CV, "umount", staging, "--timeout", str(int(UMOUNT_TIMEOUT_S))],
                        dict(os.environ, CURVINE_RUN_DIR=self.run_dir), UMOUNT_TIMEOUT_S + 10)
            if r is not None and mount_at(read_mounts(), staging) is not None:
                raise CsiError(Code.INTERNAL, f"umount {staging}: {r}")
            log.info("mount daemon at %s stopped: its last volume was unpublished", staging)
        remove_dir(staging)

    def recover(self) -> None:
        """At start: report the staging mounts found in the mount table (they keep serving
        their binds), stop those no bind uses any more (a publish or unpublish cut short)."""
        mounts = read_mounts()
        for entry in mounts:
            if not (self.is_staging(entry.point) and entry.fstype == FUSE_TYPE):
                continue
            binds = self.binds_of(mounts, entry)
            pid = self.daemon_pid(entry.point)
            log.info("found staging mount %s (daemon %s): %d volume(s) published%s", entry.point,
                     pid or "gone", len(binds), "".join(f"\n  {b.point}" for b in binds))
            if not binds:
                try:
                    with self.locked(entry.point):
                        self._release(entry.point)
                except CsiError as e:   # the next unpublish or start tries again
                    log.warning("%s", e.message)
        for leftover in Path(self.mounts_dir).iterdir():   # dirs of staging mounts gone meanwhile
            if mount_at(mounts, str(leftover)) is None:
                with contextlib.suppress(OSError):
                    leftover.rmdir()


def _run_cv(cmd: list[str], env: dict[str, str], timeout: float) -> str | None:
    """Run a cv command; None on success, else its last line of error output."""
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd[3:5])}: no answer in {timeout:.0f} s"
    if r.returncode == 0:
        return None
    lines = (r.stderr.strip() or r.stdout.strip() or f"exit status {r.returncode}").splitlines()
    return lines[-1]




def fuse_ready() -> str | None:
    """Why this node cannot mount (None: it can): the node service's Probe."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (the node plugin's container needs it: privileged, or the device mounted)"
    for tool in ("mount", "umount", "fusermount3"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed on this node"
    return None
