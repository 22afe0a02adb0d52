"""The cv command line without a cluster: parsing, exit codes, formatting, transfers
against a fake client, and the local-cluster launcher's layout decisions."""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from curvine_py.cluster import ports as clusterports
from curvine_py.cluster import local as lc
from curvine_py.cli import Context, output
from curvine_py.cli import cluster as clustercmd
from curvine_py.cli import fs as fscmd
from curvine_py.cli import report as reportcmd
from curvine_py.cli.main import build_parser, main
from curvine_py.common import config as cfgmod
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.sdk.results import MasterInfo, Report


def parse(*argv: str) -> typing.Any:
    return build_parser().parse_args(list(argv))


# ---------------------------------------------------------------- parsing


def test_every_documented_command_parses() -> None:
    cases = [
        ("fs", "ls", "-l", "/a"), ("fs", "ls"), ("fs", "mkdir", "-p", "/a/b"), ("fs", "put", "x", "/x"),
        ("fs", "get", "/x", "x"), ("fs", "cat", "/x"), ("fs", "touch", "/x"), ("fs", "rm", "-r", "/x"),
        ("fs", "mv", "/a", "/b"), ("fs", "stat", "/x"), ("fs", "du", "-s", "/x"), ("fs", "df"),
        ("fs", "blocks", "/x", "--json"), ("report", "--json"), ("version",), ("config",),
        ("cluster", "start", "--dir", "D", "--workers", "3", "--mount", "M", "--foreground",
         "--capacity", "1GiB", "--master-port", "9000", "--base-port", "9100"),
        ("cluster", "start", "--masters", "3"),
        ("cluster", "stop", "--dir", "D"), ("cluster", "status", "--dir", "D", "--json"),
    ]
    for argv in cases:
        args = parse(*argv)
        assert callable(args.func), argv


def test_flags_land_where_commands_read_them() -> None:
    a = parse("fs", "ls", "-l", "/a")
    assert (a.long, a.path, a.json) == (True, "/a", False)
    a = parse("fs", "mkdir", "-p", "/a", "/b")
    assert a.parents and a.paths == ["/a", "/b"]
    a = parse("fs", "rm", "-rf", "/a")
    assert a.recursive and a.force
    a = parse("fs", "du", "-s", "/a")
    assert a.summary
    a = parse("cluster", "start")
    assert (a.dir, a.workers, a.foreground, a.master_port, a.base_port, a.capacity, a.mount, a.masters) == \
        (".curvine", 2, False, None, None, None, None, None)
    assert parse("cluster", "start", "--masters", "3").masters == 3
    assert parse("cluster", "start", "--masters", "5").masters == 5


def test_master_option_takes_a_list_of_masters() -> None:
    assert parse("--master", "h:1, g:2,h:1", "fs", "ls").master == "h:1,g:2"
    assert parse("report", "--master", "10.0.0.1:8995").master == "10.0.0.1:8995"


@pytest.mark.parametrize("argv", [
    ("--master", "h:1", "fs", "ls"), ("fs", "--master", "h:1", "ls"), ("fs", "ls", "--master", "h:1"),
    ("report", "--master", "h:1"), ("cluster", "status", "--master", "h:1"),
])
def test_master_option_is_accepted_at_every_level(argv: tuple[str, ...]) -> None:
    assert parse(*argv).master == "h:1"


def test_config_option_on_every_command() -> None:
    assert parse("fs", "df", "--config", "c.toml").config == "c.toml"
    assert parse("--config", "c.toml", "version").config == "c.toml"
    assert parse("version").config is None


@pytest.mark.parametrize("argv", [
    [], ["fs"], ["fs", "put", "x"], ["fs", "nope"], ["--master", "nohost", "fs", "ls"],
    ["--master", "h:99999", "version"], ["cluster", "start", "--workers", "0"],
    ["cluster", "start", "--master-port", "x"], ["fs", "ls", "--bogus"],
    ["cluster", "start", "--masters", "2"], ["cluster", "start", "--masters", "0"],
    ["cluster", "start", "--masters", "three"], ["--master", "h:1,nohost", "fs", "ls"], ["--master", ",", "fs", "ls"],
])
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cv: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["fs", "put", "--help"])
    assert e.value.code == 0
    assert "LOCAL" in capsys.readouterr().out


