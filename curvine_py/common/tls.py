"""Mutual TLS on every TCP channel of a cluster, from one cluster CA (docs/security.md).

Every process holds a certificate issued by the cluster's CA.  Its *role* is the DNS name
in its subjectAltName, ``<role>.curvine`` (master, worker or client): a server checks the
role of the peer that connected (a client certificate cannot register as a worker), and
a client checks the server's by asking for that name as the TLS server name (so a worker
cannot pose as the master).  Python's ``ssl`` and gRPC (BoringSSL) both check names that
way, so one certificate serves the gRPC ports, the framed metadata channel and the block
data channel alike.

Keys are EC P-256: a handshake costs ~1 ms of CPU on each side, against ~10 ms with
RSA-3072, and connections are pooled.  Certificates are made with ``cryptography`` (a
dependency already: PySyncObj's encryption); private keys are written mode 0600.

The cluster secret stays a second check inside the channel (docs/security.md): with TLS
on it never crosses the wire in clear.
"""
from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import ssl
import typing
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from curvine_py.common.errors import ConfigError

if typing.TYPE_CHECKING:
    import grpc

    from curvine_py.common.config import TlsConfig

log = logging.getLogger(__name__)
ROLES = ("master", "worker", "client")
DOMAIN = "curvine"                  # a role's name is f"{role}.{DOMAIN}"
CA_DAYS = 3650
CERT_DAYS = 365
HANDSHAKE_S = 10.0                  # a peer that has not finished its handshake by then is cut
EVERYONE = frozenset(ROLES)


def role_name(role: str) -> str:
    """The DNS name that says a certificate's role."""
    return f"{role}.{DOMAIN}"


def key_path_of(cert: str | Path) -> Path:
    """Where the key of a certificate lives when only the certificate is named:
    ``x.pem`` -> ``x.key`` (the CA's key beside the CA is what issues certificates)."""
    p = Path(cert)
    return p.with_suffix(".key")


# ---------------------------------------------------------------- making certificates

def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """The private key in PEM, mode 0600 from its creation (never readable by others)."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(tmp, 0o600)   # an existing tmp kept its old mode through O_TRUNC
    os.replace(tmp, path)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def create_ca(cert_path: Path, name: str = "") -> None:
    """A new self-signed CA: cert_path and its key beside it (key_path_of).

    Its name holds its creation time unless given, so that two CAs trusted together
    while one replaces the other (docs/security.md "Rotation") never share a subject;
    certificates name their CA's key too (authority key identifier), so a verifier
    holding both picks the right one."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = name or f"curvine cluster CA {_now():%Y-%m-%d %H:%M:%S}"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    _write_key(key_path_of(cert_path), key)
    _write_cert(cert_path, cert)


def issue(ca_path: Path, name: str, role: str, cert_path: Path, key_path: Path,
          days: int = CERT_DAYS, addresses: typing.Iterable[str] = ()) -> None:
    """A certificate for `name` in `role`, signed by the CA at ca_path (its key beside it);
    its common name is name's first 64 characters (X.509's limit).

    addresses: IPs or host names added to the subjectAltName (not needed by our own
    clients, which check the role name; useful to other tools)."""
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    ca_key_path = key_path_of(ca_path)
    try:
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    except FileNotFoundError as e:
        raise ConfigError(f"cannot issue a certificate: {e.filename} not found "
                          "(the CA and its key, as `cv cluster start --tls` makes them)") from None
    except ValueError as e:
        raise ConfigError(f"cannot issue a certificate: {ca_path} or its key is not PEM: {e}") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{ca_key_path}: the CA key must be an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64] or role),
                                     x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(_alt_names(role, addresses)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    _write_key(key_path, key)
    _write_cert(cert_path, cert)


def _alt_names(role: str, addresses: typing.Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(role_name(role))]
    for a in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(a)))
        except ValueError:
            names.append(x509.DNSName(a))
    return names


