"""Drive an LMCache 0.5.6 L2 adapter the way LMCache's storage manager does, from its
``--l2-adapter`` JSON: LMCache parses the spec and builds the adapter itself (its
``plugin`` type imports curvine_py.kv.lmcache), memory objects are LMCache's own
``TensorMemoryObj``, completions are awaited on the adapter's event fds.  Runs in the
LMCache venv (``make lmcache-deps``); prints one JSON line.

    roundtrip: store, lookup-and-lock (with misses), unlock, load, delete, with a
               listener and the usage checked at each step
    put / get: store, or look up and load, keys of a seed (a writer and a reader that
               may be different adapters: the plugin and LMCache's fs adapter on a mount)
"""
from __future__ import annotations

import argparse
import json
import select
import sys
import time
from typing import Any

import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.platform import consume_fd

WAIT_S = 60.0


class Listener:
    """Counts what the adapter tells its listeners (L2AdapterListener's three calls)."""

    def __init__(self) -> None:
        self.stored: list[Any] = []
        self.deleted: list[Any] = []
        self.accessed: list[Any] = []

    def on_l2_keys_stored(self, keys: list[Any], sizes: list[int]) -> None:
        self.stored += keys

    def on_l2_keys_deleted(self, keys: list[Any]) -> None:
        self.deleted += keys

    def on_l2_keys_accessed(self, keys: list[Any]) -> None:
        self.accessed += keys


def keys_of(seed: int, n: int, offset: int = 0) -> list[ObjectKey]:
    return [ObjectKey(chunk_hash=(seed * 1_000_003 + offset + i).to_bytes(16, "big"), model_name="Qwen/Qwen2.5-7B",
                      kv_rank=0x01000000) for i in range(n)]


def objects(n: int, size: int, seed: int | None) -> list[TensorMemoryObj]:
    """n memory objects of size bytes: random bytes of seed (per key), or zeros."""
    out = []
    for i in range(n):
        if seed is None:
            t = torch.zeros(size, dtype=torch.uint8)
        else:
            g = torch.Generator().manual_seed(seed * 7919 + i)
            t = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
        meta = MemoryObjMetadata(shape=torch.Size([size]), dtype=torch.uint8, address=0, phy_size=size,
                                 fmt=MemoryFormat.KV_2LTD, ref_count=1)
        out.append(TensorMemoryObj(raw_data=t, metadata=meta, parent_allocator=None))
    return out


def signalled(fd: int) -> bool:
    """Did the adapter signal fd within WAIT_S (consumed)?"""
    ready, _, _ = select.select([fd], [], [], WAIT_S)
    if ready:
        consume_fd(fd)
    return bool(ready)


def build(spec: str) -> Any:
    parser = argparse.ArgumentParser()
    add_l2_adapters_args(parser)
    cfg = parse_args_to_l2_adapters_config(parser.parse_args(["--l2-adapter", spec]))
    return create_l2_adapter(cfg.adapters[0])


def store(adapter: Any, keys: list[Any], objs: list[Any]) -> tuple[bool, int, bool]:
    tid = adapter.submit_store_task(keys, objs)
    woke = signalled(adapter.get_store_event_fd())
    deadline = time.monotonic() + WAIT_S
    done: dict[int, Any] = {}
    while tid not in done and time.monotonic() < deadline:
        done.update(adapter.pop_completed_store_tasks())
        time.sleep(0.005)
    r = done.get(tid)
    return r is not None and r.is_successful(), r.bytes_transferred() if r is not None else 0, woke


def lookup(adapter: Any, keys: list[Any]) -> tuple[list[int], bool]:
    tid = adapter.submit_lookup_and_lock_task(keys, {})
    woke = signalled(adapter.get_lookup_and_lock_event_fd())
    bitmap = _poll(lambda: adapter.query_lookup_and_lock_result(tid))
    return list(bitmap.get_indices_list()), woke


def load(adapter: Any, keys: list[Any], objs: list[Any]) -> tuple[list[int], bool]:
    tid = adapter.submit_load_task(keys, objs)
    woke = signalled(adapter.get_load_event_fd())
    bitmap = _poll(lambda: adapter.query_load_result(tid))
    return list(bitmap.get_indices_list()), woke


def _poll(query: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = query()
        if got is not None:
            return got
        time.sleep(0.005)
    raise TimeoutError("the adapter never completed the task")


def bad_chunks(want: list[Any], got: list[Any]) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(want, got)) if not torch.equal(a.raw_data, b.raw_data)]


def roundtrip(a: argparse.Namespace) -> dict[str, Any]:
    adapter = build(a.spec)
    listener = Listener()
    adapter.register_listener(listener)
    keys, src = keys_of(a.seed, a.keys), objects(a.keys, a.size, a.seed)
    out: dict[str, Any] = {}
    out["stored_ok"], out["stored_bytes"], out["store_fd"] = store(adapter, keys, src)
    out["restored_ok"], out["restored_bytes"], _ = store(adapter, keys, src)   # once: the second writes nothing
    out["listener_stored"] = len(listener.stored)
    out["usage_after_store"] = adapter.get_usage().total_bytes_used
    missing = keys_of(a.seed + 1, 2)
    out["hits"], out["lookup_fd"] = lookup(adapter, [*keys, *missing])
    out["locked_after_lookup"] = adapter.report_status()["locked_chunks"]
    _, _ = lookup(adapter, keys[:1])   # a second lock of key 0
    adapter.submit_unlock(keys)
    out["locked_after_one_unlock"] = adapter.report_status()["locked_chunks"]
    adapter.submit_unlock(keys[:1])
    out["locked_after_unlocks"] = adapter.report_status()["locked_chunks"]
    dst = objects(a.keys, a.size, None)
    out["loaded"], out["load_fd"] = load(adapter, keys, dst)
    out["bad_chunks"] = bad_chunks(src, dst)
    out["listener_accessed"] = len(listener.accessed)
    miss_dst = objects(1, a.size, None)
    out["loaded_missing"], _ = load(adapter, missing[:1], miss_dst)
    adapter.delete(keys[:2])
    out["listener_deleted"] = len(listener.deleted)
    out["usage_after_delete"] = adapter.get_usage().total_bytes_used
    out["hits_after_delete"], _ = lookup(adapter, keys)
    adapter.submit_unlock(keys)
    fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
    out["distinct_fds"] = len(fds)
    adapter.close()
    return out


def put(a: argparse.Namespace) -> dict[str, Any]:
    adapter = build(a.spec)
    ok, nbytes, _ = store(adapter, keys_of(a.seed, a.keys), objects(a.keys, a.size, a.seed))
    adapter.close()
    return {"stored_ok": ok, "stored_bytes": nbytes}


def get(a: argparse.Namespace) -> dict[str, Any]:
    adapter = build(a.spec)
    keys = keys_of(a.seed, a.keys)
    hits, _ = lookup(adapter, keys)
    dst = objects(a.keys, a.size, None)
    loaded, _ = load(adapter, keys, dst)
    adapter.submit_unlock(keys)
    adapter.close()
    return {"hits": hits, "loaded": loaded, "bad_chunks": bad_chunks(objects(a.keys, a.size, a.seed), dst)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("command", choices=("roundtrip", "put", "get"))
    p.add_argument("--spec", required=True, help="the --l2-adapter JSON")
    p.add_argument("--keys", type=int, default=8)
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    result = {"roundtrip": roundtrip, "put": put, "get": get}[a.command](a)
    print(json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
