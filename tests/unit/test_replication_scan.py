"""The periodic re-replication scan walks the blocks a slice per tick (a pool of millions
of blocks must not hold the master's housekeeping thread for seconds), finds every
under-replicated block across slices, and starts a new pass only after its interval."""
from __future__ import annotations

import sqlite3
import time

from curvine_py.common.security import BlockTokens
from curvine_py.master.replication import Replicator
from curvine_py.master.schema import SCHEMA, name_key


class _Registry:
    """Replica locations as the master's registry answers them (no live worker holds
    the blocks of `lost`)."""

    def __init__(self, lost: set[int]) -> None:
        self.lost = lost

    def replicas(self, bid: int) -> list[int]:
        return [] if bid in self.lost else [1, 2]


def _db(nblocks: int) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.create_function("name_key", 1, name_key, deterministic=True)   # (dirents_name's key: schema.open_db does this)
    conn.executescript(SCHEMA)
    conn.execute("INSERT INTO inodes (ino, mode, uid, gid, atime_ns, mtime_ns, ctime_ns, replicas) "
                 "VALUES (5, 33188, 0, 0, 0, 0, 0, 2)")
    conn.executemany("INSERT INTO blocks (ino, idx, block_id, length, checksum) VALUES (5, ?, ?, 1, 0)",
                     [(i, 100 + 3 * i) for i in range(nblocks)])
    return conn


def test_a_scan_is_sliced_and_finds_every_under_replicated_block() -> None:
    lost = {100, 103, 157, 196}        # 4 of the 33 blocks (ids 100, 103, ..., 196)
    conn = _db(33)
    rep = Replicator(_Registry(lost), placement=None, tokens=BlockTokens(""),  # type: ignore[arg-type]
                     grace_s=0.0, scan_interval_s=3600.0, scan_slice=10)
    assert sorted(rep.scan(conn)) == sorted(lost)             # the whole pass at once (cv report)
    assert rep.scan_slice(conn, -1) == ([100, 103], 127)
    assert rep.scan_slice(conn, 127) == ([157], 157)
    assert rep.scan_slice(conn, 187) == ([196], None)          # the last, short slice ends the pass

    seen: list[int] = []
    rep.suspect = seen.extend                                  # type: ignore[method-assign]
    for _ in range(4):                                         # 33 blocks: 4 slices of 10
        rep.tick(conn)
    assert sorted(seen) == sorted(lost) and rep._scan_after is None
    rep.tick(conn)                                             # the next pass waits for its interval
    assert sorted(seen) == sorted(lost)
    rep._next_scan = time.monotonic()
    rep.tick(conn)
    assert seen[len(lost):] == [100, 103]                      # a new pass, from the lowest id
