"""The cluster secret and block access tokens.

Every gRPC call carries the cluster's shared secret as metadata; servers refuse calls
without it (UNAUTHENTICATED, with a message that names the setting).  The data channel
carries no secret: each block frame carries a *block token* instead, an HMAC of the
secret over (block id, mode) that only the master mints, when it hands a block out to a
reader (mode ``r``) or a writer (``w``).  Workers check tokens with the same secret, so
a peer that knows block ids but was never handed them cannot read or write them, and
the secret itself never crosses the data channel.

An empty secret means an open cluster (tests of single components, a laptop); every
check then passes and tokens are empty.
"""
from __future__ import annotations

import hashlib
import hmac
import typing

import grpc

SECRET_METADATA_KEY = "curvine-secret"
READ = "r"
WRITE = "w"
_MAC_LEN = 32  # hex chars of the HMAC kept in a token (128 bits)


class BlockTokens:
    """Mint and check block tokens for one cluster secret."""

    def __init__(self, secret: str) -> None:
        self._key = secret.encode()

    @property
    def enabled(self) -> bool:
        return bool(self._key)

    def mint(self, block_id: int, mode: str) -> str:
        if not self._key:
            return ""
        return mode + self._mac(block_id, mode)

    def allows(self, token: str, block_id: int, write: bool) -> bool:
        """True if token grants this access; a write token also grants reads (a writer
        reads back the blocks it patches)."""
        if not self._key:
            return True
        mode = token[:1]
        if mode not in (READ, WRITE) or (write and mode != WRITE):
            return False
        return hmac.compare_digest(token[1:], self._mac(block_id, mode))

    def _mac(self, block_id: int, mode: str) -> str:
        msg = f"{block_id}:{mode}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()[:_MAC_LEN]


class SecretCheck(grpc.ServerInterceptor):
    """Refuse every call whose metadata lacks the cluster secret."""

    def __init__(self, secret: str, service: str) -> None:
        self._secret = secret
        self._refusal = grpc.unary_unary_rpc_method_handler(self._refuse)
        self._service = service

    def intercept_service(self, continuation: typing.Callable[..., typing.Any],
                          details: grpc.HandlerCallDetails) -> typing.Any:
        if not self._secret:
            return continuation(details)
        for key, value in details.invocation_metadata or ():
            if key == SECRET_METADATA_KEY and hmac.compare_digest(str(value), self._secret):
                return continuation(details)
        return self._refusal

    def _refuse(self, request: typing.Any, context: grpc.ServicerContext) -> typing.NoReturn:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"{self._service} refused the call: missing or wrong cluster secret "
                      "(set [cluster] secret in the config file, as on the servers)")
        raise AssertionError("grpc's context.abort returned")   # it raises; mypy cannot tell


class _AddSecret(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Attach the secret to every outgoing call of a channel."""

    def __init__(self, secret: str) -> None:
        self._pair = (SECRET_METADATA_KEY, secret)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = list(details.metadata or ()) + [self._pair]
        return CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation: typing.Any, details: grpc.ClientCallDetails,
                              request: typing.Any) -> typing.Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: typing.Any, details: grpc.ClientCallDetails,
                               request: typing.Any) -> typing.Any:
        return continuation(self._details(details), request)


class _CallDetails(typing.NamedTuple):
    method: str
    timeout: float | None
    metadata: typing.Any
    credentials: typing.Any
    wait_for_ready: bool | None
    compression: typing.Any


class CallDetails(_CallDetails, grpc.ClientCallDetails):
    """grpc wants a ClientCallDetails instance; a NamedTuple gives the fields."""


def with_secret(channel: grpc.Channel, secret: str) -> grpc.Channel:
    """channel, sending the secret on every call (unchanged when the secret is empty)."""
    if not secret:
        return channel
    return grpc.intercept_channel(channel, _AddSecret(secret))
