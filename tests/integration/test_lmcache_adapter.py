"""The native LMCache L2 adapter (curvine_py.kv.lmcache) loaded by real LMCache 0.5.6.

Every test runs LMCache's own code in its venv (``make lmcache-deps``): its ``plugin``
adapter type imports our module from the ``--l2-adapter`` JSON, its memory objects are
filled and checked byte for byte (tests/kvclients/l2_adapter_driver.py), and its own
``lmcache bench l2`` drives the plugin with verification on.  Chunk files are shared
with LMCache's ``fs`` adapter on a mount of the same pool, both ways.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.local import LocalCluster

from tests.posix.conftest import start_mount

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "lmcache" / "bin" / "python"
LMCACHE = ROOT / ".venv" / "lmcache" / "bin" / "lmcache"
DRIVER = ROOT / "tests" / "kvclients" / "l2_adapter_driver.py"
RUN_TIMEOUT_S = 300
MiB = 1 << 20


@functools.cache   # the probe imports torch (~3.5 s): once per session, not once per test
def _missing() -> str | None:
    if not PYTHON.exists():
        return f"real LMCache is not installed ({PYTHON}: `make lmcache-deps`)"
    probe = subprocess.run([str(PYTHON), "-c", "import lmcache, torch, curvine_py.kv.lmcache"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"LMCache or the adapter does not import: {probe.stderr[-300:]}"


@pytest.fixture(autouse=True)
def _needs_lmcache() -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)


def plugin_spec(c: LocalCluster, base_path: str, **params: typing.Any) -> str:
    """The --l2-adapter JSON of the native adapter, on worker 0's host (a local replica)."""
    params = {"config": str(c.config_path), "base_path": base_path, "host": c.worker_host(0), **params}
    return json.dumps({"type": "plugin", "module_path": "curvine_py.kv.lmcache", "class_name": "CurvineL2Adapter",
                       "config_class_name": "CurvineL2AdapterConfig", "adapter_params": params})


def fs_spec(directory: Path) -> str:
    return json.dumps({"type": "fs", "base_path": str(directory)})


def run_lmcache(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1"}   # the tests' cluster secret included
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=cwd, env=env)


def drive(tmp_path: Path, *args: str) -> dict[str, typing.Any]:
    proc = run_lmcache([str(PYTHON), str(DRIVER), *args], tmp_path)
    out = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and out, f"{args[0]}: exit {proc.returncode}: {proc.stderr[-2000:]}"
    return typing.cast(dict[str, typing.Any], json.loads(out[-1]))


def test_store_lookup_lock_load_delete_through_lmcache(shared_cluster: LocalCluster, tmp_path: Path) -> None:
    n, size = 6, 3 * MiB + 12345   # several blocks each, not block-aligned
    got = drive(tmp_path, "roundtrip", "--spec", plugin_spec(shared_cluster, "/kv/roundtrip"), "--keys", str(n),
                "--size", str(size), "--seed", "5")
    assert got["stored_ok"] and got["stored_bytes"] == n * size and got["store_fd"]
    assert got["restored_ok"] and got["restored_bytes"] == 0        # each object written once
    assert got["listener_stored"] == n and got["usage_after_store"] == n * size
    assert got["hits"] == list(range(n)) and got["lookup_fd"]      # the two missing keys: misses
    assert got["locked_after_lookup"] == n
    assert got["locked_after_one_unlock"] == 1                      # key 0 was locked twice
    assert got["locked_after_unlocks"] == 0
    assert got["loaded"] == list(range(n)) and got["load_fd"] and got["bad_chunks"] == []
    assert got["listener_accessed"] == n and got["loaded_missing"] == []
    assert got["listener_deleted"] == 2 and got["usage_after_delete"] == (n - 2) * size
    assert got["hits_after_delete"] == list(range(2, n))
    assert got["distinct_fds"] == 3


