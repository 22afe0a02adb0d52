"""What every target shares: running one under atheris, and what counts as a finding."""
from __future__ import annotations

import atexit
import logging
import sys
import typing

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


def run(fuzz_one: typing.Callable[[bytes], None]) -> None:
    """`python -m fuzz.<target> [libFuzzer flags] [corpus dirs]`: fuzz until a finding or
    -max_total_time.  Every Python module loaded so far (the product's included) is
    instrumented for coverage, so a target imports what it tests before calling this.
    Log lines below ERROR are off: the product logs every refused input once, and those
    lines cost the fuzzer more than the inputs (an internal error still logs its traceback)."""
    logging.disable(logging.WARNING)
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: `make fuzz` installs it (pip install -e '.[fuzz]')")
    atheris.instrument_all()
    atheris.Setup(sys.argv, fuzz_one)
    atheris.Fuzz()
