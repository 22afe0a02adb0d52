"""`make fuzz`: every target under atheris for a set time, one after another, then one
table of executions per target and the crashes found.

``python -m fuzz.run_all [--seconds 60] [target ...]``.  Each target starts from its
corpus in the repository (fuzz/corpus/<target>/, only read) and from what earlier runs
here found (.fuzz/<target>/corpus/, where new inputs go); a crash leaves its input in
.fuzz/<target>/ and the run goes on with the next target.  Exit status 1 when a target
crashed or could not run."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fuzz.harness import HANG_S, MAX_INPUT

TARGETS = ("data_channel", "meta_channel", "blockmeta_sidecar", "config_parse", "master_handlers", "csi_requests")
ROOT = Path(__file__).resolve().parent.parent
RSS_LIMIT_MB = 4096
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_PROGRESS = re.compile(r"^#(\d+)\s", re.MULTILINE)
_CRASH = re.compile(r"Test unit written to (\S+)")


@dataclass(frozen=True)
class Outcome:
    """One target's run: executions, seconds, and the inputs that crashed it."""
    target: str
    runs: int
    seconds: float
    crashes: tuple[str, ...]
    status: int

    @property
    def rate(self) -> float:
        return self.runs / self.seconds if self.seconds else 0.0


def fuzz_target(target: str, seconds: int) -> Outcome:
    work = ROOT / ".fuzz" / target
    (work / "corpus").mkdir(parents=True, exist_ok=True)
    seeds = ROOT / "fuzz" / "corpus" / target
    cmd = [sys.executable, "-m", f"fuzz.{target}", f"-max_total_time={seconds}", f"-timeout={int(HANG_S) * 2}",
           f"-rss_limit_mb={RSS_LIMIT_MB}", f"-max_len={MAX_INPUT}", f"-artifact_prefix={work}/",
           str(work / "corpus"), *([str(seeds)] if seeds.is_dir() else [])]
    log = work / "log"
    start = time.monotonic()
    with open(log, "w") as out:
        status = subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
    elapsed = time.monotonic() - start
    text = log.read_text(errors="replace")
    done = _DONE.search(text)
    if done:
        runs, secs = int(done.group(1)), float(done.group(2)) or elapsed
    else:   # stopped by a crash: the last progress line
        marks = _PROGRESS.findall(text)
        runs, secs = (int(marks[-1]) if marks else 0), elapsed
    return Outcome(target, runs, secs, tuple(_CRASH.findall(text)), status)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=60, help="how long each target runs")
    p.add_argument("targets", nargs="*", metavar="TARGET", help=f"of {', '.join(TARGETS)} (default: all)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        p.error(f"no such target: {', '.join(unknown)} (targets: {', '.join(TARGETS)})")
    outcomes = []
    for target in args.targets or TARGETS:
        print(f"fuzzing {target} for {args.seconds} s (log: .fuzz/{target}/log)", flush=True)
        outcomes.append(fuzz_target(target, args.seconds))
    print(f"\n{'target':<20} {'execs':>10} {'seconds':>8} {'execs/s':>9}  crashes")
    for o in outcomes:
        found = ", ".join(os.path.relpath(c, ROOT) for c in o.crashes) or ("-" if o.status == 0 else f"exit {o.status}")
        print(f"{o.target:<20} {o.runs:>10} {o.seconds:>8.0f} {o.rate:>9.0f}  {found}")
    return 1 if any(o.crashes or o.status for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
