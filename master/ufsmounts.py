"""UFS mounts on the master: the opened stores, lazy metadata, and name changes in the UFS.

The mount table itself is journaled (``ufsops.py``); this module holds what is not: one
opened ``Ufs`` per mount (credentials stay here and on the workers), and the calls to it
that the namespace needs.

* **Lazy metadata.**  A lookup or listing of a directory under a mount whose listing is
  older than the mount's metadata TTL lists the UFS directory (one ListObjectsV2 walk)
  and journals what it found (``ufs_sync_dir``); an open of a file whose last check is
  older than the TTL asks for the object (HEAD) and journals a change
  (``ufs_refresh``), so stale bytes are never served.  One listing per directory runs at
  a time; callers arriving meanwhile wait for it.  A UFS that fails is left alone for
  ``BACKOFF_S`` and the cached names are served meanwhile (cached data stays readable).
* **Names in the UFS.**  mkdir, rmdir, unlink and rename of files under a mount change
  the UFS first (rename = copy + delete: S3 has none), then the namespace; a UFS error
  fails the call with its errno and the namespace stays as it was.
"""
from __future__ import annotations

import errno
import json
import logging
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable

from curvine_py.common.errors import err
from curvine_py.common.types import RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO
from curvine_py.master import metrics
from curvine_py.master.namespace import Namespace
from curvine_py.master.posix import Cred
from curvine_py.master.records import Mknod, Submit, SyncEntry, UfsRefresh, UfsState, UfsSyncDir, UfsUmount
from curvine_py.master.records import UfsMount as UfsMountRecord
from curvine_py.master.store import Result, Row
from curvine_py.master.ufsops import PERSISTED, child_key
from curvine_py.pb import curvine_pb2 as pb
from curvine_py import ufs as providers
from curvine_py.ufs.base import Ufs, UfsError

log = logging.getLogger(__name__)
BACKOFF_S = 5.0            # a mount whose UFS failed is not asked again for metadata this long
WRITE_MODES = ("through", "back")
SECRET_OPTIONS = frozenset({"secret_access_key", "session_token", "access_key_id"})


@dataclass(frozen=True)
class Mount:
    """One row of the mount table, typed."""

    mount_id: int
    path: str
    ino: int
    uri: str
    options: dict[str, str]
    write_mode: str
    metadata_ttl_ms: int
    ttl_ms: int
    created_ns: int

    @classmethod
    def of(cls, row: Row) -> "Mount":
        return cls(row["mount_id"], row["path"], row["ino"], row["uri"], json.loads(row["options"]),
                   row["write_mode"], row["metadata_ttl_ms"], row["ttl_ms"], row["created_ns"])

    def to_pb(self, secrets: bool) -> pb.UfsMount:
        opts = {k: (v if secrets or k not in SECRET_OPTIONS else "***") for k, v in self.options.items()}
        return pb.UfsMount(mount_id=self.mount_id, path=self.path, uri=self.uri, options=opts,
                           write_mode=self.write_mode, metadata_ttl_ms=self.metadata_ttl_ms, ttl_ms=self.ttl_ms,
                           created_ns=self.created_ns)

    def object_uri(self, key: str) -> str:
        return f"{self.uri.rstrip('/')}/{key}" if key else self.uri


