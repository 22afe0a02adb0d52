"""glibc malloc tuning for processes that move large buffers.

Fresh pages cost: on these machines a new 100 MB bytearray is zeroed at ~0.3 GB/s
while memory reused from malloc's heap is filled at ~5 GB/s (measured in
docs/performance.md).  glibc serves big allocations with mmap and returns them to
the kernel on free, so every large read would pay for fresh pages again.  Raising
the mmap and trim thresholds keeps freed memory in the heap for reuse (the
MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_/MALLOC_TOP_PAD_ settings of BRIEF.md,
applied at run time with mallopt so no environment is needed).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
_done = False


def tune_malloc(mmap_threshold: int = 1 << 30, trim_threshold: int = (1 << 31) - 1,
                top_pad: int = 64 << 20) -> bool:
    """Apply once per process; returns False where glibc's mallopt is not available."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = all(libc.mallopt(opt, val) == 1 for opt, val in (
            (M_MMAP_THRESHOLD, min(mmap_threshold, 1 << 30)), (M_TRIM_THRESHOLD, trim_threshold),
            (M_TOP_PAD, top_pad)))
    except (OSError, AttributeError):
        return False
    _done = ok
    return ok
