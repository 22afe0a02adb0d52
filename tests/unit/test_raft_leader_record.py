"""The leader of a Raft group applies the record it built, not a decode of its text
(master/raft.py ``_Node._in_flight``, ``Journal.apply_entry``'s rec); followers and replays
decode.  Both must leave the same store and give the same results, and the records kept
for the leader's apply must not pile up."""
from __future__ import annotations

import socket
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from curvine_py.common.config import MasterConfig
from curvine_py.common.errors import CurvineError
from curvine_py.common.types import ROOT_INO
from curvine_py.master import schema
from curvine_py.master.journal import Journal, encode_result
from curvine_py.master.namespace import Namespace
from curvine_py.master.raft import RaftGroup
from curvine_py.master.records import (
    Cred, Create, Link, Mknod, Record, Removexattr, Rename, Rmdir, Setattr, Setxattr, Unlink, decode,
)

pytestmark = pytest.mark.timeout(60)
SETATTR_MODE = 1   # FUSE's FATTR_MODE


def store(path: Path) -> Journal:
    conn = schema.open_db(str(path))
    schema.init_db(conn, 4 << 20, 2, now_ns=0)
    return Journal(Namespace(conn, 4 << 20, 2))


def tables(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    """Every table's rows, in a stable order."""
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    return {t: sorted((tuple(r) for r in conn.execute(f"SELECT * FROM {t}")), key=repr) for t in names}


def same(a: Any, b: Any) -> bool:
    """Equal results (an op's error compares by errno and message)."""
    if isinstance(a, CurvineError) or isinstance(b, CurvineError):
        return type(a) is type(b) and (a.errno, a.strerror) == (b.errno, b.strerror)
    return encode_result(a) == encode_result(b)


class Pair:
    """A leader's store and a follower's, fed the same entries the way each master is."""

    def __init__(self, tmp_path: Path) -> None:
        self.leader, self.follower = store(tmp_path / "leader.db"), store(tmp_path / "follower.db")
        self.index = 1

    def apply(self, rec: Record) -> Any:
        self.index += 1
        text = rec.to_json()
        assert decode(text) == rec, f"{rec.op}: its text decodes to another record"
        mine = self.leader.apply_entry(self.index, text, rec)
        theirs = self.follower.apply_entry(self.index, text)
        assert same(mine, theirs), f"{rec.op}: the leader got {mine!r}, a follower {theirs!r}"
        return mine


def test_the_leaders_record_and_a_followers_decode_leave_the_same_store(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    who = Cred(1000, 1000, frozenset({1000, 27, 4}))
    t = time.time_ns()
    d = p.apply(Mknod(parent=ROOT_INO, name="dir é", mode=stat.S_IFDIR | 0o3777,
                      request_id="r1", now_ns=t))["attr"].ino
    f = p.apply(Create(parent=d, name="f.tmp", mode=0o644, lease_ms=30_000, cred=who, request_id="r2",
                       client_id="c1", now_ns=t + 1))["attr"].ino
    p.apply(Setxattr(ino=f, name="user.k", value=b"\x00\xffv", cred=who, request_id="r3", now_ns=t + 2))
    p.apply(Link(ino=f, new_parent=ROOT_INO, new_name="g", request_id="r4", now_ns=t + 3))
    p.apply(Rename(parent=d, name="f.tmp", new_parent=d, new_name="f.data", cred=who, request_id="r5",
                   now_ns=t + 4))
    p.apply(Setattr(ino=f, valid=SETATTR_MODE, mode=0o600, cred=who, request_id="r6", now_ns=t + 5))
    p.apply(Mknod(parent=ROOT_INO, name="dir é", mode=stat.S_IFDIR | 0o755, request_id="r7", now_ns=t + 6))  # EEXIST
    p.apply(Rmdir(parent=ROOT_INO, name="dir é", request_id="r8", now_ns=t + 7))   # ENOTEMPTY
    p.apply(Rmdir(parent=ROOT_INO, name="dir é", cred=who, request_id="r9", now_ns=t + 7))   # EACCES
    p.apply(Mknod(parent=ROOT_INO, name="dir é", mode=stat.S_IFDIR | 0o3777,
                  request_id="r1", now_ns=t + 8))   # a retry: the first answer again
    p.apply(Removexattr(ino=f, name="user.k", cred=who, now_ns=t + 9))
    p.apply(Unlink(parent=ROOT_INO, name="g", keep=(f,), request_id="r10", now_ns=t + 10))
    p.apply(Unlink(parent=d, name="f.data", cred=who, request_id="r11", now_ns=t + 11))
    p.apply(Rmdir(parent=ROOT_INO, name="dir é", request_id="r12", now_ns=t + 12))
    assert p.leader.stored_index() == p.follower.stored_index() == p.index
    assert tables(p.leader.conn) == tables(p.follower.conn)


def test_the_leader_applies_the_record_it_was_given(tmp_path: Path) -> None:
    """With a record, the entry's text is not decoded (a text no decode would take still applies)."""
    j = store(tmp_path / "meta.db")
    rec = Mknod(parent=ROOT_INO, name="a", mode=stat.S_IFDIR | 0o755, now_ns=1)
    assert j.apply_entry(2, "not a record", rec)["attr"].ino > ROOT_INO
    with pytest.raises(CurvineError):
        j.apply_entry(3, "not a record")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Seen(Journal):
    """A journal that notes whether each entry came with its record (the leader's shortcut)."""

    def __init__(self, ns: Namespace) -> None:
        super().__init__(ns)
        self.given: list[bool] = []

    def apply_entry(self, index: int, text: str, rec: Record | None = None) -> Any:
        self.given.append(rec is not None)
        return super().apply_entry(index, text, rec)


def test_a_group_of_one_applies_its_own_records_and_keeps_none(tmp_path: Path) -> None:
    """A real PySyncObj node (a group of one leads alone): each submitted record reaches the
    journal with its text, results as without the shortcut, and none is kept afterwards."""
    conn = schema.open_db(str(tmp_path / "meta.db"))
    schema.init_db(conn, 4 << 20, 2, now_ns=0)
    journal = Seen(Namespace(conn, 4 << 20, 2))
    port = free_port()
    cfg = MasterConfig(ip="127.0.0.1", bind="127.0.0.1", raft_port=port, raft_peers=f"127.0.0.1:{port}",
                       election_timeout_s=0.3)
    group = RaftGroup(cfg, "secret", journal, str(tmp_path / "meta.db"), lambda: 0)
    try:
        deadline = time.monotonic() + 20
        while not group.ready():
            assert time.monotonic() < deadline, "a group of one never became ready"
            time.sleep(0.05)
        made = group.submit(Mknod(parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755, request_id="q1"))
        with pytest.raises(CurvineError):   # EEXIST: a failed op's entry is applied too
            group.submit(Mknod(parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755, request_id="q2"))
        again = group.submit(Mknod(parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755, request_id="q1"))
        assert again["attr"] == made["attr"]
        assert journal.given[-3:] == [True, True, True]
        assert group.node._in_flight == {}
        group.node.forget_in_flight()
    finally:
        group.stop()
