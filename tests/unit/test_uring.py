"""What is Uring's own, beside the IoEngine contract: the contract (reads, writes,
scatter/gather, errors, fsync, more ops than entries, close, concurrent submitters) runs
on both engines in test_ioengine.py.  Skips through the session's io_uring probe where
io_uring cannot work."""
from __future__ import annotations

import pytest

from curvine_py.worker.uring import Uring


def test_entries_validated() -> None:
    with pytest.raises(ValueError):
        Uring(1)
