"""Which method applies which op record: the table behind ``Namespace.apply``.

The op methods live in several mixins (``namespace.py``, ``files.py``, ``cacheops.py``,
``ufsops.py``); each marks itself with ``@applies(RecordType)``, and ``handlers(cls)``
collects the marks of a class and its bases once.  Dispatch is then one dict lookup on
the record's type, with no names to keep in step, and a record type nobody applies is
an error when the table is built (at import), not when such a record first arrives.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from curvine_py.master.records import RECORDS, Record
from curvine_py.master.store import Result

R = TypeVar("R", bound=Record)
Handler = Callable[[Any, Any], Result]
_MARK = "__applies__"


def applies(record: type[R]) -> Callable[[Callable[[Any, R], Result]], Callable[[Any, R], Result]]:
    """Mark an op method as the one that applies records of type record."""
    def mark(fn: Callable[[Any, R], Result]) -> Callable[[Any, R], Result]:
        setattr(fn, _MARK, record)
        return fn
    return mark


@functools.cache
def handlers(cls: type) -> dict[type[Record], Handler]:
    """The marked methods of cls and its bases by record type (a subclass's method of the
    same name overrides); every record type must have exactly one."""
    found: dict[type[Record], tuple[str, Handler]] = {}
    for klass in reversed(cls.__mro__):
        for name, fn in vars(klass).items():
            record = getattr(fn, _MARK, None)
            if record is None:
                continue
            if record in found and found[record][0] != name:
                raise TypeError(f"{record.op} is applied by both {found[record][0]} and {name}")
            found[record] = (name, fn)
    missing = sorted(r.op for r in RECORDS.values() if r not in found)
    if missing:
        raise TypeError(f"{cls.__name__} applies no {', '.join(missing)} records")
    return {record: fn for record, (_, fn) in found.items()}
