"""LMCache's in-process engine (vLLM's ``LMCacheConnectorV1``) on the pool, without a mount:
``CurvineConnector``, a remote storage plugin.

    remote_storage_plugins: ["curvine"]
    extra_config:
      remote_storage_plugin.curvine.module_path: curvine_py.kv.lmcache_connector
      remote_storage_plugin.curvine.class_name: CurvineConnector
      remote_storage_plugin.curvine.base_path: /kv/lmcache
      remote_storage_plugin.curvine.master: 10.0.0.1:8995      # and config, host, io_threads, ...

The same ``ChunkStore`` as the multi-process adapter (curvine_py/kv/chunkstore.py), and
the files of LMCache's own ``fs://`` connector: its names (``FSConnector._get_file_name``)
and its format (LMCache's ``RemoteMetadata`` header, then the tensor bytes, when
``save_chunk_meta`` is on, as by default), so an ``fs://`` engine on a mount of the pool
and this one read each other's chunks.  Every SDK call runs in a thread: LMCache's event
loop never waits on the network.  docs/kvcache.md has the settings.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import posixpath
from typing import Any, Optional

from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.connector.fs_connector import FSConnector

from curvine_py.common.errors import CurvineError
from curvine_py.kv.chunkstore import ChunkStore
from curvine_py.kv.lmcache import CurvineL2AdapterConfig

log = logging.getLogger(__name__)
CLASS_NAME = "CurvineConnector"
_LOADER_KEYS = ("module_path", "class_name")


def plugin_params(config: Any) -> tuple[str, dict[str, Any]]:
    """This plugin's name in ``remote_storage_plugins`` and its own ``extra_config`` keys
    (``remote_storage_plugin.<name>.<key>``, the loader's two left out)."""
    extra = dict(getattr(config, "extra_config", None) or {})
    for name in getattr(config, "remote_storage_plugins", None) or []:
        prefix = f"remote_storage_plugin.{name}."
        if extra.get(prefix + "class_name") == CLASS_NAME:
            return name, {k[len(prefix):]: v for k, v in extra.items()
                          if k.startswith(prefix) and k[len(prefix):] not in _LOADER_KEYS}
    raise ValueError(f"no remote_storage_plugins entry has class_name {CLASS_NAME} in extra_config")


class CurvineConnector(RemoteConnector):
    """LMCache's ``RemoteConnector`` over the pool (see the module's doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any) -> None:
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.plugin_name, params = plugin_params(config)
        cfg = CurvineL2AdapterConfig.from_dict(params)
        self.client = cfg.connect()
        self.chunks = ChunkStore(self.client, cfg.store_config())
        log.info("curvine remote storage plugin %s: pool directory %s", self.plugin_name, self.chunks.base)

    def file_name(self, key: Any) -> str:
        """LMCache's fs:// name of key (its FSConnector's own function)."""
        return str(FSConnector._get_file_name(self, key))   # an FSConnector method that uses no state

    def _get_file_path(self, key: Any) -> str:
        return posixpath.join(self.chunks.base, self.file_name(key))

    # ------------------------------------------------------------------ lookups
    async def exists(self, key: Any) -> bool:
        return await asyncio.to_thread(self.exists_sync, key)

    def exists_sync(self, key: Any) -> bool:
        return self.chunks.lookup([self.file_name(key)])[0]

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[Any], pin: bool = False) -> int:
        """How many leading keys are there: one master call for all of them."""
        hits = await asyncio.to_thread(self.chunks.lookup, [self.file_name(k) for k in keys])
        return hits.index(False) if False in hits else len(hits)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[Any]) -> int:
        hits = self.chunks.lookup([self.file_name(k) for k in keys])
        return hits.index(False) if False in hits else len(hits)

    # ------------------------------------------------------------------ reads
    async def get(self, key: Any) -> Optional[Any]:
        return await asyncio.to_thread(self._get, key)

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[Any]) -> list[Optional[Any]]:
        return list(await asyncio.gather(*(self.get(k) for k in keys)))

    def _get(self, key: Any) -> Optional[Any]:
        """The chunk in a memory object of LMCache's CPU backend (None: absent or short)."""
        path = self._get_file_path(key)
        obj = None
        try:
            with self.client.open(path, "rb") as f:
                if self.save_chunk_meta:
                    head = f.read(self.remote_metadata_bytes)
                    if len(head) != self.remote_metadata_bytes:
                        return None
                    meta = RemoteMetadata.deserialize(head)
                    obj = self.local_cpu_backend.allocate(meta.shapes, meta.dtypes, meta.fmt)
                else:
                    obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
                if obj is None:
                    return None
                buf = memoryview(obj.byte_array).cast("B")
                got = _read_full(f, buf)
            if self.save_chunk_meta:
                if got != len(buf):
                    raise CurvineError(errno.EIO, f"short chunk: {got} of {len(buf)} bytes", path)
                return obj
            return self.reshape_partial_chunk(obj, got)
        except CurvineError as e:
            if e.errno != errno.ENOENT:   # a miss
                log.warning("curvine plugin: reading %s failed: %s", path, e)
            if obj is not None:
                obj.ref_count_down()
            return None

    # ------------------------------------------------------------------ writes, removal, listing
    async def put(self, key: Any, memory_obj: Any) -> None:
        buf = memory_obj.byte_array
        header = (RemoteMetadata(len(buf), memory_obj.get_shapes(), memory_obj.get_dtypes(),
                                 memory_obj.get_memory_format()).serialize() if self.save_chunk_meta else b"")
        got = await asyncio.to_thread(self.chunks.store, [self.file_name(key)], [buf], [header])
        if got.failed:
            raise RuntimeError(f"curvine plugin: storing {self.file_name(key)} failed")

    def remove_sync(self, key: Any) -> bool:
        return self.chunks.delete([self.file_name(key)])[0] >= 0

    async def list(self) -> list[str]:
        names = await asyncio.to_thread(self.client.listdir, self.chunks.base)
        return [n[:-len(".data")] for n in names if n.endswith(".data")]

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self.chunks.close()
        self.client.close()

    def __repr__(self) -> str:
        return f"CurvineConnector({self.chunks.base})"


def _read_full(f: Any, buf: memoryview) -> int:
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got
