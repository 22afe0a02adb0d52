"""LMCache's native L2 adapter for the pool: ``CurvineL2Adapter``, loaded by LMCache itself.

    lmcache server ... --l2-adapter '{"type": "plugin", "module_path": "curvine_py.kv.lmcache",
        "class_name": "CurvineL2Adapter", "config_class_name": "CurvineL2AdapterConfig",
        "adapter_params": {"master": "10.0.0.1:8995", "base_path": "/kv/lmcache"}}'

It implements LMCache 0.5.6's ``L2AdapterInterface`` (lmcache/v1/distributed/l2_adapters/
base.py) over ``ChunkStore`` (curvine_py/kv/chunkstore.py): each submitted task runs on a
task thread, its completion is recorded and its event fd signalled, as LMCache's own
``fs`` adapter does.  Chunk files are named by LMCache's ``_object_key_to_filename``, so a
native writer and the ``fs`` adapter on a mount of the pool share one cache, both ways.

Only LMCache's venv can import this module (``make lmcache-deps`` installs the checkout
there); nothing else in curvine_py imports it.  docs/kvcache.md has the settings.
"""
from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename
from lmcache.v1.platform import create_event_notifier

from curvine_py.common import config as config_mod
from curvine_py.kv.chunkstore import ChunkStore, ChunkStoreConfig
from curvine_py.sdk import Client

log = logging.getLogger(__name__)
TASK_THREADS = 2   # LMCache's store and prefetch controllers submit from two threads

_FIELDS: dict[str, tuple[type, ...]] = {
    "base_path": (str,), "master": (str,), "config": (str,), "host": (str,), "io_threads": (int,),
    "lock_ttl_s": (int, float), "block_size": (int,), "max_capacity_bytes": (int,), "cache_writes": (bool,),
}


class CurvineL2AdapterConfig(L2AdapterConfigBase):
    """``adapter_params``: ``base_path`` (the pool directory, required); ``master``
    ("host:port", several comma-separated; default: the config file's); ``config`` (a
    curvine.toml: secret, TLS, client settings; default: the usual search); ``host`` (this
    client's host identity, for local replicas; default: the config's); ``io_threads`` (8);
    ``lock_ttl_s`` (30); ``block_size`` (0: the directory's); ``max_capacity_bytes`` (0:
    LMCache's global eviction off, the pool bounds itself); ``cache_writes`` (true: a
    chunk's replica on this host is written through the page cache, so a load finds it in
    memory, ``client.cache_local_writes``)."""

    def __init__(self, base_path: str, master: str = "", config: str = "", host: str = "",
                 io_threads: int = 8, lock_ttl_s: float = 30.0, block_size: int = 0,
                 max_capacity_bytes: int = 0, cache_writes: bool = True) -> None:
        self.base_path = base_path
        self.master = master
        self.config = config
        self.host = host
        self.io_threads = io_threads
        self.lock_ttl_s = float(lock_ttl_s)
        self.block_size = block_size
        self.max_capacity_bytes = max_capacity_bytes
        self.cache_writes = cache_writes

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CurvineL2AdapterConfig":
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise ValueError(f"curvine adapter: unknown adapter_params {unknown} (known: {sorted(_FIELDS)})")
        for key, value in d.items():
            if not isinstance(value, _FIELDS[key]) or (isinstance(value, bool) and bool not in _FIELDS[key]):
                raise ValueError(f"curvine adapter: {key} must be {' or '.join(t.__name__ for t in _FIELDS[key])}, "
                                 f"not {value!r}")
        if not d.get("base_path"):
            raise ValueError("curvine adapter: base_path (the pool directory, e.g. /kv/lmcache) is required")
        for key in ("io_threads", "lock_ttl_s"):
            if key in d and d[key] <= 0:
                raise ValueError(f"curvine adapter: {key} must be > 0, not {d[key]}")
        for key in ("block_size", "max_capacity_bytes"):
            if key in d and d[key] < 0:
                raise ValueError(f"curvine adapter: {key} must be >= 0, not {d[key]}")
        return cls(**d)

    @classmethod
    def help(cls) -> str:
        return "Curvine L2 adapter (curvine_py.kv.lmcache) adapter_params:\n" + (cls.__doc__ or "")

    def connect(self) -> Client:
        """An SDK client as these settings say."""
        cfg = config_mod.load(path=self.config or None)
        if self.host:
            cfg.client.host = self.host
        # LMCache loads a chunk again soon (its L1 evicted it, another pod asks): written
        # O_DIRECT it was read back from disk, 8 x 14 MiB in one 16 MiB block each in
        # 150-220 ms against 55-79 ms (docs/kvcache.md)
        cfg.client.cache_local_writes = self.cache_writes
        return Client(self.master or None, cfg)

    def store_config(self) -> ChunkStoreConfig:
        return ChunkStoreConfig(self.base_path, self.io_threads, self.lock_ttl_s, self.block_size)


