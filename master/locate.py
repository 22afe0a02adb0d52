"""Locate: many paths' attributes, holders and tier in one call (and LMCache's locks).

One call answers what a KV-aware caller asks of a whole prompt: for up to
``MAX_PATHS`` absolute paths, each one's attributes or the errno that says why it is
absent, the hosts holding a live replica of every one of its blocks, and its tier.
The LMCache L2 adapter's lookup-and-lock is this call with ``pin_ms`` (found files are
pinned against eviction for that client, master/pinleases.py) and its unlock the same
call with ``unpin``; ``Client.locate`` and ``cv fs locate`` are it without either.

Paths are answered per directory, not per path: each distinct parent is resolved once
and its names are read in one statement (LMCache keeps every chunk of a model in one
flat directory), and all the files' blocks in one more.  The per-path work is kept to
plain tuples and one snapshot of the registry per call, and the reply's fields are set
in place: at 256 paths the per-path costs are the whole call.  Measured in-process on
256 one-block files (2026-12-06, A/B in one process): 2.74 ms a call before the cuts
below, 2.24 after (32 paths 0.41 -> 0.35, 8 paths 0.17 -> 0.155); what is left is the
SQLite statement of the names (0.75 ms at 256, ~1.5 us a row for its 14 columns) and
the reply's messages (~3 us a path):

- a path the client sent normalised (the SDK always does) is split, not normalised;
- hosts and tier are worked out once per distinct set of holders (a prompt's chunks
  share their two holders), not per file: sorted once, the tier of the set once;
- an attribute field left at zero is not set (protobuf's default is zero).

The brief form (the KV lookup) has its own path (``_brief``): one statement per
directory that answers only the whole chunks (and symlinks, followed after), by the
names' index, so the Python per name is one list slot per hit; ChunkStore sends the
directory once and bare names (``dir`` + ``names``), so no path is split.  Only whole
chunks are pinned.  In process, 256 names, A/B alternated (2026-12-07, load 5): 1.01 ->
0.36 ms (8 names 0.074 -> 0.055); the paths form of older clients 0.54.
"""
from __future__ import annotations

import errno
import posixpath
import operator
import stat
from collections import defaultdict
from typing import Any, Callable, Iterable

from curvine_py.common.errors import CurvineError, err
from curvine_py.master import posix
from curvine_py.master.cachepolicy import TIER, Policies
from curvine_py.master.namespace import Namespace
from curvine_py.master.pinleases import PinLeases
from curvine_py.master.posix import X, Cred
from curvine_py.master.workers import Registry
from curvine_py.pb import curvine_pb2 as pb

MAX_PATHS = 1000
MAX_PIN_MS = 600_000   # a lock outliving 10 minutes unrenewed is a bug of the caller's
_CHUNK = 500           # values per IN (...) statement, well under SQLite's variable limit
# the columns of a found name, in pb.Attr's field names (complete last but one: a bool there)
_FIELDS = ("ino", "mode", "uid", "gid", "size", "nlink", "atime_ns", "mtime_ns", "ctime_ns", "rdev",
           "block_size", "replicas", "generation")
# a brief Locate's (the KV lookup's) columns: what "a whole chunk" and a pin need
_BRIEF = ("ino", "mode", "size")
_INO, _MODE, _COMPLETE, _BRIEF_SIZE = 0, 1, -1, 2
_SECOND = operator.itemgetter(1)
Found = tuple[Any, ...]   # the call's fields' values (_FIELDS or _BRIEF), then complete


def _names_sql(fields: tuple[str, ...]) -> str:
    return ("SELECT d.name, " + ", ".join(f"i.{f}" for f in fields) + ", i.complete"
            " FROM dirents d INDEXED BY dirents_name JOIN inodes i ON i.ino = d.ino"
            " WHERE d.parent=?1 AND name_key(d.name) IN ({keys})"
            " AND +d.name IN ({names})")


def _in_names(n: int) -> dict[str, str]:
    """The IN lists of _NAMES for n names (parameters ?2 to ?n+1): their keys (found in
    dirents_name), then the names themselves."""
    marks = [f"?{k}" for k in range(2, n + 2)]
    return {"keys": ",".join(f"name_key({m})" for m in marks), "names": ",".join(marks)}


