"""What a client holds right now, as text: for the mount's watchdog and anyone debugging a hang.

``describe(vfs)`` reads the VFS, its open files' writers and readers and the buffer
pools without taking any of their locks (a hang may be holding them) and without
changing them: every attribute is read defensively (``getattr`` with a default), so the
description never fails because a class grew or lost a field; a part that cannot be
read says so and the rest goes on.
"""
from __future__ import annotations

import typing

MAX_FILES = 32     # open handles / writers described one by one; the rest are counted


def describe(vfs: typing.Any, requests: typing.Iterable[tuple[str, float, str]] = ()) -> str:
    """The client's state in a few lines.

    requests: the requests in flight as (what, age in seconds, what it waits for), most
    urgent first (the mount's watchdog passes its own)."""
    lines: list[str] = []
    for part in (_pools, _executor, _handles, _writers):
        try:
            lines.extend(part(vfs))
        except Exception as e:   # a description must never be the next failure
            lines.append(f"  ({part.__name__.strip('_')}: cannot describe: {type(e).__name__}: {e})")
    reqs = list(requests)
    lines.append(f"  requests in flight: {len(reqs)}")
    for what, age, waits in reqs[:MAX_FILES]:
        lines.append(f"    {what}: {age:.1f} s, {waits}")
    if len(reqs) > MAX_FILES:
        lines.append(f"    ... and {len(reqs) - MAX_FILES} more")
    return "state:\n" + "\n".join(lines)


# ---------------------------------------------------------------------- parts
def _pool_line(pool: typing.Any) -> str:
    stats = getattr(pool, "stats", None)
    if callable(stats):
        return str(stats())
    free = getattr(pool, "_free", ())
    return (f"BufferPool size={getattr(pool, 'size', '?')} max={getattr(pool, 'max_buffers', '?')} "
            f"created={getattr(pool, '_count', '?')} free={len(free)}")


def _pools(vfs: typing.Any) -> list[str]:
    """The client core's block pools: its default one and one per other block size in use
    (ClientCore._pools, read without its lock; older cores kept them in the module)."""
    core = getattr(vfs, "core", None)
    pools = []
    main = getattr(core, "buffers", None)
    if main is not None:
        pools.append(main)
    others = getattr(core, "_pools", None)
    if others is None:
        from curvine_py.client import core as coremod
        others = getattr(coremod, "_pools", {})
    pools.extend(p for _, p in sorted(dict(others).items()) if p is not main)
    return ["  pools:"] + [f"    {_pool_line(p)}" for p in pools]


def _executor(vfs: typing.Any) -> list[str]:
    ex = getattr(getattr(vfs, "core", None), "executor", None)
    if ex is None:
        return []
    queue = getattr(ex, "_work_queue", None)
    queued = queue.qsize() if queue is not None else "?"
    return [f"  I/O threads: {len(getattr(ex, '_threads', ()))} of {getattr(ex, '_max_workers', '?')}, "
            f"{queued} jobs queued"]


def _reader_line(r: typing.Any) -> str:
    entries = list(dict(getattr(r, "_cache", {})).items())
    pinned = [i for i, e in entries if getattr(e, "users", 0)]
    fetching = [i for i, e in entries if not _done(getattr(e, "future", None))]
    return (f"reader(size={getattr(r, 'size', '?')} cached={len(entries)} pinned={_ids(pinned)} "
            f"fetching={_ids(fetching)})")


def _done(future: typing.Any) -> bool:
    done = getattr(future, "done", None)
    return bool(done()) if callable(done) else True


def _ids(idx: list[typing.Any]) -> str:
    """Block slots, listed when few: '2[4,5]'."""
    if not idx:
        return "0"
    shown = ",".join(str(i) for i in idx[:8]) + (",..." if len(idx) > 8 else "")
    return f"{len(idx)}[{shown}]"


def _handles(vfs: typing.Any) -> list[str]:
    handles = list(dict(getattr(vfs, "_handles", {})).items())
    lines = [f"  open handles: {len(handles)}"]
    for fh, h in handles[:MAX_FILES]:
        what = [f"fh={fh} ino={getattr(h, 'ino', '?')}"]
        if getattr(h, "writes", False):
            what.append("writes")
        r = getattr(h, "reader", None)
        if r is not None:
            what.append(_reader_line(r))
        if getattr(h, "local_block", None) is not None:
            what.append("local block")
        lines.append("    " + " ".join(what))
    if len(handles) > MAX_FILES:
        lines.append(f"    ... and {len(handles) - MAX_FILES} more")
    return lines


def _writers(vfs: typing.Any) -> list[str]:
    states = list(dict(getattr(vfs, "_inodes", {})).values())
    writers = [w for w in (getattr(st, "writer", None) for st in states) if w is not None]
    lines = [f"  writers: {len(writers)}"]
    for w in writers[:MAX_FILES]:
        dirty = list(dict(getattr(w, "dirty", {})))
        inflight = dict(getattr(w, "inflight", {}))
        running = [i for i, f in inflight.items() if not _done(f)]
        shipped = list(getattr(w, "shipped", ()))
        error = getattr(w, "_error", None)
        lines.append(
            f"    ino={getattr(w, 'ino', '?')} size={getattr(w, 'size', '?')} dirty={_ids(dirty)} "
            f"inflight={_ids(running)} of {len(inflight)} ships={sum(not _done(f) for f in shipped)} running "
            f"streams={_ids(list(dict(getattr(w, 'streams', {}))))} closed={getattr(w, 'closed', '?')} "
            f"soft={getattr(w, 'soft', '?')} error={error!r}")
        r = getattr(w, "reader", None)
        if r is not None and dict(getattr(r, "_cache", {})):
            lines.append(f"      its {_reader_line(r)}")
    if len(writers) > MAX_FILES:
        lines.append(f"    ... and {len(writers) - MAX_FILES} more")
    return lines
