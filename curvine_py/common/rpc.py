"""gRPC channel and server options shared by every process, and the servicer that
serves transport-neutral handlers over gRPC."""
from __future__ import annotations

import functools
import types
import typing

import grpc

from curvine_py.common.errors import CurvineError, Unavailable, to_grpc
from curvine_py.common.security import with_secret
from curvine_py.common.tls import Tls, grpc_peer_role, role_name
from curvine_py.pb import curvine_pb2

MAX_MESSAGE = 64 * 1024 * 1024


def server_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.so_reuseport", 0)]


def channel(address: str, secret: str = "", tls: "Tls | None" = None, peer: str = "master") -> grpc.Channel:
    """A channel with large messages and keepalives (detect dead masters fast) that sends
    the cluster secret on every call; with tls, mutual TLS to a server whose certificate
    is of role `peer` (common/tls.py)."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.keepalive_time_ms", 10000),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.enable_retries", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        # without this gRPC waits up to 20 s (its default minimum) before reconnecting to a
        # restarted master, so every call in between fails fast and retries exhaust
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    if tls is None:
        return with_secret(grpc.insecure_channel(address, options=options), secret)
    options.append(("grpc.ssl_target_name_override", role_name(peer)))
    return with_secret(grpc.secure_channel(address, tls.grpc_channel_credentials(), options=options), secret)


def add_port(server: grpc.Server, address: str, tls: "Tls | None") -> int:
    """Listen on address, with mutual TLS when tls is given; 0 when the port is taken."""
    try:
        if tls is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, tls.grpc_server_credentials())
    except RuntimeError:
        return 0


def grpc_servicer(service: object, name: str,
                  roles: typing.Mapping[str, frozenset[str]] | None = None) -> object:
    """A gRPC servicer for the proto service `name` over `service`'s transport-neutral
    handlers (``errors.handler``: request -> reply): each method is the handler with its
    errors turned into statuses.  Handed to the generated ``add_*Servicer_to_server``,
    which looks the methods up by name; a handler missing from `service` fails here, at
    start, rather than as UNIMPLEMENTED on the first call.

    roles: the methods only some roles may call (common/tls.py), checked on calls that
    came over TLS: e.g. only a worker's certificate registers a worker."""
    roles = roles or {}
    methods = {m.name: _grpc_method(getattr(service, m.name), roles.get(m.name))
               for m in curvine_pb2.DESCRIPTOR.services_by_name[name].methods}
    return types.SimpleNamespace(**methods)


def _grpc_method(fn: typing.Callable[[typing.Any], typing.Any],
                 allowed: frozenset[str] | None) -> typing.Callable[..., typing.Any]:
    @functools.wraps(fn)
    def call(request: typing.Any, context: grpc.ServicerContext) -> typing.Any:
        if allowed is not None and (role := grpc_peer_role(context)) is not None and role not in allowed:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"{fn.__name__} refused: a {role or 'role-less'} certificate may not call it "
                          f"(only {', '.join(sorted(allowed))})")
        try:
            return fn(request)
        except (CurvineError, Unavailable) as e:
            to_grpc(context, e)
    return call
