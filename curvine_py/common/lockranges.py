"""POSIX byte-range lock arithmetic: one owner's ranges set, cut and merged, and which
range of another owner is in the way.

Pure functions over tuples, shared by the master's lock table (master/locks.py) and the
mount's record of what it holds (client/locks.py), so both agree on what a lock call
leaves behind.  The rules are fcntl(2)'s: a lock replaces whatever the same owner held
over its range (a write lock may become a read lock and back), an unlock of part of a
range splits it, touching ranges of one type merge, and two owners conflict when their
ranges overlap and either lock is a write lock.  flock(2) locks are the special case of
one range over the whole file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")

RDLCK, WRLCK, UNLCK = 0, 1, 2     # the wire's lock types (proto LockRequest.type)
TO_EOF = (1 << 63) - 1            # the end of a range that runs to the end of the file


@dataclass(frozen=True)
class Range:
    """One held lock: a type over the inclusive byte range [start, end], and the process
    that took it (F_GETLK reports it)."""

    type: int
    start: int
    end: int
    pid: int = 0

    def overlaps(self, start: int, end: int) -> bool:
        return self.start <= end and start <= self.end

    def conflicts(self, type: int, start: int, end: int) -> bool:
        """Does this lock (another owner's) stand in the way of taking type over [start, end]?"""
        return self.overlaps(start, end) and WRLCK in (self.type, type)


def check(type: int, start: int, end: int) -> None:
    """A lock request that makes sense, or ValueError (the caller's EINVAL)."""
    if type not in (RDLCK, WRLCK, UNLCK):
        raise ValueError(f"lock type {type} is none of F_RDLCK, F_WRLCK, F_UNLCK")
    if not 0 <= start <= end <= TO_EOF:
        raise ValueError(f"lock range {start}-{end} is empty or past the largest offset")


def cut(held: tuple[Range, ...], start: int, end: int) -> tuple[Range, ...]:
    """The owner's ranges without [start, end]: a range across either end is split."""
    out: list[Range] = []
    for r in held:
        if not r.overlaps(start, end):
            out.append(r)
            continue
        if r.start < start:
            out.append(Range(r.type, r.start, start - 1, r.pid))
        if r.end > end:
            out.append(Range(r.type, end + 1, r.end, r.pid))
    return tuple(sorted(out, key=lambda r: r.start))


def put(held: tuple[Range, ...], new: Range) -> tuple[Range, ...]:
    """The owner's ranges after it locked new (UNLCK: unlocked its range): what it held
    there replaced, and ranges of one type that touch or overlap merged into one."""
    rest = cut(held, new.start, new.end)
    if new.type == UNLCK:
        return rest
    merged: list[Range] = []
    for r in sorted((*rest, new), key=lambda r: r.start):
        last = merged[-1] if merged else None
        if last is not None and last.type == r.type and r.start <= last.end + 1:
            merged[-1] = Range(r.type, last.start, max(last.end, r.end), new.pid)
        else:
            merged.append(r)
    return tuple(merged)


def blocker(others: dict[K, tuple[Range, ...]], type: int, start: int, end: int) -> tuple[K, Range] | None:
    """The first (lowest) lock of another owner in the way of type over [start, end], and
    its owner; None when the lock can be had (or type is UNLCK)."""
    if type == UNLCK:
        return None
    found: tuple[K, Range] | None = None
    for owner, ranges in others.items():
        for r in ranges:
            if r.conflicts(type, start, end) and (found is None or r.start < found[1].start):
                found = (owner, r)
    return found
