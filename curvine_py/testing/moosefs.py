"""A MooseFS cluster across network-namespace hosts: the peer `bench/compare` measures us against.

MooseFS (Debian's ``moosefs-master``, ``moosefs-chunkserver``, ``moosefs-client``, 3.0) is a
C master + chunkservers + FUSE client keeping 2 copies: the closest runnable peer to our
shape.  Everything here is private to one directory: each daemon gets its own config
file (``-c``), data path and lock file, and runs in the foreground (``-f``) as a process
tracked by the Hosts run, so teardown kills it even when the caller crashes.  Chunkservers
refuse to register from a loopback address, hence the namespaces: the master runs on one
host, each chunkserver on another, the mounts wherever the caller says.  Every namespace
has its own ports, so the default ones (9419-9422) are used.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
import typing
from pathlib import Path

from curvine_py.common.mounttable import detach, is_mounted

if typing.TYPE_CHECKING:
    from curvine_py.testing.testhosts import Host, Hosts

PACKAGES = ("moosefs-master", "moosefs-chunkserver", "moosefs-client")
BINARIES = ("mfsmaster", "mfschunkserver", "mfsmount", "mfssetgoal", "mfsfileinfo")
CLIENT_PORT = 9421
START_TIMEOUT_S = 60.0


class MooseFSError(Exception):
    """A MooseFS daemon did not start or a mount did not appear (the message says which)."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def install() -> str | None:
    """apt-get install the packages when a binary is missing; why it failed, or None."""
    if not missing_binaries():
        return None
    if shutil.which("apt-get") is None:
        return "MooseFS is not installed and there is no apt-get"
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    r = subprocess.run(["apt-get", "install", "-y", "-q", *PACKAGES], capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"apt-get install {' '.join(PACKAGES)} failed: {tail}"
    missing = missing_binaries()
    return f"still missing after apt-get: {', '.join(missing)}" if missing else None


def _write_cfg(path: Path, settings: dict[str, object]) -> Path:
    path.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
    return path


class MooseFS:
    """Master on hosts[master_host], one chunkserver per chunk host, mounts on demand."""

    def __init__(self, hosts: "Hosts", directory: str | Path, master_host: int = 0,
                 chunk_hosts: typing.Sequence[int] = (1, 2)) -> None:
        self.hosts = hosts
        self.dir = Path(directory).absolute()
        self.master = hosts[master_host]
        self.chunk_hosts = [hosts[i] for i in chunk_hosts]
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.mounts: list[Path] = []

    # ------------------------------------------------------------ daemons

    def _spawn(self, host: "Host", name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = self.dir / f"{name}.log"
        with open(log, "ab") as f:
            p = host.popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
        self.procs.append((name, p, log))
        return p

    def _check_alive(self) -> None:
        for name, p, log in self.procs:
            if p.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise MooseFSError(f"MooseFS {name} exited with status {p.returncode}:\n{tail}")

    def start(self) -> "MooseFS":
        """Write the configs, start master and chunkservers, wait until the master serves."""
        self.dir.mkdir(parents=True, exist_ok=True)
        run_as = {"WORKING_USER": "root", "WORKING_GROUP": "root", "NICE_LEVEL": 0,
                  "LOCK_MEMORY": 0, "DISABLE_OOM_KILLER": 0}
        mdir = self.dir / "master"
        mdir.mkdir(exist_ok=True)
        (mdir / "metadata.mfs").write_bytes(b"MFSM NEW")        # an empty filesystem
        exports = self.dir / "mfsexports.cfg"
        exports.write_text("*\t/\trw,alldirs,admin,maproot=0:0\n")
        topology = self.dir / "mfstopology.cfg"
        topology.write_text("")
        cfg = _write_cfg(self.dir / "mfsmaster.cfg", {
            **run_as, "DATA_PATH": mdir, "EXPORTS_FILENAME": exports, "TOPOLOGY_FILENAME": topology,
            "ATIME_MODE": 4, "REPLICATIONS_DELAY_INIT": 0})
        self._spawn(self.master, "master", ["mfsmaster", "-f", "-c", str(cfg), "start"])
        self._wait_port(self.master.ip, CLIENT_PORT)
        for i, host in enumerate(self.chunk_hosts):
            cdir = self.dir / f"chunkserver{i}"
            (cdir / "hdd").mkdir(parents=True, exist_ok=True)
            hdd = self.dir / f"mfshdd{i}.cfg"
            hdd.write_text(f"{cdir / 'hdd'}\n")
            ccfg = _write_cfg(self.dir / f"mfschunkserver{i}.cfg", {
                **run_as, "DATA_PATH": cdir, "HDD_CONF_FILENAME": hdd, "MASTER_HOST": self.master.ip,
                "BIND_HOST": host.ip, "HDD_LEAVE_SPACE_DEFAULT": "256MiB"})
            self._spawn(host, f"chunkserver{i}", ["mfschunkserver", "-f", "-c", str(ccfg), "start"])
        return self

    def _wait_port(self, ip: str, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            self._check_alive()
            try:
                socket.create_connection((ip, port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise MooseFSError(f"MooseFS master on {ip}:{port} did not listen within "
                                       f"{START_TIMEOUT_S:.0f} s") from None
                time.sleep(0.1)

    # ------------------------------------------------------------ mounts

    def mount(self, host: int, mountpoint: str | Path, *options: str) -> Path:
        """mfsmount in the foreground inside hosts[host]; returns once it is in the mount table."""
        mp = Path(mountpoint).absolute()
        mp.mkdir(parents=True, exist_ok=True)
        self.hosts.track_mount(str(mp))
        argv = ["mfsmount", "-f", str(mp), "-H", self.master.ip, "-P", str(CLIENT_PORT)]
        for opt in options:
            argv += ["-o", opt]
        self._spawn(self.hosts[host], f"mount-{mp.name}", argv)
        self.mounts.append(mp)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not is_mounted(str(mp)):
            self._check_alive()
            if time.monotonic() > deadline:
                raise MooseFSError(f"mfsmount at {mp} did not appear within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        return mp

    def unmount(self, mountpoint: str | Path) -> None:
        """Unmount one mount (its mfsmount -f then ends by itself); stop() skips it."""
        mp = Path(mountpoint).absolute()
        if is_mounted(str(mp)):
            subprocess.run(["umount", str(mp)], capture_output=True, timeout=30)
        detach(str(mp))
        self.mounts = [m for m in self.mounts if m != mp]

    def set_goal(self, host: int, path: str | Path, goal: int = 2) -> None:
        """Copies per chunk for path and everything created below it.

        The tools talk to the master as the mount's session, from the mount's host.
        """
        r = self.hosts[host].run(["mfssetgoal", "-r", str(goal), str(path)], capture_output=True,
                                 text=True, timeout=60)
        if r.returncode != 0:
            raise MooseFSError(f"mfssetgoal {goal} {path}: {r.stderr.strip() or r.stdout.strip()}")

    def wait_copies(self, host: int, mountpoint: str | Path, copies: int = 2) -> None:
        """Wait until a new file gets `copies` copies: every chunkserver has registered."""
        probe = Path(mountpoint) / ".mfs-probe"
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                self._check_alive()
                probe.write_bytes(b"probe" * 1000)
                info = self.hosts[host].run(["mfsfileinfo", str(probe)], capture_output=True,
                                            text=True, timeout=30).stdout
                if info.count("copy ") >= copies:
                    return
                probe.unlink()
                if time.monotonic() > deadline:
                    raise MooseFSError(f"MooseFS chunks did not get {copies} copies within "
                                       f"{START_TIMEOUT_S:.0f} s (chunkservers not registered):\n{info}")
                time.sleep(0.5)
        finally:
            probe.unlink(missing_ok=True)

    # ------------------------------------------------------------ teardown

    def stop(self) -> None:
        """Unmount, then stop chunkservers and master (SIGTERM, then SIGKILL); idempotent."""
        for mp in self.mounts:          # a clean unmount ends mfsmount -f by itself
            if is_mounted(str(mp)):
                subprocess.run(["umount", str(mp)], capture_output=True, timeout=30)
            detach(str(mp))
        for _name, p, _ in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for _name, p, _ in reversed(self.procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        for mp in self.mounts:          # detach checks the mount table itself
            detach(str(mp))
        self.mounts, self.procs = [], []
