"""The SDK against a real cluster: 1 master + 2 workers as processes on loopback."""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
import typing

import pytest
import xxhash

from curvine_py import Client, CurvineError
from curvine_py.cluster.local import LocalCluster


def payload(n: int, seed: int = 0) -> bytes:
    return os.urandom(n) if seed == 0 else bytes((i * seed) & 0xFF for i in range(n))


def test_put_get_50mib_round_trip_and_two_replicas(client: Client) -> None:
    data = os.urandom(50 << 20)
    client.mkdir("/rt", exist_ok=True)
    client.put_bytes("/rt/obj", data)
    assert client.stat("/rt/obj").size == len(data)
    assert client.get_bytes("/rt/obj") == data
    blocks = client.block_locations("/rt/obj")
    assert len(blocks) == 13  # 12 full 4 MiB blocks + 2 MiB
    offset = 0
    for b in blocks:
        assert b.offset == offset
        assert b.checksum == xxhash.xxh3_64_intdigest(data[offset:offset + b.length])
        assert len(b.workers) == 2
        assert len({w.host for w in b.workers}) == 2
        offset += b.length
    assert offset == len(data)


def test_file_objects_stream_and_seek(client: Client) -> None:
    data = payload(9 << 20 | 12345, seed=7)
    with client.open("/stream.bin", "wb") as f:
        for i in range(0, len(data), 100_000):
            f.write(data[i:i + 100_000])
    with client.open("/stream.bin", "rb") as f:
        assert f.read(4096) == data[:4096]
        assert f.read() == data[4096:]
        f.seek(5 << 20)
        buf = bytearray(1 << 20)
        assert f.readinto(buf) == 1 << 20 and bytes(buf) == data[5 << 20:6 << 20]
        f.seek(-10, os.SEEK_END)
        assert f.read() == data[-10:]
        assert f.tell() == len(data)


def test_append_to_partial_block(client: Client) -> None:
    client.put_bytes("/app", b"a" * 5000)
    with client.open("/app", "ab") as f:
        f.write(b"b" * 3000)
    assert client.get_bytes("/app") == b"a" * 5000 + b"b" * 3000


def test_small_and_empty_objects(client: Client) -> None:
    client.put_bytes("/empty", b"")
    assert client.get_bytes("/empty") == b""
    client.put_bytes("/tiny", b"x")
    assert client.get_bytes("/tiny") == b"x"
    client.put_bytes("/tiny", b"replaced")
    assert client.get_bytes("/tiny") == b"replaced"


def test_namespace_calls_and_errors(client: Client) -> None:
    client.mkdir("/ns/a/b", parents=True)
    client.put_bytes("/ns/a/b/f", b"123")
    assert client.listdir("/ns/a") == ["b"]
    assert list(client.walk("/ns")) == [("/ns", ["a"], []), ("/ns/a", ["b"], []), ("/ns/a/b", [], ["f"])]
    client.rename("/ns/a/b/f", "/ns/g")
    assert client.exists("/ns/g") and not client.exists("/ns/a/b/f")
    assert client.du("/ns") == (3, 1, 3)
    with pytest.raises(CurvineError) as e:
        client.get_bytes("/ns/missing")
    assert e.value.errno == errno.ENOENT and "/ns/missing" in str(e.value)
    with pytest.raises(FileNotFoundError):
        client.stat("/nope")
    with pytest.raises(CurvineError) as e:
        client.rmdir("/ns/a")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(CurvineError) as e:
        client.mkdir("/ns/" + "n" * 256)
    assert e.value.errno == errno.ENAMETOOLONG
    with pytest.raises(CurvineError) as e:
        client.open("/ns/g", "xb")
    assert e.value.errno == errno.EEXIST
    with pytest.raises(CurvineError) as e:
        client.get_bytes("/ns")
    assert e.value.errno == errno.EISDIR
    with pytest.raises(CurvineError) as e:
        client.put_bytes("/ns/g/under-a-file", b"")
    assert e.value.errno == errno.ENOTDIR


