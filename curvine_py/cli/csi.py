"""`cv csi node` and `cv csi controller`: the Kubernetes CSI driver's two servers (docs/csi.md).

Both run in the foreground until SIGTERM/SIGINT and log to stderr (the container's log).
The cluster they serve is the usual configuration's (--config, $CURVINE_CONF, --master),
unless a request's secrets name another (keys ``master`` and ``secret``).
"""
from __future__ import annotations

import argparse
import logging
import socket
import sys
import typing

from curvine_py.cli import EXIT_OK, Context, UsageError
from curvine_py.csi import DEFAULT_STATE_DIR

if typing.TYPE_CHECKING:
    from curvine_py.csi.server import Endpoint


def _endpoint(text: str) -> "Endpoint":
    from curvine_py.csi.server import Endpoint
    try:
        return Endpoint.parse(text)
    except ValueError as e:
        raise UsageError(f"--endpoint: {e}") from None


def _log_to_stderr() -> None:
    """A server's log lines are its output (kubectl logs), not noise: INFO by default."""
    logger = logging.getLogger("curvine.csi")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def cmd_node(ctx: Context) -> int:
    from curvine_py.csi.server import run_node
    a = ctx.args
    endpoint = _endpoint(a.endpoint)
    _log_to_stderr()
    run_node(ctx.config, endpoint, a.node_id or socket.gethostname(), a.state_dir, getattr(a, "config", None))
    return EXIT_OK


def cmd_controller(ctx: Context) -> int:
    from curvine_py.csi.server import run_controller
    endpoint = _endpoint(ctx.args.endpoint)
    _log_to_stderr()
    run_controller(ctx.config, endpoint)
    return EXIT_OK


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv csi node` and `cv csi controller`."""
    p = sub.add_parser("csi", parents=[common], help="the Kubernetes CSI driver (node and controller servers)",
                       description="Serve the CSI spec's gRPC services for Kubernetes (docs/csi.md).")
    cmds = p.add_subparsers(dest="csi_command", metavar="SERVER", required=True)
    endpoint_help = "where the CO dials: unix:///path/csi.sock or tcp://host:port (default unix:///csi/csi.sock)"

    p = cmds.add_parser("node", parents=[common], help="Identity + Node: mount volumes on this node",
                        description="Publish pool directories at pods' target paths: one FUSE mount daemon "
                                    "per (cluster, directory), a bind mount per volume.")
    p.add_argument("--endpoint", default="unix:///csi/csi.sock", help=endpoint_help)
    p.add_argument("--node-id", metavar="NAME", help="this node's id (default: the hostname)")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, metavar="DIR",
                   help=f"staging mounts, daemons' pid files and logs (default {DEFAULT_STATE_DIR})")
    p.set_defaults(func=cmd_node)

    p = cmds.add_parser("controller", parents=[common], help="Identity + Controller: create and delete volumes",
                        description="CreateVolume/DeleteVolume make and remove directories in the pool.")
    p.add_argument("--endpoint", default="unix:///csi/csi.sock", help=endpoint_help)
    p.set_defaults(func=cmd_controller)
