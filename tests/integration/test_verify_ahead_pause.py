"""A check ahead (client/mount/localfiles.py) starts in a pause of the mount's lookups, not
beside them: with every 14 MiB KV chunk one block (the default block size), checks started
at each of a prompt's stats made the stats 4-10x slower on a replica's host
(docs/kvcache.md "The default block size").  Through a real local cluster, with the
mount's own lookup (tests/integration/test_verify_ahead.py's helpers)."""
from __future__ import annotations

import os
import time
import typing

from tests.integration.test_verify_ahead import ONE_BLOCK, lookup, mount_vfs, opens_of, settled

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client


def test_a_check_ahead_waits_for_the_lookups_to_pause(local_client: "Client", remote_dir: str) -> None:
    local_client.put_bytes(f"{remote_dir}/chunk", os.urandom(ONE_BLOCK))
    vfs, sc = mount_vfs(local_client)
    try:
        before = sc.stats()["ahead"]
        lookups = opens_of(vfs).lookups
        with lookups:                       # another lookup still running (a run of stats)
            lookup(vfs, f"{remote_dir}/chunk")
            time.sleep(0.3)                 # ~100 checks' time at page-cache speed
            assert sc.stats()["ahead"] == before, "a check ran beside a lookup"
        settled(vfs)                        # the pause (2 ms with no lookup) lets it start
        assert sc.stats()["ahead"] == before + 1
    finally:
        vfs.close()


def test_an_open_lets_the_checks_start_at_once(local_client: "Client", remote_dir: str) -> None:
    """The reads begin: the checks need not wait out the pause (LMCache opens the first
    chunk right after its stats)."""
    local_client.put_bytes(f"{remote_dir}/chunk", os.urandom(ONE_BLOCK))
    vfs, sc = mount_vfs(local_client)
    try:
        before = sc.stats()["ahead"]
        lookups = opens_of(vfs).lookups
        lookups.quiet_s = 30.0              # a pause that never comes within the test
        lookup(vfs, f"{remote_dir}/chunk")
        time.sleep(0.3)
        assert sc.stats()["ahead"] == before
        lookups.opened()
        settled(vfs)
        assert sc.stats()["ahead"] == before + 1
    finally:
        vfs.close()