class CurvineL2Adapter(L2AdapterInterface):
    """LMCache's L2 tier in the pool (see the module's doc)."""

    def __init__(self, config: CurvineL2AdapterConfig | dict[str, Any], l1_memory_desc: object = None) -> None:
        if isinstance(config, dict):   # loaded without config_class_name
            config = CurvineL2AdapterConfig.from_dict(config)
        super().__init__(config.max_capacity_bytes)
        self.config = config
        self.client = config.connect()
        self.chunks = ChunkStore(self.client, config.store_config())
        self._efds = {kind: create_event_notifier() for kind in ("store", "lookup", "load")}
        self._mu = threading.Lock()
        self._next_id: L2TaskId = 0
        self._stores: dict[L2TaskId, L2StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._tasks = ThreadPoolExecutor(TASK_THREADS, thread_name_prefix="kv-task")
        self._closed = False
        log.info("curvine L2 adapter: pool directory %s, masters %s", self.chunks.base,
                 ",".join(self.client.master_addresses))

    # ------------------------------------------------------------------ event fds
    def get_store_event_fd(self) -> int:
        return int(self._efds["store"].fileno())

    def get_lookup_and_lock_event_fd(self) -> int:
        return int(self._efds["lookup"].fileno())

    def get_load_event_fd(self) -> int:
        return int(self._efds["load"].fileno())

    # ------------------------------------------------------------------ tasks
    def _submit(self, work: Callable[[], None]) -> None:
        self._tasks.submit(work)

    def _task_id(self) -> L2TaskId:
        with self._mu:
            tid = self._next_id
            self._next_id += 1
            return tid

    def _done(self, kind: str, table: dict[L2TaskId, Any], tid: L2TaskId, result: Any) -> None:
        with self._mu:
            table[tid] = result
        self._efds[kind].notify()

    # ------------------------------------------------------------------ store
    def submit_store_task(self, keys: list[Any], objects: list[Any]) -> L2TaskId:
        tid = self._task_id()
        self._submit(lambda: self._store(tid, keys, objects))
        return tid

    def _store(self, tid: L2TaskId, keys: list[Any], objects: list[Any]) -> None:
        ok, nbytes = False, 0
        try:
            got = self.chunks.store(_names(keys), [o.byte_array for o in objects])
            ok, nbytes = got.failed == 0, got.bytes
            if got.written:
                self._notify_keys_stored([keys[i] for i in got.written], list(got.sizes))
        except Exception:
            log.exception("curvine L2 adapter: store task %d failed", tid)
        self._done("store", self._stores, tid, L2StoreResult(ok, nbytes))

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._mu:
            done, self._stores = self._stores, {}
        return done

    # ------------------------------------------------------------------ lookup and lock
    def submit_lookup_and_lock_task(self, keys: list[Any], group_layout_descs: dict[int, Any]) -> L2TaskId:
        tid = self._task_id()
        self._submit(lambda: self._lookup(tid, keys))
        return tid

    def _lookup(self, tid: L2TaskId, keys: list[Any]) -> None:
        bitmap = Bitmap(len(keys))
        try:
            bitmap = _bitmap(self.chunks.lookup(_names(keys), lock=True))
        except Exception:
            log.exception("curvine L2 adapter: lookup task %d failed (all misses)", tid)
        self._done("lookup", self._lookups, tid, bitmap)

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._mu:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: list[Any]) -> None:
        self.chunks.unlock(_names(keys))

    # ------------------------------------------------------------------ load
    def submit_load_task(self, keys: list[Any], objects: list[Any]) -> L2TaskId:
        tid = self._task_id()
        self._submit(lambda: self._load(tid, keys, objects))
        return tid

    def _load(self, tid: L2TaskId, keys: list[Any], objects: list[Any]) -> None:
        bitmap = Bitmap(len(keys))
        try:
            got = self.chunks.load(_names(keys), [o.byte_array for o in objects])
            bitmap = _bitmap(got)
            loaded = [k for k, ok in zip(keys, got) if ok]
            if loaded:
                self._notify_keys_accessed(loaded)
        except Exception:
            log.exception("curvine L2 adapter: load task %d failed (all misses)", tid)
        self._done("load", self._loads, tid, bitmap)

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._mu:
            return self._loads.pop(task_id, None)

    # ------------------------------------------------------------------ delete, status, close
    def delete(self, keys: list[Any]) -> None:
        if not keys:
            return
        try:
            sizes = self.chunks.delete(_names(keys))
        except Exception as e:
            log.warning("curvine L2 adapter: delete of %d keys failed: %s", len(keys), e)
            return
        gone = [(k, s) for k, s in zip(keys, sizes) if s >= 0]
        if gone:
            self._notify_keys_deleted([k for k, _ in gone], [s for _, s in gone])

    def report_status(self) -> dict[str, Any]:
        return {"is_healthy": not self._closed, "type": "CurvineL2Adapter",
                "base_path": self.chunks.base, "masters": list(self.client.master_addresses),
                "locked_chunks": self.chunks.locked()}

    def close(self) -> None:
        self._closed = True
        self._tasks.shutdown(wait=True)
        self.chunks.close()
        self.client.close()
        for efd in self._efds.values():
            efd.close()
        log.info("curvine L2 adapter closed")


