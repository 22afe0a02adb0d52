"""The master's namespace through the journal: POSIX rules, errors, retry cache, durability."""
from __future__ import annotations

import errno
import json
import os
import stat
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from curvine_py.common.errors import CurvineError, Unavailable
from curvine_py.common.types import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO, SETATTR_MODE, SETATTR_SIZE, SETATTR_UID
from curvine_py.master import schema
from curvine_py.master.journal import Journal, decode_result, encode_result
from curvine_py.master.namespace import Namespace
from curvine_py.master.posix import Cred
from curvine_py.master.records import (
    ROOT, Allocate, Commit, CommitBlock, Create, ExpireLeases, Link, Mknod, OpenWrite, Record, Rename, Renew, Rmdir,
    PruneOplog, Setattr, Unlink,
)
from curvine_py.master.store import INODE_FIELDS, InodeRow

ALICE = Cred(1000, 1000, frozenset())
BOB = Cred(1001, 1001, frozenset())


class NS:
    """A namespace with a running journal, as the master uses it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path / "meta.db")
        conn = schema.open_db(self.path)
        schema.init_db(conn, 4 << 20, 2)
        self.ns = Namespace(conn, 4 << 20, 2)
        self.journal = Journal(self.ns)
        self.journal.start()

    def do(self, record: type[Record], cred: Cred = ROOT, **kw: Any) -> dict:
        """Submit a record of type record (client c1 unless kw says otherwise)."""
        return self.journal.submit(record(cred=cred, **{"client_id": "c1", **kw}))

    def mkdir(self, parent: int, name: str, mode: int = 0o755, cred: Cred = ROOT) -> int:
        return self.do(Mknod, cred, parent=parent, name=name, mode=stat.S_IFDIR | mode)["attr"].ino

    def create(self, parent: int, name: str, mode: int = 0o644, cred: Cred = ROOT, **kw: Any) -> dict:
        return self.do(Create, cred, parent=parent, name=name, mode=mode, exclusive=kw.pop("exclusive", False),
                       lease_ms=60000, flags=kw.pop("flags", 0), **kw)

    def lookup(self, parent: int, name: str, cred: Cred = ROOT) -> InodeRow:
        return self.ns.lookup(cred, parent, name)


@pytest.fixture
def ns(tmp_path: Path) -> Iterator[NS]:
    n = NS(tmp_path)
    yield n
    n.journal.stop()


def errno_of(fn: Any) -> int:
    with pytest.raises(CurvineError) as e:
        fn()
    return e.value.errno


def test_mkdir_lookup_and_nlink(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "a")
    assert ns.lookup(ROOT_INO, "a").ino == d
    assert ns.ns.inode(ROOT_INO).nlink == 3
    ns.mkdir(d, "b")
    assert ns.ns.inode(d).nlink == 3
    assert errno_of(lambda: ns.mkdir(ROOT_INO, "a")) == errno.EEXIST
    assert errno_of(lambda: ns.lookup(ROOT_INO, "zz")) == errno.ENOENT
    assert errno_of(lambda: ns.mkdir(ROOT_INO, "x" * 256)) == errno.ENAMETOOLONG
    assert errno_of(lambda: ns.mkdir(ROOT_INO, "a/b")) == errno.EINVAL
    assert errno_of(lambda: ns.do(Rmdir, parent=ROOT_INO, name="a")) == errno.ENOTEMPTY


def test_rename_rules(ns: NS) -> None:
    a, b = ns.mkdir(ROOT_INO, "a"), ns.mkdir(ROOT_INO, "b")
    f = ns.create(a, "f")["attr"].ino
    ns.do(Commit, ino=f, lease_id=ns.ns.inode(f).lease_id, size=0, blocks=[], release=True)
    ns.do(Rename, parent=a, name="f", new_parent=b, new_name="g")
    assert ns.lookup(b, "g").ino == f
    assert errno_of(lambda: ns.do(Rename, parent=ROOT_INO, name="a", new_parent=a, new_name="x")) == errno.EINVAL
    assert errno_of(lambda: ns.do(Rename, parent=b, name="g", new_parent=ROOT_INO, new_name="a")) == errno.EISDIR
    assert errno_of(lambda: ns.do(Rename, parent=ROOT_INO, name="a", new_parent=b, new_name="g")) == errno.ENOTDIR
    ns.mkdir(a, "sub")
    ns.do(Rename, parent=a, name="sub", new_parent=b, new_name="sub")
    assert ns.ns.inode(a).nlink == 2 and ns.ns.inode(b).nlink == 3
    assert errno_of(lambda: ns.do(Rename, parent=b, name="g", new_parent=b, new_name="sub",
                                  flags=RENAME_NOREPLACE)) == errno.EEXIST
    ns.create(b, "h")
    assert errno_of(lambda: ns.do(Rename, parent=b, name="g", new_parent=b, new_name="h",
                                  flags=RENAME_NOREPLACE)) == errno.EEXIST
    g, h = ns.lookup(b, "g").ino, ns.lookup(b, "h").ino
    ns.do(Rename, parent=b, name="g", new_parent=b, new_name="h", flags=RENAME_EXCHANGE)
    assert ns.lookup(b, "g").ino == h and ns.lookup(b, "h").ino == g


def test_rename_over_file_frees_its_blocks(ns: NS) -> None:
    r = ns.create(ROOT_INO, "t.tmp")
    ino, lease = r["attr"].ino, r["lease_id"]
    ids = ns.do(Allocate, ino=ino, lease_id=lease, count=2)["block_ids"]
    ns.do(Commit, ino=ino, lease_id=lease, size=5 << 20, release=True,
          blocks=[CommitBlock(ids[0], 0, 4 << 20, 1),
                  CommitBlock(ids[1], 4 << 20, 1 << 20, 2)])
    r2 = ns.create(ROOT_INO, "u.tmp")
    ns.do(Commit, ino=r2["attr"].ino, lease_id=r2["lease_id"], size=0, blocks=[], release=True)
    out = ns.do(Rename, parent=ROOT_INO, name="u.tmp", new_parent=ROOT_INO, new_name="t.tmp")
    assert sorted(out["freed"]) == sorted(ids)


def test_hard_links_and_unlink(ns: NS) -> None:
    r = ns.create(ROOT_INO, "f")
    ino = r["attr"].ino
    ns.do(Commit, ino=ino, lease_id=r["lease_id"], size=0, blocks=[], release=True)
    ns.do(Link, ino=ino, new_parent=ROOT_INO, new_name="f2")
    assert ns.ns.inode(ino).nlink == 2
    ns.do(Unlink, parent=ROOT_INO, name="f")
    assert ns.ns.inode(ino).nlink == 1
    ns.do(Unlink, parent=ROOT_INO, name="f2")
    assert errno_of(lambda: ns.ns.inode(ino)) == errno.ENOENT


def _closed_file(ns: NS, name: str) -> int:
    r = ns.create(ROOT_INO, name)
    ns.do(Commit, ino=r["attr"].ino, lease_id=r["lease_id"], size=0, blocks=[], release=True)
    return int(r["attr"].ino)


def test_unlink_and_rename_keep_the_callers_open_files(ns: NS) -> None:
    """UnlinkRequest.keep / RenameRequest.keep: a name that is the last link of an inode
    the caller has open is left alone (`kept`), in the same transaction as the check;
    anything else is removed as usual."""
    f, g, other = _closed_file(ns, "f"), _closed_file(ns, "g"), _closed_file(ns, "other")
    out = ns.do(Unlink, parent=ROOT_INO, name="f", keep=[other, f])
    assert out.get("kept") and ns.lookup(ROOT_INO, "f").ino == f
    out = ns.do(Rename, parent=ROOT_INO, name="g", new_parent=ROOT_INO, new_name="f", keep=[f])
    assert out.get("kept")
    assert ns.lookup(ROOT_INO, "f").ino == f and ns.lookup(ROOT_INO, "g").ino == g
    # a kept name is not a held one: without it in `keep` (the file closed) it goes
    out = ns.do(Rename, parent=ROOT_INO, name="g", new_parent=ROOT_INO, new_name="f", keep=[other])
    assert not out.get("kept") and ns.lookup(ROOT_INO, "f").ino == g
    assert errno_of(lambda: ns.ns.inode(f)) == errno.ENOENT
    # one link of two: removing it drops no file, so nothing is kept
    ns.do(Link, ino=g, new_parent=ROOT_INO, new_name="g2")
    out = ns.do(Unlink, parent=ROOT_INO, name="g2", keep=[g])
    assert not out.get("kept") and ns.ns.inode(g).nlink == 1
    # errors come first, as without keep
    assert errno_of(lambda: ns.do(Unlink, ALICE, parent=ROOT_INO, name="f", keep=[g])) == errno.EACCES
    assert errno_of(lambda: ns.do(Unlink, parent=ROOT_INO, name="nothing", keep=[g])) == errno.ENOENT


def test_permissions_and_sticky_bit(ns: NS) -> None:
    tmp = ns.mkdir(ROOT_INO, "tmp", 0o1777)
    mine = ns.create(tmp, "alice-file", cred=ALICE)
    assert mine["attr"].uid == 1000 and mine["attr"].gid == 1000
    ns.do(Commit, cred=ALICE, ino=mine["attr"].ino, lease_id=mine["lease_id"], size=0, blocks=[],
          release=True)
    assert errno_of(lambda: ns.do(Unlink, BOB, parent=tmp, name="alice-file")) == errno.EPERM
    assert errno_of(lambda: ns.mkdir(ROOT_INO, "nope", cred=ALICE)) == errno.EACCES
    private = ns.mkdir(ROOT_INO, "private", 0o700)
    assert errno_of(lambda: ns.lookup(private, "x", cred=ALICE)) == errno.EACCES
    assert errno_of(lambda: ns.do(Setattr, ALICE, ino=private, valid=SETATTR_MODE, mode=0o777)) == errno.EPERM
    assert errno_of(lambda: ns.do(Setattr, ALICE, ino=mine["attr"].ino, valid=SETATTR_UID,
                                  uid=0)) == errno.EPERM
    ns.do(Unlink, ALICE, parent=tmp, name="alice-file")


def test_setgid_directory_inheritance(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "shared", 0o2777)
    ns.do(Setattr, ino=d, valid=4, gid=50)
    sub = ns.do(Mknod, ALICE, parent=d, name="sub", mode=stat.S_IFDIR | 0o755)["attr"]
    assert sub.gid == 50 and sub.mode & stat.S_ISGID
    f = ns.create(d, "f", cred=ALICE)["attr"]
    assert f.gid == 50


def test_suid_cleared_on_write_by_non_root(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "w", 0o777)
    r = ns.create(d, "prog", 0o6755, cred=ALICE)
    ino = r["attr"].ino
    assert r["attr"].mode & stat.S_ISUID
    ids = ns.do(Allocate, ALICE, ino=ino, lease_id=r["lease_id"], count=1)["block_ids"]
    attr = ns.do(Commit, ALICE, ino=ino, lease_id=r["lease_id"], size=10, release=True,
                 blocks=[CommitBlock(ids[0], 0, 10, 0)])["attr"]
    assert not attr.mode & stat.S_ISUID and not attr.mode & stat.S_ISGID


def test_truncate_drops_blocks(ns: NS) -> None:
    r = ns.create(ROOT_INO, "big")
    ino, lease = r["attr"].ino, r["lease_id"]
    ids = ns.do(Allocate, ino=ino, lease_id=lease, count=3)["block_ids"]
    blocks = [CommitBlock(b, i * (4 << 20), 4 << 20, 0) for i, b in enumerate(ids)]
    ns.do(Commit, ino=ino, lease_id=lease, size=12 << 20, blocks=blocks, release=True)
    out = ns.do(Setattr, ino=ino, valid=SETATTR_SIZE, size=5 << 20)
    assert out["freed"] == [ids[2]]
    assert [b.length for b in ns.ns.blocks(ino)] == [4 << 20, 1 << 20]


def test_several_clients_hold_leases_of_one_file_and_each_expires(ns: NS) -> None:
    """No EBUSY: another client's open for writing gets a lease of its own beside the
    first; each lapses on its own, and the file is complete once none is left."""
    r = ns.create(ROOT_INO, "leased")
    ino = r["attr"].ino
    ns.do(Allocate, ino=ino, lease_id=r["lease_id"], count=1)   # the writer's first write
    other = ns.do(OpenWrite, client_id="other", ino=ino, flags=0, lease_ms=1000)
    assert other["lease_id"] not in (0, r["lease_id"])
    assert ns.ns.inode(ino).complete == 0
    ns.do(ExpireLeases, now_ns=(other["lease_expiry_ms"] + 1) * 1_000_000)   # other's only
    assert ns.ns.inode(ino).lease_id == r["lease_id"]
    assert errno_of(lambda: ns.do(Allocate, client_id="other", ino=ino, lease_id=other["lease_id"],
                                  count=1)) == errno.ESTALE
    ns.do(ExpireLeases, now_ns=(r["lease_expiry_ms"] + 1) * 1_000_000)
    assert ns.ns.inode(ino).lease_id == 0 and ns.ns.inode(ino).complete == 1


def test_a_new_files_lease_is_soft_until_its_first_allocate(ns: NS) -> None:
    """Create leaves the file complete under a soft lease: it keeps nobody out, and a close
    with nothing written needs no commit (the lease lapses); the first allocate makes it
    a lease like any other."""
    r = ns.create(ROOT_INO, "soft", exclusive=True)
    ino = r["attr"].ino
    assert r["soft"] and r["lease_id"] and ns.ns.inode(ino).complete == 1
    other = ns.do(OpenWrite, client_id="other", ino=ino, flags=0, lease_ms=1000)   # no EBUSY
    assert other["lease_id"] != r["lease_id"] and not other["soft"]
    assert ns.ns.inode(ino).complete == 0
    assert ns.do(Allocate, ino=ino, lease_id=r["lease_id"], count=1)["block_ids"]   # both write
    truncating = ns.do(OpenWrite, client_id="third", ino=ino, flags=os.O_TRUNC, lease_ms=1000)
    for lease, client in ((r["lease_id"], "c1"), (other["lease_id"], "other")):   # a new generation
        assert errno_of(lambda: ns.do(Allocate, client_id=client, ino=ino, lease_id=lease, count=1)) == errno.ESTALE
    assert ns.do(Allocate, client_id="third", ino=ino, lease_id=truncating["lease_id"], count=1)["block_ids"]

    r = ns.create(ROOT_INO, "hardened")
    ino = r["attr"].ino
    ns.do(Allocate, ino=ino, lease_id=r["lease_id"], count=2)
    assert ns.ns.inode(ino).complete == 0
    assert ns.do(OpenWrite, client_id="other", ino=ino, flags=0, lease_ms=1000)["lease_id"]

    existing = ns.create(ROOT_INO, "hardened", client_id="c1")   # open of an existing file: hard at once
    assert not existing["soft"]


def test_a_creators_soft_lease_is_its_inodes_alone_until_another_lease_needs_a_row(ns: NS) -> None:
    """A create writes no writers row (files.py _own_row): the lease is the inode's lease
    columns.  It is still renewed (not answered "expired"), still its holder's for
    GetBlockLocations, and gets its row when another client's lease joins it."""
    r = ns.create(ROOT_INO, "own")
    ino, lease = r["attr"].ino, r["lease_id"]
    writers = lambda: ns.ns.conn.execute("SELECT lease_id, client, hard FROM writers WHERE ino=?",  # noqa: E731
                                         (ino,)).fetchall()
    assert writers() == [] and ns.ns.inode(ino).lease_id == lease
    assert ns.ns.is_writer(ino, lease, "c1") and not ns.ns.is_writer(ino, lease, "c2")
    renewed = ns.do(Renew, lease_ids=(lease, lease + 1000), lease_ms=120_000)
    assert renewed["expired"] == [lease + 1000]
    assert ns.ns.inode(ino).lease_expiry_ms > r["lease_expiry_ms"]
    assert ns.do(Renew, client_id="c2", lease_ids=(lease,), lease_ms=1)["expired"] == [lease]   # not c2's
    other = ns.do(OpenWrite, client_id="c2", ino=ino, flags=0, lease_ms=1000)
    assert sorted(tuple(w) for w in writers()) == [(lease, "c1", 0), (other["lease_id"], "c2", 1)]
    ns.do(ExpireLeases, now_ns=(other["lease_expiry_ms"] + 1) * 1_000_000)   # c2's lapses, c1's was renewed
    assert [tuple(w) for w in writers()] == [(lease, "c1", 0)] and ns.ns.inode(ino).lease_id == lease