def role_of_cert(cert_path: Path) -> str:
    """The role a certificate file was issued for ("" if none of ours)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ""
    return _role_among(san.get_values_for_type(x509.DNSName))


def _role_among(names: typing.Iterable[str]) -> str:
    for n in names:
        role, _, domain = n.partition(".")
        if domain == DOMAIN and role in ROLES:
            return role
    return ""


# ---------------------------------------------------------------- one process's TLS

@dataclass(frozen=True)
class Material:
    """The files of one process's identity."""
    ca: Path
    cert: Path
    key: Path


class Tls:
    """One process's TLS: its identity and the contexts made from it, built once (loading
    a key costs milliseconds; a context per connection would cost that per connection)."""

    def __init__(self, material: Material, role: str, data: bool = True) -> None:
        """role: what this process is; its certificate must say so.  data: TLS on the
        block-data channel too (tls.data; metadata and control always)."""
        self.material = material
        self.role = role
        self.data = data
        self._client = self._context(ssl.PROTOCOL_TLS_CLIENT)
        self._servers: dict[frozenset[str], ssl.SSLContext] = {}
        self._pem = (material.ca.read_bytes(), material.cert.read_bytes(), material.key.read_bytes())

    def _context(self, protocol: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_verify_locations(cafile=str(self.material.ca))
            ctx.load_cert_chain(str(self.material.cert), str(self.material.key))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"TLS: cannot load {self.material.cert} / {self.material.key} "
                              f"(CA {self.material.ca}): {e}") from None
        return ctx

    # -- sockets (the framed metadata channel, the block-data channel)

    def server_context(self, accept: frozenset[str] = EVERYONE) -> ssl.SSLContext:
        if accept not in self._servers:
            self._servers[accept] = self._context(ssl.PROTOCOL_TLS_SERVER)
        return self._servers[accept]

    def accept(self, sock: socket.socket, accept: frozenset[str] = EVERYONE,
               timeout: float = HANDSHAKE_S) -> ssl.SSLSocket:
        """The server's side of the handshake on an accepted socket; PeerRefused when the
        peer's certificate is not one of ours or not of an accepted role."""
        sock.settimeout(timeout)
        tls = self.server_context(accept).wrap_socket(sock, server_side=True)
        role = peer_role(tls)
        if role not in accept:
            tls.close()
            raise PeerRefused(f"a {role or 'role-less'} certificate may not connect here "
                              f"(accepted: {', '.join(sorted(accept))})")
        return tls

    def connect(self, sock: socket.socket, peer: str) -> ssl.SSLSocket:
        """The client's side of the handshake on a connected socket, to a peer of role
        `peer` (its certificate must name that role)."""
        return self._client.wrap_socket(sock, server_hostname=role_name(peer))

    def client_context(self) -> ssl.SSLContext:
        """For trio.SSLStream (the mount's framed calls); server_hostname=role_name(peer)."""
        return self._client

    # -- gRPC

    def grpc_server_credentials(self) -> "grpc.ServerCredentials":
        import grpc
        ca, cert, key = self._pem
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    def grpc_channel_credentials(self) -> "grpc.ChannelCredentials":
        import grpc
        ca, cert, key = self._pem
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


class PeerRefused(ConnectionError):
    """The peer's certificate was valid but of a role this server does not accept."""


