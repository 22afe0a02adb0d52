"""Locate (master/locate.py): many paths in one call, their holders and tier, and the
expiring pins that are LMCache's locks, on real clusters."""
from __future__ import annotations

import errno
import json
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.local import LocalCluster
from curvine_py.common.errors import CurvineError
from curvine_py.kv.chunkstore import ChunkStore, ChunkStoreConfig
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master
from curvine_py.sdk import Client

from tests.integration.test_cli import run_cv
from tests.integration.test_eviction import EVICT_FLAGS, connect, payload, present, settle

MiB = 1 << 20


def test_locate_answers_each_path_in_order_with_its_holders(client: Client, remote_dir: str,
                                                           shared_cluster: LocalCluster) -> None:
    d = remote_dir
    client.put_bytes(f"{d}/a", b"x" * (9 * MiB))      # 3 blocks, two replicas each
    client.put_bytes(f"{d}/empty", b"")
    client.mkdir(f"{d}/sub")
    client.put_bytes(f"{d}/sub/b", b"y" * 100)
    client.symlink(f"{d}/a", f"{d}/link")
    got = client.locate([f"{d}/a", f"{d}/missing", f"{d}/sub/b", f"{d}/a/under", f"{d}/empty", f"{d}/link",
                         f"{d}/nodir/x", d])
    assert [g.errno for g in got] == [0, errno.ENOENT, 0, errno.ENOTDIR, 0, 0, errno.ENOENT, 0]
    a, _, b, _, empty, link, _, top = got
    workers = {shared_cluster.worker_host(0), shared_cluster.worker_host(1)}
    assert a.status is not None and a.status.size == 9 * MiB and a.status.is_file
    assert set(a.hosts) == workers and list(a.hosts) == sorted(a.hosts)   # 2 workers, 2 replicas: both hold all
    assert set(b.hosts) == workers
    assert empty.hosts == () and empty.status is not None and empty.status.size == 0
    assert link.status is not None and link.status.ino == a.status.ino   # followed, as stat(2)
    assert top.status is not None and top.status.is_dir and top.hosts == ()
    assert a.tier == "DISK" or a.tier in ("SSD", "HDD", "MEM", ""), a.tier


def test_a_brief_locate_answers_whether_each_path_is_a_whole_file(client: Client, remote_dir: str) -> None:
    """The KV lookup's form: one flag per path, a complete regular file of > 0 bytes, the
    same verdict as the full answer's (a file still being written is a miss)."""
    d = remote_dir
    client.put_bytes(f"{d}/a", b"x" * (5 * MiB))
    client.put_bytes(f"{d}/empty", b"")
    client.mkdir(f"{d}/sub")
    client.symlink(f"{d}/a", f"{d}/link")
    client.symlink(f"{d}/gone", f"{d}/dangling")
    paths = [f"{d}/a", f"{d}/missing", f"{d}/empty", f"{d}/sub", f"{d}/link", f"{d}/dangling", f"{d}/a/x",
             "relative", f"{d}/writing"]
    with client.open(f"{d}/writing", "wb") as f:
        f.write(b"y" * 1000)
        f.flush()
        brief = client.meta.call(Master.Locate, pb.LocateRequest(caller=client.meta.caller(), paths=paths, brief=True))
        full = client.meta.call(Master.Locate, pb.LocateRequest(caller=client.meta.caller(), paths=paths))
    assert list(brief.whole) == [True, False, False, False, True, False, False, False, False]
    assert not brief.files
    assert [m.errno == 0 and m.attr.complete and m.attr.size > 0 and m.attr.mode & 0o170000 == 0o100000
            for m in full.files] == list(brief.whole)
    store = ChunkStore(client, ChunkStoreConfig(base_path=d, lock_ttl_s=30))
    try:
        assert store.lookup(["a", "missing", "empty", "link", "writing"], lock=True) == [True, False, False, True, True]
        assert store.locked() == 3
    finally:
        store.close()


def test_locate_tier_policy_and_limits(client: Client, remote_dir: str) -> None:
    d = remote_dir
    client.put_bytes(f"{d}/f", b"z")
    client.set_tier(d, "mem")
    assert client.locate([f"{d}/f"])[0].tier == "MEM"
    many = [f"{d}/f"] * 1001   # the SDK splits; the master takes at most 1,000 per call
    assert all(g.found for g in client.locate(many))
    with pytest.raises(CurvineError) as e:
        client.meta.call(Master.Locate, pb.LocateRequest(caller=client.meta.caller(), paths=many))
    assert e.value.errno == errno.EINVAL and "at most 1000" in str(e.value)
    reply = client.meta.call(Master.Locate, pb.LocateRequest(caller=client.meta.caller(), paths=["rel", "/x\0y"]))
    assert [m.errno for m in reply.files] == [errno.EINVAL, errno.EINVAL]


