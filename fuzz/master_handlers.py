"""Target: every MasterService handler (master/service.py, master/handlers.py) fed
well-formed requests of its type with fuzzed fields, a few calls per input, on a real
master over a temporary directory (fuzz/realmaster.py).

Checks: a handler answers or raises CurvineError (an errno) or Unavailable; an internal
error (any other exception, which the handler wrapper turns into EIO and logs with its
traceback) is a finding; after each input the root still answers GetAttr, ReadDir and
StatFs (the namespace was not broken)."""
from __future__ import annotations

import stat

from curvine_py.common.errors import CurvineError, Unavailable
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import methods
from fuzz.draw import Draw, message
from fuzz.harness import MAX_INPUT, Finding, run
from fuzz.realmaster import MASTER, NOT_FUZZED, Gated, is_internal, master

CALLS_PER_INPUT = 8
FUZZED = [m for m in methods.METHODS if m.name not in NOT_FUZZED]
ROOT = 1
close = MASTER.close


def fuzz_one(data: bytes) -> None:
    service = Gated(master())
    draw = Draw(data[:MAX_INPUT])
    for _ in range(CALLS_PER_INPUT):
        if draw.left() <= 0:
            break
        method = draw.choice(FUZZED)
        call(service, method.name, message(method.request, draw))
    _check_root(service)


def call(service: Gated, name: str, request: object) -> object | None:
    """The handler's reply; None for an expected error."""
    try:
        return getattr(service, name)(request)
    except CurvineError as e:
        if is_internal(e):
            raise Finding(f"{name}({request}) failed inside: {e.strerror}") from None
        return None
    except Unavailable:
        return None


def _check_root(service: Gated) -> None:
    caller = pb.Caller(uid=0, gid=0)
    attr = service.GetAttr(pb.InodeRequest(caller=caller, ino=ROOT)).attr
    if attr.ino != ROOT or not stat.S_ISDIR(attr.mode):
        raise Finding(f"the root is no longer a directory: {attr}")
    service.ReadDir(pb.ReadDirRequest(caller=caller, ino=ROOT, limit=1000))
    service.StatFs(pb.Empty())


def main() -> None:
    master()   # started before instrumenting: its threads' code is instrumented too
    run(fuzz_one)


if __name__ == "__main__":
    main()
