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
  the fast path, bounded by ``client.rpc_timeout_s``) fails at its next hop.  The mount
  goes on serving everything else.
- The mount is looked for in ``/proc/self/mountinfo`` by its device number (recorded at
  start: a path can be mounted over again).  When it is gone (``fusermount3 -uz``, a
  lazy ``umount -l``) the kernel may still hold requests the daemon would otherwise wait
  on forever: the connection is aborted (``/sys/fs/fuse/connections/<minor>/abort``,
  every pending request fails at once; where fusectl is not mounted, as in containers,
  the connection ends when the daemon closes /dev/fuse right after its loop), and the
  loop is stopped (every request still in it cancelled) so the daemon exits 0 after its
  usual cleanup, without unmounting (something else may be mounted there by now).

No per-request trio cancel scope: one costs ~10% of a lookup's loop time (see
client/asyncmeta.py), so scopes are entered only around thread hops, which cost ~30x more.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import threading
import time
import typing
from pathlib import Path

import trio

from curvine_py.client.state import describe

log = logging.getLogger(__name__)
TICK_S = 2.0
MOUNTINFO = "/proc/self/mountinfo"
FUSE_CONNECTIONS = Path("/sys/fs/fuse/connections")
_ESCAPE = re.compile(r"\\([0-7]{3})")


class Abandoned(Exception):
    """The request ran past fuse.request_timeout_s (or the mount went away): answered EIO."""


class Request:
    """One request being served: what, since when, and the thread hop it waits in."""

    __slots__ = ("op", "name", "value", "start", "scope", "waits", "expired", "token")

    def __init__(self, op: str, name: str, value: typing.Any, start: float) -> None:
        self.op = op
        self.name, self.value = name, value           # what it works on: "fh", 3
        self.start = start
        self.scope: trio.CancelScope | None = None   # set while the request is in a thread hop
        self.waits = ""                               # ...and the function that hop runs
        self.expired = False                          # past the limit: fails with EIO
        self.token: typing.Any = None                 # CURRENT's, reset at its end

    @property
    def target(self) -> str:
        return f"{self.name}={self.value}" if self.name and isinstance(self.value, int) else ""

    def describe(self, now: float) -> tuple[str, float, str]:
        what = f"{self.op} {self.target}".rstrip()
        waits = f"thread hop {self.waits}" if self.scope is not None else "on the loop"
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
        if r.scope is not None:
            r.scope.cancel()

    def snapshot(self, now: float) -> list[tuple[str, float, str]]:
        return sorted((r.describe(now) for r in list(self.active)), key=lambda d: -d[1])


class Hop:
    """One thread hop a request may abandon.  Whichever comes second, the thread's return
    or the abandonment, hands a result nobody will use to ``discard`` (an unpin, a
    descriptor to close, a writer to fail): the thread may finish just as the request is
    given up, after trio has dropped its result."""

    __slots__ = ("fn", "args", "discard", "lock", "state", "result")
    RUNNING, DONE, ABANDONED = 0, 1, 2

    def __init__(self, fn: typing.Callable[..., typing.Any], args: tuple[typing.Any, ...],
                 discard: typing.Callable[[typing.Any], None] | None) -> None:
        self.fn, self.args, self.discard = fn, args, discard
        self.lock = threading.Lock()
        self.state = Hop.RUNNING
        self.result: typing.Any = None

    def __call__(self) -> typing.Any:   # in the worker thread
        r = self.fn(*self.args)
        if self.discard is None:
            return r
        with self.lock:
            if self.state == Hop.RUNNING:
                self.state, self.result = Hop.DONE, r
                return r
        self._discard(r)   # given up meanwhile
        return r

    def abandon(self) -> None:   # on the loop
        if self.discard is None:
            return
        with self.lock:
            was, self.state = self.state, Hop.ABANDONED
            r, self.result = self.result, None
        if was == Hop.DONE:
            self._discard(r)

    def _discard(self, r: typing.Any) -> None:
        try:
            self.discard(r)   # type: ignore[misc]
        except Exception:
            log.exception("dropping the result of an abandoned %s", getattr(self.fn, "__name__", self.fn))


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
    heads = "; ".join(f"{r.op} {r.target} after {now - r.start:.1f} s, "
                      + ("its thread hop %s abandoned" % r.waits if r.scope is not None
                         else "waiting on the loop (fails at its next thread hop)") for r in late)
    lines = [f"request timed out (fuse.request_timeout_s={requests.timeout_s:g}), failing it with EIO: {heads}",
             describe(vfs, requests.snapshot(now))]
    with contextlib.suppress(Exception):
        more = extra()
        if more:
            lines.append(more)
    return "\n".join(lines)


__all__ = ["Abandoned", "CURRENT", "Hop", "MountCheck", "Request", "Requests", "report", "watch"]