@pytest.fixture
def small(cluster_factory: typing.Callable[..., LocalCluster]) -> typing.Iterator[tuple[LocalCluster, Client, Client]]:
    """Two workers of 48 MiB each, two replicas, eviction every 0.1 s; two clients."""
    c = cluster_factory(capacity="48MiB", extra_master_flags=EVICT_FLAGS)
    one, other = connect(c), connect(c)
    try:
        yield c, one, other
    finally:
        one.close()
        other.close()


def test_a_pin_holds_against_eviction_until_its_client_unpins(small: tuple[LocalCluster, Client, Client]) -> None:
    _, client, other = small
    client.mkdir("/kv")
    for i in range(4):
        client.put_bytes(f"/kv/{i}", payload(i))
    assert all(g.found for g in client.locate(["/kv/0", "/kv/1"], pin_s=60))   # the oldest: LRU's first victims
    other.locate(["/kv/2"], pin_s=60)                                           # another client's
    for i in range(4, 16):   # 64 MiB more into a 48 MiB pool
        client.put_bytes(f"/kv/{i}", payload(i))
    settle(client)
    assert present(client, "/kv/0") and present(client, "/kv/1")
    assert client.get_bytes("/kv/0") == payload(0)
    client.unpin_located(["/kv/0", "/kv/2"])   # 2 is other's pin: this client's unpin leaves it
    for i in range(16, 28):
        client.put_bytes(f"/kv/{i}", payload(i))
    settle(client)
    assert not present(client, "/kv/0")
    assert present(client, "/kv/1") and client.get_bytes("/kv/1") == payload(1)
    assert present(client, "/kv/2") and client.get_bytes("/kv/2") == payload(2)


def test_cv_fs_locate(client: Client, remote_dir: str, shared_cluster: LocalCluster, tmp_path: Path) -> None:
    d = remote_dir
    client.put_bytes(f"{d}/a", b"q" * 1000)
    got = run_cv("fs", "locate", f"{d}/a", f"{d}/nope", "--json", master=shared_cluster.master_address, cwd=tmp_path)
    assert got.returncode == 1, got.stderr   # one path absent
    a, nope = json.loads(got.stdout)
    assert a["found"] and a["size"] == 1000 and set(a["hosts"]) == {shared_cluster.worker_host(0),
                                                                    shared_cluster.worker_host(1)}
    assert not nope["found"] and nope["error"] == "No such file or directory"
    got = run_cv("fs", "locate", f"{d}/a", master=shared_cluster.master_address, cwd=tmp_path)
    text = got.stdout.decode()
    assert got.returncode == 0 and f"{d}/a" in text and shared_cluster.worker_host(0) in text, text


def test_cv_fs_locate_prefix(client: Client, remote_dir: str, shared_cluster: LocalCluster, tmp_path: Path) -> None:
    """Chunks in prefix order: both workers hold every chunk until the first absent one."""
    d = remote_dir
    for name in ("c0", "c1", "c3"):
        client.put_bytes(f"{d}/{name}", name.encode() * 100)
    chunks = [f"{d}/c0", f"{d}/c1", f"{d}/c2", f"{d}/c3"]
    assert client.prefix_hosts(chunks) == {shared_cluster.worker_host(0): 2, shared_cluster.worker_host(1): 2}
    got = run_cv("fs", "locate", "--prefix", *chunks, "--json", master=shared_cluster.master_address, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"chunks": 4, "hosts": {shared_cluster.worker_host(0): 2,
                                                            shared_cluster.worker_host(1): 2}}
    text = run_cv("fs", "locate", "--prefix", *chunks, master=shared_cluster.master_address, cwd=tmp_path)
    assert "LEADING CHUNKS" in text.stdout.decode() and "50%" in text.stdout.decode()


def test_locate_answers_paths_not_normalised_as_their_normal_form(client: Client, remote_dir: str) -> None:
    """The master splits a path as sent when it is normal (the SDK's always are) and
    normalises the others first: every spelling of one file gets the same answer."""
    d = remote_dir
    client.put_bytes(f"{d}/a", b"a" * 10)
    client.mkdir(f"{d}/sub")
    spellings = [f"{d}/a", f"/{d}//a", f"{d}/./a", f"{d}/sub/../a", f"{d}/a/", f"{d}/sub/.."]
    reply = client.meta.call(Master.Locate, pb.LocateRequest(caller=client.meta.caller(), paths=spellings))
    want = client.stat(f"{d}/a").ino
    assert [m.errno for m in reply.files] == [0] * 6
    assert [m.attr.ino for m in reply.files[:5]] == [want] * 5
    assert reply.files[5].attr.ino == client.stat(d).ino
    root = client.meta.call(Master.Locate, pb.LocateRequest(caller=client.meta.caller(), paths=["/", "//", "/."]))
    assert [m.attr.ino for m in root.files] == [client.root_ino()] * 3


