"""Files the kernel reads by itself from a local block file, and their checks ahead of the open.

A mount with FUSE passthrough (fuse/passthrough.py) answers the open of a complete file
that is exactly one block with a replica on this host with that replica's block file,
after checking it whole (``ShortCircuit.open_verified``: every chunk's xxh3, ~2-3 ms for
a 14 MiB KV chunk, memory-bound, once per block and mount).

LMCache looks every chunk of a prompt up before it reads any (one stat each, in prefix
order, BRIEF.md), so the lookup is the earliest sign of a read: the mount's lookups ask
the master for a one-block file's block too (``LookupRequest.one_block``), and a file
that qualifies has its block file checked in the background (``after_lookup``), hashed
at idle priority by a helper process (client/mount/checker.py).  The open then finds the
block verified, or waits for the check already running (lending it normal priority)
instead of starting another; a cold block's disk read (``fadvise``) starts at the
lookup too.  The queue is bounded, so a listing of a large directory of chunks costs at
most AHEAD_QUEUE checks at a time, and each file version is checked ahead once.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from curvine_py.client.mount.checker import Checker
from curvine_py.client.mount.lookups import Lookups
from curvine_py.client.core import ClientCore
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master


log = logging.getLogger(__name__)

AHEAD_QUEUE = 16       # checks queued or running at most; later lookups leave theirs to the open
AHEAD_SEEN = 4096      # file versions remembered as checked ahead (bounded LRU)


def one_block(attr: pb.Attr, blocks: Sequence[pb.BlockInfo], flags: int = 0) -> pb.BlockInfo | None:
    """The file's only block when the file is complete and exactly that block (not empty),
    and not opened O_DIRECT (a backing file would be read with it, which needs aligned
    reads): what the kernel can be given as a backing file, or a lookup can fetch whole."""
    if not attr.complete or flags & os.O_DIRECT or len(blocks) != 1 or not attr.size:
        return None
    block = blocks[0]
    return None if block.offset or block.length != attr.size else block


class LocalFiles:
    """Which files qualify for the kernel's own reads, and their checks ahead."""

    def __init__(self, core: ClientCore, ahead: bool, lookups: Lookups | None = None) -> None:
        self.core = core
        self.enabled = False      # set by a mount whose kernel takes backing files (passthrough.start)
        self.ahead = ahead        # fuse.verify_ahead
        self.lookups = lookups    # the mount's lookups: a check starts only in a pause of them
        self._closed = False
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._queued = 0          # checks queued or running
        self._todo: deque[pb.BlockInfo] = deque()   # queued, in lookup order
        self._draining = False    # the checks' thread takes them (_drain)
        self._pool: ThreadPoolExecutor | None = None
        self._checker = Checker()     # hashes at idle priority in a process of its own

    def block_of(self, attr: pb.Attr, blocks: Sequence[pb.BlockInfo], flags: int = 0) -> pb.BlockInfo | None:
        """The file's only block (one_block) if the kernel may read its local replica's
        file: one with a replica on this host."""
        if not self.enabled or self.core.paths.shortcircuit is None:
            return None
        block = one_block(attr, blocks, flags)
        return block if block is not None and self.core.paths.local_replica(block) is not None else None

    def warm(self) -> None:
        """Ahead of the first open: what the checks need of this host's workers, and the
        checker process (~50 ms to start)."""
        sc = self.core.paths.shortcircuit
        if sc is None:
            return
        if self.ahead:
            self._checker.start()
            with self._lock:   # its thread too: started at a fresh mount's first check, it cost that lookup ~0.1 ms
                pool = None if self._closed else self._thread()
            if pool is not None:
                pool.submit(int)
        try:
            ring = self.core.meta.call(Master.GetRing, pb.Empty())
        except CurvineError as e:
            log.info("workers not learned ahead of the first open (%s)", e)
            return
        self.core.workers.learn(list(ring.workers))
        sc.warm(list(ring.workers))

    @property
    def wanted(self) -> bool:
        """Lookups should ask the master for a one-block file's block (LookupRequest.one_block)."""
        return self.ahead and self.enabled

    def check_ahead(self, attr: pb.Attr, block: pb.BlockInfo) -> None:
        """Queue the check of a looked-up file's only block, which has a replica here
        (block_of's answer), unless checked ahead already or AHEAD_QUEUE are queued.  On
        the mount's event loop at every lookup of a run of stats, so it only appends to
        the queue: one thread, started once per run (not a task submitted per check, ~10
        us each), takes the checks in order in the lookups' pause."""
        if not self.wanted:
            return
        key = (attr.ino, attr.generation)
        with self._lock:
            if self._closed or key in self._seen or self._queued >= AHEAD_QUEUE:
                return
            self._seen[key] = None
            while len(self._seen) > AHEAD_SEEN:
                self._seen.popitem(last=False)
            self._queued += 1
            self._todo.append(block)
            if self._draining:
                return
            self._draining = True
            pool = self._thread()
        pool.submit(self._drain)

    def _thread(self) -> ThreadPoolExecutor:
        """(lock held) The checks' thread (made once)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-ahead")
        return self._pool

    def _drain(self) -> None:
        """(the checks' thread) Check the queued blocks in lookup order, each in a pause
        of the lookups, until none is left."""
        while True:
            with self._lock:
                if not self._todo:
                    self._draining = False
                    return
                block = self._todo.popleft()
            self._check(block)

    def _check(self, block: pb.BlockInfo) -> None:
        # Not beside the lookups: LMCache stats a prompt's chunks, then opens them; with
        # every 14 MiB chunk one block (the default block size), checks started at each
        # lookup made 32 stats on a replica's host 45-57 ms against 4 ms without them.
        # The pause (or the first open) comes before the reads that want the checks.
        try:
            if self.lookups is not None:
                self.lookups.wait_quiet(lambda: self._closed)
            if self._closed:
                return
            self._checker.idle()      # again: an open waiting for the last check lent it normal priority
            sc, addr = self.core.paths.shortcircuit, self.core.paths.local_replica(block)
            if sc is not None and addr is not None:
                # a failure is logged there; the open tries again
                sc.verify(addr, block, self._checker.sums, self._checker.boost)
        except Exception:   # a background hint: never let it die silently
            log.exception("checking block %d ahead", block.block_id)
        finally:
            with self._lock:
                self._queued -= 1

    def close(self) -> None:
        self._closed = True
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._checker.close()

