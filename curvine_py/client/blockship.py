"""Storing one whole block on its workers: the write of a block that is not streamed (or
whose stream fell back), with its retries.

A block is written under a fresh block id each attempt: a failed attempt may have left
bytes on some worker, and blocks never change, so a retry asks the master for another
block on other workers (``elsewhere``; or on the same ones when a worker refused the
block's write token as expired: the new id comes with a fresh token).  A worker out of space gets more attempts, with
waits, while the master's eviction frees room.  A replica on this host goes by
short-circuit when the client has it (client/blockpaths.py chooses).  The caller (client/writer.py
``FileWriter._send``) owns the buffer and the writer's sticky error.
"""
from __future__ import annotations

import errno
import logging
import typing

from curvine_py.client.core import ClientCore
from curvine_py.common.errors import CurvineError
from curvine_py.common.retry import Failed, Retry
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
WRITE_ATTEMPTS = 3
NOSPACE_RETRIES = 30   # a worker out of space: ~13 s of backoff while the master's eviction frees room


def _nospace(e: BaseException) -> bool:
    return isinstance(e, CurvineError) and e.errno == errno.ENOSPC


def _write_attempts(e: BaseException) -> int:
    """How many attempts a block write gets in all, the latest having failed with e.  A
    worker out of space (ENOSPC: the master's view of usage lags a heartbeat) gets more,
    with waits (_write_wait), while eviction frees room.  When nothing can be evicted the
    master answers ENOSPC itself, to the allocation of the next block, which ends the
    retries (the allocation runs in Retry.before_retry)."""
    return NOSPACE_RETRIES + 1 if _nospace(e) else WRITE_ATTEMPTS


def _write_wait(attempt: int, e: BaseException) -> float:
    """Out of space: 0.05 s more after each attempt, up to 0.5 s; any other failure: at once."""
    return min(0.05 * attempt, 0.5) if _nospace(e) else 0.0


def store_block(core: ClientCore, offset: int, data: memoryview, target: pb.BlockInfo,
                owned: memoryview | None,
                elsewhere: typing.Callable[[pb.BlockInfo, BaseException], pb.BlockInfo]) -> pb.BlockInfo:
    """Store data, the block at file offset `offset`, as target (then as the block
    elsewhere(failed target, its error) gives, for each retry); the stored block's record.  owned: the
    pooled buffer data lives in, when the short-circuit path may hand it to the local worker."""
    where = [target]   # the block being written: a new one, on other workers, for each retry

    def retrying(failed: Failed) -> None:
        log.warning("block %d: %s; retrying on other workers", where[0].block_id, failed.error)

    def moved(failed: Failed) -> None:   # what this raises (the master's ENOSPC) is not retried
        where[0] = elsewhere(where[0], failed.error)

    policy = Retry(transient=lambda e: isinstance(e, CurvineError), attempts=_write_attempts, wait=_write_wait,
                   before_sleep=retrying, before_retry=moved)
    return policy.call(_store_once, core, offset, data, where, owned)


def _store_once(core: ClientCore, offset: int, data: memoryview, where: list[pb.BlockInfo],
                owned: memoryview | None) -> pb.BlockInfo:
    """One attempt: the block where[0] on its workers, a replica on this host by short-circuit."""
    target = where[0]
    acked, checksum = core.paths.writer.write(core.workers.of(target), target, data, owned)
    return pb.BlockInfo(block_id=target.block_id, offset=offset, length=len(data),
                        checksum=checksum, workers=acked, token=target.token)
