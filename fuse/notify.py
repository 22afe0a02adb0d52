"""The kernel's side of the master's invalidations (issues 39 §2 and 41).

A mount's cache session (client/cachesession.py) gets a push from the master for every
name or attribute it holds that someone else changes, and acknowledges it before the
change's caller is answered.  The mount's own cache forgets the keys at once; without
this module the kernel kept its dentries and attributes until ``fuse.entry_timeout_s`` /
``fuse.attr_timeout_s`` ran out.  KernelNotifier tells the kernel too: a name key
becomes ``invalidate_entry(parent, name)``, an attribute key (and a directory's mode key)
``invalidate_inode(ino, attr_only=True)``.  The same for what no push will ever end: an
answer the cache refused (MetaCache.on_refused) and what it held when its session ended
(MetaCache.on_end).  What the kernel may still keep for its timeouts: docs/posix.md
"The kernel's caches".

Why a thread of its own: pyfuse3's notifications block in the kernel while a related
request is in flight (``invalidate_entry`` waits for the directory's lock that a
lookup, create, unlink or rename there holds).  Called from the trio loop or a thread a
FUSE request waits on, that is a deadlock; called from the session thread, a stuck one
would stop its beats.  So the session hands each push here and waits for it only briefly
(WAIT_S): the acknowledgement, and so the changer's answer, normally comes after the
kernel forgot, but a push that collides with a request of this mount in the same
directory (which may itself wait for the other mount's acknowledgement: a cycle) is
acknowledged without waiting, and the kernel forgets as soon as that request is done.
"""
from __future__ import annotations

import errno
import logging
import os
import queue
import threading
import time
import typing
from collections.abc import Callable

from curvine_py.client.metacache import LISTING
from curvine_py.common.types import ROOT_INO
from curvine_py.fuse import metrics
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
WAIT_S = 0.05        # how long a push's acknowledgement waits for the kernel to forget it
STOP_WAIT_S = 1.0    # how long stop() waits for a notification in the kernel to return
PUSHED, REFUSED, TOLD, LATE = (metrics.KERNEL_INVALIDATIONS.labels(k) for k in ("push", "refused", "told", "late"))


class Note(typing.NamedTuple):
    """One thing the kernel is told to forget: a name in a directory, or (name None) an
    inode's attributes; kernel inode numbers."""
    ino: int
    name: bytes | None


