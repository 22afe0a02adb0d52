"""Locate: many paths' attributes, holders and tier in one call (and LMCache's locks).

One call answers what a KV-aware caller asks of a whole prompt: for up to
``MAX_PATHS`` absolute paths, each one's attributes or the errno that says why it is
absent, the hosts holding a live replica of every one of its blocks, and its tier.
The LMCache L2 adapter's lookup-and-lock is this call with ``pin_ms`` (found files are
pinned against eviction for that client, master/pinleases.py) and its unlock the same
call with ``unpin``; ``Client.locate`` and ``cv fs locate`` are it without either.

Paths are answered per directory, not per path: each distinct parent is resolved once
and its names are read in one statement (LMCache keeps every chunk of a model in one
flat directory), and all the files' blocks in one more.
"""
from __future__ import annotations

import errno
import posixpath
import stat
from collections import defaultdict
from typing import Callable, Iterable

from curvine_py.common.errors import CurvineError, err
from curvine_py.master import posix
from curvine_py.master.cachepolicy import Policies
from curvine_py.master.namespace import Namespace
from curvine_py.master.pinleases import PinLeases
from curvine_py.master.posix import X, Cred
from curvine_py.master.store import ATTR_COLS, Row
from curvine_py.master.workers import Registry
from curvine_py.pb import curvine_pb2 as pb

MAX_PATHS = 1000
MAX_PIN_MS = 600_000   # a lock outliving 10 minutes unrenewed is a bug of the caller's
_CHUNK = 500           # names per IN (...) statement, well under SQLite's variable limit
_NAMES = ("SELECT d.name, " + ", ".join(f"i.{c.strip()}" for c in ATTR_COLS.split(",")) + ", i.target"
          " FROM dirents d JOIN inodes i ON i.ino = d.ino WHERE d.parent=? AND d.name IN ({})")


class Locator:
    """Answers Locate from a read connection, the registry and the evictor's pins."""

    def __init__(self, ns: Callable[[], Namespace], registry: Registry, pins: PinLeases,
                 fresh_dir: Callable[[int], object], to_attr: Callable[[Row], pb.Attr]) -> None:
        self._ns = ns
        self.registry = registry
        self.pins = pins
        self._fresh_dir = fresh_dir   # a UFS directory's listing refreshed before its names are read
        self._to_attr = to_attr

    def locate(self, request: pb.LocateRequest) -> pb.LocateReply:
        paths = list(request.paths)
        if len(paths) > MAX_PATHS:
            raise err(errno.EINVAL, f"Locate: {len(paths)} paths in one call, at most {MAX_PATHS}")
        if request.pin_ms > MAX_PIN_MS:
            raise err(errno.EINVAL, f"Locate: pin_ms {request.pin_ms} is over {MAX_PIN_MS}")
        c = request.caller
        cred = Cred(c.uid, c.gid, frozenset(c.groups) | {c.gid})
        ns = self._ns()
        rows = self._rows(ns, cred, paths)
        files = [r["ino"] for r in rows if isinstance(r, dict) and stat.S_ISREG(r["mode"])]
        if request.unpin:
            self.pins.release(c.client_id, files)
            return pb.LocateReply()
        if request.pin_ms:
            self.pins.hold(c.client_id, files, request.pin_ms / 1000)
        holders = self._holders(ns, files)
        policies = Policies(ns.conn)
        out = []
        for r in rows:
            if isinstance(r, int):
                out.append(pb.Located(errno=r))
                continue
            hosts = holders.get(r["ino"], ())
            out.append(pb.Located(attr=self._to_attr(r), hosts=sorted(hosts),
                                  tier=self._tier(policies, r["ino"], hosts)))
        return pb.LocateReply(files=out)

    # ------------------------------------------------------------------ names
    def _rows(self, ns: Namespace, cred: Cred, paths: list[str]) -> list[Row | int]:
        """Each path's row, or the errno of its absence, in order."""
        out: list[Row | int] = [errno.ENOENT] * len(paths)
        by_dir: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for i, p in enumerate(paths):
            if not p.startswith("/") or "\0" in p:
                out[i] = errno.EINVAL
                continue
            q = "/" + posixpath.normpath(p).lstrip("/")
            if q == "/":
                out[i] = self._one(ns, cred, q)
                continue
            parent, name = posixpath.split(q)
            by_dir[parent].append((i, name))
        for parent, items in by_dir.items():
            self._in_dir(ns, cred, parent, items, paths, out)
        return out

    def _in_dir(self, ns: Namespace, cred: Cred, parent: str, items: list[tuple[int, str]],
                paths: list[str], out: list[Row | int]) -> None:
        try:
            d = ns.resolve(cred, parent, True, self._fresh_dir)
            if not stat.S_ISDIR(d["mode"]):
                raise err(errno.ENOTDIR)
            posix.require(d, cred, X)
            self._fresh_dir(d["ino"])
        except CurvineError as e:
            for i, _ in items:
                out[i] = e.errno or errno.EIO
            return
        found: dict[str, Row] = {}
        names = sorted({n for _, n in items})
        for k in range(0, len(names), _CHUNK):
            part = names[k:k + _CHUNK]
            sql = _NAMES.format(",".join("?" * len(part)))
            for r in ns.conn.execute(sql, (d["ino"], *part)):
                got = dict(r)
                found[got.pop("name")] = got
        for i, name in items:
            row = found.get(name)
            if row is None:
                out[i] = errno.ENAMETOOLONG if len(name.encode("utf-8", "surrogateescape")) > 255 else errno.ENOENT
            elif stat.S_ISLNK(row["mode"]):
                out[i] = self._one(ns, cred, paths[i])   # followed, as stat(2) does
            else:
                out[i] = row

    def _one(self, ns: Namespace, cred: Cred, path: str) -> Row | int:
        try:
            return ns.resolve(cred, path, True, self._fresh_dir)
        except CurvineError as e:
            return e.errno or errno.EIO

    # ------------------------------------------------------------------ where
    def _holders(self, ns: Namespace, inos: Iterable[int]) -> dict[int, set[str]]:
        """Per file, the hosts with a live replica of every one of its blocks."""
        blocks: dict[int, list[int]] = defaultdict(list)
        inos = sorted(set(inos))
        for k in range(0, len(inos), _CHUNK):
            part = inos[k:k + _CHUNK]
            sql = f"SELECT ino, block_id FROM blocks WHERE ino IN ({','.join('?' * len(part))})"
            for ino, bid in ns.conn.execute(sql, part):
                blocks[ino].append(bid)
        out: dict[int, set[str]] = {}
        for ino, bids in blocks.items():
            hosts: set[str] | None = None
            for bid in bids:
                here = {w.host for w in map(self.registry.get, self.registry.replicas(bid)) if w is not None}
                hosts = here if hosts is None else hosts & here
                if not hosts:
                    break
            out[ino] = hosts or set()
        return out

    def _tier(self, policies: Policies, ino: int, hosts: Iterable[str]) -> str:
        """The file's tier policy; else the one tier of its holders' data dirs ('' = mixed)."""
        tier = policies.tier(ino)
        if tier:
            return tier
        hosts = set(hosts)
        if not hosts:
            return ""
        tiers = {d.tier.upper() for w in self.registry.live_workers() if w.host in hosts for d in w.dirs}
        return tiers.pop() if len(tiers) == 1 else ""