def _names(keys: Sequence[Any]) -> list[str]:
    """LMCache's own file names for keys (its fs adapter's), so both share one directory.
    A prompt's keys share all but the hash (model, rank, group, salt): LMCache's function
    makes the first one's name, the others are it with their own hash in its place (256
    keys in 55 against 200 us); a key that differs is named by LMCache's function."""
    if not keys:
        return []
    k0 = keys[0]
    head = (k0.model_name, k0.kv_rank, k0.object_group_id, k0.cache_salt)
    pre, post = _around_hash(k0)
    return [f"{pre}{k.chunk_hash.hex()}{post}" if (k.model_name, k.kv_rank, k.object_group_id, k.cache_salt) == head
            else _object_key_to_filename(k) for k in keys]


def _around_hash(key: Any) -> tuple[str, str]:
    """LMCache's file name of key, cut around its hash ('<model>@<rank>@<group>@', then
    '[@<salt>].data'): the hash is the last '@'-led field before the salt and the suffix,
    neither of which holds an '@'."""
    name, h = _object_key_to_filename(key), key.chunk_hash.hex()
    at = name.rindex(f"@{h}{'@' if key.cache_salt else '.'}") + 1
    return name[:at], name[at + len(h):]


def _bitmap(hits: Sequence[bool]) -> Bitmap:
    """LMCache's bitmap of hits: the leading run made at construction, the rest set in one
    call (a set() per bit was 30 us at 256 keys, this 9)."""
    n = len(hits)
    try:
        lead = hits.index(False)
    except ValueError:
        lead = n
    bitmap = Bitmap(n, lead)
    rest = list(itertools.compress(range(lead, n), hits[lead:]))
    if rest:
        bitmap.batched_set(rest)
    return bitmap
