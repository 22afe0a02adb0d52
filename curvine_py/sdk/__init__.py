"""The Python SDK: ``Client`` (paths over the client's VFS, file objects, whole-object
helpers; ``client.py``), its typed results (``results.py``) and its UFS administration
(``ufsadmin.py``, reached as ``Client.ufs``).
"""
from __future__ import annotations

from curvine_py.sdk.client import Client, File, Progress
from curvine_py.sdk.results import (BlockLocation, CachePolicy, DataDir, FileStatus, MasterInfo, Report, StatFs,
                                    WorkerRef, WorkerReport)

__all__ = ["BlockLocation", "CachePolicy", "Client", "DataDir", "File", "FileStatus", "MasterInfo", "Progress",
           "Report", "StatFs", "WorkerRef", "WorkerReport"]
