"""fsspec over the SDK: the ``curvine://`` (and ``cv://``) protocol for pandas, pyarrow,
Dask, Ray and everything else that opens files through fsspec (docs/integrations.md).

    import pandas as pd
    df = pd.read_parquet("curvine:///data/t.parquet", storage_options={"master": "m1:8995"})

A path is the same absolute path in the pool with or without the protocol:
``curvine:///a/b``, ``curvine://a/b`` and ``/a/b`` all name ``/a/b`` (no host in the
URL: the masters come from ``storage_options`` or the configuration).

Why it has this shape:
- **Writes are atomic.** A file written here (``open(..., "wb")``, ``put_file``,
  ``cp_file``, ``pipe_file(mode="create")``) goes to a hidden sibling
  (``.<name>.<random>.cvtmp``) and is renamed over its name once complete (one
  journal op): nobody ever sees a half-written object under the real name, and an
  overwrite shows the old bytes until the rename.  Exclusive writes (``xb``,
  ``mode="create"``) rename with RENAME_NOREPLACE, so two racing creators cannot both
  win.  A write abandoned (an exception in its ``with`` block, a file object collected
  unclosed) is aborted and its sibling removed, never published.  ``pipe_file`` of a
  whole object is ``Client.put_bytes`` (already atomic: one Commit), and appends
  (``ab``) write the file itself, committed at close (close-to-open: readers see the
  old bytes until then).
- **The client is made lazily**, per process: the filesystem pickles as its storage
  options only (fsspec's ``__reduce__``), so Dask and Ray ship it to workers, and a
  forked or unpickled copy connects on first use instead of reusing the parent's
  sockets and threads.
- Errors are the SDK's ``CurvineError``, already the builtin ``OSError`` subclasses
  fsspec users catch (``FileNotFoundError``, ``FileExistsError``, ``NotADirectoryError``,
  ``IsADirectoryError``, ``PermissionError``), named after the caller's path.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import glob
import os
import functools
import logging
import posixpath
import queue
import threading
import typing
import warnings
from typing import Any, Callable, Iterator, TypeVar

from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import isfilelike

from curvine_py.common import config as config_mod
from curvine_py.common.buffers import fresh_bytes
from curvine_py.common.config import Config
from curvine_py.common.errors import CurvineError, err
from curvine_py.sdk.client import COPY_CHUNK, Client, File, copy_stream
from curvine_py.sdk.results import FileStatus

T = TypeVar("T")
MiB = 1 << 20
TEMP_SUFFIX = ".cvtmp"    # the hidden sibling a write goes to before its rename
TEMP_NAME_BYTES = 200     # room left in NAME_MAX (255) for the dot, the token and the suffix
# AbstractFileSystem's own options (listings cache, asyncio), accepted beside ours
FSSPEC_OPTIONS = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths", "asynchronous", "loop"})

# (pid, master, config path) -> the SDK client every instance with those options shares
_CLIENTS: dict[tuple[int, str | None, str | None], Client] = {}
_CLIENTS_LOCK = threading.Lock()


log = logging.getLogger(__name__)

# Cleanups of file objects collected unclosed, run by one daemon thread (_finalizer_thread).
# fsspec's files are in reference cycles (file -> cache -> bound _fetch_range -> file), so
# only the cyclic GC collects one left unclosed (pyarrow leaves every input file so), and
# it runs wherever an allocation triggers it: once inside the VFS with its lock held, where
# a __del__ closing the handle deadlocked its own thread.  SimpleQueue.put is safe in __del__.
_FINALIZE: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
_finalizer_pid = 0
# Every SDK File an open CurvineFile holds, also held here: reachable from a module, it is
# never in the same garbage as its CurvineFile, so the GC never runs the File's own
# finalizer (IOBase.__del__ closes it: the same deadlock); the CurvineFile's __del__ hands
# it to the finalizer thread instead.
_HELD: dict[int, File] = {}


def _hold(f: File) -> File:
    _HELD[id(f)] = f
    return f


def _let_go(f: File) -> None:
    _HELD.pop(id(f), None)


def _finalizer_thread() -> None:
    """Start the finalizer thread of this process if it has none (never from a __del__)."""
    global _finalizer_pid
    if _finalizer_pid != os.getpid():
        _finalizer_pid = os.getpid()
        threading.Thread(target=_run_finalizers, name="curvine-fsspec-finalizer", daemon=True).start()


def _run_finalizers() -> None:
    while True:
        fn = _FINALIZE.get()
        try:
            fn()
        except Exception:   # a cleanup that failed must not end the thread
            log.warning("curvine fsspec: the cleanup of a file collected unclosed failed", exc_info=True)


def _after_fork_in_child() -> None:
    """A fork while another thread held the lock would leave it held in the child forever."""
    global _CLIENTS_LOCK
    _CLIENTS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _temp_name(name: str) -> str:
    """The hidden sibling of name a write fills: unique per write, within NAME_MAX."""
    short = name.encode()[:TEMP_NAME_BYTES].decode(errors="ignore")
    return f".{short}.{os.urandom(6).hex()}{TEMP_SUFFIX}"


def _oserror(e: CurvineError, path: str) -> CurvineError:
    """e as the same errno subclass, naming the caller's path (not a temp sibling's)."""
    return e.with_path(path)


def _master_list(master: str | list[str] | tuple[str, ...] | None) -> str | None:
    """storage_options' master: "h:p,h:p" or a list of "h:p"; None = the configuration's."""
    if master is None or isinstance(master, str):
        return master or None
    return ",".join(master)


class CurvineFileSystem(AbstractFileSystem):
    """An fsspec filesystem over one curvine-py cluster (the SDK's ``Client``).

    storage_options:
      master: the masters, "host:port[,host:port...]" or a list (default: the config's
        ``client.master``, or ``$CURVINE_MASTER``);
      config: a TOML file (curvine.toml: cluster secret, [client] settings); default:
        ``$CURVINE_CONF``, ./curvine.toml, ./.curvine/curvine.toml, /etc/curvine/curvine.toml;
      auto_mkdir: writes create missing parent directories (default True, as object
        stores behave; False: FileNotFoundError);
      tls: reserved.  The cluster's channels have no TLS (docs/architecture.md
        "Security": a cluster secret and HMAC-signed block tokens); tls material is
        accepted so shared option dicts work, and a warning says it is not used.
    """

    protocol = ("curvine", "cv")
    root_marker = "/"
    blocksize = COPY_CHUNK

    def __init__(self, master: str | list[str] | None = None, config: str | None = None,
                 auto_mkdir: bool = True, tls: Any = None, **kwargs: Any) -> None:
        unknown = set(kwargs) - FSSPEC_OPTIONS
        if unknown:
            raise TypeError(f"curvine: unknown storage option(s) {sorted(unknown)} "
                            f"(known: master, config, auto_mkdir, tls, {', '.join(sorted(FSSPEC_OPTIONS))})")
        super().__init__(master=master, config=config, auto_mkdir=auto_mkdir, tls=tls, **kwargs)
        if tls:
            warnings.warn("curvine: the tls storage option is reserved: the cluster's channels have no TLS "
                          "(a cluster secret and signed block tokens instead); the material given is not used",
                          stacklevel=2)
        self.master = _master_list(master)
        self.config_path = os.fspath(config) if config is not None else None
        self.auto_mkdir = auto_mkdir
        self._config = self._load_config()   # a bad file or master list fails here, not at first use
        self._key = (self.master, self.config_path)

    def _load_config(self) -> Config:
        cfg = config_mod.load(path=self.config_path)
        if self.master:
            cfg.client.master = self.master
        if not config_mod.addresses(cfg.client.master):
            raise ValueError(f"curvine: no master address (master={self.master!r}, config={self.config_path!r})")
        return cfg

    # ------------------------------------------------------------------ the connection
    @property
    def client(self) -> Client:
        """This process's SDK client for these options, connected on first use.

        One per process and (master, config), shared by every instance: fsspec caches an
        instance per thread, and Dask or Ray unpickle one per task, but a Client (its
        buffer pools, I/O threads, connections) is made to be shared.  Keyed by the pid
        too: a forked child makes its own, never using (or closing: that would release
        the parent's leases) the parent's sockets and threads."""
        key = (os.getpid(), *self._key)
        client = _CLIENTS.get(key)
        if client is None:
            with _CLIENTS_LOCK:
                client = _CLIENTS.get(key)
                if client is None:
                    client = _CLIENTS[key] = Client(master=self.master, config=self._config)
        return client

    def close(self) -> None:
        """Close this process's client for these options (the next call connects again)."""
        with _CLIENTS_LOCK:
            client = _CLIENTS.pop((os.getpid(), *self._key), None)
        if client is not None:
            client.close()

    # ------------------------------------------------------------------ paths
    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """"curvine:///a/b", "cv://a/b", "a/b/" -> "/a/b"; lists element-wise."""
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = os.fspath(path)
        for proto in cls.protocol:
            if path.startswith(f"{proto}://"):
                path = path[len(proto) + 3:]
                break
        return "/" + path.strip("/")

    def unstrip_protocol(self, name: str) -> str:
        return f"curvine://{self._strip_protocol(name)}"

    # ------------------------------------------------------------------ metadata
    def _details(self, st: FileStatus) -> dict[str, Any]:
        """fsspec's info dict of a status (symlinks followed, as LocalFileSystem does)."""
        islink = st.is_symlink
        if islink:
            with contextlib.suppress(OSError):   # a dangling link stays an "other"
                st = self.client.stat(st.path)
        kind = "directory" if st.is_dir else "file" if st.is_file else "other"
        return {"name": st.path, "size": 0 if st.is_dir else st.size, "type": kind, "mode": st.mode,
                "uid": st.uid, "gid": st.gid, "nlink": st.nlink, "ino": st.ino, "islink": islink,
                "mtime": st.mtime_ns / 1e9, "created": st.ctime_ns / 1e9,
                "block_size": st.block_size, "replicas": st.replicas, "complete": st.complete}

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._details(self.client.lstat(self._strip_protocol(path)))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """A directory's entries (a file: itself), sorted by name; FileNotFoundError if missing."""
        p = self._strip_protocol(path)
        try:
            entries = [self._details(s) for s in self.client.scandir(p)]
        except NotADirectoryError:
            entries = [self.info(p)]
        entries.sort(key=lambda d: d["name"])
        return entries if detail else [d["name"] for d in entries]

    def exists(self, path: str, **kwargs: Any) -> bool:
        """False for a missing path; other errors (an unreachable master) raise, instead of
        fsspec's default answering False to any error."""
        return self.client.exists(self._strip_protocol(path))

    def modified(self, path: str) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    def created(self, path: str) -> datetime.datetime:
        """The inode's change time (ctime): the pool keeps no birth time.  For a file
        written here (each write a new inode renamed into place) that is when it was
        last written or renamed; LocalFileSystem answers st_ctime on Linux too."""
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.timezone.utc)

    def sign(self, path: str, expiration: int = 100, **kwargs: Any) -> str:
        raise NotImplementedError(
            "curvine: sign() is not supported: the cluster serves no HTTP URLs (blocks move on its own "
            "framed TCP channel with per-block tokens); read through fsspec, the SDK or a mount instead")

    # ------------------------------------------------------------------ directories
    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """FileExistsError if path exists; the parents are made too unless create_parents=False."""
        p = self._strip_protocol(path)
        if create_parents:
            parent = posixpath.dirname(p)
            if parent != p:
                self.client.mkdir(parent, parents=True, exist_ok=True)
        self.client.mkdir(p)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        p = self._strip_protocol(path)
        if not exist_ok and self.exists(p):
            raise err(errno.EEXIST).with_path(p)
        self.client.mkdir(p, parents=True, exist_ok=True)

    def rmdir(self, path: str) -> None:
        self.client.rmdir(self._strip_protocol(path))

    # ------------------------------------------------------------------ removal and renames
    def rm_file(self, path: str) -> None:
        self.client.remove(self._strip_protocol(path))

    def _rm(self, path: str) -> None:
        """One path: a file unlinked, an (empty) directory removed."""
        p = self._strip_protocol(path)
        try:
            self.client.remove(p)
        except IsADirectoryError:
            self.client.rmdir(p)

    def rm(self, path: str | list[str], recursive: bool = False, maxdepth: int | None = None) -> None:
        """Files and, with recursive=True, directories with all they hold (without it a
        directory is an IsADirectoryError, as LocalFileSystem's).  A tree is listed once,
        one directory at a time, and emptied depth first: no failed unlink per directory."""
        paths = self.expand_path(path, recursive=recursive and maxdepth is not None, maxdepth=maxdepth)
        for p in reversed(paths):   # sorted: a directory's entries before the directory
            if maxdepth is not None:
                self._rm(p)   # what lies below maxdepth stays: its directory's rmdir fails
                continue
            try:
                self.client.remove(p)
            except IsADirectoryError:
                if not recursive:
                    raise IsADirectoryError(errno.EISDIR, "is a directory (use recursive=True)", p) from None
                self._rm_tree(p)
            except FileNotFoundError:
                if not recursive:   # (recursive: a glob matched it below a tree removed already)
                    raise

    def _rm_tree(self, path: str) -> None:
        for entry in self.client.scandir(path):
            if entry.is_dir:
                self._rm_tree(entry.path)
            else:
                self.client.remove(entry.path)
        self.client.rmdir(path)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: int | None = None,
           **kwargs: Any) -> None:
        """One path to another: a rename (atomic, any size, directories too; into path2 if
        it is a directory or ends with "/", as shutil.move).  Lists and globs: fsspec's
        copy and delete."""
        if not (isinstance(path1, str) and isinstance(path2, str)) or glob.has_magic(path1):
            super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
            return
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        if src == dst:
            return
        if path2.endswith("/") or self.isdir(dst):
            dst = posixpath.join(dst, posixpath.basename(src))
        self._with_parents(dst, lambda: self.client.rename(src, dst))

    # ------------------------------------------------------------------ whole objects
    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """Bytes [start, end) of a file; negative offsets count from its end (fsspec's rule)."""
        p = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.get_bytes(p)
        with self.client.open(p, "rb") as f:
            size = f.size
            lo, hi = _range(size, start, end)
            return _read_range(f, lo, hi)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """A whole object; mode="create": FileExistsError if path exists (checked atomically
        by the rename)."""
        p = self._strip_protocol(path)
        if mode == "create":
            with self._writing(p, exclusive=True) as out:
                out.write(value)
            return
        self._with_parents(p, lambda: self.client.put_bytes(p, value))

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        """An empty file (truncate=True: also over an existing one), or an existing file's
        times set to now (truncate=False)."""
        p = self._strip_protocol(path)
        if truncate:
            self._with_parents(p, lambda: self.client.put_bytes(p, b""))
        else:
            self._with_parents(p, lambda: self.client.touch(p))

    # ------------------------------------------------------------------ streams
    def put_file(self, lpath: Any, rpath: str, callback: Callback = DEFAULT_CALLBACK, mode: str = "overwrite",
                 **kwargs: Any) -> None:
        """A local file to the pool, streamed, atomic (a local directory: a directory)."""
        p = self._strip_protocol(rpath)
        if not isfilelike(lpath) and os.path.isdir(lpath):
            self.makedirs(p, exist_ok=True)
            return
        with contextlib.ExitStack() as stack:
            size = None
            src = lpath if isfilelike(lpath) else stack.enter_context(open(lpath, "rb"))
            if not isfilelike(lpath):
                size = os.fstat(src.fileno()).st_size
                callback.set_size(size)
            with self._writing(p, exclusive=mode == "create") as out:
                copy_stream(src, out, callback.relative_update, size)

    def get_file(self, rpath: str, lpath: Any, callback: Callback = DEFAULT_CALLBACK, outfile: Any = None,
                 **kwargs: Any) -> None:
        """A file of the pool to a local path or file object (a directory: a local directory)."""
        p = self._strip_protocol(rpath)
        target = outfile if outfile is not None else lpath if isfilelike(lpath) else None
        if target is None and self.isdir(p):
            os.makedirs(lpath, exist_ok=True)
            return
        with self.client.open(p, "rb") as src, contextlib.ExitStack() as stack:
            if target is None:
                os.makedirs(os.path.dirname(os.path.abspath(lpath)), exist_ok=True)
                target = stack.enter_context(open(lpath, "wb"))
            callback.set_size(src.size)
            copy_stream(src, target, callback.relative_update, src.size)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """A copy through this client (the pool has no server-side copy), atomic at path2;
        a directory: a new directory."""
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        try:
            f = self.client.open(src, "rb")
        except IsADirectoryError:
            self.makedirs(dst, exist_ok=True)
            return
        with f, self._writing(dst, exclusive=False) as out:
            copy_stream(f, out, DEFAULT_CALLBACK.relative_update, f.size)

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict[str, Any] | None = None, **kwargs: Any) -> "CurvineFile":
        if mode not in ("rb", "wb", "xb", "ab"):
            raise NotImplementedError(f"curvine: file mode {mode!r} is not supported (rb, wb, xb, ab: a file "
                                      "is written whole, then published)")
        return CurvineFile(self, self._strip_protocol(path), mode, block_size or "default", autocommit,
                           cache_options=cache_options, **kwargs)

    # ------------------------------------------------------------------ atomic writes
    def _with_parents(self, path: str, fn: Callable[[], T]) -> T:
        """fn() (which makes path), once more after making path's missing parents when
        auto_mkdir: parents that exist (the common case) cost no extra call."""
        try:
            return fn()
        except FileNotFoundError:
            parent = posixpath.dirname(path)
            if not self.auto_mkdir or parent == path or self.client.exists(parent):
                raise
            self.client.mkdir(parent, parents=True, exist_ok=True)
        return fn()

    def begin_write(self, path: str, exclusive: bool) -> tuple[File, str]:
        """A new hidden sibling of path opened for writing, and its path.  Refused at once
        (before any byte is written) when path is a directory, or exists and exclusive."""
        parent, name = posixpath.split(path)
        if not name:
            raise err(errno.EISDIR).with_path(path)
        try:
            st = self.client.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None and st.is_dir:
            raise err(errno.EISDIR).with_path(path)
        if st is not None and exclusive:
            raise err(errno.EEXIST).with_path(path)
        tmp = posixpath.join(parent, _temp_name(name))
        try:
            return self._with_parents(tmp, lambda: self.client.open(tmp, "xb")), tmp
        except CurvineError as e:
            raise _oserror(e, path) from None

    def publish(self, out: File, tmp: str, path: str, exclusive: bool) -> None:
        """Commit the sibling's bytes, then rename it over path (exclusive: only if path is
        still free); any failure removes the sibling and leaves path as it was."""
        try:
            out.close()
            self.client.rename(tmp, path, replace=not exclusive)
        except CurvineError as e:
            self._remove_quietly(tmp)
            raise _oserror(e, path) from None
        except BaseException:
            self._remove_quietly(tmp)
            raise

    def abandon(self, out: File, tmp: str | None) -> None:
        """Give up a write: nothing of it is committed, its sibling (if any) removed."""
        with contextlib.suppress(OSError):
            out.abort()
        if tmp is not None:
            self._remove_quietly(tmp)

    def _remove_quietly(self, tmp: str) -> None:
        with contextlib.suppress(OSError):
            self.client.remove(tmp)

    @contextlib.contextmanager
    def _writing(self, path: str, exclusive: bool) -> Iterator[File]:
        out, tmp = self.begin_write(path, exclusive)
        try:
            yield out
        except BaseException:
            self.abandon(out, tmp)
            raise
        self.publish(out, tmp, path, exclusive)


