"""curvine_py/pb/methods.py is what proto/gen_methods.py writes from the proto today, and
every caller names a method through it (no method name as a string)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from curvine_py.pb import curvine_pb2
from curvine_py.pb.methods import METHODS, Master

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_methods", ROOT / "proto" / "gen_methods.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_methods_are_current() -> None:
    """A method added to the proto without `make proto` fails here, not on the wire."""
    render = _generator().render
    assert (ROOT / "curvine_py" / "pb" / "methods.py").read_text() == render(), \
        "curvine_py/pb/methods.py is stale: run `make proto`"


def test_ids_and_types_follow_the_service() -> None:
    service = curvine_pb2.DESCRIPTOR.services_by_name["MasterService"]
    assert [m.name for m in METHODS] == [m.name for m in service.methods]
    for i, (m, d) in enumerate(zip(METHODS, service.methods)):
        assert m.id == i and getattr(Master, m.name) is m
        assert m.request.DESCRIPTOR.full_name == d.input_type.full_name
        assert m.reply.DESCRIPTOR.full_name == d.output_type.full_name


def test_no_caller_names_a_method_by_string() -> None:
    """`call("Lookup", ...)` or `yield "Lookup", ...` would bypass the types."""
    names = "|".join(m.name for m in METHODS)
    pattern = re.compile(rf'(\.call|send_soon|send|yield)\(?\s*"({names})"')
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("curvine_py", "fuse", "master", "worker")
             for p in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