def test_a_file_written_by_one_client_never_gets_a_writers_row(ns: NS) -> None:
    """The only lease of a file stays in its inode through the first allocate (hard now)
    and the close; a lease held so that lapses is released with its uncommitted blocks."""
    rows = lambda: ns.ns.conn.execute("SELECT count(*) FROM writers").fetchone()[0]  # noqa: E731
    r = ns.create(ROOT_INO, "one")
    ino, lease = r["attr"].ino, r["lease_id"]
    ids = ns.do(Allocate, ino=ino, lease_id=lease, count=2)["block_ids"]
    assert rows() == 0 and ns.ns.inode(ino).complete == 0 and ns.ns.is_writer(ino, lease, "c1")
    assert errno_of(lambda: ns.do(Allocate, client_id="c2", ino=ino, lease_id=lease, count=1)) == errno.EACCES
    out = ns.do(Commit, ino=ino, lease_id=lease, size=5, blocks=[CommitBlock(ids[0], 0, 5, 1)], release=True)
    assert out["attr"].lease_id == 0 and out["attr"].complete == 1 and out["attr"].size == 5
    assert out["freed"] == [ids[1]] and rows() == 0
    r = ns.create(ROOT_INO, "lapses")
    ids = ns.do(Allocate, ino=r["attr"].ino, lease_id=r["lease_id"], count=1)["block_ids"]
    out = ns.do(ExpireLeases, now_ns=(r["lease_expiry_ms"] + 1) * 1_000_000)
    assert out["freed"] == ids and ns.ns.inode(r["attr"].ino).lease_id == 0


