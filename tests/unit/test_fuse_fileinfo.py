"""What the mount tells the kernel about an opened file (fuse/ops.py `_file_info`)."""
from __future__ import annotations

import pytest
from pyfuse3_features import needs_noflush, needs_patched

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 is not installed: no FUSE mount here")

from curvine_py.client.vfs import Opened  # noqa: E402
from curvine_py.common.config import FuseConfig  # noqa: E402
from curvine_py.fuse.ops import CurvineOps  # noqa: E402
from curvine_py.pb import curvine_pb2 as pb  # noqa: E402


def info(opened: Opened, **cfg: object) -> pyfuse3.FileInfo:
    ops = object.__new__(CurvineOps)   # _file_info needs only the config
    ops.cfg = FuseConfig(**cfg)  # type: ignore[arg-type]
    return ops._file_info(opened)


@needs_patched
def test_the_built_pyfuse3_has_noflush() -> None:
    """deploy/build-pyfuse3.sh's pyfuse3 can ask for FOPEN_NOFLUSH (a stock one cannot)."""
    assert hasattr(pyfuse3.FileInfo(), "noflush") and hasattr(pyfuse3.FileInfo(), "backing_id")


@needs_noflush
def test_handles_that_never_write_ask_for_no_flush_at_close() -> None:
    """A FLUSH of a read-only handle would do nothing: the kernel is told to skip it, so a
    reader's close(2) is one round trip shorter.  A writing handle's close commits: kept."""
    attr = pb.Attr(ino=5)
    assert info(Opened(7, attr, keep_cache=True, writes=False)).noflush
    assert not info(Opened(8, attr, keep_cache=False, writes=True)).noflush


def test_cache_and_direct_io_flags() -> None:
    """What any pyfuse3 (stock or patched) is told about a handle's caching."""
    attr = pb.Attr(ino=5)
    read = info(Opened(7, attr, keep_cache=True, writes=False))
    assert read.fh == 7 and read.keep_cache and not read.direct_io
    write = info(Opened(8, attr, keep_cache=False, writes=True))
    assert not write.keep_cache
    assert info(Opened(9, attr, keep_cache=False, direct=True), direct_io=False).direct_io
    assert info(Opened(9, attr, keep_cache=False), direct_io=True).direct_io
