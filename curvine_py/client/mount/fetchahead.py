"""Blocks fetched when their file is looked up (``fuse.fetch_ahead``), for the open after.

LMCache's retrieve looks up every chunk of a prompt (a ``stat`` each, in order) before it
opens and reads any of them.  A KV chunk with the KV settings is one block; the master's
Lookup reply carries that block (``LookupRequest.one_block``), so a mount can start
fetching it at the lookup, and the chunk's bytes are on their way (or in) when it is read:
its fetch overlaps the lookups and the reads of the chunks before it.  Only for a complete
file of one block with no replica on this host (a local one is read by passthrough or
short-circuit), one fetch at a time in lookup order, only with a buffer the pool has at
hand (never waited for), and at most ``limit`` blocks queued or held.  When that many
are, a lookup queues nothing unless the oldest is STALE_S old (it then makes room): a
prompt of more chunks than the limit has its first ones fetched from their lookups (the
reads go in the lookups' order), the rest at their opens, and no fetch is pushed out
before its read.  A lookup never
followed by an open costs one block fetch and the buffer for STALE_S, or until the pool
takes it back.  Off by default: ``ls -l`` of a directory of one-block files would fetch
them.

A fetch starts only in a pause of the lookups (``Lookups``): none running, and none for
QUIET_S or an open since the last one.  Started at each lookup, the fetches ran beside the
run of stats they came from and slowed every one of them (on 2 cores they take the CPU,
the GIL and the worker that the lookups' round trips need): LMCache's 32-chunk lookup of
2 MiB chunks took 32-33 ms against 22-24 without fetch_ahead, 23-24 with the fetches
started in its pauses (bench/kv_lookup.py).  The stats of a run follow each other within
microseconds, so the fetches start at the first open after it or QUIET_S after its last
stat; the file opened then fetches its block itself (its queued fetch is dropped for it,
never made twice).
"""
from __future__ import annotations

import logging
import threading
import time
import typing
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from curvine_py.client import metrics
from curvine_py.client.mount.lookups import Lookups
from curvine_py.client.reader import CachedBlock, FileReader, start_fetch
from curvine_py.pb import curvine_pb2 as pb

if typing.TYPE_CHECKING:
    from curvine_py.client.core import ClientCore
    from curvine_py.common.buffers import BufferPool

log = logging.getLogger(__name__)

LIMIT = 8       # blocks queued or held at most: a 1,925-token prompt is 8 chunks
IN_FLIGHT = 1   # fetches at once: in lookup order, so the first chunk read is the first in
STALE_S = 2.0   # a held block not opened for this long makes room for a newer lookup's


def readable(core: ClientCore, block: pb.BlockInfo) -> pb.BlockInfo | None:
    """block, unless the cluster uses read tokens and it carries none: without one the
    caller may not read the file (its open will fail), so nothing is fetched ahead."""
    return None if core.cfg.cluster.secret and not block.token else block


class _Ahead(typing.NamedTuple):
    ino: int
    block: pb.BlockInfo
    pool: "BufferPool"
    at: float                     # time.monotonic() of the lookup
    entry: CachedBlock | None     # None: queued, its fetch not started


