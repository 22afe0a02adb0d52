"""gRPC channel and server options shared by every process."""
from __future__ import annotations

import grpc

from curvine_py.common.security import with_secret

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
