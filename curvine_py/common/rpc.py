"""gRPC channel and server options shared by every process, and the servicer that
serves transport-neutral handlers over gRPC."""
from __future__ import annotations

import functools
import types
import typing

import grpc

from curvine_py.common.errors import CurvineError, Unavailable, to_grpc
from curvine_py.common.security import with_secret
from curvine_py.pb import curvine_pb2

MAX_MESSAGE = 64 * 1024 * 1024


def server_options() -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.so_reuseport", 0)]


def channel(address: str, secret: str = "") -> grpc.Channel:
    """A channel with large messages and keepalives (detect dead masters fast) that sends
    the cluster secret on every call."""
    return with_secret(grpc.insecure_channel(address, options=[
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
    ]), secret)


def grpc_servicer(service: object, name: str) -> object:
    """A gRPC servicer for the proto service `name` over `service`'s transport-neutral
    handlers (``errors.handler``: request -> reply): each method is the handler with its
    errors turned into statuses.  Handed to the generated ``add_*Servicer_to_server``,
    which looks the methods up by name; a handler missing from `service` fails here, at
    start, rather than as UNIMPLEMENTED on the first call."""
    methods = {m.name: _grpc_method(getattr(service, m.name))
               for m in curvine_pb2.DESCRIPTOR.services_by_name[name].methods}
    return types.SimpleNamespace(**methods)


def _grpc_method(fn: typing.Callable[[typing.Any], typing.Any]) -> typing.Callable[..., typing.Any]:
    @functools.wraps(fn)
    def call(request: typing.Any, context: grpc.ServicerContext) -> typing.Any:
        try:
            return fn(request)
        except (CurvineError, Unavailable) as e:
            to_grpc(context, e)
    return call
