"""Run one of the package's daemons up to its configuration, print that, and stop.

    python deploy_probe.py PROGRAM [ARGS...]

PROGRAM is a console script of the installed package (``curvine-master``,
``curvine-worker``, ``cv``), found through its entry points, so the names are the
package's, not this file's.  Its real ``main`` runs with ARGS: the real argparse parser,
then the real ``curvine_py.common.config.load`` (file, environment, flags; the worker's
``validate`` too).  There the probe prints the effective configuration as JSON and exits
0, before any server, socket or mount exists: what a manifest or a unit starts can be
checked offline, against the code that would run it, without starting it.

Exit status: 0 and the JSON; what the program itself exits with when it refuses the
command line or the configuration (2, its one error line on stderr); 3 when the program
returned without ever loading its configuration (a command that is not a daemon).

Used by tests/unit/test_deploy_manifests.py in a subprocess: the daemons' mains install
signal handlers and tune malloc, which the test process must not get.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import typing
from importlib import metadata

from curvine_py.common import config

NEVER_LOADED = 3


def entry_point(program: str) -> typing.Callable[[list[str]], int]:
    """The function the console script PROGRAM of curvine-py runs."""
    for ep in metadata.distribution("curvine-py").entry_points:
        if ep.group == "console_scripts" and ep.name == program:
            return ep.load()
    raise SystemExit(f"deploy_probe: {program!r} is not a console script of curvine-py")


def stop_at_config(program: str) -> None:
    """Replace config.load by the real one followed by printing its result and exiting."""
    real_load = config.load

    def load_and_report(*args: typing.Any, **kwargs: typing.Any) -> config.Config:
        cfg = real_load(*args, **kwargs)
        if program == "curvine-worker":   # its main validates right after loading
            from curvine_py.worker.main import validate
            validate(cfg)
        sys.stdout.write(json.dumps({"program": program, "config": dataclasses.asdict(cfg)}) + "\n")
        sys.stdout.flush()
        os._exit(0)   # nothing after the configuration may run: no servers, no mounts

    config.load = load_and_report


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    program, args = argv[0], argv[1:]
    run = entry_point(program)
    stop_at_config(program)
    sys.argv = [program, *args]
    try:
        code = run(args)
    except SystemExit as e:   # argparse's own usage errors (the daemons' parsers)
        code = e.code if isinstance(e.code, int) else 2
    return code if code else NEVER_LOADED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
