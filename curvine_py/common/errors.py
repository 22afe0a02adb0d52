"""POSIX errors on the wire: one exception type, mapped to and from gRPC statuses.

A server raises ``CurvineError(errno.ENOENT, "...")``; the gRPC layer turns it into a
status code plus the trailing metadata ``curvine-errno: <n>``; the client turns that
back into the same ``CurvineError`` (an ``OSError``), so the SDK raises
``FileNotFoundError``-compatible errors and the mount can hand the errno to the kernel.
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import time
import typing

import grpc

ERRNO_KEY = "curvine-errno"
LEADER_KEY = "curvine-leader"   # a follower's UNAVAILABLE names the leader it knows (docs/ha.md)
log = logging.getLogger(__name__)

_STATUS_OF: dict[int, grpc.StatusCode] = {
    errno.ENOENT: grpc.StatusCode.NOT_FOUND,
    errno.EEXIST: grpc.StatusCode.ALREADY_EXISTS,
    errno.EACCES: grpc.StatusCode.PERMISSION_DENIED,
    errno.EPERM: grpc.StatusCode.PERMISSION_DENIED,
    errno.ENOSPC: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errno.EAGAIN: grpc.StatusCode.UNAVAILABLE,
    errno.ETIMEDOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    errno.EIO: grpc.StatusCode.INTERNAL,
    errno.ENOSYS: grpc.StatusCode.UNIMPLEMENTED,
    errno.EOPNOTSUPP: grpc.StatusCode.UNIMPLEMENTED,
    errno.ESTALE: grpc.StatusCode.FAILED_PRECONDITION,
    errno.EBUSY: grpc.StatusCode.FAILED_PRECONDITION,
    errno.ENOTEMPTY: grpc.StatusCode.FAILED_PRECONDITION,
}

# Status codes that mean "the call may not have reached the server: retry it".  CANCELLED
# is what a call in flight gets from a master stopping (SIGTERM: its gRPC server's grace
# ran out), as in a rolling restart of a group of masters.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


class CurvineError(OSError):
    """An error with a POSIX errno; the one error type crossing process boundaries.

    ``CurvineError(errno.ENOENT, ...)`` is also a ``FileNotFoundError`` (and likewise for
    the other errno-specific OSError subclasses), so callers can catch either.
    """

    def __new__(cls, err: int = 0, message: str = "", path: str | None = None) -> "CurvineError":
        if cls is CurvineError and err in _SPECIFIC:
            cls = _SPECIFIC[err]
        return super().__new__(cls, err, message)

    def __init__(self, err: int, message: str, path: str | None = None) -> None:
        super().__init__(err, message)
        self.path = path

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}{self.strerror}"

    def with_path(self, path: str) -> "CurvineError":
        code = self.errno or errno.EIO
        return CurvineError(code, self.strerror or os.strerror(code), path)


def _specific(base: type[OSError]) -> type[CurvineError]:
    return type(f"Curvine{base.__name__}", (CurvineError, base), {"__module__": __name__})


_SPECIFIC: dict[int, type[CurvineError]] = {
    code: _specific(base) for code, base in (
        (errno.ENOENT, FileNotFoundError), (errno.EEXIST, FileExistsError), (errno.EISDIR, IsADirectoryError),
        (errno.ENOTDIR, NotADirectoryError), (errno.EACCES, PermissionError), (errno.EPERM, PermissionError),
        (errno.ETIMEDOUT, TimeoutError), (errno.ECONNRESET, ConnectionResetError),
        (errno.ECONNREFUSED, ConnectionRefusedError), (errno.EINTR, InterruptedError))
}


class ConfigError(Exception):
    """A bad configuration value or file; reported as one line by every command."""


def err(code: int, message: str | None = None) -> CurvineError:
    """Build a CurvineError whose message defaults to strerror(code)."""
    return CurvineError(code, message or os.strerror(code))


def status_of(code: int) -> grpc.StatusCode:
    return _STATUS_OF.get(code, grpc.StatusCode.INVALID_ARGUMENT if code == errno.EINVAL
                          else grpc.StatusCode.UNKNOWN)


def abort(context: grpc.ServicerContext, e: CurvineError) -> typing.NoReturn:
    """End an RPC with e's status, message and errno."""
    context.set_trailing_metadata(((ERRNO_KEY, str(e.errno)),))
    context.abort(status_of(e.errno or errno.EIO), e.strerror or "error")
    raise AssertionError("unreachable")  # context.abort raises


F = typing.TypeVar("F", bound=typing.Callable[..., typing.Any])


class Unavailable(Exception):
    """The server cannot answer yet (e.g. a master waiting for its workers to register):
    sent as UNAVAILABLE without an errno, which clients retry like an unreachable server."""


