"""KV directories (issue 43 s2; docs/kvcache.md): `cv fs mkdir --kv` / `cv fs policy --kv`
mark a directory; what is made under it copies the mark (Attr.kv), a file there has
blocks of at least 16 MiB unless its client names a block size, so a KV chunk is one
block and a mount with default flags on a replica's host hands it to the kernel by FUSE
passthrough, where the same chunk outside the directory is read through the mount.  Seen
in the mount's counters, not in timings."""
from __future__ import annotations

import os
import subprocess
import time
import typing
from pathlib import Path

import pytest

from pyfuse3_features import needs_passthrough

from curvine_py.cli.stats import scrape
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.common.config import host_identity
from curvine_py.common.policy import KV, KV_BLOCK_SIZE
from curvine_py.sdk import Client
from tests.conftest import CV, FAST_MASTER_FLAGS, client_config
from tests.posix.test_posix_passthrough import write_kv   # (as LMCache's fs connector writes a chunk)

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
DEFAULT_BS = 4 * MiB


@pytest.fixture(scope="module")
def kv_cluster(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[LocalCluster]:
    """Two workers and (where FUSE works) a mount with default [fuse] settings on worker 0's
    host: it holds a replica of every block (two workers, two replicas)."""
    tmp = tmp_path_factory.mktemp("kvdir")
    c = LocalCluster(tmp / "cluster", workers=2, mount=str(tmp / "mnt") if fuse_available() else None,
                     die_with_parent=True, extra_master_flags=FAST_MASTER_FLAGS,
                     env={"CURVINE_CLIENT_HOST": f"{host_identity('')}-w0"}).start(timeout=60)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def client(kv_cluster: LocalCluster) -> typing.Iterator[Client]:
    with Client(master=kv_cluster.master_address, config=client_config(kv_cluster)) as c:
        yield c


def cv(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CURVINE_MASTER": cluster.master_address}
    return subprocess.run([CV, "fs", *args], capture_output=True, text=True, env=env, timeout=60)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr.strip()


def test_the_mark_is_copied_down_and_makes_one_block_files(client: Client) -> None:
    client.mkdir("/kvm", kv=True)
    client.mkdir("/kvm/sub")
    client.put_bytes("/kvm/sub/a.data", os.urandom(5 * MiB))
    client.put_bytes("/kvm/sub/own.data", os.urandom(5 * MiB), block_size=8 * MiB)   # the client's size stays
    client.mkdir("/plainm")
    client.put_bytes("/plainm/a.data", os.urandom(5 * MiB))
    assert client.stat("/kvm/sub/a.data").block_size == KV_BLOCK_SIZE
    assert len(client.block_locations("/kvm/sub/a.data")) == 1
    assert client.stat("/kvm/sub/own.data").block_size == 8 * MiB
    assert client.stat("/plainm/a.data").block_size == DEFAULT_BS
    assert len(client.block_locations("/plainm/a.data")) == 2
    pol = client.cache_policy("/kvm/sub/a.data")
    assert pol.kv and pol.kv_from == "/kvm"
    assert not client.cache_policy("/plainm/a.data").kv
    assert client.getxattr("/kvm/sub", KV) == b"1" and KV in client.listxattr("/kvm/sub/a.data")

    client.set_kv("/kvm", False)   # new files no longer KV; what is there keeps its mark
    client.put_bytes("/kvm/b.data", os.urandom(5 * MiB))
    assert client.stat("/kvm/b.data").block_size == DEFAULT_BS
    assert not client.cache_policy("/kvm/b.data").kv
    assert client.cache_policy("/kvm/sub/a.data").kv_from == "/kvm/sub"   # its run now starts at sub


def test_cli_marks_shows_and_clears(kv_cluster: LocalCluster) -> None:
    assert cv(kv_cluster, "mkdir", "--kv", "/kvc").returncode == 0
    assert cv(kv_cluster, "mkdir", "/kvc/d").returncode == 0
    out = cv(kv_cluster, "stat", "/kvc/d").stdout
    assert "kv:" in out and "yes (from /kvc)" in out, out
    assert "yes (from /kvc)" in cv(kv_cluster, "policy", "/kvc/d").stdout
    assert cv(kv_cluster, "policy", "/kvc", "--no-kv").returncode == 0
    assert cv(kv_cluster, "policy", "/kvc/d", "--no-kv").returncode == 0
    assert "kv:" in cv(kv_cluster, "stat", "/kvc/d").stdout and "yes" not in cv(kv_cluster, "policy", "/kvc/d").stdout
    assert cv(kv_cluster, "policy", "/kvc/d", "--kv").returncode == 0
    assert '"kv": true' in cv(kv_cluster, "stat", "/kvc/d", "--json").stdout
    assert "no such" in one_line_error(cv(kv_cluster, "policy", "/nowhere", "--kv")).lower()
    one_line_error(cv(kv_cluster, "policy", "/kvc", "--kv", "--no-kv"))
    with Client(master=kv_cluster.master_address, config=client_config(kv_cluster)) as c:
        with pytest.raises(Exception, match="bad user.curvine.kv"):
            c.setxattr("/kvc", KV, b"maybe")


def passthrough_opens(metrics: str) -> float:
    return scrape(metrics).total("curvine_client_reads_total", source="passthrough")


@needs_passthrough
@pytest.mark.skipif(not fuse_available(), reason="no FUSE mount here")
def test_a_default_mount_on_a_replicas_host_hands_kv_chunks_to_the_kernel(kv_cluster: LocalCluster,
                                                                         client: Client) -> None:
    """A 6 MiB chunk (over the default 4 MiB block) under a KV directory is one block, so a
    mount with default flags on a replica's host answers its open by passthrough; the same
    chunk outside is two blocks, read through the mount (short-circuit) as before."""
    mnt = Path(kv_cluster.mount or "")
    metrics = next(p.metrics for p in kv_cluster.processes if p.name == "fuse")
    (mnt / "kvr").mkdir()
    os.setxattr(mnt / "kvr", KV, b"1")                  # as `cv fs policy --kv`, through the mount
    (mnt / "plainr").mkdir()
    chunk = os.urandom(6 * MiB + 28)
    write_kv(mnt / "kvr" / "c.data", chunk)
    write_kv(mnt / "plainr" / "c.data", chunk)
    assert client.stat("/kvr/c.data").block_size == KV_BLOCK_SIZE
    assert len(client.block_locations("/kvr/c.data")) == 1
    assert len(client.block_locations("/plainr/c.data")) == 2

    def read(p: Path) -> float:
        """Passthrough opens counted while p is read whole, LMCache's way."""
        before = passthrough_opens(metrics)
        with open(p, "rb", buffering=0) as f:
            assert f.read(4096) == chunk[:4096] and f.read() == chunk[4096:]
        deadline = time.monotonic() + 5
        while passthrough_opens(metrics) == before and time.monotonic() < deadline:
            time.sleep(0.1)    # counters are read as the mount updates them
        return passthrough_opens(metrics) - before

    assert read(mnt / "plainr" / "c.data") == 0
    assert read(mnt / "kvr" / "c.data") == 1
