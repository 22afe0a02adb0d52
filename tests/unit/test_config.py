"""Configuration: file, environment and flag precedence, sizes, errors, documentation."""
from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import pytest

from curvine_py.common import config
from curvine_py.common.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_precedence_file_env_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[master]\nport = 1111\nblock_size = "8MiB"\n[worker]\ndirs = ["[MEM]/a", "/b"]\n')
    monkeypatch.setenv("CURVINE_MASTER_PORT", "2222")
    monkeypatch.setenv("CURVINE_MASTER", "m:1")
    monkeypatch.delenv("CURVINE_MASTER_BLOCK_SIZE", raising=False)   # (the suite's 4 MiB: tests/conftest.py)
    p = argparse.ArgumentParser()
    config.add_flags(p)
    cfg = config.load(p.parse_args(["--config", str(f), "--master-rpc-threads", "3"]))
    assert cfg.master.port == 2222 and cfg.master.block_size == 8 << 20
    assert cfg.master.rpc_threads == 3 and cfg.worker.dirs == ["[MEM]/a", "/b"]
    assert cfg.client.master == "m:1"
    cfg2 = config.load(p.parse_args(["--config", str(f), "--master-port", "3333"]))
    assert cfg2.master.port == 3333


def test_default_block_size_makes_a_kv_chunk_one_block() -> None:
    """16 MiB: a 14 MiB KV chunk (Qwen2.5-7B's 256 tokens) written with defaults is one
    block, which a mount on a replica's host hands to the kernel (docs/kvcache.md)."""
    assert config.Config().master.block_size == 16 << 20
    assert config.Config().master.block_size >= 14 * (1 << 20) + 28


@pytest.mark.parametrize("text,value", [("4MiB", 4 << 20), ("100GB", 100 << 30), ("1.5G", 3 << 29), ("4096", 4096)])
def test_sizes(text: str, value: int) -> None:
    assert config.parse_size(text) == value


def test_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[master]\nport = 'x'\n")
    with pytest.raises(ConfigError, match="master.port"):
        config.load(path=str(bad))
    bad.write_text("[nope]\na = 1\n")
    with pytest.raises(ConfigError, match="unknown section"):
        config.load(path=str(bad))
    bad.write_text("[master]\nbogus = 1\n")
    with pytest.raises(ConfigError, match="unknown configuration key"):
        config.load(path=str(bad))
    with pytest.raises(ConfigError, match="not found"):
        config.load(path=str(tmp_path / "missing.toml"))


def test_a_misspelt_variable_is_an_error_not_a_silent_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """CURVINE_<SECTION>_<KEY> with no such key fails like an unknown key in the file;
    variables that name no section (CURVINE_CONF, CURVINE_RUN_DIR) are not settings."""
    monkeypatch.setenv("CURVINE_WORKER_IO_ENGIN", "threads")
    with pytest.raises(ConfigError, match=r"unknown configuration key worker.io_engin \(in CURVINE_WORKER_IO_ENGIN\)"):
        config.load(path=os.devnull)
    monkeypatch.delenv("CURVINE_WORKER_IO_ENGIN")
    monkeypatch.setenv("CURVINE_RUN_DIR", "/tmp/somewhere")
    monkeypatch.setenv("CURVINE_WORKER_IO_ENGINE", "threads")
    assert config.load(path=os.devnull).worker.io_engine == "threads"


def test_round_trip_through_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("CURVINE_")]:   # the tests' secret, metrics
        monkeypatch.delenv(name)                                        # ports off, a forced io engine
    cfg = config.Config()
    cfg.worker.dirs = ["[SSD:1GiB]/x"]
    f = tmp_path / "out.toml"
    f.write_text(config.to_toml(cfg))
    assert config.load(path=str(f)) == cfg


def test_every_key_is_documented() -> None:
    text = DOCS.read_text()
    cfg = config.Config()
    for section in config.SECTIONS:
        assert f"## [{section}]" in text
        for f in dataclasses.fields(cfg.section(section)):
            assert f"| `{f.name}` |" in text, f"{section}.{f.name} missing from docs/config.md"


# Found by fuzzing (fuzz/config_parse.py): each raised something else than ConfigError,
# which the CLI prints as one line, or printed a config that did not load back.
@pytest.mark.parametrize("text", [b"~\n\x9c\x7f", b"[master]\nport = inf\n", b"[master]\nport = 1e999\n",
                                  b'[master]\nblock_size = "1e999"\n', b'[master]\nblock_size = "-1e999KiB"\n'])
def test_fuzzed_files_are_config_errors(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as e:
        config.load_file(config.Config(), path)
    assert "\n" not in str(e.value)


def test_an_infinite_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not a size"):
        config.parse_size("1e999")


def test_strings_with_control_characters_print_as_loadable_toml(tmp_path: Path) -> None:
    cfg = config.Config()
    cfg.cluster.name = 'a\nb\x00c\x7fd\t"e\\'
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml(cfg))
    again = config.Config()
    config.load_file(again, path)
    assert again.cluster.name == cfg.cluster.name
