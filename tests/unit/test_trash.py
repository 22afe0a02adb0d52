"""Names in the trash directory and who keeps them (common/trash.py, master/trashsweep.py)."""
from __future__ import annotations

from curvine_py.common.trash import kept_name, owner_of, tag_of
from curvine_py.common.types import HIDDEN_PREFIX
from curvine_py.master.trashsweep import TrashOwners

A, B = "host-a/101/0a1b2c3d", "host-b/202/4e5f6a7b"


def test_a_kept_name_carries_its_clients_tag_and_nothing_else_does() -> None:
    name = kept_name(f"{HIDDEN_PREFIX}1f_3", A)
    assert owner_of(name) == tag_of(A) != tag_of(B)
    assert "/" not in name and len(name.encode()) <= 255
    for untagged in (f"{HIDDEN_PREFIX}1f_3", f"{HIDDEN_PREFIX}tmpab12", "plain@" + tag_of(A),
                     f"{HIDDEN_PREFIX}x@short", f"{HIDDEN_PREFIX}x@" + "g" * 16):
        assert owner_of(untagged) is None, untagged


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_names_of_a_client_not_heard_for_a_grace_are_stale_and_no_others() -> None:
    clock = Clock()
    owners = TrashOwners(grace_s=10, clock=clock)
    a, b, old = kept_name(f"{HIDDEN_PREFIX}1_1", A), kept_name(f"{HIDDEN_PREFIX}2_1", B), f"{HIDDEN_PREFIX}3_1"
    assert owners.stale([a, b, old]) == []          # a new leader: nobody heard yet, nothing stale for a grace
    clock.now += 5
    owners.heard(A)
    clock.now += 6
    assert owners.stale([a, b, old]) == [b]          # B silent since the start; an untagged name never
    clock.now += 9
    owners.heard(A)
    assert owners.stale([a, b]) == [b]
    clock.now += 10.5
    assert owners.stale([a, b]) == [a, b]            # A silent for more than a grace now
    owners.new_term()
    assert owners.stale([a, b]) == []                # leading again: a grace for every client to renew