_NAMES = {_FIELDS: _names_sql(_FIELDS), _BRIEF: _names_sql(_BRIEF)}
# A brief Locate's statement over `n` names: (index, ino) of each whole chunk (a complete
# regular file of > 0 bytes) and (index, -ino) of each symlink (followed by the caller);
# nothing for the rest.  The names are a VALUES table probed in their order (an IN list is
# sorted into a temporary index first: 0.31 against 0.22 ms at 256 names), and answer by
# their index, not their name (no string made per row).  Sizes are rounded up to a power
# of two (the padding NULL matches nothing) so a few statements stay compiled.
_S_IFMT, _S_IFREG, _S_IFLNK = 0o170000, stat.S_IFREG, stat.S_IFLNK
_WHOLE = ("WITH v(k, n) AS (VALUES {}) SELECT v.k, CASE WHEN (i.mode & %d) = %d THEN -i.ino ELSE i.ino END"
          " FROM v CROSS JOIN dirents d INDEXED BY dirents_name"
          " ON d.parent = ? AND name_key(d.name) = name_key(v.n) AND +d.name = v.n"
          " JOIN inodes i ON i.ino = d.ino"
          " WHERE ((i.mode & %d) = %d AND i.complete AND i.size > 0) OR (i.mode & %d) = %d"
          % (_S_IFMT, _S_IFLNK, _S_IFMT, _S_IFREG, _S_IFMT, _S_IFLNK))
_WHOLE_SQL: dict[int, str] = {}


def _whole_sql(n: int) -> str:
    sql = _WHOLE_SQL.get(n)
    if sql is None:
        sql = _WHOLE_SQL[n] = _WHOLE.format(",".join(f"({i},?)" for i in range(n)))
    return sql


def _bucket(n: int) -> int:
    """n names' statement size: the next power of two, at least 8."""
    return max(8, 1 << (n - 1).bit_length())


Where = tuple[tuple[str, ...], str]   # a file's holders, sorted, and their one tier ("": mixed)