class CurvineFile(AbstractBufferedFile):
    """A buffered fsspec file over an SDK ``File``.

    Reading: ``_fetch_range`` reads from one SDK handle kept open for the file's life, so
    the client's read-ahead follows a sequential reader across fetches.  No fsspec cache
    by default (``cache_type="none"``): the SDK's reader already keeps the blocks it
    fetched and reads ahead, and fsspec's "readahead" cache on top of it fetched each
    parquet column chunk plus one more block size and copied it out again (pyarrow's
    read_table at a third of the speed).

    Writing (``wb``/``xb``): ``_upload_chunk`` hands each buffer to a hidden sibling, and
    the last one commits and renames it over the path (``commit``; with autocommit=False,
    the transaction's commit does that).  ``ab`` appends to the file itself, committed at
    close.  An exception in the ``with`` block, or a file collected unclosed, discards the
    write (fsspec's own class would publish what was written so far).
    """

    DEFAULT_BLOCK_SIZE = 8 * MiB   # two 4 MiB blocks: full blocks go straight to the workers
    fs: CurvineFileSystem

    def __init__(self, fs: CurvineFileSystem, path: str, mode: str = "rb", block_size: int | str = "default",
                 autocommit: bool = True, cache_type: str = "none",
                 cache_options: dict[str, Any] | None = None, size: int | None = None, **kwargs: Any) -> None:
        self._sdk: File | None = None
        self._tmp: str | None = None
        self._published = False
        _finalizer_thread()
        if mode == "rb":
            self._sdk = _hold(fs.client.open(path, "rb"))
            if size is None:
                size = self._sdk.size
        elif mode in ("wb", "xb"):
            sdk, self._tmp = fs.begin_write(path, exclusive=mode == "xb")
            self._sdk = _hold(sdk)
        elif mode == "ab":
            self._sdk = _hold(fs._with_parents(path, lambda: fs.client.open(path, "ab")))
        try:
            super().__init__(fs, path, mode, block_size, autocommit, cache_type, cache_options, size, **kwargs)
        except BaseException:
            self._drop()
            raise

    def _fetch_range(self, start: int, end: int) -> bytes:
        assert self._sdk is not None
        lo, hi = _range(self.size, start, end)
        return _read_range(self._sdk, lo, hi)

    def _upload_chunk(self, final: bool = False) -> bool:
        assert self._sdk is not None
        try:
            view = self.buffer.getbuffer()
            try:
                if len(view):
                    self._sdk.write(view)
            finally:
                view.release()
            if final and self.autocommit:
                self.commit()
        except BaseException:
            self.discard()
            raise
        return True

    def commit(self) -> None:
        """Publish what was written: the sibling renamed over the path (an append: committed)."""
        if self._published or self._sdk is None:
            return
        self._published = True
        try:
            if self._tmp is None:
                self._sdk.close()
            else:
                self.fs.publish(self._sdk, self._tmp, self.path, exclusive=self.mode == "xb")
        finally:
            _let_go(self._sdk)

    def discard(self) -> None:
        """Throw the write away: nothing of it becomes visible."""
        if self._published or self._sdk is None:
            return
        self._published = True
        try:
            self.fs.abandon(self._sdk, self._tmp)
        finally:
            _let_go(self._sdk)

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            if self.mode == "rb":
                self._drop()

    def _drop(self) -> None:
        """Let the SDK handle go without publishing anything."""
        if self._sdk is None:
            return
        if self.mode == "rb":
            with contextlib.suppress(OSError):
                self._sdk.close()
            _let_go(self._sdk)
        else:
            self.discard()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and self.writable():
            self.discard()
            self.closed = True
        else:
            self.close()

    def __del__(self) -> None:
        """Collected unclosed: a reader's handle closed, a writer's write discarded (never
        published half-written), both by the finalizer thread, never here: this may run
        inside the client with its locks held (_FINALIZE)."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        sdk, self._sdk = getattr(self, "_sdk", None), None
        if sdk is None:
            return
        _let_go(sdk)   # (the queued cleanup holds it now)
        if self.mode == "rb":
            _FINALIZE.put(functools.partial(_close_quietly, sdk))
        elif not self._published:
            self._published = True
            _FINALIZE.put(functools.partial(self.fs.abandon, sdk, self._tmp))


def _close_quietly(f: File) -> None:
    with contextlib.suppress(OSError):
        f.close()


def _range(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """fsspec's [start, end) of a size-byte file: None = its start / end, negative = from
    its end; clamped to the file."""
    lo = 0 if start is None else start + size if start < 0 else start
    hi = size if end is None else end + size if end < 0 else end
    lo, hi = max(0, min(lo, size)), max(0, min(hi, size))
    return lo, max(lo, hi)


def _read_range(f: File, lo: int, hi: int) -> bytes:
    """Bytes [lo, hi) of an open SDK file, received straight into the returned object."""
    if hi <= lo:
        return b""
    obj, view = fresh_bytes(hi - lo)
    f.seek(lo)
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:   # the file shrank since its size was read
            return bytes(view[:got])
        got += n
    return bytes(obj)   # no copy when obj already is bytes


if typing.TYPE_CHECKING:   # the protocol's entry points (pyproject.toml) name this class
    _: type[AbstractFileSystem] = CurvineFileSystem