def test_lmcache_bench_l2_drives_the_plugin_verified(shared_cluster: LocalCluster, tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    proc = run_lmcache([str(LMCACHE), "bench", "l2", "--l2-adapter", plugin_spec(shared_cluster, "/kv/bench"),
                        "--num-keys", "8", "--data-size-kb", "1024", "--no-skip-verify", "--lookup-max-hit-rate", "1.0",
                        "--format", "json", "--output", str(report), "-q"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ops = {op["operation"]: op for op in _ops(json.loads(report.read_text()))}
    assert ops["Store"]["total_success"] == 8 and ops["Load"]["total_success"] == 8
    assert ops["Lookup"]["total_success"] == ops["Lookup"]["total_keys"] > 0


def _ops(report: dict[str, typing.Any]) -> list[dict[str, typing.Any]]:
    """The per-operation entries of lmcache bench l2's JSON (op_0, op_1, ... at any depth)."""
    found: list[dict[str, typing.Any]] = []
    for key, value in report.items():
        if isinstance(value, dict):
            found += [value] if key.startswith("op_") else _ops(value)
    return found


def test_a_bad_adapter_param_is_one_clear_error(shared_cluster: LocalCluster, tmp_path: Path) -> None:
    spec = json.loads(plugin_spec(shared_cluster, "/kv/x"))
    del spec["adapter_params"]["base_path"]
    proc = run_lmcache([str(PYTHON), str(DRIVER), "put", "--spec", json.dumps(spec)], tmp_path)
    assert proc.returncode != 0 and "base_path (the pool directory, e.g. /kv/lmcache) is required" in proc.stderr
    spec["adapter_params"].update(base_path="/kv/x", io_threads="8")
    proc = run_lmcache([str(PYTHON), str(DRIVER), "put", "--spec", json.dumps(spec)], tmp_path)
    assert proc.returncode != 0 and "io_threads must be int, not '8'" in proc.stderr


def test_native_writer_and_fs_adapter_on_a_mount_share_one_cache(shared_cluster: LocalCluster,
                                                                  tmp_path: Path) -> None:
    m = start_mount(shared_cluster, tmp_path / "mnt", tmp_path / "run", tmp_path / "mount.log")
    try:
        n, size = 4, 2 * MiB + 7
        put = drive(tmp_path, "put", "--spec", plugin_spec(shared_cluster, "/kv/shared-a"), "--keys", str(n),
                    "--size", str(size), "--seed", "11")
        assert put["stored_ok"] and put["stored_bytes"] == n * size
        got = drive(tmp_path, "get", "--spec", fs_spec(m.path / "kv" / "shared-a"), "--keys", str(n),
                    "--size", str(size), "--seed", "11")
        assert got["hits"] == list(range(n)) and got["loaded"] == list(range(n)) and got["bad_chunks"] == []
        put = drive(tmp_path, "put", "--spec", fs_spec(m.path / "kv" / "shared-b"), "--keys", str(n),
                    "--size", str(size), "--seed", "12")
        assert put["stored_ok"]
        got = drive(tmp_path, "get", "--spec", plugin_spec(shared_cluster, "/kv/shared-b"), "--keys", str(n),
                    "--size", str(size), "--seed", "12")
        assert got["hits"] == list(range(n)) and got["loaded"] == list(range(n)) and got["bad_chunks"] == []
        names = sorted(os.listdir(m.path / "kv" / "shared-a"))
        assert len(names) == n and all(x.startswith("Qwen-SEP-Qwen2.5-7B@0x01000000@0@") and x.endswith(".data")
                                       for x in names), names
    finally:
        m.stop()


ENGINE_DRIVER = ROOT / "tests" / "kvclients" / "lmcache_driver.py"


def engine(tmp_path: Path, *args: str) -> dict[str, typing.Any]:
    """LMCache's in-process engine (tests/kvclients/lmcache_driver.py): one JSON line."""
    proc = run_lmcache([str(PYTHON), str(ENGINE_DRIVER), *args], tmp_path)
    out = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and out, f"{args[0]}: exit {proc.returncode}: {out[-1:]} {proc.stderr[-2000:]}"
    return typing.cast(dict[str, typing.Any], json.loads(out[-1]))


def test_in_process_engine_through_the_remote_storage_plugin(shared_cluster: LocalCluster, tmp_path: Path) -> None:
    """LMCache's engine stores a prompt through CurvineConnector; a fresh process retrieves
    it through the plugin, and another through fs:// on a mount (same files); and an fs://
    writer's prompt is retrieved through the plugin.  Every byte checked."""
    m = start_mount(shared_cluster, tmp_path / "mnt", tmp_path / "run", tmp_path / "mount.log")
    try:
        def plugin(base: str) -> tuple[str, ...]:
            params = {"base_path": base, "config": str(shared_cluster.config_path),
                      "host": shared_cluster.worker_host(0)}
            return ("--curvine", json.dumps(params), "--dir", str(m.path / base.strip("/")))
        put = engine(tmp_path, "put", *plugin("/kv/inproc-a"), "--tokens", "1925", "--seed", "7")
        assert put["chunks"] == 8 and len(put["files"]) == 8
        for reader in (plugin("/kv/inproc-a"), ("--dir", str(m.path / "kv" / "inproc-a"))):
            got = engine(tmp_path, "get", *reader, "--tokens", "1925", "--seed", "7", "--check-files")
            assert got["hit_tokens"] == got["retrieved_tokens"] == 1925, got
            assert got["bad_chunks"] == 0 and not got["file_bad_chunks"], got
        engine(tmp_path, "put", "--dir", str(m.path / "kv" / "inproc-b"), "--tokens", "700", "--seed", "8")
        got = engine(tmp_path, "get", *plugin("/kv/inproc-b"), "--tokens", "700", "--seed", "8")
        assert got["hit_tokens"] == got["retrieved_tokens"] == 700 and got["bad_chunks"] == 0, got
    finally:
        m.stop()


NAMES_CHECK = """
import random
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename
from curvine_py.kv.lmcache import _bitmap, _names
rnd = random.Random(3)
keys = [ObjectKey(chunk_hash=rnd.randbytes(rnd.choice([0, 1, 16, 32])), model_name=rnd.choice(["Qwen/Qwen2.5-7B", "m"]),
                  kv_rank=rnd.choice([0, 1, 0x01020304]), object_group_id=rnd.choice([0, 17]),
                  cache_salt=rnd.choice(["", "s", "salt-x"])) for _ in range(400)]
assert _names(keys) == [_object_key_to_filename(k) for k in keys]
for hits in ([], [True], [False], [True, True, False, True], [False, True], [True] * 9, [False] * 3):
    b = _bitmap(hits)
    assert b.size() == len(hits) and b.get_indices_list() == [i for i, h in enumerate(hits) if h], hits
print("ok")
"""


def test_the_adapters_file_names_and_bitmaps_are_lmcaches(tmp_path: Path) -> None:
    """The adapter makes a prompt's file names from the first one's (models, ranks, groups
    and salts mixed here) and its bitmaps from runs: the same as LMCache's own function
    and per-bit sets, or the fs adapter and the plugin would not share one cache."""
    proc = run_lmcache([str(PYTHON), "-c", NAMES_CHECK], tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
