"""The block ids one writer holds: asked for from the master in batches, spent one per
block written (client/writer.py).

Blocks never change, so every block written, and every retry of one, takes a new id
(with its workers and write token) from an ``AllocateBlocks`` call.  Ids come in batches
that double as the file grows (up to 64, or the caller's hint of how many blocks it will
write), so a large file costs a master call per many blocks.  An allocation whose answer
never came (the mount's loop stopped while it was on its way) is sent again as it was,
request id and all, since the master may have applied it: a retried request id is
answered from the master's retry cache, never allocated twice.
"""
from __future__ import annotations

import errno
import typing

from curvine_py.client import metrics
from curvine_py.client.core import ClientCore
from curvine_py.client.metaclient import Identity
from curvine_py.common.errors import CurvineError
from curvine_py.common.security import token_expired
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master

MAX_BATCH = 64


class BlockIds:
    """Not locked: the writer's lock serializes take/allocate; `received` alone runs on
    the mount's loop, and its list extend is atomic under the GIL."""

    def __init__(self, core: ClientCore, ino: int, lease_id: int, ident: Identity | None,
                 bound: typing.Callable[[], None]) -> None:
        self.core, self.ino, self.lease_id, self.ident = core, ino, lease_id, ident
        self._bound = bound          # the master may have made the lease binding (any answer but ESTALE)
        self._spare: list[pb.BlockInfo] = []
        self._batch = 2
        self.expected = 0            # a hint: how many blocks the caller will write
        self._unanswered: pb.AllocateBlocksRequest | None = None

    @property
    def at_hand(self) -> bool:
        """An id is here: a block can be started without a master call."""
        return bool(self._spare)

    def take(self) -> pb.BlockInfo:
        """The next id, a batch asked for first when none is left."""
        if not self._spare:
            self._spare = self.allocate(self._grow())
        return self._spare.pop(0)

    def put_back(self, block: pb.BlockInfo) -> None:
        """An id taken and not used: the next take gives it again."""
        self._spare.insert(0, block)

    def fill(self) -> None:
        """Ask for a batch now (a soft lease's first allocation makes it binding)."""
        self._spare.extend(self.allocate(self._grow()))

    def allocate(self, count: int, exclude: list[int] | None = None) -> list[pb.BlockInfo]:
        """count new ids (on workers other than exclude), from the master, in a thread."""
        request, self._unanswered = self._unanswered, None
        if request is None or exclude:
            request = self.core.meta.allocate_request(self.ino, self.lease_id, count, exclude, ident=self.ident,
                                                      unreachable=self.core.unreachable_workers())
        try:
            reply = self.core.meta.call(Master.AllocateBlocks, request)
        except CurvineError as e:
            if e.errno != errno.ESTALE:   # the master may have applied it (and made the lease hard)
                self._bound()
            raise
        return self._learn(reply)

    def replace(self, failed: pb.BlockInfo, error: BaseException) -> pb.BlockInfo:
        """A new id for a block whose write failed with error, on other workers than
        failed's (client/blockship.py) -- unless a worker refused its token as expired:
        those workers are fine, and the spare ids, minted in the same batch, have expired
        too (dropped: the master frees ids never committed, as it does failed ones)."""
        if token_expired(error):
            metrics.TOKEN_RENEWALS.labels("write").inc()
            self._spare.clear()
            return self.allocate(1)[0]
        return self.allocate(1, exclude=list(failed.workers))[0]

    def request(self) -> pb.AllocateBlocksRequest:
        """A batch's AllocateBlocks for the mount's loop to send (then received or unanswered)."""
        self._unanswered = self.core.meta.allocate_request(self.ino, self.lease_id, self._grow(), ident=self.ident,
                                                           unreachable=self.core.unreachable_workers())
        return self._unanswered

    def received(self, reply: pb.AllocateBlocksReply) -> None:
        """The answer to request() came (on the mount's loop)."""
        self._unanswered = None
        self._spare.extend(self._learn(reply))   # atomic under the GIL; take pops under the writer's lock

    def refused(self) -> None:
        """request() failed for good: nothing to send again."""
        self._unanswered = None

    def _learn(self, reply: pb.AllocateBlocksReply) -> list[pb.BlockInfo]:
        """The ids an AllocateBlocks gave; it also made the lease hard at the master."""
        self._bound()
        self.core.workers.learn(list(reply.workers))
        return list(reply.blocks)

    def _grow(self) -> int:
        self._batch = min(MAX_BATCH, max(self._batch * 2, self.expected))
        return self._batch
