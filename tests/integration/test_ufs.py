"""UFS mounts end to end: a real cluster (master + 2 workers, real sockets) in front of a
shared directory (file://, the NAS case) and of real S3 servers (moto, SeaweedFS) on loopback.

What a user relies on: objects written behind our back read byte-exact (SDK, `cv fs get`,
the mount), by block (a small read caches one block, not the object), new after the
metadata TTL when overwritten, again after eviction or the loss of every replica;
write-through puts the object in the UFS at close, write-back soon after and across a
master SIGKILL; `cv load` / `cv fs free`; bad mounts refused with one line; a UFS that is
down fails reads of uncached data with EIO in bounded time, cached data still reads.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from curvine_py.common.errors import CurvineError
from curvine_py.cluster.local import LocalCluster
from curvine_py.sdk import Client

from tests.conftest import START_TIMEOUT_S, client_config, client_on_host, start_cluster

MiB = 1 << 20
BLOCK = 4 * MiB
CV = [str(Path(sys.executable).parent / "cv")]  # the console script of this venv


def data(n: int, seed: int = 0) -> bytes:
    return (bytes(range(256)) * (n // 256 + 2))[seed % 256:][:n]


def rand(n: int) -> bytes:
    return os.urandom(n)


def wait_for(cond: typing.Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def cv(c: LocalCluster, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CURVINE_MASTER": c.master_address, "CURVINE_CLUSTER_SECRET": c.secret}
    r = subprocess.run([*CV, *args], capture_output=True, text=True, env=env, timeout=120)
    if check and r.returncode:
        raise AssertionError(f"cv {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


@pytest.fixture(scope="module")
def ufs_cluster(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[LocalCluster]:
    """A cluster whose masters upload write-back files quickly (tests wait less)."""
    old = {k: os.environ.get(k) for k in ("CURVINE_UFS_UPLOAD_DELAY_S", "CURVINE_UFS_TIMEOUT_S")}
    os.environ["CURVINE_UFS_UPLOAD_DELAY_S"] = "0.2"
    os.environ["CURVINE_UFS_TIMEOUT_S"] = "5"
    try:
        c = start_cluster(tmp_path_factory.mktemp("ufs") / "cluster")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def client(ufs_cluster: LocalCluster) -> typing.Iterator[Client]:
    c = Client(master=ufs_cluster.master_address, config=client_config(ufs_cluster))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def nas(tmp_path: Path) -> Path:
    d = tmp_path / "nas"
    d.mkdir()
    return d


def mount_point(request: pytest.FixtureRequest) -> str:
    return "/u/" + "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:60] + os.urandom(2).hex()


# ---------------------------------------------------------------- read-through (NAS)

def test_files_written_behind_our_back_read_byte_exact(client: Client, ufs_cluster: LocalCluster, nas: Path,
                                                       request: pytest.FixtureRequest, tmp_path: Path) -> None:
    (nas / "a").mkdir()
    big = rand(3 * BLOCK + 12345)
    (nas / "a" / "big.bin").write_bytes(big)
    (nas / "small.txt").write_bytes(b"hello ufs\n")
    (nas / "empty").write_bytes(b"")
    mp = mount_point(request)
    info = client.ufs.mount(f"file://{nas}", mp)
    assert info.write_mode == "through" and info.path == mp
    assert sorted(client.listdir(mp)) == ["a", "empty", "small.txt"]
    assert client.stat(f"{mp}/a/big.bin").size == len(big)
    assert client.get_bytes(f"{mp}/a/big.bin") == big
    assert client.get_bytes(f"{mp}/small.txt") == b"hello ufs\n"
    assert client.get_bytes(f"{mp}/empty") == b""
    out = tmp_path / "got"
    cv(ufs_cluster, "fs", "get", f"{mp}/a/big.bin", str(out), check=True)
    assert out.read_bytes() == big
    st = client.ufs.stat(f"{mp}/a/big.bin")
    assert st.uri == f"file://{nas}/a/big.bin" and st.state == "persisted" and st.cached_bytes == len(big)
    r = cv(ufs_cluster, "fs", "stat", f"{mp}/a/big.bin")
    assert r.returncode == 0 and f"file://{nas}/a/big.bin" in r.stdout and "persisted" in r.stdout
    mounts = json.loads(cv(ufs_cluster, "ufs", "ls", "--json", check=True).stdout)
    assert any(m["path"] == mp and m["uri"] == f"file://{nas}" for m in mounts)


def test_a_small_read_caches_one_block_not_the_object(client: Client, nas: Path,
                                                      request: pytest.FixtureRequest) -> None:
    body = rand(8 * BLOCK)
    (nas / "obj").write_bytes(body)
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp)
    with client.open(f"{mp}/obj") as f:
        f.seek(5 * BLOCK + 1000)
        assert f.read(4096) == body[5 * BLOCK + 1000:5 * BLOCK + 5096]
    wait_for(lambda: client.ufs.stat(f"{mp}/obj").cached_bytes == BLOCK, 10, "one block reported cached")
    time.sleep(0.5)
    assert client.ufs.stat(f"{mp}/obj").cached_bytes == BLOCK


def test_an_object_changed_behind_our_back_reads_new_after_the_ttl(client: Client, nas: Path,
                                                                   request: pytest.FixtureRequest) -> None:
    (nas / "f").write_bytes(b"old contents")
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp, metadata_ttl_s=1)
    assert client.get_bytes(f"{mp}/f") == b"old contents"
    time.sleep(0.05)
    (nas / "f").write_bytes(b"new, longer contents")
    (nas / "g").write_bytes(b"appeared")
    time.sleep(1.2)
    assert client.get_bytes(f"{mp}/f") == b"new, longer contents"
    assert client.get_bytes(f"{mp}/g") == b"appeared"
    (nas / "g").unlink()
    time.sleep(1.2)
    assert "g" not in client.listdir(mp)


def test_cached_ufs_blocks_are_read_from_the_local_block_file(ufs_cluster: LocalCluster, client: Client,
                                                               nas: Path, request: pytest.FixtureRequest) -> None:
    """A fetched UFS block has checksum 0 at the master (cut from the object): a reader on a
    worker's host still reads its replica there by short-circuit, verified against the
    sidecar the worker wrote from the fetched bytes."""
    body = rand(2 * BLOCK + 3)
    (nas / "sc").write_bytes(body)
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp)
    assert client.get_bytes(f"{mp}/sc") == body
    wait_for(lambda: client.ufs.stat(f"{mp}/sc").cached_bytes == len(body), 10, "cached")
    # cached_bytes counts a block once one replica is stored; the copy forwarded to the
    # other worker may come later, and a reader on worker 0's host needs its own
    ino = client.stat(f"{mp}/sc").ino
    wait_for(lambda: all(len(b.workers) == 2 for b in client.core.meta.block_locations(ino).blocks), 10,
             "both replicas of every block")
    with client_on_host(ufs_cluster, ufs_cluster.worker_host(0)) as local:
        sc = local.core.paths.shortcircuit
        assert sc is not None
        assert local.get_bytes(f"{mp}/sc") == body
        assert sc.stats()["reads"] >= 1 and sc.stats()["fallbacks"] == 0, sc.stats()


def test_freed_and_lost_files_read_again(client: Client, ufs_cluster: LocalCluster, nas: Path,
                                         request: pytest.FixtureRequest) -> None:
    body = rand(2 * BLOCK + 7)
    (nas / "x").write_bytes(body)
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp)
    assert client.get_bytes(f"{mp}/x") == body
    wait_for(lambda: client.ufs.stat(f"{mp}/x").cached_bytes == len(body), 10, "cached")
    r = cv(ufs_cluster, "fs", "free", mp, "-r", check=True)
    assert "freed 1 files" in r.stdout
    assert client.ufs.stat(f"{mp}/x").cached_bytes == 0
    assert client.get_bytes(f"{mp}/x") == body
    # every replica lost: both workers die and come back with empty disks
    wait_for(lambda: client.ufs.stat(f"{mp}/x").cached_bytes == len(body), 10, "cached again")
    for i in range(2):
        ufs_cluster.kill_worker(i)
        shutil.rmtree(ufs_cluster.worker_dir_spec(i).split("]")[-1])
    for i in range(2):
        ufs_cluster.restart_worker(i)
    with Client(master=ufs_cluster.master_address, config=client_config(ufs_cluster)) as fresh:
        assert fresh.get_bytes(f"{mp}/x") == body


# ---------------------------------------------------------------- writes

def test_write_through_puts_the_object_in_the_ufs_at_close(client: Client, nas: Path,
                                                           request: pytest.FixtureRequest) -> None:
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp)
    body = rand(BLOCK + 99)
    client.mkdir(f"{mp}/d")
    assert (nas / "d").is_dir()
    client.put_bytes(f"{mp}/d/x.tmp", body)
    assert (nas / "d" / "x.tmp").read_bytes() == body          # at close, not later
    assert client.ufs.stat(f"{mp}/d/x.tmp").state == "persisted"
    client.rename(f"{mp}/d/x.tmp", f"{mp}/d/x.data")
    assert not (nas / "d" / "x.tmp").exists() and (nas / "d" / "x.data").read_bytes() == body
    assert client.get_bytes(f"{mp}/d/x.data") == body
    client.remove(f"{mp}/d/x.data")
    assert not (nas / "d" / "x.data").exists()
    client.rmdir(f"{mp}/d")
    assert not (nas / "d").exists()
    with pytest.raises(CurvineError) as e:
        client.symlink("/x", f"{mp}/link")
    assert e.value.errno == errno.EOPNOTSUPP


def test_an_append_to_an_uncached_object_keeps_its_other_blocks(client: Client, nas: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    """Appending rewrites only the last block: the untouched, uncached ones are fetched from
    the old object before the upload replaces it."""
    old = rand(2 * BLOCK + BLOCK // 2)
    (nas / "log").write_bytes(old)
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp)
    assert client.ufs.stat(f"{mp}/log").cached_bytes == 0
    with client.open(f"{mp}/log", "ab") as f:
        f.write(b"tail" * 25)
    assert (nas / "log").read_bytes() == old + b"tail" * 25
    assert client.get_bytes(f"{mp}/log") == old + b"tail" * 25


def test_write_back_uploads_soon_and_survives_a_master_kill(cluster_factory: typing.Callable[..., LocalCluster],
                                                            nas: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CURVINE_UFS_UPLOAD_DELAY_S", "3")
    c = cluster_factory()
    with Client(master=c.master_address, config=client_config(c)) as client:
        client.ufs.mount(f"file://{nas}", "/wb", write_mode="back")
        body = rand(BLOCK * 2 + 5)
        client.put_bytes("/wb/kv.tmp", body)
        client.rename("/wb/kv.tmp", "/wb/kv.data")           # the LMCache pattern, at pool speed
        assert not (nas / "kv.data").exists()                # close returned before the upload
        assert client.ufs.stat("/wb/kv.data").state == "pending upload"
    c.kill_master(signal.SIGKILL)
    c.restart_master(timeout=START_TIMEOUT_S)
    with Client(master=c.master_address, config=client_config(c)) as client:
        wait_for(lambda: (nas / "kv.data").exists() and (nas / "kv.data").read_bytes() == body, 30,
                 "the queued upload after the master restart")
        assert not (nas / "kv.tmp").exists()
        wait_for(lambda: client.ufs.stat("/wb/kv.data").state == "persisted", 10, "persisted")


# ---------------------------------------------------------------- load, bad input, umount

def test_load_a_tree_and_free_it(client: Client, ufs_cluster: LocalCluster, nas: Path,
                                 request: pytest.FixtureRequest) -> None:
    for i in range(40):
        (nas / "many").mkdir(exist_ok=True)
        (nas / "many" / f"f{i:03d}").write_bytes(data(1000 + i, i))
    (nas / "big").write_bytes(rand(3 * BLOCK))
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp)
    r = cv(ufs_cluster, "load", mp, "-r", "--wait", check=True)
    assert "done, 41 files" in r.stdout
    total = 3 * BLOCK + sum(1000 + i for i in range(40))
    wait_for(lambda: sum(client.ufs.stat(p).cached_bytes for p in
                         [f"{mp}/big", *(f"{mp}/many/f{i:03d}" for i in range(40))]) == total, 15, "all cached")
    jobs = json.loads(cv(ufs_cluster, "load", "--status", "--json", check=True).stdout)
    assert jobs[-1]["state"] == "done" and jobs[-1]["loaded_bytes"] == total
    assert client.ufs.free(mp, recursive=True).files == 41
    assert client.get_bytes(f"{mp}/many/f007") == data(1007, 7)


def test_bad_mounts_are_refused_with_one_line(ufs_cluster: LocalCluster, client: Client, nas: Path,
                                              tmp_path: Path) -> None:
    for args, words in [
        (["ufs", "mount", "nope://x", "/bad1"], "nope"),
        (["ufs", "mount", f"file://{tmp_path}/missing", "/bad2"], "missing"),
        (["ufs", "mount", f"file://{nas}", "/bad3", "-o", "colour=blue"], "colour"),
        (["ufs", "mount", f"file://{nas}", "/bad4", "-o", "novalue"], "KEY=VALUE"),
    ]:
        r = cv(ufs_cluster, *args)
        assert r.returncode in (1, 2), (args, r)
        assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert not any(p in client.listdir("/") for p in ("bad1", "bad2", "bad3", "bad4"))
    assert all(m.path not in ("/bad1", "/bad2", "/bad3", "/bad4") for m in client.ufs.mounts())


def test_umount_drops_the_cache_and_leaves_the_ufs(client: Client, ufs_cluster: LocalCluster, nas: Path,
                                                   request: pytest.FixtureRequest) -> None:
    (nas / "keep").write_bytes(b"stays")
    mp = mount_point(request)
    client.ufs.mount(f"file://{nas}", mp)
    assert client.get_bytes(f"{mp}/keep") == b"stays"
    cv(ufs_cluster, "ufs", "umount", mp, check=True)
    assert client.listdir(mp) == []
    assert (nas / "keep").read_bytes() == b"stays"
    assert all(m.path != mp for m in client.ufs.mounts())