def test_create_rename_unlink_take_few_statements(ns: NS) -> None:
    """The master's CPU per mutation is mostly its SQL statements (bench/journal_cpu.py):
    a create, a rename and an unlink took 30, 26 and 28 statements (a trigger's statements count, as
    the trace shows them) before they were cut to these; more means a statement crept back
    onto the hot path."""
    d = ns.mkdir(ROOT_INO, "d")
    seen: list[str] = []
    for record, kw, most in ((Create, dict(parent=d, name="f.tmp", mode=0o644, lease_ms=60_000), 20),
                             (Rename, dict(parent=d, name="f.tmp", new_parent=d, new_name="f.data"), 20),
                             (Unlink, dict(parent=d, name="f.data"), 23)):
        seen.clear()
        ns.journal.conn.set_trace_callback(seen.append)
        try:
            ns.do(record, request_id=f"r-{record.__name__}", **kw)
        finally:
            ns.journal.conn.set_trace_callback(None)
        assert len(seen) <= most, f"{record.__name__}: {len(seen)} statements\n" + "\n".join(seen)


def test_a_soft_lease_lapses_and_an_unlink_takes_the_file_at_once(ns: NS) -> None:
    r = ns.create(ROOT_INO, "kept")
    kept = r["attr"].ino
    gone = ns.create(ROOT_INO, "gone")["attr"].ino
    ns.do(Unlink, parent=ROOT_INO, name="gone")
    assert errno_of(lambda: ns.ns.inode(gone)) == errno.ENOENT   # no writer holds anything
    ns.do(ExpireLeases, now_ns=(r["lease_expiry_ms"] + 1) * 1_000_000)
    row = ns.ns.inode(kept)
    assert row.lease_id == 0 and row.complete == 1 and row.size == 0


