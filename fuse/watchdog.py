"""The mount's watchdog: no kernel request waits forever, no detached mount's daemon lingers.

Every request handler of ``fuse/ops.py`` is registered while it runs (in the ``_fs_errors``
decorator: a set entry per request, and a context variable naming the request its task
serves; pyfuse3 serves one request per task at a time).  A task (``watch``, started by
``fuse/main.py`` in its nursery beside the signal listener) looks every ``TICK_S``, so a
request is failed between the limit and the limit + ``TICK_S``:

- A request older than ``fuse.request_timeout_s`` is logged once, at ERROR, with what
  holds it up (``curvine_py/client/state.describe``: the buffer pools, the open files,
  every request in flight and what it waits for), and failed with EIO: a request waiting
  in a thread hop (``CurvineOps._run``) has that hop cancelled (the thread is abandoned;
  what it returns later is dropped, ``Hop``), one waiting on the loop (a master call over
  the framed channel, retried while the master is unreachable) fails before its next
  retry or hop.  The mount goes on serving everything else.
- The mount is looked for in ``/proc/self/mountinfo`` by its device number (recorded at
  start: a path can be mounted over again).  When it is gone (``fusermount3 -uz``, a
  lazy ``umount -l``) the kernel may still hold requests the daemon would otherwise wait
  on forever: the connection is aborted (``/sys/fs/fuse/connections/<minor>/abort``,
  every pending request fails at once; a daemon running as root mounts fusectl at start
  when nothing is mounted there, ``ensure_fusectl``; where it cannot, as in containers,
  the connection ends when the daemon closes /dev/fuse right after its loop), and the
  loop is stopped (every request still in it cancelled) so the daemon exits 0 after its
  usual cleanup, without unmounting (something else may be mounted there by now).

No trio cancel scope at all: one per request costs ~10% of a lookup's loop time (see
client/asyncmeta.py), and one around each thread hop added 25-40 us to a ~170 us hop
(measured here).  A thread hop a request may abandon is instead made with trio's low-level
thread API (``hop``): the request's task waits in ``wait_task_rescheduled``, and the
watchdog reschedules it with ``Abandoned`` itself; the thread's result, when it comes,
finds nobody waiting and is dropped (``discard``).  (A request that finds every thread
busy -- abandoned threads keep theirs until they end -- waits for one under a cancel
scope of its own, the one case the watchdog ends with a cancellation.)
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import ctypes
import functools
import logging
import os
import re
import time
import typing
from pathlib import Path

import outcome
import trio

from curvine_py.client.state import describe

log = logging.getLogger(__name__)
TICK_S = 2.0
MOUNTINFO = "/proc/self/mountinfo"
FUSE_CONNECTIONS = Path("/sys/fs/fuse/connections")
T = typing.TypeVar("T")
_ESCAPE = re.compile(r"\\([0-7]{3})")


class Abandoned(Exception):
    """The request ran past fuse.request_timeout_s (or the mount went away): answered EIO."""


class Request:
    """One request being served: what, since when, and the thread hop it waits in."""

    __slots__ = ("op", "name", "value", "start", "hop", "scope", "scope_for", "waits", "expired", "token")

    def __init__(self, op: str, name: str, value: typing.Any, start: float) -> None:
        self.op = op
        self.name, self.value = name, value           # what it works on: "fh", 3
        self.start = start
        self.hop: Hop | None = None                   # set while the request waits in a thread hop
        self.scope: trio.CancelScope | None = None    # ...or on the loop, in a wait the watchdog may end
        self.scope_for = ""                           # ...for what: a free thread, blocks to land
        self.waits = ""                               # ...and the function that hop runs
        self.expired = False                          # past the limit: fails with EIO
        self.token: typing.Any = None                 # CURRENT's, reset at its end

    @property
    def target(self) -> str:
        return f"{self.name}={self.value}" if self.name and isinstance(self.value, int) else ""

    def describe(self, now: float) -> tuple[str, float, str]:
        what = f"{self.op} {self.target}".rstrip()
        waits = (f"thread hop {self.waits}" if self.hop is not None
                 else self.scope_for if self.scope is not None
                 else "on the loop")
        return what + (" (timed out)" if self.expired else ""), now - self.start, waits


# The request the running task serves (pyfuse3 serves one request per task at a time);
# None in system tasks.  A context variable is ~3x cheaper than a dict keyed by the task.
CURRENT: contextvars.ContextVar[Request | None] = contextvars.ContextVar("curvine_fuse_request", default=None)


class Requests:
    """The requests in flight, for the watchdog.  The decorator adds and removes them
    itself (``begin``/``end`` inlined: ~1 us per request, the hot path)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.active: set[Request] = set()

    def begin(self, op: str, name: str = "", value: typing.Any = None) -> Request:
        req = Request(op, name, value, time.monotonic())
        self.active.add(req)
        req.token = CURRENT.set(req)
        return req

    def end(self, req: Request) -> None:
        self.active.discard(req)
        CURRENT.reset(req.token)

    @staticmethod
    def current() -> Request | None:
        """The request the calling task serves (None: not a request, e.g. a system task)."""
        return CURRENT.get()

    def overdue(self, now: float) -> list[Request]:
        """Requests past the limit not yet reported; each is marked expired and its thread
        hop (if it waits in one) cancelled."""
        if self.timeout_s <= 0:
            return []
        late = [r for r in list(self.active) if not r.expired and now - r.start >= self.timeout_s]
        for r in late:
            self.expire(r)
        return late

    def expire_all(self) -> None:
        for r in list(self.active):
            self.expire(r)

    @staticmethod
    def expire(r: Request) -> None:
        r.expired = True
        if r.hop is not None:
            r.hop.abandon()
        elif r.scope is not None:
            r.scope.cancel()

    def snapshot(self, now: float) -> list[tuple[str, float, str]]:
        return sorted((r.describe(now) for r in list(self.active)), key=lambda d: -d[1])


