"""POSIX ACLs across hosts (issue 41): an ACL set through one host's mount is enforced
through another host's mount of the same pool, and a default ACL set on one host is
inherited by files made on the other.  The master stores and checks the ACLs; each
mount's kernel checks them too (FUSE_POSIX_ACL), from its cache of them, which it drops
when it revalidates the name (fuse.entry_timeout_s, 1 s): so a change shows there
within about that bound, as a chmod does (docs/posix.md "ACLs")."""
from __future__ import annotations

import errno
import os
import time
import typing
from pathlib import Path

import pytest

from curvine_py.master import acl
from curvine_py.master.acl import GROUP_OBJ, MASK, OTHER, UNDEFINED_ID, USER, USER_OBJ, Acl, Entry
from curvine_py.testing.netcluster import NetCluster
from tests.conftest import FAST_MASTER_FLAGS
from tests.posix.conftest import run_as_user

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(180)]
Factory = typing.Callable[..., NetCluster]
U1, U2, U3 = 1000, 1001, 1002
SHOWS_WITHIN_S = 5.0     # the kernel's entry (and so ACL) cache: 1 s, with slack for a loaded VM
DENIED = ("errno", errno.EACCES)


def acl_of(users: dict[int, int], user: int = 6, mask: int = 7, other: int = 0) -> bytes:
    e = [Entry(USER_OBJ, user, UNDEFINED_ID), *(Entry(USER, p, u) for u, p in sorted(users.items())),
         Entry(GROUP_OBJ, 0, UNDEFINED_ID), Entry(MASK, mask, UNDEFINED_ID), Entry(OTHER, other, UNDEFINED_ID)]
    return Acl(tuple(e)).to_bytes()


def read_file(name: str) -> bytes:
    with open(name, "rb") as f:
        return f.read()


def create(name: str, mode: int) -> int:
    os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
    return os.stat(name).st_mode & 0o777


def eventually(probe: typing.Callable[[], typing.Any], want: typing.Any) -> float:
    """Seconds until probe() == want (fails after SHOWS_WITHIN_S)."""
    start = time.monotonic()
    while True:
        got = probe()
        took = time.monotonic() - start
        if got == want:
            return took
        assert took < SHOWS_WITHIN_S, f"still {got!r} after {took:.1f} s, want {want!r}"
        time.sleep(0.05)


def test_an_acl_set_on_one_host_is_enforced_on_another(net_cluster_factory: Factory, tmp_path: Path) -> None:
    c = net_cluster_factory(worker_hosts=(1, 2), extra_master_flags=FAST_MASTER_FLAGS)
    m1, m2 = c.mount(1, tmp_path / "m1"), c.mount(3, tmp_path / "m2")
    (m1 / "d").mkdir()
    os.chmod(m1 / "d", 0o777)
    (m1 / "d" / "f").write_bytes(b"secret")
    os.chmod(m1 / "d" / "f", 0o600)
    on_a, on_b = m1 / "d", m2 / "d"   # (the users work in them: pytest's dirs above are 0700)

    def reads(uid: int) -> typing.Callable[[], typing.Any]:
        return lambda: run_as_user(read_file, "f", uid=uid, cwd=on_b)

    eventually(reads(U1), DENIED)
    os.setxattr(m1 / "d" / "f", acl.ACCESS, acl_of({U1: 4, U2: 0}, other=0))
    shown = eventually(reads(U1), b"secret")
    assert run_as_user(read_file, "f", uid=U2, cwd=on_b) == DENIED
    assert run_as_user(read_file, "f", uid=U3, cwd=on_b) == DENIED
    assert os.getxattr(m2 / "d" / "f", acl.ACCESS) == acl_of({U1: 4, U2: 0}, other=0)

    os.setxattr(m1 / "d" / "f", acl.ACCESS, acl_of({U1: 0, U2: 4}, other=0))   # the grant moves to U2
    moved = eventually(reads(U1), DENIED)
    eventually(reads(U2), b"secret")

    os.chmod(m1 / "d" / "f", 0o600)   # chmod on A: the mask ---, so U2's entry no longer grants on B
    masked = eventually(reads(U2), DENIED)

    os.setxattr(m1 / "d", acl.DEFAULT, acl_of({U2: 6}, user=7, mask=7, other=0))
    eventually(lambda: acl.DEFAULT in os.listxattr(m2 / "d"), True)
    assert run_as_user(create, "new", 0o660, uid=U1, umask=0, cwd=on_b) == 0o660
    inherited = acl.parse(os.getxattr(m1 / "d" / "new", acl.ACCESS))
    assert inherited is not None and inherited.perm(USER) == 6 and inherited.perm(MASK) == 6
    (m1 / "d" / "new").write_bytes(b"x")   # (root)
    assert run_as_user(read_file, "new", uid=U2, cwd=on_a) == b"x"
    assert run_as_user(read_file, "new", uid=U3, cwd=on_a) == DENIED
    print(f"\nACL change seen on the other host within: grant {shown:.2f} s, move {moved:.2f} s, "
          f"chmod {masked:.2f} s")
