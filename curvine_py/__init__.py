"""curvine-py: a distributed cache filesystem (a Python re-implementation of Curvine).

``from curvine_py import Client`` gives the SDK; the names load lazily so that the
servers (``curvine_py.master``, ``curvine_py.worker``) do not import the client.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Client", "File", "FileStatus", "CurvineError"]


def __getattr__(name: str) -> Any:
    if name in ("Client", "File"):
        from curvine_py.sdk import client
        return getattr(client, name)
    if name in ("FileStatus", "StatFs", "BlockLocation", "WorkerRef", "Report", "WorkerReport", "DataDir",
                "CachePolicy", "MasterInfo"):
        from curvine_py.sdk import results
        return getattr(results, name)
    if name == "CurvineError":
        from curvine_py.common.errors import CurvineError
        return CurvineError
    raise AttributeError(name)
