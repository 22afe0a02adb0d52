"""The mount's Prometheus metrics: FUSE requests, bytes, and the KV view of lookups.

The KV view: LMCache's ``fs://`` asks whether a chunk exists by a ``stat`` of its
path, so a FUSE LOOKUP that finds the name is an L2 hit and one answered ENOENT a miss.
They are counted per top-level directory of the pool (``dir``: the first component of
the parent's path, at most ``MAX_DIRS`` distinct values, then ``other``; ``/`` for names
in the root itself), which the mount learns from the lookups themselves: a directory
looked up in the root is a top-level one, and a directory looked up inside one inherits
its top-level name.  A directory
the mount never saw looked up (an inode the kernel kept across a daemon restart) counts
as ``unknown``.  The kernel answers repeated lookups of an existing name itself for
``fuse.entry_timeout_s`` (misses for ``fuse.negative_timeout_s``): those never reach the
mount and are not counted (docs/metrics.md).
"""
from __future__ import annotations

import stat
import typing

from prometheus_client import Counter

from curvine_py.common.metrics import histogram

MAX_DIRS = 32          # top-level directories labelled by name; the rest are "other"
MAX_DIR_INODES = 1 << 16   # directory inodes remembered (their top-level name); then reset
ROOT_INODE = 1

OP_SECONDS = histogram("curvine_fuse_op_duration_seconds", "One FUSE request, from its arrival in the "
                       "mount to its answer, by op", ["op"])
READ_BYTES = Counter("curvine_fuse_read_bytes", "Bytes answered to FUSE READ requests")
WRITTEN_BYTES = Counter("curvine_fuse_written_bytes", "Bytes of FUSE WRITE requests accepted")
LOOKUPS = Counter("curvine_fuse_lookups", "FUSE lookups by result (hit: the name exists; miss: ENOENT) and "
                  "top-level directory of the pool: the KV cache's hit rate", ["dir", "result"])
# fuse/notify.py: what the master's pushes and the cache's refusals cost the kernel (issue 39)
KERNEL_INVALIDATIONS = Counter("curvine_fuse_kernel_invalidations", "fuse.kernel_invalidation's work, by "
                               "outcome: push (pushes handed to the kernel), refused (refused answers and session "
                               "ends), told (notifications the kernel took), late (pushes acknowledged before the "
                               "kernel forgot: the 50 ms wait ran out)", ["outcome"])


class TopDirs:
    """Which top-level directory each directory inode is under, learnt from lookups,
    and the lookup counters' children per label (bounded: MAX_DIRS names, then other)."""

    def __init__(self) -> None:
        self._top: dict[int, str] = {}
        self._labels: set[str] = set()
        self._children: dict[tuple[str, str], typing.Any] = {}
        for result in ("hit", "miss"):   # exported at 0 from the start: a dashboard's rate shows 0, not "no data"
            self._children[("/", result)] = LOOKUPS.labels("/", result)

    def label_of(self, parent: int) -> str:
        """The dir label of a lookup in parent: "/" in the root itself (no file name ever
        becomes a label), else the top-level directory parent is under."""
        if parent == ROOT_INODE:
            return "/"
        return self._top.get(parent, "unknown")

    def found(self, parent: int, name: str, ino: int, mode: int) -> None:
        """A lookup of name in parent found ino: a directory's children share its label
        (a directory in the root starts a label of its own, while there is room)."""
        if not stat.S_ISDIR(mode):
            return
        if len(self._top) >= MAX_DIR_INODES:
            self._top.clear()
        self._top[ino] = self._bounded(name) if parent == ROOT_INODE else self._top.get(parent, "unknown")

    def _bounded(self, name: str) -> str:
        if name in self._labels:
            return name
        if len(self._labels) >= MAX_DIRS:
            return "other"
        self._labels.add(name)
        return name

    def count(self, label: str, result: str) -> None:
        """One lookup's result.  (Its latency is curvine_fuse_op_duration_seconds{op="lookup"}:
        a second histogram per lookup cost ~3 us here, 1-2% of a lookup.)"""
        child = self._children.get((label, result))
        if child is None:
            child = self._children[(label, result)] = LOOKUPS.labels(label, result)
        child.inc()