class UfsMounts:
    """One per master: opened stores by mount id, and the metadata calls made on them."""

    def __init__(self, ns: Callable[[], Namespace], submit: Submit,
                 timeout_s: float) -> None:
        """ns: this thread's read connection; submit: the journal (the service's submit,
        which also sends the delete orders of the blocks an op freed)."""
        self._ns = ns
        self.submit = submit
        self.timeout_s = timeout_s
        self._stores: dict[int, Ufs] = {}
        self._lock = threading.Lock()
        self._flights: dict[int, threading.Event] = {}
        self._failed_until: dict[int, float] = {}

    # ------------------------------------------------------------------ the table
    def mount(self, m: pb.UfsMount, cred: Cred) -> Mount:
        """Check the UFS, then journal the mount; refuses with one line, mounting nothing."""
        if m.write_mode not in WRITE_MODES:
            raise err(errno.EINVAL, f"write mode {m.write_mode!r}: one of {', '.join(WRITE_MODES)}")
        if not m.path.startswith("/") or m.path.rstrip("/") == "":
            raise err(errno.EINVAL, f"{m.path!r}: a UFS mount point is an absolute path below /")
        store = providers.open_ufs(m.uri, dict(m.options), self.timeout_s)
        try:
            store.check()
        except BaseException:
            store.close()
            raise
        path = "/" + m.path.strip("/")
        ino = self._mount_dir(path, cred)
        result = self.submit(UfsMountRecord(cred=cred, path=path, ino=ino, uri=m.uri,
                                            options=tuple(sorted(m.options.items())), write_mode=m.write_mode,
                                            metadata_ttl_ms=m.metadata_ttl_ms, ttl_ms=m.ttl_ms))
        mount = Mount.of(result["mount"])
        with self._lock:
            self._stores[mount.mount_id] = store
        log.info("UFS %s mounted at %s (write %s)", m.uri, path, m.write_mode)
        return mount

    def _mount_dir(self, path: str, cred: Cred) -> int:
        """The mount point's inode; missing directories on the way are made (mkdir -p)."""
        row = self._ns().inode(ROOT_INO)
        for name in [p for p in path.split("/") if p]:
            child = self._ns().lookup(cred, row.ino, name) if self._ns().child(row.ino, name) else None
            if child is None:
                child = self.submit(Mknod(cred=cred, parent=row.ino, name=name, mode=stat.S_IFDIR | 0o755,
                                          umask=0, exclusive=True))["attr"]
            row = child
            if not stat.S_ISDIR(row.mode):
                raise err(errno.ENOTDIR, f"{path}: {name} is not a directory")
        return row.ino

    def umount(self, path: str, force: bool) -> list[int]:
        result = self.submit(UfsUmount(path="/" + path.strip("/"), force=force))
        with self._lock:
            store = self._stores.pop(result["mount"]["mount_id"], None)
        if store is not None:
            store.close()
        return result["freed"]

    def get(self, mount_id: int) -> Mount:
        row = self._ns().ufs_mount(mount_id)
        if row is None:
            raise err(errno.ENOENT, f"no UFS mount {mount_id}")
        return Mount.of(row)

    def all(self) -> list[Mount]:
        return [Mount.of(r) for r in self._ns().ufs_mounts()]

    def store(self, mount_id: int) -> Ufs:
        """The opened UFS of a mount (opened on first use after a master restart)."""
        with self._lock:
            s = self._stores.get(mount_id)
        if s is not None:
            return s
        m = self.get(mount_id)
        s = providers.open_ufs(m.uri, m.options, self.timeout_s)
        with self._lock:
            s = self._stores.setdefault(mount_id, s)
        return s

    def close(self) -> None:
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for s in stores:
            s.close()

    # ------------------------------------------------------------------ lazy metadata
    def fresh_dir(self, ino: int) -> bool:
        """List directory ino's UFS directory if its listing is older than the mount's TTL;
        whether ino is under a UFS mount at all."""
        ns = self._ns()
        u = ns.ufs_dir(ino)
        if u is None:
            return False
        m = self.get(u.mount_id)
        if time.time_ns() - u.listed_ns < m.metadata_ttl_ms * 1_000_000 or self._backing_off(m):
            return True
        self._once(ino, lambda: self._list(m, ino, u.ukey))
        return True

    def _list(self, m: Mount, ino: int, key: str) -> None:
        try:
            entries = tuple(SyncEntry(e.key.rsplit("/", 1)[-1], e.is_dir, e.size, e.mtime_ns, e.etag)
                            for e in self.store(m.mount_id).list(key))
        except UfsError as e:
            self._failed(m, e)
            return
        metrics.UFS_LISTINGS.labels("ok").inc()
        self.submit(UfsSyncDir(ino=ino, entries=entries))

    def fresh_file(self, ino: int) -> None:
        """At open: check the file's object if its last check is older than the TTL.  An
        object changed in the UFS gets fresh (uncached) blocks; one deleted there: ENOENT."""
        f = self._ns().ufs_file(ino)
        if f is None or f.state != PERSISTED:
            return
        m = self.get(f.mount_id)
        if time.time_ns() - f.checked_ns < m.metadata_ttl_ms * 1_000_000 or self._backing_off(m):
            return
        try:
            info = self.store(m.mount_id).stat(f.ukey)
        except UfsError as e:
            self._failed(m, e)
            return
        metrics.UFS_LISTINGS.labels("ok").inc()
        if info is None or info.is_dir:
            rec = UfsRefresh(ino=ino, gone=True)
        else:
            rec = UfsRefresh(ino=ino, size=info.size, mtime_ns=info.mtime_ns, etag=info.etag)
        if self.submit(rec).get("gone"):
            raise err(errno.ENOENT, f"{m.object_uri(f.ukey)} was deleted from the UFS")

    def _once(self, ino: int, fn: Callable[[], None]) -> None:
        """Run fn for ino unless a run is in flight; then wait for that one (bounded)."""
        with self._lock:
            ev = self._flights.get(ino)
            mine = ev is None
            if mine:
                ev = self._flights[ino] = threading.Event()
        assert ev is not None
        if not mine:
            ev.wait(self.timeout_s + 5)
            return
        try:
            fn()
        finally:
            with self._lock:
                self._flights.pop(ino, None)
            ev.set()

    def _backing_off(self, m: Mount) -> bool:
        return time.monotonic() < self._failed_until.get(m.mount_id, 0.0)

    def _failed(self, m: Mount, e: UfsError) -> None:
        metrics.UFS_LISTINGS.labels("failed").inc()
        self._failed_until[m.mount_id] = time.monotonic() + BACKOFF_S
        log.warning("UFS %s: metadata not refreshed (%s); serving cached names for %.0f s", m.uri, e, BACKOFF_S)

    # ------------------------------------------------------------------ names in the UFS
    def where(self, parent: int, name: str) -> tuple[Mount, str] | None:
        """The mount and key of name in directory parent (None: not under a mount)."""
        u = self._ns().ufs_dir(parent)
        if u is None:
            return None
        return self.get(u.mount_id), child_key(u.ukey, name)

    def mkdir(self, parent: int, name: str) -> None:
        at = self.where(parent, name)
        if at is not None:
            self.store(at[0].mount_id).mkdir(at[1])

    def rmdir(self, parent: int, name: str) -> None:
        at = self.where(parent, name)
        if at is not None:
            self.store(at[0].mount_id).rmdir(at[1])

    def in_ufs(self, parent: int, name: str) -> tuple[Mount, str] | None:
        """The mount and key of an existing file whose object is in the UFS (None otherwise)."""
        ns = self._ns()
        row = ns.child(parent, name)
        f = ns.ufs_file(row.ino) if row is not None and stat.S_ISREG(row.mode) else None
        if f is None or not f.etag:
            return None
        return self.get(f.mount_id), f.ukey

    def unlink(self, parent: int, name: str) -> None:
        at = self.in_ufs(parent, name)
        if at is not None:
            self.store(at[0].mount_id).delete(at[1])

    def rename(self, parent: int, name: str, new_parent: int, new_name: str, flags: int,
               apply: Callable[[], Result]) -> Result:
        """Copy the object to its new key, apply the rename, then delete the old key.  A
        rename the namespace will refuse for its flags (no-replace onto an existing name,
        exchange) goes to the namespace first, so the copy never overwrites the object of a
        name that stays (mv -n)."""
        src = self.in_ufs(parent, name)
        dst = self.where(new_parent, new_name)
        refused = flags & RENAME_EXCHANGE or (flags & RENAME_NOREPLACE and self._ns().child(new_parent, new_name))
        if src is None or dst is None or src[0].mount_id != dst[0].mount_id or refused:
            return apply()      # nothing in the UFS yet, or the namespace refuses (EXDEV, EEXIST)
        store = self.store(src[0].mount_id)
        row = self._ns().child(parent, name)
        info = store.copy(src[1], dst[1])
        try:
            result = apply()
        except BaseException:
            store.delete(dst[1])
            raise
        store.delete(src[1])
        if row is not None:
            f = self._ns().ufs_file(row.ino)
            if f is not None and f.state == PERSISTED:
                cur = self._ns().inode(row.ino)
                self.submit(UfsState(ino=row.ino, generation=cur.generation, key=dst[1], etag=info.etag,
                                     mtime_ns=info.mtime_ns))
        return result