class Locator:
    """Answers Locate from a read connection, the registry and the evictor's pins."""

    def __init__(self, ns: Callable[[], Namespace], registry: Registry, pins: PinLeases,
                 fresh_dir: Callable[[int], object]) -> None:
        self._ns = ns
        self.registry = registry
        self.pins = pins
        self._fresh_dir = fresh_dir   # a UFS directory's listing refreshed before its names are read

    def locate(self, request: pb.LocateRequest) -> pb.LocateReply:
        n = len(request.names) or len(request.paths)
        if n > MAX_PATHS:
            raise err(errno.EINVAL, f"Locate: {n} paths in one call, at most {MAX_PATHS}")
        if request.pin_ms > MAX_PIN_MS:
            raise err(errno.EINVAL, f"Locate: pin_ms {request.pin_ms} is over {MAX_PIN_MS}")
        if request.names and request.paths:
            raise err(errno.EINVAL, "Locate: paths or dir and names, not both")
        c = request.caller
        cred = Cred(c.uid, c.gid, frozenset(c.groups) | {c.gid})
        ns = self._ns()
        if request.brief:
            return self._brief(ns, cred, request)
        paths = _joined(request.dir, request.names) if request.names else list(request.paths)
        rows = self._rows(ns, cred, paths, _FIELDS)
        files = [r[_INO] for r in rows if isinstance(r, tuple) and stat.S_ISREG(r[_MODE])]
        if request.unpin:
            self.pins.release(c.client_id, files)
            return pb.LocateReply()
        if request.pin_ms:
            self.pins.hold(c.client_id, files, request.pin_ms / 1000)
        return self._reply(ns, rows, files)

    # ------------------------------------------------------------------ brief (the KV lookup)
    def _brief(self, ns: Namespace, cred: Cred, request: pb.LocateRequest) -> pb.LocateReply:
        """One flag per name: a whole chunk.  Only whole chunks are pinned (a miss is never
        unlocked by LMCache, its pin would only run out) and unpinned."""
        if request.names:
            hits, inos = _flags(len(request.names), self._whole_in(ns, cred, request.dir, list(request.names)))
        else:
            hits, inos = self._brief_paths(ns, cred, list(request.paths))
        c = request.caller
        if request.unpin:
            self.pins.release(c.client_id, inos)
            return pb.LocateReply()
        if request.pin_ms:
            self.pins.hold(c.client_id, inos, request.pin_ms / 1000)
        return pb.LocateReply(whole=hits)

    def _brief_paths(self, ns: Namespace, cred: Cred, paths: list[str]) -> tuple[list[bool], list[int]]:
        """The paths form's flags and whole files' inodes: the paths grouped by parent."""
        by_dir: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for i, p in enumerate(paths):
            if p.startswith("/") and "\0" not in p:
                parent, name = _split(p)
                if name:
                    by_dir[parent].append((i, name))
        hits = [False] * len(paths)
        inos: list[int] = []
        for parent, items in by_dir.items():
            for k, ino in self._whole_in(ns, cred, parent, [name for _, name in items]):
                hits[items[k][0]] = True
                inos.append(ino)
        return hits, inos

    def _whole_in(self, ns: Namespace, cred: Cred, parent: str, names: list[str]) -> list[tuple[int, int]]:
        """Of names in directory parent, (index, inode) of each whole chunk (a symlink
        followed, as stat(2) does); none when parent is no directory this caller may search."""
        try:
            d = ns.resolve(cred, parent, True, self._fresh_dir)
            if not stat.S_ISDIR(d.mode):
                return []
            posix.require(d, cred, X)
            self._fresh_dir(d.ino)
        except CurvineError:
            return []
        cur = ns.conn.cursor()
        cur.row_factory = None
        out: list[tuple[int, int]] = []
        for k in range(0, len(names), _CHUNK):
            part = names[k:k + _CHUNK]
            size = _bucket(len(part))
            rows = cur.execute(_whole_sql(size), (*part, *[None] * (size - len(part)), d.ino)).fetchall()
            out += rows if not k else [(k + i, ino) for i, ino in rows]
        if out and min(map(_SECOND, out)) < 0:   # symlinks (their inode negated): followed one by one
            out = [x for x in (self._followed(ns, cred, parent, names, i, ino) for i, ino in out) if x]
        return out

    def _followed(self, ns: Namespace, cred: Cred, parent: str, names: list[str], i: int,
                  ino: int) -> tuple[int, int] | None:
        """(i, ino) of a whole chunk as it is, or of the whole chunk a symlink (ino < 0) names."""
        if ino > 0:
            return i, ino
        row = self._one(ns, cred, f"{parent.rstrip('/')}/{names[i]}", _BRIEF)
        return (i, row[_INO]) if isinstance(row, tuple) and _whole(row) else None

    def _reply(self, ns: Namespace, rows: list[Found | int], files: list[int]) -> pb.LocateReply:
        """The full answer: each path's attributes, holders and tier."""
        holders = self._where(ns, files)
        policies = Policies(ns.conn)
        tier_of = policies.tier if policies.values[TIER] else None   # no tier policy anywhere: skip the walk
        reply = pb.LocateReply()
        nowhere: Where = ((), "")
        for r in rows:
            m = reply.files.add()
            if isinstance(r, int):
                m.errno = r
                continue
            a = m.attr
            for f, v in zip(_FIELDS, r):
                if v:
                    setattr(a, f, v)
            a.complete = bool(r[_COMPLETE])
            hosts, tier = holders.get(r[_INO], nowhere)
            if hosts:
                m.hosts.extend(hosts)
            tier = (tier_of(r[_INO]) if tier_of is not None else "") or tier
            if tier:
                m.tier = tier
        return reply

    # ------------------------------------------------------------------ names
    def _rows(self, ns: Namespace, cred: Cred, paths: list[str], fields: tuple[str, ...]) -> list[Found | int]:
        """Each path's fields (then complete), or the errno of its absence, in order."""
        out: list[Found | int] = [errno.ENOENT] * len(paths)
        by_dir: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for i, p in enumerate(paths):
            if not p.startswith("/") or "\0" in p:
                out[i] = errno.EINVAL
                continue
            parent, name = _split(p)
            if not name:
                out[i] = self._one(ns, cred, "/", fields)
                continue
            by_dir[parent].append((i, name))
        for parent, items in by_dir.items():
            self._in_dir(ns, cred, parent, items, paths, out, fields)
        return out

    def _in_dir(self, ns: Namespace, cred: Cred, parent: str, items: list[tuple[int, str]],
                paths: list[str], out: list[Found | int], fields: tuple[str, ...]) -> None:
        try:
            d = ns.resolve(cred, parent, True, self._fresh_dir)
            if not stat.S_ISDIR(d.mode):
                raise err(errno.ENOTDIR)
            posix.require(d, cred, X)
            self._fresh_dir(d.ino)
        except CurvineError as e:
            for i, _ in items:
                out[i] = e.errno or errno.EIO
            return
        found: dict[str, Found] = {}
        names = sorted({n for _, n in items})
        cur = ns.conn.cursor()
        cur.row_factory = None   # plain tuples: no Row, no dict per name
        for k in range(0, len(names), _CHUNK):
            part = names[k:k + _CHUNK]
            for r in cur.execute(_NAMES[fields].format(**_in_names(len(part))), (d.ino, *part)):
                found[r[0]] = r[1:]
        for i, name in items:
            row = found.get(name)
            if row is None:
                out[i] = errno.ENAMETOOLONG if len(name.encode("utf-8", "surrogateescape")) > 255 else errno.ENOENT
            elif stat.S_ISLNK(row[_MODE]):
                out[i] = self._one(ns, cred, paths[i], fields)   # followed, as stat(2) does
            else:
                out[i] = row

    def _one(self, ns: Namespace, cred: Cred, path: str, fields: tuple[str, ...]) -> Found | int:
        try:
            row = ns.resolve(cred, path, True, self._fresh_dir)
        except CurvineError as e:
            return e.errno or errno.EIO
        return (*(getattr(row, f) for f in fields), row.complete)

    # ------------------------------------------------------------------ where
    def holders(self, ns: Namespace, inos: Iterable[int]) -> dict[int, set[str]]:
        """Per file, the hosts with a live replica of every one of its blocks (the event feed's hosts)."""
        return self._holders(ns, inos)[0]

    def _where(self, ns: Namespace, inos: Iterable[int]) -> dict[int, Where]:
        """Per file with a holder: its holders sorted and their one tier, each worked out
        once per distinct set of holders."""
        holders, host_tiers = self._holders(ns, inos)
        memo: dict[frozenset[str], Where] = {}
        out: dict[int, Where] = {}
        for ino, hosts in holders.items():
            if not hosts:
                continue
            key = frozenset(hosts)
            got = memo.get(key)
            if got is None:
                got = memo[key] = (tuple(sorted(hosts)), _one_tier(hosts, host_tiers))
            out[ino] = got
        return out

    def _holders(self, ns: Namespace, inos: Iterable[int]) -> tuple[dict[int, set[str]], dict[str, set[str]]]:
        """Per file, the hosts with a live replica of every one of its blocks; and the
        tiers of each live host's data dirs."""
        blocks: dict[int, list[int]] = defaultdict(list)
        inos = sorted(set(inos))
        cur = ns.conn.cursor()
        cur.row_factory = None
        for k in range(0, len(inos), _CHUNK):
            part = inos[k:k + _CHUNK]
            for ino, bid in cur.execute(f"SELECT ino, block_id FROM blocks WHERE ino IN ({','.join('?' * len(part))})",
                                        part):
                blocks[ino].append(bid)
        out: dict[int, set[str]] = {}
        with self.registry.lock:   # one snapshot for the call
            host_of = {w.worker_id: w.host for w in self.registry.workers.values() if w.live}
            tiers: dict[str, set[str]] = defaultdict(set)
            for w in self.registry.workers.values():
                if w.live:
                    tiers[w.host].update(d.tier.upper() for d in w.dirs)
            locations = self.registry.locations
            for ino, bids in blocks.items():
                hosts: set[str] | None = None
                for bid in bids:
                    here = {host_of[w] for w in locations.get(bid, ()) if w in host_of}
                    hosts = here if hosts is None else hosts & here
                    if not hosts:
                        break
                out[ino] = hosts or set()
        return out, tiers


