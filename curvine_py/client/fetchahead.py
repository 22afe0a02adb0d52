"""Blocks fetched when their file is looked up (``fuse.fetch_ahead``), for the open after.

LMCache's retrieve looks up every chunk of a prompt (a ``stat`` each, in order) before it
opens and reads any of them.  A KV chunk with the KV settings is one block; the master's
Lookup reply carries that block (``LookupRequest.one_block``), so a mount can start
fetching it at the lookup, and the chunk's bytes are on their way (or in) when it is read:
its fetch overlaps the lookups and the reads of the chunks before it.  Only for a complete
file of one block with no replica on this host (a local one is read by passthrough or
short-circuit), only with a buffer the pool has at hand (never waited for), and at most
``limit`` blocks held.  When that many are held, a lookup fetches nothing unless the
oldest held block is STALE_S old (it then makes room): a prompt of more chunks than the
limit has its first ones fetched at their lookups (the reads go in the lookups' order),
the rest at their opens, and no fetch is pushed out before its read.  A lookup never
followed by an open costs one block fetch and the buffer for STALE_S, or until the pool
takes it back.  Off by default: ``ls -l`` of a directory of one-block files would fetch
them.
"""
from __future__ import annotations

import logging
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import Sequence

from curvine_py.client import metrics
from curvine_py.client.reader import CachedBlock, FileReader, start_fetch
from curvine_py.pb import curvine_pb2 as pb

if typing.TYPE_CHECKING:
    from curvine_py.client.core import ClientCore
    from curvine_py.common.buffers import BufferPool

log = logging.getLogger(__name__)

LIMIT = 8       # blocks held at most: a 1,925-token prompt is 8 chunks
STALE_S = 2.0   # a held block not opened for this long makes room for a newer lookup's


class _Ahead(typing.NamedTuple):
    block: pb.BlockInfo
    entry: CachedBlock
    pool: "BufferPool"
    at: float   # time.monotonic() of the lookup


class FetchAhead:
    """The blocks fetched at lookups, by block id, oldest first; a pool holder (cheap)."""

    def __init__(self, core: ClientCore, limit: int = LIMIT) -> None:
        self.core = core
        self.limit = limit
        self._lock = threading.Lock()
        self._held: OrderedDict[int, _Ahead] = OrderedDict()
        self._pools: set[int] = set()   # ids of the pools this is a holder of

    def after_lookup(self, attr: pb.Attr, blocks: Sequence[pb.BlockInfo]) -> None:
        """Start fetching the looked-up file's block if it qualifies (never waits: this
        runs on the mount's event loop)."""
        if not attr.complete or len(blocks) != 1:
            return
        block = blocks[0]
        if block.offset or block.length != attr.size or not block.length \
                or self.core.paths.local_replica(block) is not None:
            return
        pool = self.core.buffer_pool(attr.block_size or self.core.cfg.master.block_size)
        if block.length > pool.size:
            return
        now = time.monotonic()
        with self._lock:
            if block.block_id in self._held:
                return
            stale = self._make_room(now)
            if stale is False:
                return
        if stale is not None:
            _retire(stale)
        raw = pool.acquire_nowait()
        if raw is None:
            return
        entry = start_fetch(self.core, attr.ino, block, raw)
        with self._lock:
            if id(pool) not in self._pools:
                self._pools.add(id(pool))
                pool.hold(self, cheap=True)
            self._held[block.block_id] = _Ahead(block, entry, pool, now)
            over = [self._held.popitem(last=False)[1] for _ in range(max(0, len(self._held) - self.limit))]
        for a in over:   # lookups racing on the loop and in threads: rarely more than the limit
            _retire(a)
        if metrics.on:
            metrics.LOOKUP_FETCHES.inc()

    def _make_room(self, now: float) -> "_Ahead | None | typing.Literal[False]":
        """(lock held) None: there is room; the oldest held block, taken out to make room
        (STALE_S old); False: full of fresh ones, fetch nothing."""
        if len(self._held) < self.limit:
            return None
        oldest = next(iter(self._held.values()))
        if now - oldest.at < STALE_S:
            return False
        return self._held.pop(oldest.block.block_id)

    def hand_over(self, reader: FileReader) -> None:
        """Give an opened file's reader the blocks fetched at its lookup (same version:
        same block id, length and checksum)."""
        for idx, block in list(reader.blocks.items()):
            with self._lock:
                a = self._held.get(block.block_id)
                if a is None or a.pool is not reader.pool or a.block.length != block.length \
                        or a.block.checksum != block.checksum:
                    continue
                del self._held[block.block_id]
            failed = a.entry.future.done() and a.entry.future.exception() is not None
            if not failed and reader.adopt(idx, a.entry):   # a failed one: the reader fetches anew
                if metrics.on:
                    metrics.LOOKUP_FETCH_HITS.inc()
            else:
                _retire(a)

    def reclaim(self) -> bool:
        """A pool ran dry: give back the oldest fetched block whose fetch is over."""
        with self._lock:
            bid = next((b for b, a in self._held.items() if a.entry.future.done()), None)
            if bid is None:
                return False
            a = self._held.pop(bid)
        _retire(a)
        return True

    def close(self) -> None:
        with self._lock:
            held = list(self._held.values())
            self._held.clear()
        for a in held:
            _retire(a)


def _retire(a: _Ahead) -> None:
    """Give a block nobody adopted back to its pool once its fetch is over."""
    if not a.entry.future.done():
        a.entry.future.add_done_callback(lambda _f: _retire(a))
        return
    if a.entry.retired:
        return
    a.entry.retired = True
    a.entry.view.release()
    a.pool.release(a.entry.raw)
