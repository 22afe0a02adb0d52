"""What the fuzz targets (fuzz/, docs/testing.md "Fuzzing") found in the master and the
CSI driver, each kept as a plain test.  (Config parsing's findings are in test_config.py.)"""
from __future__ import annotations

import errno
import typing
from pathlib import Path

import pytest

from curvine_py.common.config import Config
from curvine_py.common.errors import CurvineError
from curvine_py.master.group import LeaderOnly
from curvine_py.master.service import MasterService
from curvine_py.pb import curvine_pb2 as pb

EXABYTES = 1 << 63


@pytest.fixture
def master(tmp_path: Path) -> typing.Iterator[typing.Any]:
    """A real master service over a temporary directory, as both transports see it."""
    cfg = Config()
    cfg.master.meta_dir = str(tmp_path)
    service = MasterService(cfg, str(tmp_path / "meta.db"))
    service.journal.start()
    try:
        yield LeaderOnly(service)
    finally:
        service.group.stop()


def test_workers_reporting_more_than_2_64_bytes_do_not_break_statfs_and_report(master: typing.Any) -> None:
    """Two dirs of 2^63 bytes (a broken or hostile worker) summed past the uint64 of
    StatFs and Report, and every later call of either failed inside (EIO)."""
    dirs = [pb.DataDir(path=f"/d{i}", tier="SSD", capacity=EXABYTES, used=EXABYTES) for i in range(2)]
    master.RegisterWorker(pb.RegisterRequest(host="h", ip="127.0.0.1", data_port=1, storage_id="s", dirs=dirs))
    statfs = master.StatFs(pb.Empty())
    assert statfs.capacity == statfs.used == (1 << 64) - 1
    report = master.Report(pb.Empty())
    assert report.capacity == report.workers[0].capacity == (1 << 64) - 1


def test_renewlocks_reclaiming_another_mounts_locks_is_einval(master: typing.Any) -> None:
    """A reclaim list naming another mount (or a renewal with no client id) crashed the lock
    table with a KeyError, answered as an internal error."""
    theirs = pb.LockRequest(caller=pb.Caller(client_id="other-mount"), ino=1, owner=7, flock=True, type=1)
    for mine in ("", "this-mount"):
        with pytest.raises(CurvineError) as e:
            master.RenewLocks(pb.LockRenew(caller=pb.Caller(client_id=mine), reclaim=[theirs]))
        assert e.value.errno == errno.EINVAL, e.value
