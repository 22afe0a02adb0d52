"""Op records (master/records.py): built checked, encoded for the log, decoded back, replayed.

A replay -- decode each record a journal applied and apply it to a fresh namespace -- is
what every master of a Raft group does with the log, so it must rebuild the very same tables.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from curvine_py.common.errors import CurvineError
from curvine_py.common.types import RENAME_EXCHANGE, ROOT_INO, SETATTR_MODE, SETATTR_SIZE
from curvine_py.master.events import bounds as events_bounds
from curvine_py.master.handlers import handlers
from curvine_py.master.namespace import Namespace
from curvine_py.master.posix import Cred
from curvine_py.master.records import (
    RECORDS, ROOT, Allocate, Commit, CommitBlock, Create, Evict, ExpireLeases, LastRead, LeaderAnnounce, Link, Mknod,
    HostChange, OpenWrite, PruneEvents, PruneOplog, Record, ReplicaChanges, RecordReads, RegisterWorker, Removexattr,
    Rename, Renew, Rmdir, Setattr, Setxattr, SyncEntry, UfsFree, UfsMount, UfsRefresh, UfsState, UfsSyncDir, UfsUmount,
    Unlink, Victim, decode,
)

from tests.unit.test_namespace import NS, errno_of

ALICE = Cred(1000, 1000, frozenset({1000, 27}))
ENV: dict[str, Any] = {"cred": ALICE, "request_id": "req-7", "client_id": "client-a", "now_ns": 1_700_000_000_123}

# One record of every type, with fields away from their defaults where it matters.
SAMPLES: list[Record] = [
    Mknod(**ENV, parent=1, name="dïr \u2603", mode=stat.S_IFDIR | 0o755, umask=0o22, exclusive=False),
    Mknod(**ENV, parent=1, name="ln", mode=stat.S_IFLNK | 0o777, target="/a/b", rdev=5, block_size=8192),
    Create(**ENV, parent=2, name="x.tmp", mode=0o644, lease_ms=30_000, umask=0o22, exclusive=False,
           block_size=1 << 20, flags=os.O_TRUNC | os.O_WRONLY),
    OpenWrite(**ENV, ino=9, lease_ms=30_000, flags=os.O_TRUNC),
    Allocate(**ENV, ino=9, lease_id=(1 << 64) - 1, count=3),
    Commit(**ENV, ino=9, lease_id=4, size=5 << 20, release=True, mtime_ns=17,
           blocks=(CommitBlock(10, 0, 4 << 20, (1 << 64) - 1), CommitBlock(11, 4 << 20, 1 << 20, 0))),
    Renew(**ENV, lease_ids=(1, 2, 3), lease_ms=30_000),
    ExpireLeases(now_ns=5),
    Link(**ENV, ino=9, new_parent=1, new_name="hard"),
    Unlink(**ENV, parent=1, name="f", keep=(9, 10)),
    Rmdir(**ENV, parent=1, name="d"),
    Rename(**ENV, parent=1, name="a", new_parent=2, new_name="b", flags=RENAME_EXCHANGE, keep=(3,)),
    Setattr(**ENV, ino=9, valid=SETATTR_MODE | SETATTR_SIZE, mode=0o600, uid=1, gid=2, size=(1 << 64) - 1,
            atime_ns=-1, mtime_ns=3),
    Setxattr(**ENV, ino=9, name="user.k", value=b"\x00\xffbytes", flags=1),
    Removexattr(**ENV, ino=9, name="user.k"),
    RegisterWorker(storage_id="st-1", host="host-a"),
    RecordReads(reads=(LastRead(9, 100), LastRead(10, 200))),
    Evict(victims=(Victim(9, 4), Victim(10, 0)), reason="ttl"),
    UfsMount(**ENV, path="/s3", ino=5, uri="s3://bucket/p", write_mode="back", metadata_ttl_ms=1000,
             ttl_ms=60_000, options=(("endpoint", "http://x"), ("region", "eu"))),
    UfsUmount(path="/s3", force=True),
    UfsSyncDir(ino=5, entries=(SyncEntry("a", False, 10, 1, "e1"), SyncEntry("sub", True, 0, 0, ""))),
    UfsRefresh(ino=6, size=10, mtime_ns=2, etag="e2"),
    UfsRefresh(ino=6, gone=True),
    UfsState(ino=6, generation=2, key="k/a", etag="e3", mtime_ns=5),
    UfsState(ino=6, generation=2, key="k/a", message="upload failed", final=True),
    UfsFree(inos=(6, 7)),
    LeaderAnnounce(term=3, raft_id="10.0.0.1:8994", address="10.0.0.1:8995", frame_port=8996),
    PruneOplog(before_ms=5),
    PruneEvents(before_ms=5, keep=10),
    ReplicaChanges(changes=(HostChange(9, "h1", True), HostChange(9, "h2", False))),
]


def test_every_record_type_has_a_sample_and_an_op_method() -> None:
    assert {type(r) for r in SAMPLES} == set(RECORDS.values())
    assert set(handlers(Namespace)) == set(RECORDS.values())


@pytest.mark.parametrize("rec", SAMPLES, ids=lambda r: r.op)
def test_every_record_round_trips_through_its_json(rec: Record) -> None:
    text = rec.to_json()
    data = json.loads(text)                      # plain, readable JSON
    assert data["op"] == rec.op and data["v"] == rec.VERSION == 1
    assert decode(text) == rec
    assert decode(text.encode()) == rec


def test_the_json_form_is_the_documented_one() -> None:
    data = json.loads(SAMPLES[5].to_json())
    assert data["cred"] == [1000, 1000, [27, 1000]]
    assert data["blocks"][0] == {"block_id": 10, "offset": 0, "length": 4 << 20, "checksum": (1 << 64) - 1}
    assert json.loads(Setxattr(ino=1, name="user.k", value=b"\x01").to_json())["value"] == {"__bytes": "01"}


def test_an_unknown_op_is_refused_clearly() -> None:
    with pytest.raises(CurvineError) as e:
        decode(json.dumps({"op": "fsck_everything", "v": 1}))
    assert e.value.errno == errno.ENOSYS
    assert "unknown op record 'fsck_everything'" in str(e.value) and "mknod" in str(e.value)


def test_a_newer_version_is_refused_clearly() -> None:
    data = json.loads(SAMPLES[0].to_json())
    data["v"] = 2
    with pytest.raises(CurvineError) as e:
        decode(json.dumps(data))
    assert e.value.errno == errno.EPROTO
    assert "'mknod' is version 2, newer than this master's 1" in str(e.value) and "upgrade" in str(e.value)


@pytest.mark.parametrize("text, says", [
    ('{"op": "mknod", "parent": 1, "name": "a", "mode": 1}', "without a valid version"),
    ('{"op": "mknod", "v": 1, "parent": 1}', "missing 2 required"),
    ('{"op": "mknod", "v": 1, "parent": 1, "name": "a", "mode": 1, "colour": "red"}', "unknown fields colour"),
    ('{"op": "mknod", "v": 1, "parent": "1", "name": "a", "mode": 1}', "mknod.parent: an integer expected"),
    ('{"op": "commit", "v": 1, "ino": 1, "lease_id": 1, "size": 0, "blocks": [{"block_id": 1}]}', "missing 3"),
    ('[1, 2]', "must be a JSON object"),
    ('{"op": ', "not JSON"),
])
def test_malformed_log_rows_are_refused(text: str, says: str) -> None:
    with pytest.raises(CurvineError) as e:
        decode(text)
    assert e.value.errno == errno.EINVAL and says in str(e.value)


@pytest.mark.parametrize("build, says", [
    (lambda: Mknod(parent=1 << 63, name="a", mode=0), "mknod.parent: 9223372036854775808 is out of range"),
    (lambda: Setattr(ino=1, valid=0, size=1 << 64), "setattr.size: 18446744073709551616 is out of range"),
    (lambda: Mknod(parent=1, name=b"a", mode=0), "mknod.name: str expected, not bytes"),
    (lambda: Mknod(parent=1, name="bad\udcff", mode=0), "is not valid UTF-8"),
    (lambda: Mknod(parent=True, name="a", mode=0), "an integer expected, not bool"),
    (lambda: Setxattr(ino=1, name="user.a", value="text"), "setxattr.value: bytes expected"),
    (lambda: Commit(ino=1, lease_id=1, size=0, blocks=[{"block_id": 1}]), "CommitBlock expected, not dict"),
    (lambda: UfsMount(path="/m", ino=2, uri="file:///x", write_mode="through", metadata_ttl_ms=1, ttl_ms=0,
                      options=(("a",),)), "2 items expected, not 1"),
    (lambda: UfsState(ino=1, generation=1, key="k"), "needs an etag (uploaded) or a message (failed)"),
])
def test_a_malformed_record_cannot_be_built(build: Any, says: str) -> None:
    with pytest.raises(CurvineError) as e:
        build()
    assert e.value.errno == errno.EINVAL and says in str(e.value)


def test_lists_given_for_tuples_become_tuples() -> None:
    r = Unlink(parent=1, name="a", keep=[3, 4])
    assert r.keep == (3, 4) and hash(r) == hash(Unlink(parent=1, name="a", keep=(3, 4)))
    assert Setxattr(ino=1, name="user.a", value=bytearray(b"x")).value == b"x"
    assert Renew(lease_ids=[1], lease_ms=1).envelope() == {"cred": ROOT, "request_id": "", "client_id": "",
                                                           "now_ns": 0}


def test_the_journal_stamps_the_time_of_an_unstamped_record(tmp_path: Path) -> None:
    n = NS(tmp_path)
    try:
        applied = record_applied(n)
        rec = Mknod(parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755)
        ino = n.journal.submit(rec)["attr"].ino
        assert rec.now_ns == 0                                           # records are values
        ((stamped, _),) = applied
        assert stamped.now_ns > 0 and replace(stamped, now_ns=0) == rec
        assert n.ns.inode(ino).mtime_ns == stamped.now_ns
    finally:
        n.journal.stop()


# ---------------------------------------------------------------------- replay

def record_applied(n: NS) -> list[tuple[Record, Any]]:
    """Every record n's journal applies from now on (as stamped), with its result or error:
    the log a replay reads (the oplog keeps request ids and results only)."""
    applied: list[tuple[Record, Any]] = []
    apply_one = n.journal._apply_one

    def recording(rec: Record) -> Any:
        outcome = apply_one(rec)
        applied.append((rec, outcome))
        return outcome
    n.journal._apply_one = recording  # type: ignore[method-assign]
    return applied


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NS]:
    (tmp_path / "a").mkdir()
    n = NS(tmp_path / "a")
    yield n
    n.journal.stop()


def _fails(fn: Any) -> None:
    with pytest.raises(CurvineError):
        fn()


def _workload(ns: NS) -> None:
    """Every kind of op, failures among them (logged for their retries, so replayed too)."""
    d = ns.mkdir(ROOT_INO, "d")
    ns.do(Mknod, parent=d, name="ln", mode=stat.S_IFLNK | 0o777, target="/d")
    r = ns.create(d, "x.tmp", request_id="c-1")
    ino, lease = r["attr"].ino, r["lease_id"]
    ids = ns.do(Allocate, ino=ino, lease_id=lease, count=2)["block_ids"]
    ns.do(Commit, ino=ino, lease_id=lease, size=5 << 20, release=True,
          blocks=[CommitBlock(ids[0], 0, 4 << 20, 1 << 63), CommitBlock(ids[1], 4 << 20, 1 << 20, 2)])
    ns.do(Rename, parent=d, name="x.tmp", new_parent=ROOT_INO, new_name="x.data", request_id="r-1")
    _fails(lambda: ns.do(Rename, parent=d, name="x.tmp", new_parent=ROOT_INO, new_name="y", request_id="r-2"))
    ns.do(Link, ino=ino, new_parent=d, new_name="hard")
    ns.do(Setxattr, ino=ino, name="user.tag", value=b"\x00v")
    ns.do(Setxattr, ino=d, name="user.gone", value=b"1")
    ns.do(Removexattr, ino=d, name="user.gone")
    ns.do(Setattr, ino=ino, valid=SETATTR_SIZE, size=1 << 20)
    ns.do(Setattr, ino=ino, valid=SETATTR_MODE, mode=0o600)
    ns.do(RecordReads, reads=[LastRead(ino, 42)])
    w = ns.create(ROOT_INO, "w")
    ns.do(OpenWrite, client_id="c2", ino=w["attr"].ino, lease_ms=1000)
    ns.do(Renew, client_id="c2", lease_ids=[ns.ns.inode(w["attr"].ino).lease_id], lease_ms=5000)
    ns.do(Allocate, client_id="c2", ino=w["attr"].ino, lease_id=ns.ns.inode(w["attr"].ino).lease_id,
          count=1)
    ns.do(ExpireLeases, now_ns=(ns.ns.inode(w["attr"].ino).lease_expiry_ms + 1) * 1_000_000)
    ns.do(Unlink, parent=d, name="hard")
    ns.mkdir(d, "empty")
    ns.do(Rmdir, parent=d, name="empty")
    _fails(lambda: ns.do(Rmdir, parent=ROOT_INO, name="d", request_id="rm-1"))
    victim = ns.create(ROOT_INO, "victim")["attr"]
    ns.do(Commit, ino=victim.ino, lease_id=ns.ns.inode(victim.ino).lease_id, size=0, release=True)
    ns.do(Evict, victims=[Victim(victim.ino, ns.ns.inode(victim.ino).generation)])
    ns.do(RegisterWorker, storage_id="s-1", host="h1")
    ns.do(LeaderAnnounce, term=2, raft_id="10.0.0.2:8994", address="10.0.0.2:8995", frame_port=8996)
    ns.do(PruneOplog, before_ms=1)   # nothing that old: the replay below keeps every row
    ns.do(PruneEvents, before_ms=1, keep=2)   # the event feed keeps the newest two (meta.events_floor)
    ns.do(ReplicaChanges, changes=[HostChange(ino, "h1", True), HostChange(ino, "h2", True),
                                   HostChange(ino, "h1", False), HostChange(ino, "h2", True)])   # (the last: said)
    _ufs_workload(ns)


def _ufs_workload(ns: NS) -> None:
    """UFS records carry what the UFS said, so they replay without one."""
    m = ns.mkdir(ROOT_INO, "m")
    ns.do(UfsMount, path="/m", ino=m, uri="file:///nowhere", write_mode="back", metadata_ttl_ms=1000,
          ttl_ms=3_600_000, options=[("k", "v")])
    ns.do(UfsSyncDir, ino=m, entries=[SyncEntry("obj", False, 9 << 20, 11, "e1"), SyncEntry("sub", True, 0, 0, "")])
    obj = ns.lookup(m, "obj").ino
    ns.do(UfsRefresh, ino=obj, size=1 << 20, mtime_ns=12, etag="e2")
    ns.do(UfsFree, inos=[obj])
    new = ns.create(m, "new")
    ns.do(Commit, ino=new["attr"].ino, lease_id=new["lease_id"], size=0, release=True)
    gen = ns.ns.inode(new["attr"].ino).generation
    ns.do(UfsState, ino=new["attr"].ino, generation=gen, key="new", message="timed out")
    ns.do(UfsState, ino=new["attr"].ino, generation=gen, key="new", etag="e3", mtime_ns=13)
    ns.do(UfsRefresh, ino=obj, gone=True)
    ns.do(UfsUmount, path="/m", force=True)


TABLES = ("inodes", "dirents", "blocks", "pending_blocks", "xattrs", "workers", "meta",
          "ufs_mounts", "ufs_dirs", "ufs_files", "events", "event_hosts", "hosts")


def _tables(n: Namespace) -> dict[str, list[tuple[Any, ...]]]:
    """The tables a replay rebuilds.  The root's atime is left out: schema.init_db makes the
    root inode with its own clock, before any record (no op changes a directory's atime)."""
    out = {t: [tuple(r) for r in n.conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2")] for t in TABLES}
    cols = [r[1] for r in n.conn.execute("PRAGMA table_info(inodes)")]
    root = dict(zip(cols, out["inodes"][0]))
    assert root["ino"] == ROOT_INO
    out["inodes"][0] = tuple(v for c, v in root.items() if c != "atime_ns")
    return out


def test_a_replay_of_the_oplog_rebuilds_the_same_tables(ns: NS, tmp_path: Path) -> None:
    applied = record_applied(ns)
    _workload(ns)
    rows = [rec.to_json() for rec, _ in applied]
    assert {decode(r).op for r in rows} == set(RECORDS)   # the workload has every op
    (tmp_path / "b").mkdir()
    fresh = NS(tmp_path / "b")
    try:
        for text in rows:
            try:
                fresh.journal.submit(decode(text))
            except CurvineError:
                pass   # failed the first time too: its retry-cache row is all it left
        assert _tables(fresh.ns) == _tables(ns.ns)
        assert _tables(fresh.ns)["ufs_mounts"] == []   # (umounted at the end)
        # the event feed: the same events at the same positions, pruned at the same point
        kinds = {r[2] for r in _tables(fresh.ns)["events"]}
        assert kinds == {0, 1, 2, 3, 4} and events_bounds(fresh.ns.conn)[0] > 0
    finally:
        fresh.journal.stop()


def test_a_replay_fails_the_same_records_with_the_same_errors(ns: NS, tmp_path: Path) -> None:
    applied = record_applied(ns)
    _workload(ns)
    failed = {rec.to_json(): e.errno for rec, e in applied if isinstance(e, CurvineError)}
    assert len(failed) == 2
    remembered = [json.loads(r[0]) for r in ns.ns.conn.execute(   # (both had a request id)
        "SELECT result FROM oplog WHERE result LIKE '{\"__errno%' ORDER BY seq")]
    assert [r["__errno"] for r in remembered] == list(failed.values())
    (tmp_path / "b").mkdir()
    fresh = NS(tmp_path / "b")
    try:
        for text in [rec.to_json() for rec, _ in applied]:
            rec = decode(text)
            if text in failed:
                assert errno_of(lambda: fresh.journal.submit(rec)) == failed[text]
            else:
                fresh.journal.submit(rec)
    finally:
        fresh.journal.stop()


def test_a_stamped_or_derived_record_equals_the_one_built_and_checked() -> None:
    """Record.at (the journal's time stamp) and Record.of_checked (a create's mknod) skip
    the field checks; what they make must be the very record the checked way builds."""
    create = Create(cred=Cred(1000, 1000, frozenset({5})), request_id="r", client_id="c", parent=ROOT_INO,
                    name="f", mode=0o640, lease_ms=1000, umask=0o022)
    stamped = create.at(123)
    assert stamped == replace(create, now_ns=123) and create.now_ns == 0 and type(stamped) is Create
    assert decode(stamped.to_json()) == stamped
    derived = Mknod.of_checked(**stamped.envelope(), parent=ROOT_INO, name="f", mode=stat.S_IFREG | 0o640,
                               umask=0o022, exclusive=True, block_size=0)
    assert derived == Mknod(**stamped.envelope(), parent=ROOT_INO, name="f", mode=stat.S_IFREG | 0o640, umask=0o022)
    assert decode(derived.to_json()) == derived