class KernelNotifier:
    """Turns pushes into the kernel's invalidations, in order, on one thread of its own.

    entry and inode are pyfuse3's invalidate_entry and invalidate_inode (called only
    between start and stop: after pyfuse3.close there is no session to notify)."""

    def __init__(self, root_ino: int,
                 entry: Callable[[int, bytes], None] | None = None,
                 inode: Callable[..., None] | None = None, wait_s: float = WAIT_S) -> None:
        if entry is None or inode is None:
            import pyfuse3
            entry, inode = entry or pyfuse3.invalidate_entry, inode or pyfuse3.invalidate_inode
        self.root_ino = root_ino
        self._entry, self._inode, self._wait_s = entry, inode, wait_s
        self._queue: queue.SimpleQueue[tuple[int, list[Note]] | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._submitted = self._finished = 0      # tickets: pushes handed over, and told the kernel
        self._calling = threading.Lock()           # held while the kernel is being told
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kernel-notify", daemon=True)
        self.pushes = 0          # pushes handed over (with something for the kernel)
        self.session_s = 0.0     # the session thread's time in pushed(), over them
        self.waited_out = 0      # pushes acknowledged before the kernel forgot (WAIT_S passed)
        self.refusals = 0        # refused answers and session ends handed over (refused)
        self.told = 0            # notifications the kernel took (ENOENT: it had forgotten; not counted)

    def start(self) -> "KernelNotifier":
        self._thread.start()
        return self

    def close(self) -> None:
        """No new notification from now on (a stop signal came): the one in the kernel, if
        any, is the last.  A notification waits for the locks of the requests in flight
        in its directory; once the loop stops reading /dev/fuse, one still queued there
        unread would hold it until the connection ends, and its write keeps the device
        open, so the connection never ends.  Closing at the signal leaves only the one
        already waiting, on requests the stop answers (fuse/ops.py: EIO at the grace's end)."""
        self._closed = True
        self._queue.put(None)

    def idle(self, timeout: float) -> bool:
        """Whether no notification is in the kernel, waiting up to timeout for it to return."""
        if not self._calling.acquire(timeout=timeout):
            return False
        self._calling.release()
        return True

    def stop(self) -> bool:
        """No notification after this returns (pyfuse3.close comes next); False when one
        is still held up in the kernel after STOP_WAIT_S.  Never waits longer: the thread
        is a daemon thread that nothing joins, so a notification stuck in the kernel cannot
        hold the daemon's exit in Python; in the kernel, only the connection's abort ends
        it (the caller does that, through fusectl: fuse/watchdog.py ensure_fusectl)."""
        self.close()
        finished = self.idle(STOP_WAIT_S)
        if not finished:
            log.warning("a kernel invalidation still waits in the kernel at unmount: aborting the connection")
        if self.pushes:
            log.info("kernel invalidations: %d pushes (%.1f us each in the session thread, %d not waited for "
                     "to the end), %d refused answers or session ends, %d told",
                     self.pushes, self.session_s / self.pushes * 1e6, self.waited_out, self.refusals, self.told)
        return finished

    # ------------------------------------------------------------------ the session's side
    def pushed(self, push: pb.Invalidation) -> None:
        """The session thread's hook, after the mount's cache forgot push's keys: hand
        them to the kernel, and wait up to WAIT_S for it, unless the kernel is behind
        already (an earlier push still waits for a request in flight)."""
        notes = self.notes(push)
        if not notes or self._closed:
            return
        start = time.perf_counter()
        with self._done:
            caught_up = self._finished == self._submitted
            self._submitted += 1
            ticket = self._submitted
        self._queue.put((ticket, notes))
        if caught_up:
            with self._done:
                if not self._done.wait_for(lambda: self._finished >= ticket, timeout=self._wait_s):
                    self.waited_out += 1
                    LATE.inc()
        self.pushes += 1
        PUSHED.inc()
        self.session_s += time.perf_counter() - start

    def refused(self, keys: list[pb.CacheKey]) -> None:
        """The cache's hooks (MetaCache.on_refused, on_end), from a request's thread, the
        trio loop or the session thread: a reply the cache did not keep (a change
        elsewhere raced with it), or what it held when its session ended, which the kernel
        would keep for its timeouts with no push to end that.  Queued, never waited for:
        the kernel's invalidation of a name waits until a request that holds its directory
        (the one that brought the reply) is answered, then drops what it left."""
        notes = self.notes(pb.Invalidation(keys=keys))
        if not notes or self._closed:
            return
        with self._done:
            self._submitted += 1
            ticket = self._submitted
        self._queue.put((ticket, notes))
        self.refusals += 1
        REFUSED.inc()

    def notes(self, push: pb.Invalidation) -> list[Note]:
        """What push's keys mean to the kernel (listings: nothing, the kernel keeps no
        listing; a directory's mode key: its attributes), in kernel inode numbers."""
        out: list[Note] = []
        for k in push.keys:
            ino = self.kernel_ino(k.ino)
            if ino is None or (k.entry and k.name == LISTING):
                continue
            note = Note(ino, os.fsencode(k.name) if k.entry and k.name else None)
            if note not in out:
                out.append(note)
        return out

    def kernel_ino(self, ino: int) -> int | None:
        """The kernel's number of master inode ino (fuse/ops.py's mapping reversed: the
        mount's root, maybe a --subdir, is the kernel's 1); None: not in this mount (the
        pool's root above a subdir)."""
        if ino == self.root_ino:
            return ROOT_INO
        return None if ino == ROOT_INO else ino

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._closed:
                return
            ticket, notes = item
            with self._calling:
                for note in notes:
                    if self._closed:
                        return
                    self._tell(note)
            with self._done:
                self._finished = ticket
                self._done.notify_all()

    def _tell(self, note: Note) -> None:
        try:
            if note.name is None:
                self._inode(note.ino, attr_only=True)
            else:
                self._entry(note.ino, note.name)
            self.told += 1
            TOLD.inc()
        except OSError as e:
            if e.errno != errno.ENOENT:   # ENOENT: the kernel holds nothing of it
                log.warning("kernel invalidation of %s failed: %s", note, e)
