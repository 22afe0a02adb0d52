"""FUSE passthrough: the kernel reads a file's local block file (or staged copy) by itself.

A read through the mount costs a round trip per 1 MiB request (the kernel, pyfuse3, the
event loop, a copy of the reply), which bounds a KV chunk's read well below the disk's
speed.  Since Linux 6.9 a FUSE server may answer an open with a *backing file*
(``FOPEN_PASSTHROUGH``): reads and mmaps of that open then go from the kernel straight
to the backing file and never reach us.  A file that is one block with a replica on
this host (a KV chunk written with blocks at least its size) is the block's file byte
for byte, so its open is answered with that file, verified first
(``VFS.backing_file``, ``ShortCircuit.open_verified``).  The worker never overwrites a
block file somebody has open (``worker/blockstore.unshared``), so the bytes the kernel
reads stay those that were verified.  A file with no replica here is answered the same
way with a copy of its block fetched into memory first (``fuse.stage_remote``,
client/mount/staging.py), made at start when that is on.

The kernel's rules (fs/fuse/iomode.c) this module keeps:

* An inode has at most one backing file, and while it has one, every open of it must
  be a passthrough open of that file, else the open fails with EIO.  Later read-only
  opens share the first one's backing id; an open for writing fails with ETXTBSY (as
  for a running program's file: a writable open would reach the block file itself
  through mmap).  Writers on other hosts are not affected; readers here keep reading
  the version they opened, as readers of a block list do.
* A passthrough open fails while the inode is open in caching mode, so passthrough is
  only tried for an inode with no other handle open here.

The backing id is registered with ``FUSE_DEV_IOC_BACKING_OPEN`` on the session's
``/dev/fuse`` descriptor (root only) and closed with the inode's last passthrough
handle.  Needs the pyfuse3 built by ``deploy/build-pyfuse3.sh``.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import pyfuse3
import trio

from curvine_py.client.mount.policy import MountOpens
from curvine_py.client.vfs import VFS, Opened, opens_for_writing

log = logging.getLogger(__name__)

# _IOW(229, 1, struct fuse_backing_map {int32 fd; uint32 flags; uint64 padding})
BACKING_OPEN = 0x4010E501
# _IOW(229, 2, uint32 backing id)
BACKING_CLOSE = 0x4004E502

Run = Callable[..., Awaitable[Any]]


@dataclass
class Backing:
    """One inode's backing file as the kernel knows it."""
    backing_id: int
    handles: set[int] = field(default_factory=set)


class Passthrough:
    """Backing files of the inodes this mount hands to the kernel."""

    def __init__(self, vfs: VFS, dev_fd: int, run: Run) -> None:
        self.vfs = vfs
        self.dev_fd = dev_fd
        self.run = run            # runs a blocking call in a worker thread
        self.enabled = True       # off for good after the kernel refuses a registration
        self._by_ino: dict[int, Backing] = {}
        self._ino_of: dict[int, int] = {}   # fh -> ino, for the handles given a backing
        self._locks: defaultdict[int, trio.Lock] = defaultdict(trio.Lock)

    def lock(self, ino: int) -> trio.Lock:
        """Serializes the opens of one inode: each decides from what the others left."""
        return self._locks[ino]

    def unlock(self, ino: int) -> None:
        """Forget the inode's lock after an open if nothing needs it (no backing, no waiter)."""
        lock = self._locks.get(ino)
        if lock is not None and ino not in self._by_ino and not lock.locked() \
                and not lock.statistics().tasks_waiting:
            del self._locks[ino]

    def check_open(self, ino: int, flags: int) -> None:
        """Refuse an open the kernel would fail with EIO (ETXTBSY says why)."""
        if ino in self._by_ino and opens_for_writing(flags):
            raise pyfuse3.FUSEError(errno.ETXTBSY)

    async def attach(self, ino: int, opened: Opened, fi: pyfuse3.FileInfo) -> None:
        """Give fi the inode's backing file when it has or can have one."""
        have = self._by_ino.get(ino)
        if have is None:
            if not opened.backed:
                return
            if not (self.enabled and self.vfs.open_handles(ino) == 1):
                self.vfs.read_normally(opened.fh)   # (a staged block's memory goes back)
                return
            have = await self._register(ino, opened.fh)
            if have is None:
                return
        have.handles.add(opened.fh)
        self._ino_of[opened.fh] = ino
        fi.backing_id = have.backing_id
        fi.direct_io = False      # with direct_io the kernel would send reads to us again
        fi.keep_cache = False

    async def _register(self, ino: int, fh: int) -> Backing | None:
        fd = await self.run(self.vfs.backing_file, fh)
        if fd is None:
            return None
        try:
            bid = fcntl.ioctl(self.dev_fd, BACKING_OPEN, bytearray(struct.pack("=iIQ", fd, 0, 0)), True)
        except OSError as e:
            self.enabled = False
            log.warning("FUSE passthrough turned off: the kernel refused a backing file (%s)", e)
            self.vfs.read_normally(fh)
            self.vfs.stop_staging()   # nothing staged could be handed to the kernel now
            return None
        finally:
            os.close(fd)      # the kernel holds the file now
        backing = self._by_ino[ino] = Backing(bid)
        return backing

    def release(self, fh: int) -> None:
        """A handle went away; the inode's last one lets go of its backing id."""
        ino = self._ino_of.pop(fh, None)
        if ino is None:
            return
        backing = self._by_ino[ino]
        backing.handles.discard(fh)
        if backing.handles:
            return
        del self._by_ino[ino]
        self.unlock(ino)
        try:
            fcntl.ioctl(self.dev_fd, BACKING_CLOSE, bytearray(struct.pack("=I", backing.backing_id)), True)
        except OSError as e:
            log.warning("closing backing id %d: %s", backing.backing_id, e)


def start(vfs: VFS, run: Run) -> Passthrough | None:
    """The mount's passthrough, if the kernel took it at init (pyfuse3 built with it)."""
    enabled = getattr(pyfuse3, "passthrough_enabled", None)
    if enabled is None or not enabled():
        return None
    if isinstance(vfs.opens, MountOpens):   # (always, in a mount)
        vfs.opens.start_passthrough()
    return Passthrough(vfs, pyfuse3.session_fd_number(), run)
