"""The default block size (master.block_size, 16 MiB) makes a KV chunk one block: a 14 MiB
chunk (28-byte header + tensor, Qwen2.5-7B's 256 tokens) written through a mount with
default settings, in a plain directory, is read on a replica's host by FUSE passthrough
(docs/kvcache.md, docs/config.md).  The rest of the suite runs at 4 MiB blocks
(tests/conftest.py pins them); this module's cluster runs at the default.  Seen in the
mount's counters, not in timings."""
from __future__ import annotations

import os
import time
import typing
from pathlib import Path

import pytest

from pyfuse3_features import needs_passthrough

from curvine_py.cli.stats import scrape
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.common.config import Config, host_identity
from curvine_py.sdk import Client
from tests.conftest import FAST_MASTER_FLAGS, client_config
from tests.posix.test_posix_passthrough import write_kv   # (as LMCache's fs connector writes a chunk)

pytestmark = [pytest.mark.timeout(180), needs_passthrough,
              pytest.mark.skipif(not fuse_available(), reason="no FUSE mount here")]

MiB = 1 << 20
CHUNK = 14 * MiB + 28
PIN = "CURVINE_MASTER_BLOCK_SIZE"   # the suite's 4 MiB blocks (tests/conftest.py)


@pytest.fixture(scope="module")
def default_cluster(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[LocalCluster]:
    """Two workers and a mount with default settings on worker 0's host (a replica of
    every block), every daemon at the default block size."""
    tmp = tmp_path_factory.mktemp("defblocks")
    pinned = os.environ.pop(PIN, None)   # the daemons inherit the environment at their start
    try:
        c = LocalCluster(tmp / "cluster", workers=2, mount=str(tmp / "mnt"), die_with_parent=True,
                         extra_master_flags=FAST_MASTER_FLAGS,
                         env={"CURVINE_CLIENT_HOST": f"{host_identity('')}-w0"}).start(timeout=60)
    finally:
        if pinned is not None:
            os.environ[PIN] = pinned
    try:
        yield c
    finally:
        c.stop()


def passthrough_opens(metrics: str) -> float:
    return scrape(metrics).total("curvine_client_reads_total", source="passthrough")


def read_whole(p: Path, data: bytes, metrics: str) -> float:
    """Passthrough opens counted while p is read LMCache's way (4 KiB, then the rest)."""
    before = passthrough_opens(metrics)
    with open(p, "rb", buffering=0) as f:
        assert f.read(4096) == data[:4096] and f.read() == data[4096:]
    deadline = time.monotonic() + 5
    while passthrough_opens(metrics) == before and time.monotonic() < deadline:
        time.sleep(0.1)    # counters are read as the mount updates them
    return passthrough_opens(metrics) - before


def test_a_kv_chunk_written_with_defaults_is_one_block_read_by_the_kernel(default_cluster: LocalCluster) -> None:
    mnt = Path(default_cluster.mount or "")
    metrics = next(p.metrics for p in default_cluster.processes if p.name == "fuse")
    (mnt / "plain").mkdir()
    chunk, big = os.urandom(CHUNK), os.urandom(40 * MiB)
    write_kv(mnt / "plain" / "c.data", chunk)
    write_kv(mnt / "plain" / "big.data", big)
    with Client(master=default_cluster.master_address, config=client_config(default_cluster)) as client:
        assert client.stat("/plain/c.data").block_size == Config().master.block_size == 16 * MiB
        assert len(client.block_locations("/plain/c.data")) == 1
        assert len(client.block_locations("/plain/big.data")) == 3
    assert read_whole(mnt / "plain" / "c.data", chunk, metrics) == 1
    assert read_whole(mnt / "plain" / "big.data", big, metrics) == 0   # several blocks: through the mount