class Hop:
    """One call in a worker thread that its request may abandon (see ``hop``)."""

    __slots__ = ("task", "discard")

    def __init__(self, task: typing.Any, discard: typing.Callable[[typing.Any], None] | None) -> None:
        self.task = task          # the waiting task; None once the answer went out or nobody waits
        self.discard = discard

    def abandon(self) -> None:
        """On the loop: the waiting request goes on now, with Abandoned; the thread runs on."""
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task, outcome.Error(Abandoned()))

    def _deliver(self, limiter: trio.CapacityLimiter, result: outcome.Outcome[typing.Any]) -> None:
        """On the loop, once the thread is done: its answer to the waiting request, or, when
        nobody waits any more, its result to discard (in a thread: it may take a lock)."""
        limiter.release_on_behalf_of(self)
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task, result)
        elif self.discard is not None and isinstance(result, outcome.Value):
            trio.lowlevel.start_thread_soon(functools.partial(_discard, self.discard, result.value), _ignore)


def _discard(discard: typing.Callable[[typing.Any], None], value: typing.Any) -> None:
    try:
        discard(value)
    except Exception:
        log.exception("dropping the result of an abandoned thread hop")


def _ignore(_result: outcome.Outcome[typing.Any]) -> None:
    pass


async def hop(req: Request, limiter: trio.CapacityLimiter, fn: typing.Callable[..., T], *args: typing.Any,
              discard: typing.Callable[[T], None] | None = None) -> T:
    """fn(*args) in a worker thread for request req, as trio.to_thread.run_sync with
    abandon_on_cancel=True, but given up by the watchdog (Hop.abandon: Abandoned raised
    here) without a cancel scope (but for a wait for a free thread).  An outer cancellation
    (the loop stopping) abandons it too.  A result that comes after the request was given
    up goes to discard (an unpin, a descriptor to close, a writer to fail), in a thread.
    The limiter's token is held until the thread really ends."""
    if req.expired:
        raise Abandoned()
    task = trio.lowlevel.current_task()
    h = Hop(task, discard)
    req.waits = getattr(fn, "__name__", "?")
    try:
        limiter.acquire_on_behalf_of_nowait(h)
    except trio.WouldBlock:   # every thread busy (abandoned ones hold theirs): a wait the watchdog can end
        with trio.CancelScope() as scope:
            req.scope, req.scope_for = scope, f"a free thread for {req.waits} (every one busy)"
            try:
                await limiter.acquire_on_behalf_of(h)
            finally:
                req.scope = None
        if scope.cancelled_caught:   # no token was taken
            raise Abandoned() from None
        if req.expired:
            limiter.release_on_behalf_of(h)
            raise Abandoned() from None
    token = trio.lowlevel.current_trio_token()

    def report(result: outcome.Outcome[T]) -> None:   # in the thread
        with contextlib.suppress(trio.RunFinishedError):   # the loop is gone: nobody waits
            token.run_sync_soon(h._deliver, limiter, result)

    try:
        trio.lowlevel.start_thread_soon(functools.partial(fn, *args), report)
    except BaseException:
        limiter.release_on_behalf_of(h)
        raise

    def abort(_raise_cancel: typing.Any) -> trio.lowlevel.Abort:
        h.task = None        # cancelled from outside: abandon the thread
        return trio.lowlevel.Abort.SUCCEEDED

    req.hop = h
    try:   # trio unwraps the outcome it is rescheduled with: fn's value, its error, or Abandoned
        return await trio.lowlevel.wait_task_rescheduled(abort)
    finally:
        req.hop = None


async def landed(req: Request | None, futures: typing.Sequence[concurrent.futures.Future[typing.Any]]) -> None:
    """Wait on the loop, with no thread hop, until futures are done (blocks on their way
    to their workers: the block I/O pool completes them): each one's done-callback wakes
    this task.  Their results are the caller's to read.  The watchdog may end the wait
    (Abandoned), as a wait for a free thread."""
    token = trio.lowlevel.current_trio_token()

    def waker(event: trio.Event) -> typing.Callable[[concurrent.futures.Future[typing.Any]], None]:
        def wake(_done: concurrent.futures.Future[typing.Any]) -> None:   # in the thread that completed it
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(event.set)
        return wake
    if req is not None and req.expired:
        raise Abandoned()
    with trio.CancelScope() as scope:
        if req is not None:
            req.scope, req.scope_for = scope, f"{len(futures)} blocks to land on their workers"
        try:
            for f in futures:
                if not f.done():
                    event = trio.Event()
                    f.add_done_callback(waker(event))
                    await event.wait()
        finally:
            if req is not None:
                req.scope = None
    if scope.cancelled_caught:
        raise Abandoned()


