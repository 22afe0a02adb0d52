"""What the running pyfuse3 can do, for tests that need more than a stock one.

`make install` builds pyfuse3 with deploy/pyfuse3.patch against libfuse 3.17
(deploy/build-pyfuse3.sh); where it cannot (offline, no compiler, a checksum mismatch) it
installs PyPI's pyfuse3 3.5.0 against the system's libfuse3 instead.  The mount works
with either; these markers skip, with the reason, the tests of what only the patched
one brings.  Import from a test module as ``from pyfuse3_features import ...`` (tests/ is
on sys.path: tests/conftest.py is a rootdir conftest outside a package).
"""
from __future__ import annotations

import pytest

try:
    import pyfuse3
except ImportError:    # make install could not build even the stock one (no compiler)
    pyfuse3 = None

HAVE_PYFUSE3 = pyfuse3 is not None
# The patch's module-level additions: the session's /dev/fuse fd and passthrough at init.
PATCHED = HAVE_PYFUSE3 and hasattr(pyfuse3, "session_fd_number")
# FUSE passthrough: FileInfo.backing_id plus the kernel's answer at init (fuse/passthrough.py).
PASSTHROUGH = PATCHED and hasattr(pyfuse3, "passthrough_enabled") and hasattr(pyfuse3.FileInfo(), "backing_id")
# FOPEN_NOFLUSH for handles that never write (fuse/ops.py _NOFLUSH).
NOFLUSH = HAVE_PYFUSE3 and hasattr(pyfuse3.FileInfo(), "noflush")

_STOCK = ("pyfuse3 lacks deploy/pyfuse3.patch (make install fell back to PyPI's pyfuse3 "
          "against the system's libfuse3)")

needs_pyfuse3 = pytest.mark.skipif(not HAVE_PYFUSE3, reason="pyfuse3 is not installed: no FUSE mount here")
needs_patched = pytest.mark.skipif(not PATCHED, reason=_STOCK)
needs_passthrough = pytest.mark.skipif(not PASSTHROUGH, reason=f"FUSE passthrough off: {_STOCK}")
needs_noflush = pytest.mark.skipif(not NOFLUSH, reason=f"no FileInfo.noflush (FOPEN_NOFLUSH): {_STOCK}")
# The patch asks the kernel for FUSE_DIRECT_IO_ALLOW_MMAP at init; nothing but the patch
# itself shows it from Python.
needs_direct_io_mmap = pytest.mark.skipif(not PATCHED, reason=f"no FUSE_DIRECT_IO_ALLOW_MMAP: {_STOCK}")