def test_failed_write_leaves_no_half_file(client: Client) -> None:
    client.put_bytes("/keep", b"old contents")

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with client.open("/partial", "wb") as f:
            f.write(b"x" * (6 << 20))
            raise Boom()
    st = client.stat("/partial")
    assert st.size == 0 and st.complete  # nothing presented as written
    assert client.get_bytes("/keep") == b"old contents"


@contextlib.contextmanager
def killed_worker(cluster: LocalCluster, i: int) -> typing.Iterator[None]:
    """Worker i SIGKILLed for the with block, then started again and live: the module's
    shared cluster is whole for the next test (a cluster of their own cost each ~4 s)."""
    cluster.kill_worker(i, signal.SIGKILL)
    try:
        yield
    finally:
        cluster.restart_worker(i)


def test_read_survives_a_killed_worker(shared_cluster: LocalCluster) -> None:
    with Client(shared_cluster.master_address) as c:
        data = os.urandom(20 << 20)
        c.put_bytes("/survivor", data)
        with killed_worker(shared_cluster, 0):
            t0 = time.monotonic()
            assert c.get_bytes("/survivor") == data
            assert time.monotonic() - t0 < 30
            with Client(shared_cluster.master_address) as fresh:
                assert fresh.get_bytes("/survivor") == data


def test_write_with_one_worker_dead_still_succeeds(shared_cluster: LocalCluster) -> None:
    with Client(shared_cluster.master_address) as c, killed_worker(shared_cluster, 1):
        data = os.urandom(9 << 20)
        c.put_bytes("/one-copy", data)
        assert c.get_bytes("/one-copy") == data


def test_master_restart_keeps_acknowledged_files(shared_cluster: LocalCluster) -> None:
    cluster = shared_cluster
    with Client(cluster.master_address) as c:
        expected = {}
        c.mkdir("/durable")
        for i in range(20):
            data = os.urandom(1000 + i * 50_000)
            c.put_bytes(f"/durable/f{i}", data)
            expected[f"/durable/f{i}"] = data
        c.rename("/durable/f0", "/durable/renamed")
        expected["/durable/renamed"] = expected.pop("/durable/f0")
        cluster.kill_master(signal.SIGKILL)
        cluster.restart_master()
        # the client keeps retrying while the master is down and the workers re-register
        for path, data in expected.items():
            assert c.get_bytes(path) == data
        assert sorted(c.listdir("/durable")) == sorted(p.rsplit("/", 1)[1] for p in expected)


def test_two_clients_write_a_new_file_and_the_last_commit_wins(client: Client, shared_cluster) -> None:  # type: ignore[no-untyped-def]
    """Several writers of one file (docs/posix.md "Several writers"): another client may
    write a file the creator has open, before or after the creator's first write; the
    last commit wins the block whole.  A truncating open ("wb") ends the other writer:
    its write or close fails with ESTALE, and nothing of it shows."""
    from tests.conftest import client_config
    other = Client(master=shared_cluster.master_address, config=client_config(shared_cluster))
    try:
        f = client.open("/soft-taken", "xb")
        with other.open("/soft-taken", "ab") as g:
            g.write(b"other")
        f.write(b"mine")
        f.close()
        assert client.get_bytes("/soft-taken") == b"mine"

        f = client.open("/soft-kept", "xb")
        f.write(b"mine")
        with other.open("/soft-kept", "wb") as g:   # O_TRUNC: a new generation
            g.write(b"theirs")
        with pytest.raises(CurvineError) as info:
            f.close()
        assert info.value.errno == errno.ESTALE
        assert other.get_bytes("/soft-kept") == b"theirs"
        client.put_bytes("/soft-empty", b"")   # created, truncated to 0, closed: a plain empty file
        with other.open("/soft-empty", "ab") as g:   # not busy
            g.write(b"x")
        assert client.get_bytes("/soft-empty") == b"x"
    finally:
        other.close()