class NotLeader(Unavailable):
    """This master is not the leader of its group (docs/ha.md): the caller makes the same
    call, same request id, on the leader.  leader: its client address "host:port" as this
    master knows it, "" when it knows none (an election is under way).  On the wire: the
    framed channel's NOT_LEADER status with the address as payload; gRPC's UNAVAILABLE with
    the address in the ``curvine-leader`` trailing metadata.  A client that knows neither
    sees an UNAVAILABLE and retries, as it does for a master that is down."""

    def __init__(self, leader: str = "", message: str = "") -> None:
        super().__init__(message or (f"not the leader; the leader is {leader}" if leader
                                     else "not the leader; no leader is known (an election is under way)"))
        self.leader = leader


class Unreached(Exception):
    """A call the master may not have answered: the clients' one "master unreachable" type.

    Nothing listened, the connection broke or timed out, or the master declined the call
    (UNAVAILABLE, or a follower's NOT_LEADER).  Every client's retry loop makes the call
    again, with the same request id (the master's retry cache answers a repeat), until
    ``client.retry_s`` runs out, and then raises a CurvineError with ``code``.  The
    servers raise Unavailable and NotLeader above; a client receives either as this.

    code: EHOSTDOWN, or ETIMEDOUT when the attempt timed out.
    at: the master tried, its gRPC "host:port" ("" when the raiser does not know it).
    leader: None unless a follower answered NOT_LEADER: the leader it named ("" = none known).
    """

    def __init__(self, message: str, code: int = errno.EHOSTDOWN, *, at: str = "",
                 leader: str | None = None) -> None:
        super().__init__(message)
        self.code, self.at, self.leader = code, at, leader

    @classmethod
    def not_leader(cls, leader: str) -> "Unreached":
        """A follower's NOT_LEADER answer, naming leader ("" = none known)."""
        return cls(f"not the leader; the leader is {leader}" if leader else "not the leader; no leader known",
                   leader=leader)

    def on(self, at: str) -> "Unreached":
        """This failure, as one on master `at` (the retry loop's final error names it)."""
        self.at = at
        return self


class NoServer(Unreached):
    """Nothing at the frame port took the connection (refused, silent, or not a curvine
    frame server): the master may have restarted on another port, so the client asks
    it for the port again before the next attempt."""


class Broken(Unreached):
    """A connection failed in the middle of an exchange (reset, closed, timed out, or a
    frame that does not fit): it is closed and never used again."""


def leader_of(e: grpc.RpcError) -> str | None:
    """The leader a follower named in a failed gRPC call: its address, "" when the follower
    knew none, None when the call did not come from a follower."""
    md = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for key, value in md or ():
        if key == LEADER_KEY:
            return value if isinstance(value, str) else value.decode()
    return None


def handler(fn: F) -> F:
    """Decorate a service method ``(self, request) -> reply``: the same function answers
    every transport (gRPC through ``rpc.grpc_servicer``, the master's framed channel
    directly), so it knows none of them.  CurvineError and Unavailable pass through for
    the transport to encode; an OverflowError (an inode number past what the store can
    hold) is bad input, EINVAL; any other exception is a bug: logged, and EIO to the caller.

    And its latency: a service with an ``rpc_seconds`` histogram (labelled by method) has
    every call observed there, whichever transport made it.  Each method's labelled child
    is looked up once, not per call."""
    children: dict[typing.Any, typing.Any] = {}
    method = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: typing.Any, request: typing.Any) -> typing.Any:
        hist = getattr(self, "rpc_seconds", None)
        start = time.perf_counter()
        try:
            return fn(self, request)
        except (CurvineError, Unavailable):
            raise
        except OverflowError:
            raise CurvineError(errno.EINVAL, f"{method}: a number in the request is out of range") from None
        except Exception as e:  # a bug must not kill the server; the caller sees EIO
            log.exception("internal error in %s", method)
            raise CurvineError(errno.EIO, f"internal error in {method}: {e}") from None
        finally:
            if hist is not None:
                child = children.get(hist)
                if child is None:
                    child = children[hist] = hist.labels(method)
                child.observe(time.perf_counter() - start)
    return typing.cast(F, wrapper)


def to_grpc(context: grpc.ServicerContext, e: CurvineError | Unavailable) -> typing.NoReturn:
    """End a gRPC call with a handler's error: its errno travels in the trailing metadata,
    Unavailable as UNAVAILABLE without one (clients retry it like an unreachable server)."""
    if isinstance(e, NotLeader):
        context.set_trailing_metadata(((LEADER_KEY, e.leader),))
        context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    elif isinstance(e, Unavailable):
        context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    else:
        abort(context, e)
    raise AssertionError("unreachable")  # context.abort raises


def from_rpc_error(e: grpc.RpcError) -> CurvineError:
    """Turn a failed call into a CurvineError with the server's errno (or a transport one)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else None) or str(code)
    for key, value in (e.trailing_metadata() or ()) if hasattr(e, "trailing_metadata") else ():
        if key == ERRNO_KEY:
            return CurvineError(int(value), details)
    if code in (grpc.StatusCode.UNAVAILABLE,):
        return CurvineError(errno.EHOSTDOWN, f"unreachable: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CurvineError(errno.ETIMEDOUT, f"timed out: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return CurvineError(errno.EACCES, details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return CurvineError(errno.EINVAL, details)
    return CurvineError(errno.EIO, details)