def test_version_and_config(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["version"]) == 0
    assert "curvine-py" in capsys.readouterr().out
    (tmp_path / "c.toml").write_text("[master]\nport = 1234\n")
    assert main(["config", "--config", "c.toml", "--master", "m:5"]) == 0
    text = capsys.readouterr().out
    parsed = cfgmod.Config()
    (tmp_path / "out.toml").write_text(text)
    cfgmod.load_file(parsed, tmp_path / "out.toml")
    assert parsed.master.port == 1234 and parsed.client.master == "m:5"


def test_config_error_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[nosuch]\nx = 1\n")
    assert main(["config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cv: ") and "nosuch" in err and err.count("\n") == 1


# ---------------------------------------------------------------- errors and a fake client


class FakeClient:
    """Just enough of the SDK for the transfer commands, with injectable failures."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs = {"/"}
        self.fail_after: int | None = None

    def stat(self, path: str) -> typing.Any:
        if path in self.dirs:
            return _Status(path, 0o040755, 0)
        if path in self.files:
            return _Status(path, 0o100644, len(self.files[path]))
        raise CurvineError(errno.ENOENT, "No such file or directory", path)

    lstat = stat

    def put_file(self, local: str, path: str, callback: typing.Any = None) -> None:
        data = Path(local).read_bytes()
        self.files[path] = b""
        if self.fail_after is not None:
            self.files[path] = data[:self.fail_after]
            raise CurvineError(errno.EIO, "worker went away", path)
        self.files[path] = data
        if callback:
            callback(len(data))

    def get_file(self, path: str, local: str, callback: typing.Any = None) -> None:
        data = self.files[path]
        with open(local, "wb") as f:
            if self.fail_after is not None:
                f.write(data[:self.fail_after])
                raise CurvineError(errno.EIO, "worker went away", path)
            f.write(data)
        if callback:
            callback(len(data))

    def rename(self, src: str, dst: str) -> None:
        self.files[dst] = self.files.pop(src)

    def remove(self, path: str) -> None:
        self.files.pop(path, None)

    def close(self) -> None:
        pass


class _Status:
    def __init__(self, path: str, mode: int, size: int) -> None:
        self.path, self.mode, self.size = path, mode, size
        self.name = path.rsplit("/", 1)[-1]
        self.is_dir = mode & 0o040000 != 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr(Context, "client", property(lambda self: client))
    return client


def test_put_and_get_round_trip_through_temp_names(fake: FakeClient, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(1000))
    assert main(["fs", "put", str(src), "/"]) == 0
    assert fake.files == {"/a.bin": src.read_bytes()}
    assert main(["fs", "get", "/a.bin", str(tmp_path / "b.bin")]) == 0
    assert (tmp_path / "b.bin").read_bytes() == src.read_bytes()
    err = capsys.readouterr().err
    assert "\r" not in err and "put /a.bin" in err  # not a terminal: plain summary lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin"]


def test_failed_put_leaves_no_remote_file(fake: FakeClient, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)
    fake.fail_after = 10
    assert main(["fs", "put", str(src), "/a.bin"]) == 1
    assert fake.files == {}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "worker went away" in err


def test_failed_get_leaves_no_local_file(fake: FakeClient, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    fake.files["/a.bin"] = b"y" * 1000
    fake.fail_after = 10
    assert main(["fs", "get", "/a.bin", str(tmp_path / "out")]) == 1
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err == "cv: /a.bin: worker went away\n"


def test_get_of_missing_path(fake: FakeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fs", "get", "/nope", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == "cv: /nope: No such file or directory\n"
    assert list(tmp_path.iterdir()) == []


def test_get_into_a_missing_local_directory_names_the_target(fake: FakeClient, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    fake.files["/a.bin"] = b"y"
    target = tmp_path / "no" / "such" / "out"
    assert main(["fs", "get", "/a.bin", str(target)]) == 1
    assert capsys.readouterr().err == f"cv: {target}: No such file or directory\n"


def test_put_of_missing_local_file(fake: FakeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    assert main(["fs", "put", str(missing), "/x"]) == 1
    assert capsys.readouterr().err == f"cv: {missing}: No such file or directory\n"


def test_put_of_directory_needs_r(fake: FakeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fs", "put", str(tmp_path), "/x"]) == 1
    assert "is a directory (use -r)" in capsys.readouterr().err


def test_unexpected_exception_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    def boom(self: Context) -> typing.Any:
        raise RuntimeError("bug\nwith two lines")
    monkeypatch.setattr(Context, "client", property(boom))
    assert main(["fs", "df"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError" in err and "Traceback" not in err


def test_keyboard_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(self: Context) -> typing.Any:
        raise KeyboardInterrupt
    monkeypatch.setattr(Context, "client", property(interrupted))
    assert main(["fs", "df"]) == 130
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("given,expected", [
    ("/", "/"), ("", "/"), ("a/b", "/a/b"), ("//a//b/", "/a/b"), ("/a/./b/../c", "/a/c"),
])
def test_remote_paths_are_normalised(given: str, expected: str) -> None:
    assert fscmd.remote(given) == expected


# ---------------------------------------------------------------- formatting


@pytest.mark.parametrize("n,text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (4 << 20, "4.0 MiB"), (int(1.5 * (1 << 30)), "1.5 GiB"),
    (-2048, "-2.0 KiB"),
])
def test_format_size(n: int, text: str) -> None:
    assert output.format_size(n) == text


def test_small_formatters() -> None:
    assert output.format_percent(1, 4) == "25.0%"
    assert output.format_percent(1, 0) == "-"
    assert output.format_checksum(255) == "00000000000000ff"
    assert output.format_mode(0o040755) == "drwxr-xr-x"
    assert output.format_age_ms(400) == "0.4s ago"
    assert output.format_age_ms(180_000) == "3m ago"
    assert output.format_time_ns(0) == "-"
    assert output.format_rate(1 << 20, 1.0) == "1.0 MiB/s"


def test_table_alignment() -> None:
    text = output.table([("a", 1), ("bbb", 22)], headers=("NAME", "N"), right={1})
    assert text.splitlines() == ["NAME   N", "a      1", "bbb   22"]
    assert all(line == line.rstrip() for line in text.splitlines())
    assert output.table([]) == ""


def test_json_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    output.print_json({"a": [1, "é"]})
    assert json.loads(capsys.readouterr().out) == {"a": [1, "é"]}


def _status(role: str, term: int, commit: int, applied: int) -> pb.MasterStatusReply:
    return pb.MasterStatusReply(role=role, term=term, commit_index=commit, applied_index=applied, ready=True)


def test_masters_lag_behind_the_leader_of_the_highest_term() -> None:
    addrs = ("a:1", "b:1", "c:1", "d:1")
    infos = MasterInfo.group(addrs, [_status("leader", 3, 10, 10), _status("follower", 3, 9, 7), None,
                                     _status("leader", 2, 8, 8)])   # an old leader, cut off
    assert [(m.address, m.role, m.lag) for m in infos] == [
        ("a:1", "leader", 0), ("b:1", "follower", 3), ("c:1", "unreachable", None), ("d:1", "leader", 2)]
    assert [m.lag for m in MasterInfo.group(addrs[:2], [None, _status("follower", 1, 5, 5)])] == [None, None]


def test_report_shows_the_masters(capsys: pytest.CaptureFixture[str]) -> None:
    masters = MasterInfo.group(("a:1", "b:1", "c:1"), [_status("follower", 4, 12, 11), _status("leader", 4, 12, 12),
                                                       None])
    rep = Report((), 1, 0, 0, 0, 0, 0, "b:1", "0.1.0", 0, 0, 0, 0, masters)
    text = reportcmd.format_report(rep)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("MASTER"))
    assert lines[head].split() == ["MASTER", "ROLE", "TERM", "COMMIT", "APPLIED", "LAG"]
    assert [line.split() for line in lines[head + 1:head + 4]] == [
        ["a:1", "follower", "4", "12", "11", "1"], ["b:1", "leader", "4", "12", "12", "0"],
        ["c:1", "unreachable", "-", "-", "-", "-"]]
    js = reportcmd.report_json(rep)["masters"]
    assert [(m["address"], m["role"], m["lag"]) for m in js] == [("a:1", "follower", 1), ("b:1", "leader", 0),
                                                                 ("c:1", "unreachable", None)]
    assert js[0]["commit_index"] == 12 and js[0]["applied_index"] == 11 and js[0]["term"] == 4
    one = Report((), 1, 0, 0, 0, 0, 0, "b:1", "0.1.0", 0, 0, 0, 0, masters[1:2])
    assert "MASTER" not in reportcmd.format_report(one)   # one master: no table, the summary says it
    assert [m["role"] for m in reportcmd.report_json(one)["masters"]] == ["leader"]


# ---------------------------------------------------------------- local cluster layout


def test_documented_port_scheme(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=3, master_port=8995)
    assert c.master_address == "127.0.0.1:8995"
    assert [c.worker_ports(i) for i in range(3)] == [(8997, 8998), (8999, 9000), (9001, 9002)]
    c = lc.LocalCluster(tmp_path, workers=2, master_port=9000, base_port=9100)
    assert c.worker_ports(1) == (9102, 9103)


def test_free_port_cluster_uses_distinct_ports(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=3)
    ports = [c.master_port] + [p for i in range(3) for p in c.worker_ports(i)]
    assert len(set(ports)) == 7


def test_worker_commands_carry_identity_ports_and_capacity(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=2, master_port=8995, capacity="1GiB",
                        extra_worker_flags=["--worker-reserve", "0"])
    argv = c._command("worker", 1)
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--worker-host"].endswith("-w1")
    assert flags["--worker-rpc-port"] == "8999" and flags["--worker-data-port"] == "9000"
    assert flags["--worker-dirs"] == f"[SSD:{1 << 30}]{tmp_path.absolute()}/worker1/data"
    assert flags["--worker-master"] == "127.0.0.1:8995"
    assert flags["--worker-reserve"] == "0"
    assert argv[:2] == [sys.executable, "-c"]
    master = c._command("master", 0)
    assert "--master-meta-dir" in master and str(tmp_path.absolute() / "master") in master


def test_prepare_writes_a_loadable_config_once(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=2, master_port=9995, capacity="64MiB")
    c.prepare()
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, c.config_path)
    assert cfg.master.port == 9995 and cfg.client.master == "127.0.0.1:9995"
    assert cfg.worker.rpc_port == 9997 and cfg.master.meta_dir == str(tmp_path.absolute() / "master")
    assert clustercmd.layout_defaults(tmp_path) == (9995, 9997, 64 << 20)
    for sub in ("logs", "master", "worker0/data", "worker1/data"):
        assert (tmp_path / sub).is_dir()
    c.config_path.write_text("# edited\n[master]\nport = 7000\n")
    c.prepare()
    assert c.config_path.read_text().startswith("# edited")


def test_layout_defaults_without_config(tmp_path: Path) -> None:
    assert clustercmd.layout_defaults(tmp_path) == (8995, None, None)


def test_three_masters_port_scheme() -> None:
    """The documented layout (curvine_py/cluster/ports.py): one contiguous run from P, no
    port given twice; one master keeps the layout it always had."""
    plan = clusterports.documented(3, 2, 8995)
    assert [(m.grpc, m.frame) for m in plan.masters] == [(8995, 8996), (8997, 8998), (8999, 9000)]
    assert plan.workers == ((9001, 9002), (9003, 9004))
    assert [m.metrics for m in plan.masters] == [9005, 9006, 9007]
    assert plan.worker_metrics == (9008, 9009) and plan.mount_metrics == 9010
    assert [m.raft for m in plan.masters] == [9011, 9012, 9013]
    assert plan.clash() is None
    ports = [p for p, _ in plan.labelled()] + [plan.mount_metrics]
    assert sorted(ports) == list(range(8995, 9014))
    one = clusterports.documented(1, 2, 8995)
    assert one.masters == (clusterports.MasterPorts(8995, 8996, 0, 9001),)
    assert one.workers == ((8997, 8998), (8999, 9000)) and one.worker_metrics == (9002, 9003)


def test_a_port_given_twice_is_refused_before_anything_starts(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=2, masters=3, master_port=20000, base_port=20002)
    assert c.ports.clash() == "port 20002: master1 and worker0 rpc"
    with pytest.raises(lc.ClusterError, match="two daemons would share a port"):
        c.start()
    assert c.processes == [] and not (tmp_path / "cluster.json").exists()


def test_free_ports_for_three_masters_are_distinct(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=2, masters=3)
    ports = [p for p, _ in c.ports.labelled()] + [c.ports.mount_metrics]
    assert len(ports) == 3 * 4 + 2 * 3 + 1 == len(set(ports))


def test_an_even_number_of_masters_is_refused(tmp_path: Path) -> None:
    for n in (0, 2, 4):
        with pytest.raises(lc.ClusterError, match="must be odd"):
            lc.LocalCluster(tmp_path, masters=n)


def test_master_commands_carry_their_place_in_the_group(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=2, masters=3, master_port=8995)
    peers = "127.0.0.1:9011,127.0.0.1:9012,127.0.0.1:9013"
    for i in range(3):
        argv = c._command("master", i)
        flags = dict(zip(argv[3::2], argv[4::2]))
        assert flags["--master-port"] == str(8995 + 2 * i) and flags["--master-frame-port"] == str(8996 + 2 * i)
        assert flags["--master-ip"] == "127.0.0.1" and flags["--master-raft-port"] == str(9011 + i)
        assert flags["--master-raft-peers"] == peers
        assert flags["--master-meta-dir"] == str(tmp_path.absolute() / f"master{i}")
        assert flags["--master-metrics-port"] == str(9005 + i)
    everyone = "127.0.0.1:8995,127.0.0.1:8997,127.0.0.1:8999"
    assert c.master_address == everyone
    worker = c._command("worker", 0)
    assert dict(zip(worker[3::2], worker[4::2]))["--worker-master"] == everyone
    assert [c._record("master", i).name for i in range(3)] == ["master0", "master1", "master2"]
    assert c._record("master", 2).raft == "127.0.0.1:9013"
    single = lc.LocalCluster(tmp_path, workers=2, master_port=8995)
    argv = single._command("master", 0)
    assert not any(a.startswith("--master-raft") or a == "--master-ip" for a in argv)
    assert single._record("master", 0).name == "master" and single._record("master", 0).raft == ""


def test_prepare_for_three_masters(tmp_path: Path) -> None:
    c = lc.LocalCluster(tmp_path, workers=2, masters=3, master_port=8995)
    c.prepare()
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, c.config_path)
    assert cfgmod.addresses(cfg.client.master) == cfgmod.addresses(cfg.worker.master) == c.master_addresses
    assert cfg.master.raft_peers == "127.0.0.1:9011,127.0.0.1:9012,127.0.0.1:9013"
    assert (cfg.master.port, cfg.master.raft_port, cfg.worker.rpc_port) == (8995, 9011, 9001)
    assert all((tmp_path / f"master{i}").is_dir() for i in range(3)) and not (tmp_path / "master").exists()
    assert clustercmd.recorded_masters(tmp_path) == 3
    assert clustercmd.layout_defaults(tmp_path) == (8995, 9001, None)
    assert clustercmd.recorded_masters(tmp_path / "elsewhere") is None


def test_a_directory_keeps_its_number_of_masters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lc.LocalCluster(tmp_path, workers=1, master_port=8995).prepare()
    assert main(["cluster", "start", "--dir", str(tmp_path), "--masters", "3"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "set up for 1 master" in err and "--masters 1" in err


def test_port_checks(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert lc.port_in_use("127.0.0.1", port)
        c = lc.LocalCluster(tmp_path, workers=1, master_port=port)
        with pytest.raises(lc.ClusterError, match=f"port {port} \\(master\\)"):
            c.start()
    assert not lc.port_in_use("127.0.0.1", port)
    assert c.processes == [] and not (tmp_path / "cluster.json").exists()


def test_process_records_survive_json_and_pid_checks() -> None:
    rec = lc.ProcessRecord("worker", "worker0", 0, "127.0.0.1:1", "/l", ["x"], "127.0.0.1:2", "h-w0",
                           pid=os.getpid(), start_ticks=lc._start_ticks(os.getpid()))
    back = lc.ProcessRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert back == rec and back.is_alive()
    assert not lc.pid_alive(os.getpid(), (rec.start_ticks or 0) + 1)  # same pid, other process
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not lc.pid_alive(int(done.stdout))


def test_stop_dir_without_a_cluster(tmp_path: Path) -> None:
    assert lc.stop_dir(tmp_path) is None
    assert lc.read_state(tmp_path) is None


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert lc.log_tail(log, 3).splitlines() == ["line 97", "line 98", "line 99"]
    assert lc.log_tail(tmp_path / "missing") == ""


def test_cli_and_launcher_never_load_server_code() -> None:
    code = ("import sys, curvine_py.cli.main, curvine_py.cli.fs, curvine_py.cli.cluster, "
            "curvine_py.cli.report, curvine_py.cluster.local\n"
            "curvine_py.cli.main.build_parser()\n"
            "bad = [m for m in sys.modules if m.startswith(('curvine_py.master', 'curvine_py.worker'))]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