def cut(sock: socket.socket) -> None:
    """Shut sock down in both directions, as another thread's pending recv or send then
    fails: at the socket itself, beneath any TLS layer (an SSLSocket's own shutdown drops
    its SSL state while its thread may still be using it).  Already closed: nothing."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def peer_role(sock: ssl.SSLSocket | ssl.SSLObject) -> str:
    """The role the verified peer certificate of sock (or an SSLObject) names ("" if none)."""
    cert: dict[str, typing.Any] = typing.cast(dict[str, typing.Any], sock.getpeercert() or {})
    return _role_among(str(v) for k, v in cert.get("subjectAltName", ()) if k == "DNS")


def grpc_peer_role(context: typing.Any) -> str | None:
    """The role of a gRPC call's verified peer certificate ("" for one without a role of
    ours), None when the call did not come over TLS."""
    auth = context.auth_context() or {}
    if b"ssl" not in auth.get("transport_security_type", ()):
        return None
    return _role_among(v.decode() for v in auth.get("x509_subject_alternative_name", ()))


def load(cfg: "TlsConfig", role: str, name: str = "") -> Tls | None:
    """This process's TLS from the [tls] settings, None when tls.enabled is false.

    A certificate or key that does not exist yet is issued here from the CA, when the
    CA's key is beside it (the local cluster, a host given the CA): so a new process of
    a cluster made with `cv cluster start --tls` needs no step of its own."""
    if not cfg.enabled:
        return None
    if not cfg.ca:
        raise ConfigError("tls.enabled is true but tls.ca is not set (the cluster CA's certificate)")
    ca = Path(cfg.ca)
    if not ca.exists():
        raise ConfigError(f"tls.ca: {ca} not found (`cv cluster start --tls` creates a CA; "
                          "`cv cert issue` issues from it)")
    cert = Path(cfg.cert) if cfg.cert else ca.with_name(f"{role}.pem")
    key = Path(cfg.key) if cfg.key else key_path_of(cert)
    if not cert.exists() or not key.exists():
        issue(ca, name or socket.gethostname(), role, cert, key)
        log.info("TLS: issued %s (%s) from the CA %s", cert, role, ca)
    have = role_of_cert(cert)
    if have != role:
        raise ConfigError(f"tls.cert: {cert} is a {have or 'role-less'} certificate; "
                          f"a {role} needs a {role} certificate (`cv cert issue NAME --role {role}`)")
    return Tls(Material(ca, cert, key), role, cfg.data)


# What an ssl.SSLError's reason means for the one who sees it: the other side is not ours
# (or not TLS), or refused our certificate.  Nothing here is worth a retry.
_VERDICTS = {
    "WRONG_VERSION_NUMBER": "does not speak TLS (is tls.enabled the same on both sides?)",
    "CERTIFICATE_VERIFY_FAILED": "presented a certificate this cluster's CA did not issue, or not of its role",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "requires a client certificate (set [tls] cert and key)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "refused this certificate (issued by another CA?)",
    "TLSV1_ALERT_UNKNOWN_CA": "refused this certificate: not issued by its CA",
    "TLSV1_ALERT_DECRYPT_ERROR": "refused this certificate (issued by another CA of the same name?)",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "refused this certificate",
    "TLSV1_ALERT_ACCESS_DENIED": "refused this certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "refused this certificate: it has expired",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "refused the handshake",
}


def refusal(e: BaseException, peer: str) -> str:
    """A one-line reason when e is a TLS refusal that no retry will change, else ""."""
    if not isinstance(e, ssl.SSLError):
        return ""
    verdict = _VERDICTS.get(str(e.reason or ""), "")
    return f"TLS with {peer} failed: it {verdict} [{e.reason}]" if verdict else ""


def diagnose(address: str, tls: Tls | None, peer: str, timeout: float = 2.0) -> str:
    """Why the gRPC server at address ("host:port") closes our connections at once, when
    TLS is why: a plain client at a TLS port, or a certificate the server refuses ("" if
    neither).  gRPC itself only says "Socket closed"; this asks with Python's ssl, once,
    after a call failed that way, so the user reads the reason instead of a retry loop."""
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout)
    except (OSError, ValueError):
        return ""
    with sock:
        if tls is None:
            probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
            try:
                probe.wrap_socket(sock).close()
            except OSError:
                return ""
            return f"{peer} at {address} speaks TLS and this client has it off: set [tls] (docs/security.md)"
        ctx = tls._context(ssl.PROTOCOL_TLS_CLIENT)
        ctx.set_alpn_protocols(["h2"])   # gRPC's server refuses a handshake without it
        try:   # TLS 1.3: the server's verdict on our certificate comes after the handshake,
            secured = ctx.wrap_socket(sock, server_hostname=role_name(peer))
            secured.sendall(_H2_PREFACE)   # as its answer to HTTP/2's preface, or a close
            answer = secured.recv(1)
        except OSError as e:
            return refusal(e, f"{peer} at {address}")
        if answer:
            return ""
        return f"TLS with {peer} at {address} failed: it refused this certificate (issued by another CA?)"


# HTTP/2's client connection preface and an empty SETTINGS frame: a gRPC server that
# accepted the certificate answers with its SETTINGS.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
