"""The real `cv` console script, as a subprocess, against a real cluster."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.local import LocalCluster, free_ports, pid_alive, port_in_use

CV = str(Path(sys.executable).parent / "cv")  # the console script of this venv
MiB = 1 << 20
pytestmark = pytest.mark.timeout(120)


def run_cv(*args: str, master: str | None = None, cwd: Path | None = None, input: bytes | None = None,
           env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    full_env = dict(os.environ)
    full_env.pop("CURVINE_MASTER", None)
    if master:
        full_env["CURVINE_MASTER"] = master
    full_env.update(env or {})
    return subprocess.run([CV, *args], capture_output=True, input=input, cwd=cwd, env=full_env,
                          timeout=timeout)


def ok(proc: subprocess.CompletedProcess[bytes]) -> str:
    """stdout of a command that must have succeeded cleanly."""
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr
    return proc.stdout.decode()


def one_error_line(proc: subprocess.CompletedProcess[bytes], code: int = 1) -> str:
    """The single `cv: ...` line of a failed command."""
    err = proc.stderr.decode()
    assert proc.returncode == code, (proc.returncode, err)
    assert err.startswith("cv: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.fixture
def cv(shared_cluster: LocalCluster, tmp_path: Path) -> typing.Callable[..., subprocess.CompletedProcess[bytes]]:
    """run_cv bound to the shared cluster, in an empty working directory."""
    def call(*args: str, **kw: typing.Any) -> subprocess.CompletedProcess[bytes]:
        kw.setdefault("cwd", tmp_path)
        return run_cv(*args, master=shared_cluster.master_address, **kw)
    return call


@pytest.fixture
def rdir(cv: typing.Callable[..., subprocess.CompletedProcess[bytes]], request: pytest.FixtureRequest) -> str:
    path = f"/cli/{request.node.name}-{os.urandom(3).hex()}".replace("[", "_").replace("]", "_")
    ok(cv("fs", "mkdir", "-p", path))
    return path


# ---------------------------------------------------------------- data


def test_put_get_round_trip_is_byte_exact(cv: typing.Any, rdir: str, tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 12345)  # two blocks, the second partial
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    put = cv("fs", "put", str(src), f"{rdir}/f.bin")
    ok(put)
    assert b"\r" not in put.stderr  # stderr is a pipe: no progress bar animation
    ok(cv("fs", "get", f"{rdir}/f.bin", str(tmp_path / "back.bin")))
    assert (tmp_path / "back.bin").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.bin", "src.bin"]  # no temp names left
    assert ok(cv("fs", "ls", rdir)).split() == ["f.bin"]  # no remote temp name either
    cat = cv("fs", "cat", f"{rdir}/f.bin")
    assert cat.returncode == 0 and cat.stdout == data


def test_put_into_directory_and_overwrite(cv: typing.Any, rdir: str, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"first")
    ok(cv("fs", "put", "-q", "a.txt", rdir + "/"))
    (tmp_path / "a.txt").write_bytes(b"second, longer")
    put = cv("fs", "put", "-q", "a.txt", f"{rdir}/a.txt")
    ok(put)
    assert put.stderr == b""  # -q
    assert cv("fs", "cat", f"{rdir}/a.txt").stdout == b"second, longer"


def test_stdin_and_stdout_transfers(cv: typing.Any, rdir: str) -> None:
    data = os.urandom(MiB + 7)
    ok(cv("fs", "put", "-", f"{rdir}/in", input=data))
    got = cv("fs", "get", f"{rdir}/in", "-")
    assert got.returncode == 0 and got.stdout == data


def test_recursive_put_and_get(cv: typing.Any, rdir: str, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    files = {"a": b"A" * 10, "sub/b": os.urandom(1000), "sub/deeper/c": b""}
    for rel, content in files.items():
        (tree / rel).write_bytes(content)
    one_error_line(cv("fs", "put", str(tree), f"{rdir}/tree"))  # a directory needs -r
    ok(cv("fs", "put", "-r", "-q", str(tree), f"{rdir}/tree"))
    ok(cv("fs", "get", "-r", "-q", f"{rdir}/tree", str(tmp_path / "back")))
    for rel, content in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == content


def test_cat_into_a_closed_pipe_is_quiet(shared_cluster: LocalCluster, cv: typing.Any, rdir: str,
                                         tmp_path: Path) -> None:
    ok(cv("fs", "put", "-", f"{rdir}/big", input=os.urandom(12 * MiB)))
    env = dict(os.environ, CURVINE_MASTER=shared_cluster.master_address)
    proc = subprocess.run(f"'{CV}' fs cat {rdir}/big | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, env=env, timeout=60)
    assert proc.stderr == b""
    assert proc.stdout.strip() in (b"0", b"141")


# ---------------------------------------------------------------- namespace


def test_ls_stat_mv_rm(cv: typing.Any, rdir: str) -> None:
    ok(cv("fs", "mkdir", "-p", f"{rdir}/d/e"))
    ok(cv("fs", "touch", f"{rdir}/d/empty"))
    ok(cv("fs", "put", "-", f"{rdir}/d/data", input=b"hello"))
    assert ok(cv("fs", "ls", f"{rdir}/d")).split() == ["data", "e", "empty"]
    long = ok(cv("fs", "ls", "-l", f"{rdir}/d")).splitlines()
    assert long[0].startswith("-rw") and long[0].split()[4] == "5" and long[0].endswith("data")
    assert long[1].startswith("d")
    listing = json.loads(ok(cv("fs", "ls", "--json", f"{rdir}/d")))
    assert [(e["name"], e["type"]) for e in listing] == [("data", "file"), ("e", "directory"), ("empty", "file")]

    st = json.loads(ok(cv("fs", "stat", "--json", f"{rdir}/d/data")))
    assert st["size"] == 5 and st["type"] == "file" and st["complete"] and st["replicas"] == 2
    assert "size:" in ok(cv("fs", "stat", f"{rdir}/d/data"))

    ok(cv("fs", "mv", f"{rdir}/d/data", f"{rdir}/d/renamed"))
    ok(cv("fs", "mv", f"{rdir}/d/renamed", f"{rdir}/d/e"))  # into an existing directory
    assert cv("fs", "cat", f"{rdir}/d/e/renamed").stdout == b"hello"

    err = one_error_line(cv("fs", "rm", f"{rdir}/d"))
    assert "is a directory" in err
    ok(cv("fs", "rm", f"{rdir}/d/empty"))
    ok(cv("fs", "rm", "-r", f"{rdir}/d"))
    one_error_line(cv("fs", "stat", f"{rdir}/d"))
    ok(cv("fs", "rm", "-f", f"{rdir}/d"))


def test_du_and_df(cv: typing.Any, rdir: str) -> None:
    ok(cv("fs", "mkdir", f"{rdir}/sub"))
    ok(cv("fs", "put", "-", f"{rdir}/sub/x", input=b"x" * 1000))
    ok(cv("fs", "put", "-", f"{rdir}/y", input=b"y" * 24))
    rows = json.loads(ok(cv("fs", "du", "--json", rdir)))
    by_path = {r["path"]: r for r in rows}
    assert by_path[f"{rdir}/sub"]["bytes"] == 1000 and by_path[f"{rdir}/y"]["bytes"] == 24
    assert by_path[rdir]["bytes"] == 1024 and by_path[rdir]["files"] == 2
    total = json.loads(ok(cv("fs", "du", "-s", "--json", rdir)))
    assert [r["path"] for r in total] == [rdir] and total[0]["bytes"] == 1024
    assert "SIZE" in ok(cv("fs", "du", rdir))

    df = json.loads(ok(cv("fs", "df", "--json")))
    assert df["capacity"] > 0 and df["used"] <= df["capacity"] and df["files"] >= 2
    assert "CAPACITY" in ok(cv("fs", "df"))


def test_blocks_have_two_replicas_on_two_hosts(cv: typing.Any, rdir: str) -> None:
    size = 9 * MiB + 1
    ok(cv("fs", "put", "-", f"{rdir}/b", input=os.urandom(size)))
    info = json.loads(ok(cv("fs", "blocks", "--json", f"{rdir}/b")))
    assert info["size"] == size
    blocks = info["blocks"]
    assert len(blocks) == 3
    assert [b["offset"] for b in blocks] == [0, 4 * MiB, 8 * MiB]
    assert sum(b["length"] for b in blocks) == size
    for b in blocks:
        assert len(b["checksum"]) == 16 and int(b["checksum"], 16) >= 0
        hosts = {w["host"] for w in b["workers"]}
        assert len(b["workers"]) == 2 and len(hosts) == 2, b
        for w in b["workers"]:
            assert w["id"] > 0 and w["address"].startswith("127.0.0.1:")
    assert "CHECKSUM" in ok(cv("fs", "blocks", f"{rdir}/b"))


def test_a_directory_block_size_is_inherited(cv: typing.Any, rdir: str) -> None:
    """`mkdir --block-size`: files (and directories) created below it without a block size
    of their own get it, e.g. one block per KV chunk for FUSE passthrough."""
    ok(cv("fs", "mkdir", "--block-size", "16MiB", f"{rdir}/kv"))
    ok(cv("fs", "mkdir", f"{rdir}/kv/sub"))
    ok(cv("fs", "put", "-", f"{rdir}/kv/sub/c", input=os.urandom(14 * MiB + 28)))
    assert json.loads(ok(cv("fs", "stat", "--json", f"{rdir}/kv")))["block_size"] == 16 * MiB
    info = json.loads(ok(cv("fs", "blocks", "--json", f"{rdir}/kv/sub/c")))
    assert len(info["blocks"]) == 1 and info["blocks"][0]["length"] == 14 * MiB + 28
    assert "not a size" in one_error_line(cv("fs", "mkdir", "--block-size", "lots", f"{rdir}/x"), code=2)
    assert "block size" in one_error_line(cv("fs", "mkdir", "--block-size", "1000", f"{rdir}/x"))
    assert ok(cv("fs", "ls", rdir)).split() == ["kv"]

def test_report(shared_cluster: LocalCluster, cv: typing.Any) -> None:
    rep = json.loads(ok(cv("report", "--json")))
    live = [w for w in rep["workers"] if w["state"] == "live"]
    assert len(live) == 2 and len({w["host"] for w in live}) == 2
    assert {w["address"] for w in live} == {w.address for w in shared_cluster.workers}
    assert rep["capacity"] > 0 and "ring_epoch" in rep and "under_replicated" in rep
    assert all(w["capacity"] > 0 and w["blocks"] >= 0 for w in live)
    text = ok(cv("report"))
    assert "ring epoch" in text and "live" in text


# ---------------------------------------------------------------- errors


def test_get_of_a_missing_path(cv: typing.Any, rdir: str, tmp_path: Path) -> None:
    err = one_error_line(cv("fs", "get", f"{rdir}/missing", "out"))
    assert f"{rdir}/missing" in err and "No such file" in err
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_operation_errors_are_one_line(cv: typing.Any, rdir: str, tmp_path: Path) -> None:
    assert f"{tmp_path}/nope" in one_error_line(cv("fs", "put", str(tmp_path / "nope"), f"{rdir}/x"))
    one_error_line(cv("fs", "cat", f"{rdir}/missing"))
    one_error_line(cv("fs", "mkdir", f"{rdir}/a/b"))  # no -p: parent missing
    one_error_line(cv("fs", "ls", f"{rdir}/missing"))
    one_error_line(cv("fs", "blocks", rdir))
    one_error_line(cv("fs", "rm", "-r", "/"))


def test_usage_errors_exit_2(cv: typing.Any) -> None:
    one_error_line(cv("fs", "put", "only-one-arg"), code=2)
    one_error_line(cv("fs", "frobnicate"), code=2)
    one_error_line(cv("--master", "not-an-address", "fs", "ls"), code=2)


def test_unreachable_master_is_one_line(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    start = time.monotonic()
    proc = run_cv("fs", "ls", "/", "--master", f"127.0.0.1:{port}", cwd=tmp_path,
                  env={"CURVINE_CLIENT_RETRY_S": "1", "CURVINE_CLIENT_RPC_TIMEOUT_S": "1"})
    one_error_line(proc)
    assert time.monotonic() - start < 60


# ---------------------------------------------------------------- cv cluster


def free_port_run(n: int) -> int:
    """A first port p such that p .. p+n-1 are all free (the workers' port scheme)."""
    for _ in range(100):
        p = free_ports(1)[0]
        if p + n < 65536 and not any(port_in_use("127.0.0.1", q) for q in range(p, p + n)):
            return p
    raise AssertionError("no run of free ports")


def test_cluster_start_status_stop(tmp_path: Path) -> None:
    d = tmp_path / "c"
    base = free_port_run(9)  # master on base, workers on base+1 .. base+4, metrics base+5 .. base+8
    master_port, base = base, base + 1
    started = run_cv("cluster", "start", "--dir", str(d), "--master-port", str(master_port),
                     "--base-port", str(base), "--capacity", "256MiB", cwd=tmp_path)
    try:
        out = ok(started)
        assert "worker1" in out
        state = json.loads((d / "cluster.json").read_text())
        assert [p["role"] for p in state["processes"]] == ["master", "worker", "worker"]
        assert state["processes"][2]["address"] == f"127.0.0.1:{base + 2}"
        for p in state["processes"]:
            assert Path(p["log"]).exists() and os.getsid(p["pid"]) == p["pid"]
        assert (d / "curvine.toml").exists() and (d / "master").is_dir() and (d / "worker1" / "data").is_dir()

        again = run_cv("cluster", "start", "--dir", str(d), "--master-port", str(master_port), cwd=tmp_path)
        assert "already running" in one_error_line(again)

        status = json.loads(ok(run_cv("cluster", "status", "--dir", str(d), "--json")))
        assert status["running"] and status["live_workers"] == 2
        assert all(p["alive"] for p in status["processes"])
        assert "alive" in ok(run_cv("cluster", "status", "--dir", str(d)))

        # The cluster's own config file points clients at it.
        rep = json.loads(ok(run_cv("--config", str(d / "curvine.toml"), "report", "--json")))
        assert rep["capacity"] == 2 * 256 * MiB
    finally:
        stopped = run_cv("cluster", "stop", "--dir", str(d))
    assert "stopped" in ok(stopped)
    for p in state["processes"]:
        assert not pid_alive(p["pid"], p["start_ticks"])
    assert not (d / "cluster.json").exists()
    assert "no cluster" in ok(run_cv("cluster", "stop", "--dir", str(d)))
    assert run_cv("cluster", "status", "--dir", str(d)).returncode == 3


def test_cluster_start_on_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = one_error_line(run_cv("cluster", "start", "--dir", str(tmp_path / "c"), "--master-port", str(port)))
    assert str(port) in err and "in use" in err
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_a_taken_worker_or_metrics_port_moves_to_a_free_one(tmp_path: Path) -> None:
    """Issue 42, item 7: a leftover process holding a worker's or a metrics port (a mount's
    9002 once stopped `make run`) moves that port to a free one, said on stderr and shown
    in the status table; only the master's port, which clients are given, must be free."""
    d = tmp_path / "c"
    master_port = free_port_run(9)
    taken = [master_port + 3, master_port + 6]   # worker0's data port, the master's metrics port
    holders = []
    try:
        for port in taken:
            s = socket.socket()
            # (a connection of an earlier test may have left the port in TIME_WAIT: free to listen on)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            holders.append(s)
        started = run_cv("cluster", "start", "--dir", str(d), "--master-port", str(master_port), cwd=tmp_path)
        out = ok(started)
        for port in taken:
            assert f"port {port} (" in started.stderr.decode() and "is taken: using" in started.stderr.decode()
            assert f" {port} " not in out.replace(f"{master_port}", "")
        status = json.loads(ok(run_cv("cluster", "status", "--dir", str(d), "--json")))
        assert status["running"] and status["live_workers"] == 2
    finally:
        for s in holders:
            s.close()
        run_cv("cluster", "stop", "--dir", str(d))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cluster_foreground_stops_on_signal(tmp_path: Path, sig: int) -> None:
    d = tmp_path / "c"
    port = free_port_run(7)  # master P, worker0 P+2 and P+3, metrics P+4 .. P+6
    proc = subprocess.Popen([CV, "cluster", "start", "--dir", str(d), "--workers", "1",
                             "--master-port", str(port), "--foreground"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.decode())
            if "Ctrl-C" in lines[-1]:
                break
        else:
            pytest.fail(f"no ready line: {lines} {proc.stderr.read().decode() if proc.stderr else ''}")
        state = json.loads((d / "cluster.json").read_text())
        assert state["launcher_pid"] == proc.pid
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            run_cv("cluster", "stop", "--dir", str(d))
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
    assert b"stopped" in out
    for p in state["processes"]:
        assert not pid_alive(p["pid"], p["start_ticks"])
    assert not (d / "cluster.json").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_cluster_start_with_a_mount(tmp_path: Path) -> None:
    """--mount starts the mount daemon when it is installed (else says it is not available
    yet and starts without it); stop unmounts before stopping the servers."""
    from curvine_py.common.mounttable import is_mounted
    from curvine_py.cluster.local import fuse_available
    d, mnt = tmp_path / "c", tmp_path / "mnt"
    port = free_port_run(10)  # master P, workers P+2 .. P+5, metrics P+6 .. P+9
    started = run_cv("cluster", "start", "--dir", str(d), "--workers", "2", "--master-port", str(port),
                     "--mount", str(mnt), cwd=tmp_path)
    try:
        ok(started)
        state = json.loads((d / "cluster.json").read_text())
        assert state["mount"] == str(mnt)
        if not fuse_available():
            assert b"mounting is not available yet" in started.stderr
            return
        assert is_mounted(str(mnt)), (d / "logs" / "fuse.log").read_text()
        assert [p["role"] for p in state["processes"]][-1] == "fuse"
        (mnt / "via-mount.txt").write_bytes(b"written through FUSE")
        got = run_cv("fs", "cat", "/via-mount.txt", "--config", str(d / "curvine.toml"))
        assert ok(got) == "written through FUSE"
    finally:
        ok(run_cv("cluster", "stop", "--dir", str(d)))
    assert not is_mounted(str(mnt))