# ---------------------------------------------------------------------- the mount itself
def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


class MountCheck:
    """Is our mount still in the mount table?  Known by its device number ("0:NN")."""

    def __init__(self, path: str, dev: str) -> None:
        self.path = path
        self.dev = dev

    @classmethod
    def find(cls, path: str) -> "MountCheck | None":
        """The FUSE mount at path (the newest one there), right after pyfuse3.init: read
        from the mount table, never by stat() (our own loop would have to answer it)."""
        found = None
        try:
            with open(MOUNTINFO) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) < 5 or _unescape(parts[4]) != path:
                        continue
                    sep = parts.index("-", 6) if "-" in parts[6:] else len(parts) - 1
                    if parts[sep + 1:sep + 2] and parts[sep + 1].startswith("fuse"):
                        found = parts[2]
        except (OSError, ValueError) as e:
            log.warning("cannot read %s (%s): a detached mount will not be noticed", MOUNTINFO, e)
            return None
        if found is None:
            log.warning("%s is not in %s: a detached mount will not be noticed", path, MOUNTINFO)
            return None
        return cls(path, found)

    def present(self) -> bool:
        try:
            with open(MOUNTINFO) as f:
                return any(line.split(maxsplit=3)[2] == self.dev for line in f if line.count(" ") >= 3)
        except OSError:
            return True   # cannot tell: do not stop a working mount

    def abort(self) -> None:
        """Fail every request the kernel holds for this mount, now and later."""
        minor = self.dev.split(":")[1]
        try:
            (FUSE_CONNECTIONS / minor / "abort").write_text("1")
        except OSError as e:   # the connection is gone already (a plain unmount), or fusectl is not mounted
            log.info("cannot abort FUSE connection %s (%s): it ends when the daemon closes /dev/fuse, "
                     "right after its loop", minor, e)


def ensure_fusectl(root: Path = FUSE_CONNECTIONS) -> bool:
    """Mount fusectl on root when the daemon runs as root and nothing is mounted there, so
    MountCheck.abort works on any machine (systemd mounts it at boot; many VMs and
    containers do not): the stop's last resort against a kernel invalidation that waits on
    a request nobody will answer (fuse/notify.py).  True when it is mounted (now or before)."""
    if os.path.ismount(root):
        return True
    if os.geteuid() != 0 or not root.is_dir():   # no fuse module loaded, or not allowed to mount
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"fusectl", bytes(root), b"fusectl", 0, None) != 0:
        log.info("cannot mount fusectl on %s (%s): a stuck FUSE connection cannot be aborted",
                 root, os.strerror(ctypes.get_errno()))
        return False
    log.info("mounted fusectl on %s (nothing was): a stuck FUSE connection can be aborted", root)
    return True


async def watch(requests: Requests, vfs: typing.Any, mount: MountCheck | None,
                detached: typing.Callable[[], None],
                extra: typing.Callable[[], str] = lambda: "", tick_s: float = TICK_S) -> None:
    """The watchdog task: forever, every tick_s.  detached() stops the loop; extra() adds
    lines about the mount itself to a report (its thread-hop limiter)."""
    while True:
        await trio.sleep(tick_s)
        try:
            if mount is not None and not mount.present():
                log.warning("%s is no longer mounted (detached, e.g. fusermount3 -uz): aborting its FUSE "
                            "connection and exiting (%d requests in flight)", mount.path, len(requests.active))
                requests.expire_all()
                mount.abort()
                detached()
                return
            now = time.monotonic()
            late = requests.overdue(now)
            if late:
                log.error("%s", report(requests, vfs, late, now, extra))
        except Exception:   # the watchdog must never end the mount's loop
            log.exception("watchdog")


def report(requests: Requests, vfs: typing.Any, late: list[Request], now: float,
           extra: typing.Callable[[], str] = lambda: "") -> str:
    """The one log record of requests found past the limit, with the mount's state."""
    def how(r: Request) -> str:
        if r.hop is not None:
            return f"its thread hop {r.waits} abandoned"
        if r.scope is not None:
            return f"its wait for {r.scope_for} ended"
        return "waiting on the loop (fails at its next thread hop)"
    heads = "; ".join(" ".join(f"{r.op} {r.target}".split()) + f" after {now - r.start:.1f} s, {how(r)}"
                      for r in late)
    lines = [f"request timed out (fuse.request_timeout_s={requests.timeout_s:g}), failing it with EIO: {heads}",
             describe(vfs, requests.snapshot(now))]
    with contextlib.suppress(Exception):
        more = extra()
        if more:
            lines.append(more)
    return "\n".join(lines)


__all__ = ["Abandoned", "CURRENT", "Hop", "MountCheck", "Request", "Requests", "ensure_fusectl", "hop", "landed",
           "report", "watch"]
