"""The mount's kernel read-ahead (``fuse.read_ahead_kb``), written to its bdi in sysfs.

Why it matters: a buffered read of a FUSE file reaches the mount as read-ahead requests,
and the kernel gives a FUSE mount's bdi 128 KiB of read-ahead, so a remote 14 MiB KV chunk
costs ~112 FUSE round trips (issue 43: 96 readers, 1.4 GB in ~5 s, ~11,000 reads of
128 KiB).  A larger window makes each request as large as the connection's ``max_pages``
allows (256 pages = 1 MiB here; ``fs.fuse.max_pages_limit`` caps it) and keeps several
in flight.

Why after INIT, not after the mount: the kernel proposes the bdi's value in FUSE_INIT,
libfuse answers at most that, and the kernel then lowers the bdi to the answer
(fs/fuse/inode.c ``process_init_reply``: ``ra_pages = min(ra_pages, max_readahead)``).
A value written between the mount and the INIT reply is silently cut back to 128 KiB:
the mount did exactly that until issue 43 (it logged 16384 KiB and kept 128).  So the
mount (fuse/main.py ``_loop``) wraps its operations' ``init`` (``init_answered``) and
calls ``apply`` once the INIT has been answered (``apply_after``), reading the value back
to log what the kernel kept.
"""
from __future__ import annotations

import logging
import typing
from pathlib import Path

import trio

log = logging.getLogger("curvine.fuse")

BDI_ROOT = Path("/sys/class/bdi")
MAX_PAGES_LIMIT = Path("/proc/sys/fs/fuse/max_pages_limit")
PAGE_KB = 4


def bdi_file(dev: str, root: Path = BDI_ROOT) -> Path:
    """The read_ahead_kb file of the mount whose device is dev ("major:minor")."""
    return root / dev / "read_ahead_kb"


def read_kb(dev: str, root: Path = BDI_ROOT) -> int | None:
    """The bdi's read-ahead now (KiB), or None when it cannot be read."""
    try:
        return int(bdi_file(dev, root).read_text().strip())
    except (OSError, ValueError):
        return None


def request_cap_kb() -> int | None:
    """The largest FUSE read the kernel will send any mount (KiB): fs.fuse.max_pages_limit
    pages (the connection negotiates at most that; libfuse asks for 256 pages).  None when
    the sysctl is missing (kernels before 4.20 cap requests at 32 pages = 128 KiB)."""
    try:
        return int(MAX_PAGES_LIMIT.read_text().strip()) * PAGE_KB
    except (OSError, ValueError):
        return None


def apply(dev: str, mountpoint: str, kb: int, root: Path = BDI_ROOT) -> int | None:
    """Set the mount's read-ahead to kb KiB (0: leave the kernel's value) and return what
    the bdi holds afterwards (None: unreadable).  Never raises: where it cannot be written
    (not root, no such sysfs entry, a read-only /sys in a container) one log line says so
    and the mount goes on with the kernel's value.  Blocking (sysfs): run it in a thread."""
    before = read_kb(dev, root)
    if kb <= 0:
        log.info("read-ahead of %s left at the kernel's %s KiB (fuse.read_ahead_kb = 0)", mountpoint,
                 before if before is not None else "?")
        return before
    try:
        bdi_file(dev, root).write_text(str(kb))
    except OSError as e:
        log.warning("read-ahead of %s stays at %s KiB: cannot write %s (%s); fuse.read_ahead_kb = %d not applied",
                    mountpoint, before if before is not None else "?", bdi_file(dev, root),
                    e.strerror or e, kb)
        return before
    now = read_kb(dev, root)
    cap = request_cap_kb()
    log.info("read-ahead of %s set to %s KiB (was %s; fs.fuse.max_pages_limit allows FUSE reads of at most "
             "%s KiB each)", mountpoint, now if now is not None else "?", before if before is not None else "?",
             cap if cap is not None else 128)
    return now


def init_answered(ops: typing.Any) -> trio.Event:
    """An event set once the kernel's INIT has been answered; call before pyfuse3.main().
    ops.init runs inside pyfuse3's INIT handler, on the loop, and libfuse writes the reply
    (which the kernel applies in that write) before the loop runs any other task, so a
    task woken by the event runs after the reply.  (pyfuse3 looks operations.init() up
    when the INIT arrives: the wrapper takes the place of ops' own, which it calls.)"""
    answered = trio.Event()
    inner = ops.init

    def init() -> None:
        try:
            inner()
        finally:
            answered.set()
    ops.init = init
    return answered


async def apply_after(answered: trio.Event, dev: str, mountpoint: str, kb: int) -> None:
    """apply(dev, mountpoint, kb) in a thread once answered (init_answered) is set."""
    await answered.wait()
    await trio.to_thread.run_sync(apply, dev, mountpoint, kb)


__all__ = ["apply", "apply_after", "bdi_file", "init_answered", "read_kb", "request_cap_kb"]
