"""Real LMCache 0.5.6 stores a prompt's KV cache on one host and reads it back on another.

The client of shared/findings/lost-write-2026-12-06: LMCache's own engine, chunking,
memory objects and ``fs://`` connector (aiofiles on its put pool), with a CPU connector
in place of vLLM's GPU kernels (tests/kvclients/lmcache_driver.py, run in the LMCache
venv ``make lmcache-deps`` builds).  Pod A's process stores through a mount on a
worker's host (a replica written by short-circuit) or on a host with none; pod B's fresh
process, on the other worker's host, looks the prefix up, retrieves it through
LMCache and reads every chunk file directly, every byte checked.  At default settings,
the block size too (16 MiB, not the suite's 4 MiB pin): a chunk is one block, with a
replica on pod B's host, as in a deployment with defaults.

One prompt per test, of 8,325 tokens: 32 whole 256-token chunks and a last one of 133
tokens, the last chunk's shape of the 1,925-token reference prompt (7 whole + 133).  The
tests stored a 1,925- and an 8,192-token prompt before, four driver processes (each
importing torch) per test for the same two shapes of chunk file; 33 chunks (455 MiB) still
fit LMCache's 0.5 GB CPU buffer (the driver's default ``--cpu-gb``), which a put that
dropped a chunk would show (the file count is asserted).

Pod A's process also starts children all through the store (``--spawn-children``: vLLM
starts workers, LMCache's telemetry runs py-cpuinfo in a subprocess), each closing its
inherited copies of the chunk files: the FLUSH behind the lost writes.  Before the fix
every run of this test had 1 MiB runs of zeros (8 of 8 runs by hand, 1-8 bad chunks of 8).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import typing
from pathlib import Path

import pytest

from curvine_py.testing.netcluster import NetCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "lmcache" / "bin" / "python"
DRIVER = ROOT / "tests" / "kvclients" / "lmcache_driver.py"
RUN_TIMEOUT_S = 300
TOKENS = 8192 + 133     # 33 chunk files, the last one partial


@functools.cache   # the probe imports torch (~3.5 s): once per session, not once per test
def _missing() -> str | None:
    if not PYTHON.exists():
        return f"real LMCache is not installed ({PYTHON}: `make lmcache-deps`, log .venv/lmcache-install.log)"
    probe = subprocess.run([str(PYTHON), "-c", "import lmcache, torch"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"LMCache does not import: {probe.stderr.strip()[-300:]}"


@pytest.fixture(autouse=True)
def _default_block_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemons this test starts inherit the environment: without the suite's pin
    (tests/conftest.py TEST_BLOCK_SIZE) they make blocks of the default size."""
    monkeypatch.delenv("CURVINE_MASTER_BLOCK_SIZE", raising=False)


def drive(c: NetCluster, host: int, *args: str) -> dict[str, typing.Any]:
    """One driver process on hosts[host]; its JSON (a failure: its reason and exit code).
    It gets the cluster's secret (the suite's own CURVINE_CLUSTER_SECRET would win over
    the config file the plugin reads)."""
    env = {**os.environ, "CURVINE_CLUSTER_SECRET": c.secret}
    proc = c.hosts[host].run([str(PYTHON), str(DRIVER), *args], capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S, env=env)
    out = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and out, \
        f"{args[0]} on host {host}: exit {proc.returncode}: {out[-1:] or ''} {proc.stderr.strip()[-1500:]}"
    return typing.cast(dict[str, typing.Any], json.loads(out[-1]))


@pytest.mark.parametrize("writer_host", [1, 3], ids=["writer-on-a-worker-host", "writer-on-a-host-without"])
def test_real_lmcache_pod_a_to_pod_b_byte_exact(net_cluster: NetCluster, tmp_path: Path, writer_host: int) -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    c = net_cluster
    a = c.mount(writer_host, tmp_path / "a")
    b = c.mount(2, tmp_path / "b")
    for tokens, seed in ((TOKENS, 7),):
        d = f"kv-{tokens}"
        put = drive(c, writer_host, "put", "--dir", str(a / d), "--tokens", str(tokens), "--seed", str(seed),
                    "--spawn-children")
        assert len(put["files"]) == -(-tokens // 256) and put["children"] > 0
        got = drive(c, 2, "get", "--dir", str(b / d), "--tokens", str(tokens), "--seed", str(seed),
                    "--check-files")
        assert got["hit_tokens"] == tokens and got["retrieved_tokens"] == tokens
        assert got["bad_chunks"] == 0 and not got["file_bad_chunks"], (got["bad"], got["file_bad_chunks"])
    for m in (a, b):
        c.unmount(m)
    logs = "\n".join(p.read_text() for p in sorted((c.dir / "logs").glob("*.log")))
    assert " ERROR " not in logs, [line for line in logs.splitlines() if " ERROR " in line][:5]


def test_real_lmcache_through_the_plugin_host_to_host_byte_exact(net_cluster: NetCluster, tmp_path: Path) -> None:
    """LMCache's engine with the pool's own remote storage plugin (no mount on its data
    path): pod A on a host without a worker stores, pod B's fresh process on a worker's
    host looks the prefix up and retrieves it through the plugin, every byte checked, and
    the chunk files read through a mount there are LMCache's bytes too (issue 43)."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    c = net_cluster
    a = c.mount(3, tmp_path / "a")   # where pod A's files show (the driver checks their sizes)
    b = c.mount(2, tmp_path / "b")

    def plugin(host: int, base: str) -> tuple[str, str]:
        return "--curvine", json.dumps({"base_path": f"/{base}", "config": str(c.config_path),
                                        "host": c.hosts[host].name})
    for tokens, seed in ((TOKENS, 5),):
        base = f"kvplugin-{tokens}"
        put = drive(c, 3, "put", *plugin(3, base), "--dir", str(a / base), "--tokens", str(tokens),
                    "--seed", str(seed))
        assert len(put["files"]) == -(-tokens // 256)
        got = drive(c, 2, "get", *plugin(2, base), "--dir", str(b / base), "--tokens", str(tokens),
                    "--seed", str(seed), "--check-files")
        assert got["hit_tokens"] == tokens and got["retrieved_tokens"] == tokens
        assert got["bad_chunks"] == 0 and not got["file_bad_chunks"], (got["bad"], got["file_bad_chunks"])
    for m in (a, b):
        c.unmount(m)
