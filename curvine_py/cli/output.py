"""How the CLI shows things: sizes, times, modes, aligned tables and JSON.

Kept apart from the commands so that every command formats the same way (one size
style, one time style) and so the formatting can be unit-tested without a cluster.
Human-facing output uses binary units ("4.0 MiB"); ``--json`` output always carries
exact integers so scripts never parse a rounded number.
"""
from __future__ import annotations

import json
import stat as stat_mod
import sys
import time
import typing

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_size(n: int | float) -> str:
    """Bytes as a short binary-unit string: 0 B, 512 B, 1.0 KiB, 4.0 MiB, 1.5 GiB."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_percent(part: int, whole: int) -> str:
    """part/whole as '12.5%'; '-' when whole is 0 (an empty pool has no usage ratio)."""
    if whole <= 0:
        return "-"
    return f"{100.0 * part / whole:.1f}%"


def format_time_ns(ns: int) -> str:
    """A nanosecond timestamp as local 'YYYY-MM-DD HH:MM:SS' ('-' for 0 = never)."""
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def format_age_ms(age_ms: int) -> str:
    """An age in milliseconds as '0.4s ago', '3m ago', '2h ago', '5d ago'."""
    age = max(0.0, age_ms / 1000.0)
    if age < 60:
        return f"{age:.1f}s ago"
    if age < 3600:
        return f"{int(age // 60)}m ago"
    if age < 86400:
        return f"{int(age // 3600)}h ago"
    return f"{int(age // 86400)}d ago"


def format_mode(mode: int) -> str:
    """A full st_mode as ls shows it ('drwxr-xr-x', '-rw-r--r--', 'lrwxrwxrwx')."""
    return stat_mod.filemode(mode)


def format_duration(seconds: float) -> str:
    """A wall-clock duration for summaries: '0.12 s', '3.4 s', '2m05s'."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


def format_rate(nbytes: int, seconds: float) -> str:
    """Throughput of a transfer ('41.2 MiB/s'); '-' when too fast to time."""
    if seconds <= 0:
        return "-"
    return f"{format_size(nbytes / seconds)}/s"


def format_checksum(value: int) -> str:
    """A 64-bit xxh3 checksum as 16 lowercase hex digits (how block checksums are shown)."""
    return f"{value:016x}"


def table(rows: typing.Sequence[typing.Sequence[object]],
          headers: typing.Sequence[str] | None = None,
          right: typing.Collection[int] = ()) -> str:
    """Rows as aligned columns separated by two spaces; columns in `right` right-aligned.

    The last column is never padded, so no line carries trailing blanks.
    """
    cells = [[str(c) for c in r] for r in rows]
    if headers is not None:
        cells.insert(0, [str(h) for h in headers])
    if not cells:
        return ""
    ncols = max(len(r) for r in cells)
    widths = [max((len(r[i]) for r in cells if i < len(r)), default=0) for i in range(ncols)]
    lines = []
    for r in cells:
        parts = []
        for i, c in enumerate(r):
            last = i == len(r) - 1
            if i in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c if last else c.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def to_json(obj: object) -> str:
    """Stable, indented JSON (sorted keys stay off so fields read in a sensible order)."""
    return json.dumps(obj, indent=2, ensure_ascii=False)


def print_json(obj: object, out: typing.TextIO | None = None) -> None:
    """Write obj as JSON plus a newline to stdout (or out)."""
    stream = out if out is not None else sys.stdout
    stream.write(to_json(obj) + "\n")


def print_figures(figures: typing.Mapping[str, float], as_json: bool) -> None:
    """A benchmark script's named figures: JSON, or a metric/value table (2 decimals)."""
    if as_json:
        print_json(dict(figures))
    else:
        print(table([(k, f"{v:.2f}") for k, v in figures.items()], headers=("metric", "value"), right={1}))
