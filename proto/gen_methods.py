"""Write curvine_py/pb/methods.py (the ``Method`` class and one constant per method): MasterService's methods as typed constants.

``make proto`` runs it after protoc.  Each method of the service becomes one
``Method[Request, Reply]`` whose id is its index in the service (its frame method id,
docs/wire.md), so a caller names a method by an attribute mypy checks, and its reply
comes back typed (``MasterClient.call(Master.Lookup, req)`` is a ``pb.LookupReply``).
tests/unit/test_methods.py fails when the file is not what this script writes now.
"""
from __future__ import annotations

import sys
from pathlib import Path

HEADER = '''"""MasterService's methods, typed.  Generated from proto/curvine.proto by
proto/gen_methods.py (``make proto``): do not edit."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from google.protobuf.message import Message

from curvine_py.pb import curvine_pb2 as pb

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)


@dataclass(frozen=True)
class Method(Generic[Req, Rep]):
    """One MasterService method: its id on the framed wire, its name, its message classes."""
    id: int
    name: str
    request: type[Req]
    reply: type[Rep]


class Master:
    """MasterService: one attribute per method, in the service's order (its frame id)."""

'''


def render() -> str:
    """The module's text, from the compiled descriptor of proto/curvine.proto."""
    from curvine_py.pb import curvine_pb2
    service = curvine_pb2.DESCRIPTOR.services_by_name["MasterService"]
    lines = [HEADER]
    for i, m in enumerate(service.methods):
        req, rep = _name(m.input_type), _name(m.output_type)
        lines.append(f"    {m.name}: Final = Method({i}, \"{m.name}\", {req}, {rep})\n")
    lines.append("\n\nMETHODS: tuple[Method[Message, Message], ...] = (\n")
    lines += [f"    Master.{m.name},\n" for m in service.methods]
    lines.append(")\n")
    return "".join(lines)


def _name(message: object) -> str:
    full = getattr(message, "full_name")
    package = getattr(getattr(message, "file"), "package")
    return "pb." + full.removeprefix(package + ".") if package else "pb." + full


def main() -> None:
    out = Path(__file__).resolve().parents[1] / "curvine_py" / "pb" / "methods.py"
    out.write_text(render())
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
