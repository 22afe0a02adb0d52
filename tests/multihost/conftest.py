"""Fixtures for tests across several hosts: network namespaces on one bridge (curvine_py.testing.testhosts).

``hosts`` makes 4 hosts for one test; ``net_cluster`` starts a cluster on them: the master
on host 0, workers on hosts 1 and 2 (host 3 is free for clients and mounts);
``net_cluster_factory(worker_hosts=(1, 2, 3), ...)`` starts other shapes.  Everything is
torn down after the test, also when it failed (the daemons' log tails are printed then),
and a killed pytest run is cleaned up by the next one (or ``python -m curvine_py.testing.hostsctl down``).
The tests are skipped, with the reason, where namespaces cannot be made (not root, no
``ip netns``).  Run only these: ``pytest -m multihost``.
"""
from __future__ import annotations

import typing
from pathlib import Path

import pytest

from curvine_py.testing.netcluster import NetCluster
from curvine_py.testing.testhosts import Hosts, unavailable_reason
from tests.conftest import FAST_MASTER_FLAGS, stop_clusters

HOSTS = 4

_reason: list[str | None] = []


def _skip_reason() -> str | None:
    if not _reason:
        _reason.append(unavailable_reason())
    return _reason[0]


@pytest.fixture
def hosts() -> typing.Iterator[Hosts]:
    """4 hosts (network namespaces) on one bridge; removed after the test."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with Hosts(HOSTS) as h:
        yield h


@pytest.fixture
def net_cluster_factory(hosts: Hosts, tmp_path: Path, request: pytest.FixtureRequest
                        ) -> typing.Iterator[typing.Callable[..., NetCluster]]:
    """Start clusters on ``hosts``: ``net_cluster_factory(worker_hosts=(1, 2, 3))``."""
    started: list[NetCluster] = []

    def make(**kwargs: typing.Any) -> NetCluster:
        kwargs.setdefault("extra_master_flags", FAST_MASTER_FLAGS)
        c = NetCluster(hosts, tmp_path / f"cluster{len(started)}", **kwargs)
        started.append(c)
        return c.start()

    try:
        yield make
    finally:
        stop_clusters(started, request)


@pytest.fixture
def net_cluster(net_cluster_factory: typing.Callable[..., NetCluster]) -> NetCluster:
    """Master on host 0, workers on hosts 1 and 2; host 3 runs no daemon."""
    return net_cluster_factory(worker_hosts=(1, 2))


def pytest_terminal_summary(terminalreporter: typing.Any) -> None:
    """Print the fault suite's table (tests/multihost/faulttable.py) when it ran."""
    from tests.multihost.faulttable import ROWS, render
    if ROWS:
        terminalreporter.write_sep("=", "fault suite: nothing acknowledged may be lost")
        terminalreporter.write_line(render())
