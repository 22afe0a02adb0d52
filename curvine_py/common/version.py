"""The installed curvine-py's version: what `cv version`, the CSI driver, the master's and
the workers' reports and every daemon's curvine_build_info say."""
from __future__ import annotations

import functools
from importlib import metadata

PACKAGE = "curvine-py"


@functools.cache
def package_version() -> str:
    """The version pip installed; "unknown" for a source tree that was never installed."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"