def _whole(r: Found | int) -> bool:
    """A brief row is a whole chunk: found, a regular file, complete, not empty (a
    writer still at it, or a name made and not yet written, is a miss)."""
    return isinstance(r, tuple) and stat.S_ISREG(r[_MODE]) and bool(r[_COMPLETE]) and r[_BRIEF_SIZE] > 0


def _flags(n: int, found: list[tuple[int, int]]) -> tuple[list[bool], list[int]]:
    """n flags, set at found's indices, and found's inodes.  Found is most often a prefix
    of the names (LMCache's chunks are there up to the first miss): made without a
    Python step per name."""
    if not found:
        return [False] * n, []
    ks, inos = zip(*found)
    if ks == tuple(range(len(ks))):
        return [True] * len(ks) + [False] * (n - len(ks)), list(inos)
    hits = [False] * n
    for k in ks:
        hits[k] = True
    return hits, list(inos)


def _joined(parent: str, names: Iterable[str]) -> list[str]:
    """The names form's paths.  A name that is no entry of parent ('', '.', '..', one with
    a '/') and any name of a parent that is not absolute become '' (answered EINVAL), not
    a path elsewhere."""
    if not parent.startswith("/"):
        return ["" for _ in names]
    base = parent.rstrip("/")
    return [f"{base}/{n}" if n not in ("", ".", "..") and "/" not in n else "" for n in names]


def _split(p: str) -> tuple[str, str]:
    """(parent, name) of an absolute path ('', '' for the root); normalised first only
    when it is not already (a client's SDK sends normalised paths)."""
    if "//" in p or "/." in p or p.endswith("/"):
        p = "/" + posixpath.normpath(p).lstrip("/")
        if p == "/":
            return "", ""
    parent, _, name = p.rpartition("/")
    return parent or "/", name


def _one_tier(hosts: set[str] | None, host_tiers: dict[str, set[str]]) -> str:
    """The one tier of the holders' data dirs ('' = mixed or no holder)."""
    if not hosts:
        return ""
    tiers = set().union(*(host_tiers.get(h, set()) for h in hosts))
    return tiers.pop() if len(tiers) == 1 else ""
