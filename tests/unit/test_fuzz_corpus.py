"""Every fuzz target's corpus (fuzz/corpus/<target>/) replayed through its fuzz_one, as
the fuzzer ran it but without atheris (the suite never installs it) and in seconds: an
input that once crashed a target and was fixed stays fixed.  docs/testing.md "Fuzzing"."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from fuzz.harness import Finding
from fuzz.run_all import TARGETS

CORPUS = Path(__file__).resolve().parents[2] / "fuzz" / "corpus"


@pytest.mark.parametrize("target", TARGETS)
def test_the_corpus_replays_without_a_finding(target: str) -> None:
    module = importlib.import_module(f"fuzz.{target}")
    inputs = sorted((CORPUS / target).iterdir())
    assert inputs, f"fuzz/corpus/{target} is empty"
    try:
        for path in inputs:
            try:
                module.fuzz_one(path.read_bytes())
            except Exception as e:
                raise AssertionError(f"fuzz/corpus/{target}/{path.name}: {type(e).__name__}: {e}") from e
    finally:
        getattr(module, "close", lambda: None)()
    assert "atheris" not in sys.modules


def test_a_finding_is_raised() -> None:
    """The targets' checks can fail: a server thread's swallowed crash is kept for the
    target to raise, and a config key of the wrong type is a finding."""
    from curvine_py.common.config import Config
    from curvine_py.common.listener import FailureLog
    from fuzz import config_parse, findings

    class Server:
        _failures = FailureLog("x")

    crashes = findings.watch(Server(), "x")   # type: ignore[arg-type]
    crashes.note("a connection crashed", ValueError("boom"), trace=True)
    crashes.note("a peer broke the protocol", ValueError("expected"))
    assert [what for what, _ in crashes.take()] == ["a connection crashed"]
    assert crashes.take() == []
    cfg = Config()
    config_parse.check(cfg)
    cfg.master.port = "8995"   # type: ignore[assignment]
    with pytest.raises(Finding, match="master.port"):
        config_parse.check(cfg)