class FetchAhead:
    """The blocks of looked-up files, by block id in lookup order: fetched IN_FLIGHT at a
    time (eight fetches at once on 2 cores made every chunk late, the first one read
    included), each started in a pause of the lookups (by a thread of its own, which
    waits for it), then held for the open; a pool holder (cheap)."""

    def __init__(self, core: ClientCore, limit: int = LIMIT, lookups: Lookups | None = None) -> None:
        self.core = core
        self.limit = limit
        self.lookups = lookups if lookups is not None else Lookups()
        self._lock = threading.Lock()
        self._held: OrderedDict[int, _Ahead] = OrderedDict()
        self._running = 0
        self._closed = False
        self._kicked = False    # a _dispatch is queued or waits for a pause of the lookups
        self._starter: ThreadPoolExecutor | None = None   # runs _dispatch (made at the first lookup queued)

    def fetch_ahead(self, attr: pb.Attr, block: pb.BlockInfo) -> None:
        """Queue a looked-up one-block file's block, which has no replica here and may be
        read (MountOpens.after_lookup tells once), its fetch to start in the next pause of
        the lookups (never waits: this runs on the mount's event loop)."""
        pool = self.core.buffer_pool(attr.block_size or self.core.cfg.master.block_size)
        if block.length > pool.size:
            return
        now = time.monotonic()
        with self._lock:
            if self._closed or block.block_id in self._held:
                return
            stale = self._make_room(now)
            if stale is False:
                return
            self._held[block.block_id] = _Ahead(attr.ino, block, pool, now, None)
        pool.hold(self, cheap=True)   # (a weak set: holding again is nothing)
        if stale is not None:
            _retire(stale)
        self._kick()

    def _make_room(self, now: float) -> "_Ahead | None | typing.Literal[False]":
        """(lock held) None: there is room; the oldest entry, taken out to make room
        (STALE_S old); False: full of fresh ones, queue nothing."""
        if len(self._held) < self.limit:
            return None
        oldest = next(iter(self._held.values()))
        if now - oldest.at < STALE_S:
            return False
        return self._held.pop(oldest.block.block_id)

    def _kick(self) -> None:
        """Have the queued fetches started in the next pause of the lookups, unless that
        is asked already or IN_FLIGHT run (the end of one kicks again)."""
        with self._lock:
            if self._closed or self._kicked or self._running >= IN_FLIGHT \
                    or all(a.entry is not None for a in self._held.values()):
                return
            self._kicked = True
            if self._starter is None:
                self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fetch-ahead")
            starter = self._starter
        starter.submit(self._dispatch)

    def _dispatch(self) -> None:
        """(the starter's thread) Wait for a pause of the lookups, then start fetches."""
        try:
            self.lookups.wait_quiet(lambda: self._closed)
            with self._lock:
                self._kicked = False
            self._pump()
        except Exception:   # a background hint: never let it die silently
            log.exception("starting fetches ahead")

    def _pump(self) -> None:
        """(the starter's thread) Start the oldest queued fetches while fewer than
        IN_FLIGHT run (a queued block that finds no buffer at hand is dropped: its open
        fetches it)."""
        while True:
            with self._lock:
                if self._closed or self._running >= IN_FLIGHT:
                    return
                a = next((x for x in self._held.values() if x.entry is None), None)
                if a is None:
                    return
                raw = a.pool.acquire_nowait()
                if raw is None:
                    del self._held[a.block.block_id]
                    continue
                entry = start_fetch(self.core, a.ino, a.block, raw)
                self._held[a.block.block_id] = a._replace(entry=entry)
                self._running += 1
            entry.future.add_done_callback(self._fetched)
            if metrics.on:
                metrics.LOOKUP_FETCHES.inc()

    def _fetched(self, _future: object) -> None:
        with self._lock:
            self._running -= 1
        self._kick()

    def hand_over(self, reader: FileReader) -> None:
        """Give an opened file's reader the blocks fetched (or being fetched) since its
        lookup (same version: same block id, length and checksum); one still queued is
        dropped, the reader fetches it itself."""
        for idx, block in list(reader.blocks.items()):
            with self._lock:
                a = self._held.get(block.block_id)
                if a is None:
                    continue
                del self._held[block.block_id]
            if a.entry is None or a.pool is not reader.pool or a.block.length != block.length \
                    or a.block.checksum != block.checksum:
                _retire(a)
                continue
            failed = a.entry.future.done() and a.entry.future.exception() is not None
            if not failed and reader.adopt(idx, a.entry):   # a failed one: the reader fetches anew
                if metrics.on:
                    metrics.LOOKUP_FETCH_HITS.inc()
            else:
                _retire(a)

    def reclaim(self) -> bool:
        """A pool ran dry: give back the oldest fetched block whose fetch is over."""
        with self._lock:
            bid = next((b for b, a in self._held.items() if a.entry is not None and a.entry.future.done()), None)
            if bid is None:
                return False
            a = self._held.pop(bid)
        _retire(a)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held = list(self._held.values())
            self._held.clear()
            starter, self._starter = self._starter, None
        if starter is not None:
            starter.shutdown(wait=False, cancel_futures=True)
        for a in held:
            _retire(a)


def _retire(a: _Ahead) -> None:
    """Give a block nobody adopted back to its pool once its fetch is over."""
    entry = a.entry
    if entry is None:
        return
    if not entry.future.done():
        entry.future.add_done_callback(lambda _f: _retire(a))
        return
    if entry.retired:
        return
    entry.retired = True
    entry.view.release()
    a.pool.release(entry.raw)
