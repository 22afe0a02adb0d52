"""Client.prefix_hosts' count (sdk/client.py leading_counts): per host, the leading chunks
it holds, stopping at the first chunk a host lacks or that is absent."""
from __future__ import annotations

import errno

from curvine_py.sdk.client import leading_counts
from curvine_py.sdk.results import Location


def loc(hosts: str, missing: bool = False) -> Location:
    return Location("/p", errno.ENOENT if missing else 0, None, tuple(h for h in hosts.split(",") if h), "")


def test_each_host_counts_its_own_leading_run_most_first() -> None:
    got = leading_counts([loc("a,b"), loc("a,b,c"), loc("a,c"), loc("a"), loc("b")])
    assert got == {"a": 4, "b": 2}
    assert list(got) == ["a", "b"]


def test_a_host_without_the_first_chunk_counts_nothing() -> None:
    assert leading_counts([loc("a"), loc("b"), loc("b")]) == {"a": 1}


def test_an_absent_chunk_ends_every_run() -> None:
    assert leading_counts([loc("a,b"), loc("", missing=True), loc("a,b")]) == {"a": 1, "b": 1}
    assert leading_counts([]) == {}
    assert leading_counts([loc("", missing=True)]) == {}
