"""Typed values drawn from a fuzzer's bytes, and protobuf messages built from them.

atheris has FuzzedDataProvider for the first half, but the corpus is replayed in the
normal suite where atheris is not installed, so a target's input must decode the same
way without it.  Building messages field by field (instead of parsing the bytes as the
wire format) hands every handler a well-formed request of its type on every input: the
parser of the message itself is upb's C code, which coverage cannot see into.
"""
from __future__ import annotations

import typing

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

# Values near the edges of each integer width, and the small ones an inode or id
# usually is (the root is inode 1): drawn by index, so a one-byte change reaches them.
_EDGES = (0, 1, 2, 3, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**53, 2**63 - 1, 2**64 - 1,
          4096, 1 << 20, 4 << 20)
_INT_RANGE = {
    FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_ENUM: (-2**31, 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-2**63, 2**63 - 1), FieldDescriptor.TYPE_SINT64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
MAX_DEPTH = 4
MAX_REPEATED = 4


class Draw:
    """Consumes a fuzz input front to back; past its end every draw is 0 or empty."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def left(self) -> int:
        return len(self.data) - self.at

    def byte(self) -> int:
        if self.at >= len(self.data):
            return 0
        self.at += 1
        return self.data[self.at - 1]

    def raw(self, n: int) -> bytes:
        out = self.data[self.at:self.at + n]
        self.at += len(out)
        return out

    def uint(self, nbytes: int) -> int:
        return int.from_bytes(self.raw(nbytes), "little")

    def integer(self, lo: int, hi: int) -> int:
        """Small, an edge, or any value in [lo, hi] (clamped into it)."""
        mode = self.byte() % 4
        if mode == 0:
            v = self.byte() % 8
        elif mode == 1:
            v = _EDGES[self.byte() % len(_EDGES)]
            v = -v if self.byte() & 1 else v
        else:
            v = self.uint(8)
            v = v - 2**64 if v >= 2**63 and lo < 0 else v
        return min(max(v, lo), hi)

    def blob(self, most: int = 64) -> bytes:
        return self.raw(self.byte() % (most + 1))

    def text(self, most: int = 64) -> str:
        return self.blob(most).decode("utf-8", "replace")

    def choice(self, options: typing.Sequence[typing.Any]) -> typing.Any:
        return options[self.byte() % len(options)]


def message(cls: type[Message], draw: Draw, depth: int = 0) -> Message:
    """A message of type cls whose fields are drawn from draw (each set or left unset)."""
    msg = cls()
    fill(msg, draw, depth)
    return msg


def fill(msg: Message, draw: Draw, depth: int = 0) -> None:
    for field in msg.DESCRIPTOR.fields:
        if draw.left() <= 0 or not draw.byte() & 1:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _fill_map(msg, field, draw, depth)
        elif field.is_repeated:
            items = getattr(msg, field.name)
            for _ in range(draw.byte() % (MAX_REPEATED + 1)):
                if field.message_type is not None:
                    if depth < MAX_DEPTH:
                        fill(items.add(), draw, depth + 1)
                else:
                    items.append(_scalar(field, draw))
        elif field.message_type is not None:
            if depth < MAX_DEPTH:
                fill(getattr(msg, field.name), draw, depth + 1)
                getattr(msg, field.name).SetInParent()
        else:
            setattr(msg, field.name, _scalar(field, draw))


def _fill_map(msg: Message, field: FieldDescriptor, draw: Draw, depth: int) -> None:
    entries = getattr(msg, field.name)
    key_f, value_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
    for _ in range(draw.byte() % (MAX_REPEATED + 1)):
        key = _scalar(key_f, draw)
        if value_f.message_type is not None:
            if depth < MAX_DEPTH:
                fill(entries[key], draw, depth + 1)
        else:
            entries[key] = _scalar(value_f, draw)


def _scalar(field: FieldDescriptor, draw: Draw) -> typing.Any:
    t = field.type
    if t == FieldDescriptor.TYPE_BOOL:
        return bool(draw.byte() & 1)
    if t == FieldDescriptor.TYPE_STRING:
        return draw.text()
    if t == FieldDescriptor.TYPE_BYTES:
        return draw.blob()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return draw.choice((0.0, -1.0, 0.5, 1e300, float("inf"), float("-inf"), float("nan"),
                            float(draw.integer(-2**31, 2**31))))
    if t == FieldDescriptor.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return draw.choice(values) if draw.byte() & 3 else draw.integer(*_INT_RANGE[t])
    lo, hi = _INT_RANGE[t]
    return draw.integer(lo, hi)