def test_lapsed_leases_are_released_soft_ones_at_once_hard_ones_in_batches(ns: NS,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from curvine_py.master import files
    monkeypatch.setattr(files, "EXPIRE_BATCH", 3)
    soft = [ns.create(ROOT_INO, f"s{i}") for i in range(5)]
    hard = [ns.create(ROOT_INO, f"h{i}") for i in range(5)]
    pending = {r["attr"].ino: ns.do(Allocate, ino=r["attr"].ino, lease_id=r["lease_id"], count=1)["block_ids"]
               for r in hard}
    later = (max(r["lease_expiry_ms"] for r in soft + hard) + 1) * 1_000_000
    out = ns.do(ExpireLeases, now_ns=later)
    assert all(ns.ns.inode(r["attr"].ino).lease_id == 0 for r in soft)
    assert sum(1 for r in hard if ns.ns.inode(r["attr"].ino).lease_id) == 2
    freed = out["freed"] + ns.do(ExpireLeases, now_ns=later)["freed"]
    assert all(ns.ns.inode(r["attr"].ino).lease_id == 0 for r in hard)
    assert sorted(freed) == sorted(b for ids in pending.values() for b in ids)   # never-committed ids go
    assert all(ns.ns.inode(r["attr"].ino).complete == 1 for r in soft + hard)


def test_commit_refuses_foreign_blocks_and_stale_lease(ns: NS) -> None:
    r = ns.create(ROOT_INO, "f")
    ino = r["attr"].ino
    assert errno_of(lambda: ns.do(Commit, ino=ino, lease_id=r["lease_id"] + 99, size=0, blocks=[],
                                  release=True)) == errno.ESTALE
    bad = [CommitBlock(999999, 0, 1, 0)]
    assert errno_of(lambda: ns.do(Commit, ino=ino, lease_id=r["lease_id"], size=1, blocks=bad,
                                  release=True)) == errno.EINVAL


def test_retry_cache_lookup_uses_the_request_index(ns: NS) -> None:
    """The retry-cache lookup runs before every mutation: it must be an index search,
    not a scan of the whole oplog (which made each mutation cost milliseconds)."""
    from curvine_py.master.journal import RETRY_LOOKUP
    plan = " ".join(str(row[-1]) for row in ns.ns.conn.execute("EXPLAIN QUERY PLAN " + RETRY_LOOKUP, ("r",)))
    assert "USING INDEX oplog_req" in plan, plan


def test_prune_drops_only_expired_oplog_rows(ns: NS) -> None:
    for i in range(5):
        ns.do(Mknod, request_id=f"old-{i}", parent=ROOT_INO, name=f"old{i}", mode=stat.S_IFDIR | 0o755,
              now_ns=1_000_000_000 * (i + 1))
    ns.do(Mknod, request_id="new-1", parent=ROOT_INO, name="new1", mode=stat.S_IFDIR | 0o755)
    conn = ns.ns.conn
    count = lambda: conn.execute("SELECT count(*) FROM oplog").fetchone()[0]  # noqa: E731
    assert count() == 6
    ns.mkdir(ROOT_INO, "no-request-id")
    assert count() == 6   # no request id, nothing for a retry to find: no row
    # a record, as the housekeeping submits it (no request id: it leaves no row either)
    assert ns.do(PruneOplog, before_ms=3_000, now_ns=1_000_000)["pruned"] == 2   # t = 1 s and 2 s
    assert [r[0] for r in conn.execute("SELECT request_id FROM oplog ORDER BY seq")] == \
        ["old-2", "old-3", "old-4", "new-1"]
    ns.do(PruneOplog, before_ms=1 << 62, now_ns=1 << 61)   # everything expired
    assert count() == 0
    ns.do(PruneOplog, before_ms=1 << 62, now_ns=1 << 61)
    assert count() == 0


def test_retry_cache_applies_a_mutation_once(ns: NS) -> None:
    first = ns.do(Mknod, request_id="req-1", parent=ROOT_INO, name="once", mode=stat.S_IFDIR | 0o755)
    again = ns.do(Mknod, request_id="req-1", parent=ROOT_INO, name="once", mode=stat.S_IFDIR | 0o755)
    assert again["attr"].ino == first["attr"].ino
    e1 = errno_of(lambda: ns.do(Unlink, request_id="req-3", parent=ROOT_INO, name="missing"))
    ns.create(ROOT_INO, "missing")
    e2 = errno_of(lambda: ns.do(Unlink, request_id="req-3", parent=ROOT_INO, name="missing"))
    assert e1 == e2 == errno.ENOENT  # the retry gets the first answer, not a second application


def test_a_retried_result_holds_the_same_typed_rows(ns: NS) -> None:
    """The retry cache keeps an InodeRow as the list of its values: a retry gets equal
    InodeRows back (its directories' too).  An older master's rows (fewer columns, or
    schema 1's plain JSON objects) decode to InodeRows with defaults for what they lack."""
    first = ns.do(Mknod, request_id="req-typed", parent=ROOT_INO, name="typed", mode=stat.S_IFDIR | 0o755)
    again = ns.do(Mknod, request_id="req-typed", parent=ROOT_INO, name="typed", mode=stat.S_IFDIR | 0o755)
    assert isinstance(again["attr"], InodeRow) and again == first
    row = replace(first["attr"], kv=1, allocated=7, target="t")
    older = [getattr(row, f) for f in INODE_FIELDS if f not in ("kv", "allocated")]
    assert decode_result(json.dumps({"attr": {"@a": older}})) == {"attr": replace(row, kv=0, allocated=0)}
    plain = {f: getattr(row, f) for f in INODE_FIELDS if f != "allocated"}
    assert decode_result(json.dumps({"attr": plain})) == {"attr": replace(row, allocated=0)}
    assert decode_result(encode_result({"dirs": [row]})) == {"dirs": [row]}


def test_readdir_offsets_are_stable(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "d")
    for i in range(10):
        ns.create(d, f"f{i}")
    root = Cred(0, 0, frozenset())
    first = ns.ns.readdir(root, d, 0, 4, False)
    ns.do(Unlink, parent=d, name="f0")
    ns.create(d, "new")
    rest = ns.ns.readdir(root, d, first[-1].seq, 100, False)
    names = [r.name for r in first + rest]
    assert names[:4] == ["f0", "f1", "f2", "f3"]
    assert set(names[4:]) == {f"f{i}" for i in range(4, 10)} | {"new"}


def test_symlinks_resolve(ns: NS) -> None:
    d = ns.mkdir(ROOT_INO, "real")
    ns.create(d, "file")
    ns.do(Mknod, parent=ROOT_INO, name="link", mode=stat.S_IFLNK | 0o777, target="real")
    ns.do(Mknod, parent=ROOT_INO, name="loop", mode=stat.S_IFLNK | 0o777, target="/loop")
    root = Cred(0, 0, frozenset())
    assert ns.ns.resolve(root, "/link/file").ino == ns.lookup(d, "file").ino
    assert stat.S_ISLNK(ns.ns.resolve(root, "/link", follow=False).mode)
    assert errno_of(lambda: ns.ns.resolve(root, "/loop")) == errno.ELOOP


def test_state_survives_reopen(tmp_path: Path) -> None:
    a = NS(tmp_path)
    a.mkdir(ROOT_INO, "persist")
    a.journal.stop()
    a.ns.conn.close()
    b = NS(tmp_path)
    assert b.lookup(ROOT_INO, "persist").ino > ROOT_INO
    assert b.mkdir(ROOT_INO, "next") > b.lookup(ROOT_INO, "persist").ino
    b.journal.stop()
    assert os.path.exists(b.path)


def test_concurrent_callers_share_commits_and_each_get_their_own_result(ns: NS) -> None:
    """Callers apply each other's queued records (flat combining): every record is applied
    exactly once and each caller gets its own result or error."""
    d = ns.mkdir(ROOT_INO, "many")
    ns.create(d, "taken", exclusive=True)
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        name = "taken" if i % 10 == 0 else f"f{i}"
        try:
            results[i] = ns.create(d, name, exclusive=True)["attr"].ino
        except CurvineError as e:
            results[i] = e.errno

    before = ns.journal.applied
    threads = [threading.Thread(target=lambda k=k: [one(k * 50 + j) for j in range(50)]) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 400
    assert all(results[i] == errno.EEXIST for i in range(0, 400, 10))
    inos = [v for i, v in results.items() if i % 10]
    assert len(set(inos)) == 360 and all(ns.lookup(d, f"f{i}").ino == results[i] for i in range(400) if i % 10)
    assert ns.journal.applied - before == 400


def test_a_stopped_journal_refuses_records(ns: NS) -> None:
    ns.journal.stop()
    with pytest.raises(Unavailable):
        ns.mkdir(ROOT_INO, "late")


def _scanned(ns: NS) -> tuple[int, int, int]:
    """Inodes, blocks and directories as count(*) finds them (what Report did before)."""
    c = ns.ns.conn
    dirs = c.execute("SELECT count(*) FROM inodes WHERE (mode & ?) = ?", (0o170000, stat.S_IFDIR)).fetchone()[0]
    return (c.execute("SELECT count(*) FROM inodes").fetchone()[0],
            c.execute("SELECT count(*) FROM blocks").fetchone()[0], dirs)


def test_the_counts_report_reads_stay_exact(ns: NS, tmp_path: Path) -> None:
    """Report, StatFs and /metrics read counts the store's triggers keep (schema.COUNTS),
    not a scan: they must match the scan after creates, a block overwritten in place (an
    UPDATE: INSERT OR REPLACE would count it twice), a truncate, a rename over a file,
    unlinks and an rmdir; and a store made before the triggers gets them, counted once."""
    def counted() -> tuple[int, int, int]:
        return (*ns.ns.counts(), ns.ns.dir_count())

    d = ns.mkdir(ROOT_INO, "d")
    r = ns.create(d, "f")
    ino, lease = r["attr"].ino, r["lease_id"]
    ids = ns.do(Allocate, ino=ino, lease_id=lease, count=3)["block_ids"]
    ns.do(Commit, ino=ino, lease_id=lease, size=12 << 20, release=False,
          blocks=[CommitBlock(b, i * (4 << 20), 4 << 20, 0) for i, b in enumerate(ids)])
    again = ns.do(Allocate, ino=ino, lease_id=lease, count=1)["block_ids"]
    ns.do(Commit, ino=ino, lease_id=lease, size=12 << 20, release=True, blocks=[CommitBlock(again[0], 0, 4 << 20, 0)])
    assert counted() == _scanned(ns) == (3, 3, 2)
    ns.do(Setattr, ino=ino, valid=SETATTR_SIZE, size=5 << 20)
    _closed_file(ns, "g")
    ns.do(Rename, parent=ROOT_INO, name="g", new_parent=d, new_name="f")
    assert counted() == _scanned(ns) == (3, 0, 2)
    ns.do(Unlink, parent=d, name="f")
    ns.do(Rmdir, parent=ROOT_INO, name="d")
    assert counted() == _scanned(ns) == (1, 0, 1)

    for i in range(5):
        _closed_file(ns, f"old{i}")
    ns.journal.stop()
    conn = ns.ns.conn
    for key in schema.COUNTS:   # what a master before the triggers left
        conn.execute(f"DROP TRIGGER {key}_insert")
        conn.execute(f"DROP TRIGGER {key}_delete")
        conn.execute("DELETE FROM meta WHERE key=?", (key,))
    conn.close()
    again_ns = NS(tmp_path)
    try:
        assert (*again_ns.ns.counts(), again_ns.ns.dir_count()) == _scanned(again_ns) == (6, 0, 1)
        _closed_file(again_ns, "new")
        assert again_ns.ns.counts()[0] == 7
    finally:
        again_ns.journal.stop()
