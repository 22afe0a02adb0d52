"""The fault suite's report: one row per scenario (data written, verified, lost, time to
recover), printed at the end of the pytest run by tests/multihost/conftest.py and kept
in ``$FAULT_TABLE_FILE`` (default /tmp/curvine-fault-table.txt) for notes."""
from __future__ import annotations

import os
from dataclasses import dataclass

MiB = 1 << 20


@dataclass
class Row:
    scenario: str
    written: int        # bytes acknowledged to the writer (closed files, or ops for metadata rows)
    verified: int       # of those, bytes read back exactly
    recover_s: float    # time until the cluster was whole again (see the scenario)
    note: str = ""
    unit: str = "B"     # "B": bytes, "ops": metadata operations

    @property
    def lost(self) -> int:
        return self.written - self.verified


ROWS: list[Row] = []


def _amount(n: int, unit: str) -> str:
    return f"{n / MiB:.1f} MiB" if unit == "B" else f"{n} ops"


def render() -> str:
    head = ("scenario", "written", "verified", "lost", "recovered in", "note")
    body = [(r.scenario, _amount(r.written, r.unit), _amount(r.verified, r.unit), _amount(r.lost, r.unit),
             f"{r.recover_s:.1f} s", r.note) for r in ROWS]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in (head, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def record(row: Row) -> None:
    ROWS.append(row)
    path = os.environ.get("FAULT_TABLE_FILE", "/tmp/curvine-fault-table.txt")
    try:
        with open(path, "w") as f:
            f.write(render() + "\n")
    except OSError:
        pass
