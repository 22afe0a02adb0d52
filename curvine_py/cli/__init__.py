"""The `cv` command line: shared vocabulary of its command modules.

One module per command group (fs, report, cluster), main for the parser and the
error-to-exit-code policy, output for formatting.  What every command module needs
(the Context with config and client, the CLI's own error types, exit codes) lives here
so that command modules never import the entry point.
"""
from __future__ import annotations

import argparse
import copy
import os
import typing
from functools import cached_property

from curvine_py.common import config as cfgmod

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `cat` reports when `head` stops reading

# An interactive command should not sit for the SDK's default two minutes when the
# master is down; a configured client.retry_s (file or environment) still wins.
CLI_RETRY_S = 20.0


def host_port(text: str) -> str:
    """argparse type of an address option (--metrics): host:port with a numeric port."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"not a host:port address: {text!r}")
    return text


def host_ports(text: str) -> str:
    """argparse type of --master: one host:port, or several comma-separated (a group of
    masters, docs/ha.md), each checked."""
    entries = cfgmod.addresses(text)
    if not entries:
        raise argparse.ArgumentTypeError(f"not a host:port address: {text!r}")
    for entry in entries:
        host_port(entry)
    return ",".join(entries)


class UsageError(Exception):
    """The command line is wrong (exit 2)."""


class CliError(Exception):
    """An operation failed for a reason the CLI itself found (exit 1); str() is the line."""


class Context:
    """What a command needs: parsed args, the effective config, a lazily made Client."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._client: Client | None = None

    @cached_property
    def config(self) -> cfgmod.Config:
        """Defaults < config file < environment < --master, as `cv config` prints it."""
        cfg = cfgmod.load(path=getattr(self.args, "config", None))
        if getattr(self.args, "master", None):
            cfg.client.master = self.args.master
        return cfg

    @property
    def client(self) -> "Client":
        if self._client is None:
            from curvine_py.sdk import Client  # imported late: `cv version` needs no gRPC
            cfg = copy.deepcopy(self.config)
            if ("CURVINE_CLIENT_RETRY_S" not in os.environ
                    and cfg.client.retry_s == cfgmod.ClientConfig().retry_s):
                cfg.client.retry_s = CLI_RETRY_S
            self._client = Client(master=cfg.client.master, config=cfg)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()
