"""What a master's cache leases give a mount for directories with ACLs (issue 41).

A mount answers lookups it caches itself, checking the caller's search permission
against the directory's mode (client/metacache.py ``may_search``).  A directory with an
access ACL must not be granted its mode for that (MasterService._looked_up, _made): its
mode alone cannot say who may search it.  The master runs in this process (its real
handlers, as master/main.py builds it), with a cache session whose pushes go nowhere."""
from __future__ import annotations

import contextlib
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from curvine_py.common.config import Config
from curvine_py.common.types import ROOT_INO
from curvine_py.master import acl
from curvine_py.master.main import Servers, build_server
from curvine_py.master.service import MasterService
from curvine_py.pb import curvine_pb2 as pb

LEASE_S = 1.0
U = 0xFFFFFFFF
# u::rwx, u:1001:---, g::r-x, m::r-x, o::r-x: the mode stays 0755, user 1001 may not search
NAMED_DENIED = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in (
    (acl.USER_OBJ, 7, U), (acl.USER, 0, 1001), (acl.GROUP_OBJ, 5, U), (acl.MASK, 5, U), (acl.OTHER, 5, U)))


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterService]:
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path / "master")
    cfg.master.bind = "127.0.0.1"
    cfg.master.port = 0
    cfg.master.frame_port = 0
    cfg.master.metrics_port = 0
    cfg.master.cache_lease_s = LEASE_S
    servers: Servers = build_server(cfg)
    try:
        yield servers.service
    finally:
        servers.stop(grace=0.5)


@contextlib.contextmanager
def session(svc: MasterService) -> Iterator[pb.Caller]:
    """A cache session as a mount keeps one: every push acknowledged by the next beat
    (each LEASE_S / 4), so the session lives and mutations wait for no one."""
    pushed = [0]
    done = threading.Event()

    def push(inv: pb.Invalidation) -> bool:
        pushed[0] = max(pushed[0], inv.seq)
        return True

    svc.Lookup(pb.LookupRequest(caller=pb.Caller(), parent=ROOT_INO, name="x", miss_ok=True))
    time.sleep(LEASE_S * 1.5)   # a started master's grace: it grants nothing for one lease
    sid = svc.open_session(pb.SessionRequest(caller=pb.Caller(client_id="t")), push).session

    def beat() -> None:
        while not done.wait(LEASE_S / 4):
            svc.Beat(pb.SessionBeat(session=sid, acked=pushed[0]))

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield pb.Caller(uid=0, gid=0, client_id="t", session=sid)
    finally:
        done.set()
        beater.join()


def test_no_directory_mode_is_granted_for_a_directory_with_an_acl(master: MasterService) -> None:
    with session(master) as caller:
        check_grants(master, caller)


def check_grants(master: MasterService, caller: pb.Caller) -> None:
    d = master.Mknod(pb.MknodRequest(caller=caller, parent=ROOT_INO, name="d", mode=stat.S_IFDIR | 0o755)).attr
    master.Mknod(pb.MknodRequest(caller=caller, parent=d.ino, name="f", mode=stat.S_IFREG | 0o644))

    def looked_up() -> pb.AttrReply:
        return master.Lookup(pb.LookupRequest(caller=caller, parent=d.ino, name="f", miss_ok=True))

    before = looked_up()
    assert before.lease_seq and before.parent.ino == d.ino and not before.parent.acl
    master.SetXattr(pb.XattrRequest(caller=caller, ino=d.ino, name=acl.ACCESS, value=NAMED_DENIED))
    after = looked_up()
    assert after.lease_seq and after.attr.ino, "the name and the inode are still granted"
    assert not after.HasField("parent"), "the directory's mode would let user 1001 search it"

    master.SetXattr(pb.XattrRequest(caller=caller, ino=d.ino, name=acl.DEFAULT, value=NAMED_DENIED))
    sub = master.Mknod(pb.MknodRequest(caller=caller, parent=d.ino, name="sub", mode=stat.S_IFDIR | 0o755))
    granted = {(k.ino, k.name) for k in sub.granted}
    assert sub.attr.acl and (sub.attr.ino, "/") in granted and (sub.attr.ino, "") not in granted
    plain = master.Mknod(pb.MknodRequest(caller=caller, parent=ROOT_INO, name="plain", mode=stat.S_IFDIR | 0o755))
    assert (plain.attr.ino, "") in {(k.ino, k.name) for k in plain.granted}, "a directory without one: granted"
