"""The cluster secret and block access tokens.

Every gRPC call carries the cluster's shared secret as metadata; servers refuse calls
without it (UNAUTHENTICATED, with a message that names the setting).  The data channel
carries no secret: each block frame carries a *block token* instead, that only the
master mints, when it hands a block out to a reader (mode ``r``) or a writer (``w``).
Workers check tokens with the same secret, so a peer that knows block ids but was never
handed them cannot read or write them, and the secret itself never crosses the data
channel.

A token expires (``security.block_token_ttl_s`` after it was minted): a token seen on
the wire (the data channel may run without TLS) is worth a few minutes, not the
block's life.  Its text is ``<mode><expiry>.<mac>``: the expiry in Unix seconds and
the first 32 hex digits of HMAC-SHA256(secret, "<block id>:<mode>:<expiry>"), so
changing the block id, the mode or the expiry breaks the MAC (docs/wire.md,
docs/security.md).  Workers allow ``security.block_token_grace_s`` of clock skew past
the expiry.  An expired token is refused with EKEYEXPIRED, a forged or malformed one
with EACCES: clients renew on the first (ask the master again and retry once), and
fail on the second.

An empty secret means an open cluster (tests of single components, a laptop); every
check then passes and tokens are empty.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import time
import typing

import grpc

from curvine_py.common.errors import CurvineError

SECRET_METADATA_KEY = "curvine-secret"
READ = "r"
WRITE = "w"
_MAC_LEN = 32  # hex chars of the HMAC kept in a token (128 bits)


DEFAULT_TTL_S = 600.0     # security.block_token_ttl_s
DEFAULT_GRACE_S = 30.0    # security.block_token_grace_s


class TokenRefused(CurvineError):
    """A worker refused a block token: forged, malformed, for another block or mode (EACCES)."""

    code = errno.EACCES

    def __new__(cls, message: str) -> "TokenRefused":
        return typing.cast("TokenRefused", super().__new__(cls, cls.code, message))

    def __init__(self, message: str) -> None:
        super().__init__(self.code, message)


class TokenExpired(TokenRefused):
    """A worker refused a genuine block token past its expiry (EKEYEXPIRED): renew it."""

    code = errno.EKEYEXPIRED


def token_expired(e: BaseException) -> bool:
    """Is e a worker's refusal of an expired block token (as it arrives over the data
    channel: a CurvineError with EKEYEXPIRED)?  The client then asks the master for a
    fresh token and tries once more."""
    return isinstance(e, CurvineError) and e.errno == errno.EKEYEXPIRED


def _keyed_sha256(key: bytes) -> tuple[typing.Any, typing.Any]:
    """HMAC-SHA256's inner and outer hashes with key absorbed (RFC 2104): the MAC of m is
    outer.copy() fed inner.copy() fed m's digest, hmac.new(key, m, sha256)'s value."""
    block = 64   # SHA-256's block size
    if len(key) > block:
        key = hashlib.sha256(key).digest()
    key = key.ljust(block, b"\0")
    return (hashlib.sha256(bytes(b ^ 0x36 for b in key)), hashlib.sha256(bytes(b ^ 0x5C for b in key)))


class BlockTokens:
    """Mint and check block tokens for one cluster secret.

    ttl_s: how long a minted token is good for; grace_s: how far past its expiry a
    checked token is still taken (the clocks of the master that minted it and the worker
    that checks it may differ by that much)."""

    def __init__(self, secret: str, ttl_s: float = DEFAULT_TTL_S, grace_s: float = DEFAULT_GRACE_S,
                 clock: typing.Callable[[], float] = time.time) -> None:
        if ttl_s <= 0 or grace_s < 0:
            raise ValueError(f"block token ttl {ttl_s} s must be positive and grace {grace_s} s not negative")
        self._key = secret.encode()
        # HMAC-SHA256's two hashes keyed once (RFC 2104): a MAC copies them (~0.7 us here)
        # instead of hmac.new keying anew (~5.5 us), most of the master's cost of the read
        # tokens of a Lookup's listing (32 one-block files: a token each)
        self._keyed = _keyed_sha256(self._key) if self._key else None
        self.ttl_s = ttl_s
        self.grace_s = grace_s
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return bool(self._key)

    def mint(self, block_id: int, mode: str, expiry: int | None = None) -> str:
        """A token for block_id in mode, good until expiry (Unix seconds; default now + ttl)."""
        if not self._key:
            return ""
        if expiry is None:
            expiry = int(self._clock() + self.ttl_s + 0.999)
        return f"{mode}{expiry}.{self._mac(block_id, mode, expiry)}"

    def minter(self, mode: str) -> typing.Callable[[int], str]:
        """mint(block_id, mode) for many blocks at once (a Lookup's listing): one expiry
        for all of them, and no per-call look-ups of the mode and the clock."""
        if self._keyed is None:
            return lambda block_id: ""
        expiry = int(self._clock() + self.ttl_s + 0.999)
        head, tail, mac = f"{mode}{expiry}.", f":{mode}:{expiry}".encode(), self._hmac

        def mint(block_id: int) -> str:
            return head + mac(b"%d%s" % (block_id, tail))
        return mint

    def check(self, token: str, block_id: int, write: bool) -> None:
        """Raise TokenRefused unless token grants this access (a write token also grants
        reads: a writer reads back the blocks it patches), TokenExpired if it did until
        its expiry (plus the grace).  The MAC is checked first: only a genuine token is
        ever called expired."""
        if not self._key:
            return
        what = "write" if write else "read"
        mode = token[:1]
        stamp, dot, mac = token[1:].partition(".")
        if mode not in (READ, WRITE) or not dot or not stamp.isdigit() or len(stamp) > 12:
            raise TokenRefused(f"malformed {what} token for block {block_id} "
                               "(blocks are handed out by the master; check [cluster] secret)")
        expiry = int(stamp)
        if not hmac.compare_digest(mac, self._mac(block_id, mode, expiry)):
            raise TokenRefused(f"forged {what} token for block {block_id}: its MAC does not match "
                               "(blocks are handed out by the master; check [cluster] secret)")
        if write and mode != WRITE:
            raise TokenRefused(f"a read token cannot write block {block_id}")
        late = self._clock() - expiry
        if late > self.grace_s:
            raise TokenExpired(f"{what} token for block {block_id} expired {late:.0f} s ago "
                               f"(grace {self.grace_s:.0f} s): ask the master for a fresh one")

    def allows(self, token: str, block_id: int, write: bool) -> bool:
        """check() as a yes or no."""
        try:
            self.check(token, block_id, write)
        except TokenRefused:
            return False
        return True

    def _mac(self, block_id: int, mode: str, expiry: int) -> str:
        return self._hmac(f"{block_id}:{mode}:{expiry}".encode())

    def _hmac(self, msg: bytes) -> str:
        """hmac.new(key, msg, sha256)'s hex digest, cut to _MAC_LEN, from the hashes keyed once."""
        assert self._keyed is not None
        inner, outer = self._keyed
        i = inner.copy()
        i.update(msg)
        o = outer.copy()
        o.update(i.digest())
        return o.hexdigest()[:_MAC_LEN]


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
