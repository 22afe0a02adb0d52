"""`Client.put_bytes` keeps the previous content when it fails (issue 42, item 3).

It used to open the file with O_TRUNC first, so a wrong type emptied an existing file and
a full pool emptied a pinned one.  Now the new blocks replace the old ones in one Commit:
on any failure the file is as it was, and the new content is never visible in part.
"""
from __future__ import annotations

import errno
import os
import threading
import time
import typing

import pytest

from curvine_py.common.errors import CurvineError
from curvine_py.cluster.local import LocalCluster
from curvine_py.sdk import Client
from tests.conftest import client_config
from tests.integration.test_eviction import EVICT_FLAGS, payload

MiB = 1 << 20


def test_a_wrong_type_and_a_full_pool_leave_the_old_content(cluster_factory: typing.Callable[..., LocalCluster]
                                                            ) -> None:
    c = cluster_factory(capacity="48MiB", extra_master_flags=EVICT_FLAGS)
    client = Client(master=c.master_address, config=client_config(c))
    try:
        client.mkdir("/keep")
        client.pin("/keep")
        old = payload(1, 8 * MiB)
        client.put_bytes("/keep/big", old)
        with pytest.raises(TypeError):
            client.put_bytes("/keep/big", "not bytes")  # type: ignore[arg-type]  # the mistake under test
        assert client.get_bytes("/keep/big") == old
        with pytest.raises(CurvineError) as e:   # only pinned files left: no room for the new blocks
            for i in range(40):
                client.put_bytes(f"/keep/fill{i}", payload(10 + i, 4 * MiB))
        assert e.value.errno == errno.ENOSPC
        with pytest.raises(CurvineError) as e:
            client.put_bytes("/keep/big", payload(2, 24 * MiB))
        assert e.value.errno == errno.ENOSPC
        assert client.stat("/keep/big").size == len(old)
        assert client.get_bytes("/keep/big") == old
    finally:
        client.close()


def test_a_worker_killed_mid_put_leaves_old_or_new_whole(cluster: LocalCluster) -> None:
    client = Client(master=cluster.master_address, config=client_config(cluster))
    try:
        old, new = os.urandom(16 * MiB), os.urandom(192 * MiB)
        client.put_bytes("/replaced", old)
        outcome: list[BaseException | None] = []

        def put() -> None:
            try:
                client.put_bytes("/replaced", new)
                outcome.append(None)
            except CurvineError as e:
                outcome.append(e)

        t = threading.Thread(target=put)
        t.start()
        time.sleep(0.3)   # blocks on their way
        cluster.kill_worker(1)
        t.join(120)
        assert outcome, "the put did not end"
        got = client.get_bytes("/replaced")
        assert got == (old if outcome[0] is not None else new), \
            f"{len(got)} bytes after {'a failed' if outcome[0] else 'a successful'} put"
    finally:
        client.close()
