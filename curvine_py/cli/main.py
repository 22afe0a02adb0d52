"""The `cv` entry point: the parser, the shared --master/--config options, exit codes.

Every user-facing failure ends here as exactly one line ``cv: <path>: <reason>`` on
stderr and an exit status (1 = the operation failed, 2 = the command line or the
configuration is wrong, 130 = interrupted, 141 = the reader of our stdout went away),
never a traceback: the CLI is used in scripts, and a traceback is noise to a user who
only mistyped a path.  Set CURVINE_DEBUG=1 to get the traceback of an unexpected error.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import typing

from curvine_py.cli import (EXIT_BROKEN_PIPE, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE,
                            CliError, Context, UsageError, host_ports)
from curvine_py.common import config as cfgmod
from curvine_py.common.errors import ConfigError, CurvineError
from curvine_py.common.version import package_version


class CliParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line through our handler instead of usage+exit."""

    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def common_options(suppress: bool) -> CliParser:
    """--master and --config, accepted before and after every (sub)command.

    Sub-level copies default to SUPPRESS so they do not overwrite a value given at the
    top level (`cv --master X fs ls` and `cv fs ls --master X` both work).
    """
    p = CliParser(add_help=False)
    default = argparse.SUPPRESS if suppress else None
    p.add_argument("--master", metavar="HOST:PORT", type=host_ports, default=default,
                   help="master address, or every master's comma-separated (default: $CURVINE_MASTER, "
                        "then the config, then 127.0.0.1:8995)")
    p.add_argument("--config", metavar="FILE", default=default,
                   help="TOML configuration file (default: $CURVINE_CONF, ./curvine.toml, "
                        "/etc/curvine/curvine.toml)")
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS if suppress else 0,
                   help="show the client's log messages (-vv: debug)")
    return p


def setup_logging(verbosity: int) -> None:
    """Library log lines would break the one-line error rule, so they stay silent
    unless asked for with -v (retries, replica fail-over) or -vv (everything)."""
    root = logging.getLogger()
    if verbosity <= 0:
        root.addHandler(logging.NullHandler())  # keeps logging's last-resort stderr handler off
        return
    logging.basicConfig(level=logging.DEBUG if verbosity > 1 else logging.INFO, stream=sys.stderr,
                        format="cv: %(levelname)s %(name)s: %(message)s")


def cmd_version(ctx: Context) -> int:
    """Print the installed curvine-py version."""
    print(f"cv (curvine-py) {package_version()}")
    print(f"python {sys.version.split()[0]}")
    return EXIT_OK


def cmd_config(ctx: Context) -> int:
    """Print the effective configuration (defaults < file < environment < --master) as TOML."""
    sys.stdout.write(cfgmod.to_toml(ctx.config))
    return EXIT_OK


def build_parser() -> CliParser:
    """The whole `cv` command tree."""
    from curvine_py.cli import bench, cert, cluster, csi, fs, mount, report, stats, ufs

    parser = CliParser(prog="cv", parents=[common_options(suppress=False)],
                       description="Command line of the curvine-py distributed cache filesystem.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=CliParser)
    common = common_options(suppress=True)
    fs.register(sub, common)
    report.register(sub, common)
    cluster.register(sub, common)
    mount.register(sub, common)
    bench.register(sub, common)
    stats.register(sub, common)
    csi.register(sub, common)
    ufs.register(sub, common)
    cert.register(sub, common)
    p = sub.add_parser("version", parents=[common], help="print the version")
    p.set_defaults(func=cmd_version)
    p = sub.add_parser("config", parents=[common], help="print the effective configuration as TOML")
    p.set_defaults(func=cmd_config)
    return parser


def one_line(text: str) -> str:
    """Collapse a multi-line reason (gRPC details can span lines) into one line."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def describe(e: BaseException, ctx: Context | None) -> str:
    """The `<path>: <reason>` part of the error line."""
    if isinstance(e, CurvineError):
        if e.path is None and e.errno in (errno.EHOSTDOWN, errno.ETIMEDOUT, errno.ECONNREFUSED):
            where = ctx.config.client.master if ctx is not None else "master"
            return f"{where}: {e.strerror}"
        return str(e)
    if isinstance(e, OSError):
        reason = (e.strerror or os.strerror(e.errno)) if e.errno else str(e)
        return f"{e.filename}: {reason}" if e.filename is not None else reason
    return str(e)


def main(argv: typing.Sequence[str] | None = None) -> int:
    """Run one cv command; returns the exit status (the console script exits with it)."""
    ctx: Context | None = None
    try:
        try:
            args = build_parser().parse_args(argv)
            setup_logging(args.verbose)
            ctx = Context(args)
            return int(args.func(ctx) or EXIT_OK)
        finally:
            if ctx is not None:
                ctx.close()
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: say nothing, and keep the interpreter's
        # final flush of stdout from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        sys.stderr.write("\n" if sys.stderr.isatty() else "")
        return EXIT_INTERRUPTED
    except (UsageError, ConfigError) as e:
        return fail(one_line(str(e)), EXIT_USAGE)
    except (CliError, OSError) as e:  # CurvineError is an OSError
        return fail(one_line(describe(e, ctx)), EXIT_FAIL)
    except Exception as e:  # a bug: still one line unless debugging
        if os.environ.get("CURVINE_DEBUG"):
            raise
        return fail(one_line(f"internal error: {type(e).__name__}: {e} "
                             "(set CURVINE_DEBUG=1 for a traceback)"), EXIT_FAIL)


def fail(message: str, code: int) -> int:
    try:
        sys.stderr.write(f"cv: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
