"""`cv cert issue NAME`: a certificate from the cluster's CA for a new client or host;
`cv cert ca FILE`: a new CA, to replace the cluster's one (docs/security.md "Rotation").

The CA is the one the config names (``tls.ca``, as `cv cluster start --tls` writes it);
its key must be beside it (``ca.key``), so this runs where the CA was made or copied.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from curvine_py.cli import EXIT_OK, Context, UsageError
from curvine_py.common import tls


def cmd_issue(ctx: Context) -> int:
    a = ctx.args
    ca = Path(a.ca or ctx.config.tls.ca)
    if not str(ca) or str(ca) == ".":
        raise UsageError("no CA: give --ca, or a config whose [tls] ca names the cluster's CA")
    out = Path(a.out)
    cert, key = out / f"{a.name}.pem", out / f"{a.name}.key"
    if (cert.exists() or key.exists()) and not a.force:
        raise UsageError(f"{cert} or {key} exists (--force replaces them)")
    tls.issue(ca, a.name, a.role, cert, key, days=a.days, addresses=a.address or ())
    print(f"issued {cert} ({a.role}, {a.days} days) and its key {key} (mode 0600), from {ca}")
    print(f'use it: [tls] enabled = true, ca = "{ca}", cert = "{cert}", key = "{key}"')
    return EXIT_OK


def cmd_ca(ctx: Context) -> int:
    a = ctx.args
    cert = Path(a.file)
    key = tls.key_path_of(cert)
    if (cert.exists() or key.exists()) and not a.force:
        raise UsageError(f"{cert} or {key} exists (--force replaces them)")
    tls.create_ca(cert, a.name or "")
    print(f"made the CA {cert} and its key {key} (mode 0600)")
    print("rotate to it (docs/security.md): trust both (append it to every process's tls.ca) and restart "
          "each process; issue every certificate from it and restart each; then trust it alone and restart each")
    return EXIT_OK


def days(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("a certificate must be valid at least 1 day")
    return n


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv cert` and its command."""
    c = sub.add_parser("cert", parents=[common], help="certificates of the cluster's CA (TLS)",
                       description="Certificates for mutual TLS (docs/security.md).")
    cmds = c.add_subparsers(dest="cert_command", metavar="COMMAND", required=True)
    p = cmds.add_parser("issue", parents=[common], help="issue a certificate for a new client or host",
                        description="Issue NAME.pem and NAME.key (mode 0600) from the cluster's CA.")
    p.add_argument("name", help="who it is for (its common name, and the file names)")
    p.add_argument("--role", choices=tls.ROLES, default="client",
                   help="what it may do: client (default), worker or master")
    p.add_argument("--ca", help="the CA certificate (default: [tls] ca of the config); its key beside it")
    p.add_argument("--out", default=".", help="directory for NAME.pem and NAME.key (default .)")
    p.add_argument("--days", type=days, default=tls.CERT_DAYS,
                   help=f"validity in days (default {tls.CERT_DAYS})")
    p.add_argument("--address", action="append", metavar="IP_OR_NAME",
                   help="also name this IP or host in the certificate (for other tools); repeatable")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(func=cmd_issue)
    p = cmds.add_parser("ca", parents=[common], help="make a new CA (to rotate the cluster's)",
                        description="Make a new self-signed CA: FILE and its key beside it (mode 0600).")
    p.add_argument("file", help="the CA certificate to write (e.g. DIR/tls/ca-2027.pem); its key: the same name, .key")
    p.add_argument("--name", help="its common name (default: curvine cluster CA and the time)")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(func=cmd_ca)