def test_chunk_store_pins_again_what_a_lookup_locked_while_its_unpin_ran(client: Client, remote_dir: str) -> None:
    """ChunkStore makes no master call under its pin mutex: an unpin of a chunk no lock
    holds may land after a new lookup's pin of it, dropping that pin, so the unpin pins
    again every chunk a lookup holds once its call is over."""
    store = ChunkStore(client, ChunkStoreConfig(base_path=remote_dir, lock_ttl_s=30))
    try:
        client.put_bytes(f"{remote_dir}/c", b"kv" * 100)
        real = store._locate
        calls: list[tuple[tuple[str, ...], float, bool]] = []

        def racing(names: typing.Sequence[str], pin_s: float = 0.0, unpin: bool = False,
                   brief: bool = True) -> list[pb.LocateReply]:
            if unpin and not calls:   # a lookup locks c after the unpin chose it and before the master sees it
                calls.append((("lookup",), 0.0, False))
                assert store.lookup(["c"], lock=True) == [True]
            calls.append((tuple(names), pin_s, unpin))
            return real(names, pin_s, unpin, brief)
        store._locate = racing   # type: ignore[method-assign]
        store._unpin(["c"])     # the unpin of an earlier lock of c (none is held now)
        assert store.locked() == 1
        assert calls[-2:] == [(("c",), 0.0, True), (("c",), 30.0, False)], calls   # dropped, then pinned again
        calls.clear()
        store._unpin(["c"])     # c is locked: nothing to drop, no call
        assert calls == []
    finally:
        store.close()


def test_the_names_form_answers_as_the_paths_form(client: Client, remote_dir: str) -> None:
    """LocateRequest's dir + names (ChunkStore's form) gets the paths form's answers, brief
    and full; a name that is no entry of the directory ('', '.', '..', one with a '/') is
    a miss, not a path elsewhere."""
    d = remote_dir
    client.put_bytes(f"{d}/a", b"x" * 1000)
    client.put_bytes(f"{d}/empty", b"")
    client.mkdir(f"{d}/sub")
    client.put_bytes(f"{d}/sub/b", b"y")
    client.symlink(f"{d}/a", f"{d}/link")
    client.symlink(f"{d}/gone", f"{d}/dangling")
    names = ["a", "missing", "empty", "sub", "link", "dangling", "", ".", "..", "sub/b", "a", "a/x"]
    caller = client.meta.caller()

    def ask(brief: bool, **form: typing.Any) -> pb.LocateReply:
        return client.meta.call(Master.Locate, pb.LocateRequest(caller=caller, brief=brief, **form))
    assert list(ask(True, dir=d, names=names).whole) == [True, False, False, False, True, False, False, False,
                                                          False, False, True, False]
    paths = [f"{d}/{n}" for n in names[:6]] + [f"{d}/a"]
    full = ask(False, dir=d, names=names[:6] + ["a"])
    assert [(m.errno, m.attr.ino) for m in full.files] == [(m.errno, m.attr.ino) for m in ask(False, paths=paths).files]
    assert [m.errno for m in ask(False, dir=d, names=["", ".", "..", "sub/b"]).files] == [errno.EINVAL] * 4
    assert list(ask(True, dir=f"{d}/nodir", names=["a"]).whole) == [False]
    assert list(ask(True, dir=f"{d}/a", names=["x"]).whole) == [False]
    assert [m.errno for m in ask(False, dir=f"{d}/nodir", names=["a"]).files] == [errno.ENOENT]
    with pytest.raises(CurvineError) as e:
        ask(True, dir=d, names=["a"], paths=[f"{d}/a"])
    assert e.value.errno == errno.EINVAL


def test_a_brief_locate_of_many_names_answers_each_in_order(client: Client, remote_dir: str) -> None:
    """Over the master's 500 names per statement, repeated names and a bare 1,000: every
    hit lands at its own index."""
    d = remote_dir
    where = [0, 255, 499, 500, 511, 512, 999]
    for i in where:
        client.put_bytes(f"{d}/c{i}", b"kv")
    names = [f"c{i}" for i in range(1000)]
    for form in ({"dir": d, "names": names}, {"paths": [f"{d}/{n}" for n in names]}):
        got = client.meta.call(Master.Locate, pb.LocateRequest(caller=client.meta.caller(), brief=True, **form))
        assert [i for i, hit in enumerate(got.whole) if hit] == where
    store = ChunkStore(client, ChunkStoreConfig(base_path=d, lock_ttl_s=30))
    try:
        asked = ["c0", "c1", "c0", *names[2:40], "c999"]
        assert [i for i, hit in enumerate(store.lookup(asked, lock=True)) if hit] == [0, 2, len(asked) - 1]
        assert store.locked() == 2
    finally:
        store.close()
