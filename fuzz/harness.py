"""What every target shares: running one under atheris, and what counts as a finding."""
from __future__ import annotations

import atexit
import gc
import inspect
import logging
import os
import sys
import typing

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
MAX_INPUT = 64 * 1024   # longer inputs are cut: a frame target's bytes must fit a socket's buffers
HANG_S = 10.0           # a server silent this long on a finished input hangs (a finding)


T = typing.TypeVar("T")


class Lazy(typing.Generic[T]):
    """What a target serves its inputs with (a master, a data server), started on first
    use and stopped by close() or at exit: the corpus replay in the suite closes it."""

    def __init__(self, start: typing.Callable[[], tuple[T, typing.Callable[[], None]]]) -> None:
        self._start = start
        self._running: tuple[T, typing.Callable[[], None]] | None = None

    def get(self) -> T:
        if self._running is None:
            self._running = self._start()
            atexit.register(self.close)
        return self._running[0]

    def close(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            running[1]()


class Finding(AssertionError):
    """A broken invariant or a hang (an unexpected exception type is a finding by itself)."""


def run(fuzz_one: typing.Callable[[bytes], None], also: tuple[str, ...] = ()) -> None:
    """`python -m fuzz.<target> [libFuzzer flags] [corpus dirs]`: fuzz until a finding or
    -max_total_time.  The checkout's code loaded so far (the product's, imported by the
    target before calling this) is instrumented for coverage, and the modules named in
    also (a stdlib parser the product hands its input to, say): atheris' instrument_all
    takes every function of the process, ~10,000 with grpc's and protobuf's, a minute
    and more of start-up here for coverage that steers nothing.
    Log lines below ERROR are off: the product logs every refused input once, and those
    lines cost the fuzzer more than the inputs (an internal error still logs its traceback)."""
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: `make fuzz` installs it (pip install -e '.[fuzz]')")
    logging.disable(logging.WARNING)
    funcs = [f for f in gc.get_objects() if inspect.isfunction(f) and _ours(f, also)]
    for f in funcs:
        atheris.instrument_func(f)
    print(f"INFO: instrumented {len(funcs)} functions of the checkout{' and ' + ', '.join(also) if also else ''}",
          file=sys.stderr)
    spec = getattr(sys.modules["__main__"], "__spec__", None)   # run as `python -m fuzz.<target>`
    atheris.Setup([_relauncher(spec.name) if spec else sys.argv[0], *sys.argv[1:]], fuzz_one)
    atheris.Fuzz()


def _relauncher(module: str) -> str:
    """An executable that runs this target again: libFuzzer's -merge and -fork start
    argv[0] as a program, which `python -m fuzz.<target>` leaves as the .py file."""
    path = os.path.join(CHECKOUT, ".fuzz", "bin", module)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\ncd {CHECKOUT} && PYTHONPATH={CHECKOUT} exec {sys.executable} -m {module} "$@"\n')
    os.chmod(path, 0o755)
    return path


def _ours(f: typing.Any, also: tuple[str, ...]) -> bool:
    path = f.__code__.co_filename
    if path.startswith(CHECKOUT) and os.sep + ".venv" + os.sep not in path:
        return True
    module = getattr(f, "__module__", None) or ""
    return any(module == m or module.startswith(m + ".") for m in also)
