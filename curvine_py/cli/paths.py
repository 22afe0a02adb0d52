"""Namespace paths as every command takes them: made absolute and normalised, and named
in the one-line error of a call that fails on them."""
from __future__ import annotations

import contextlib
import posixpath
import typing

from curvine_py.common.errors import CurvineError


def remote(path: str) -> str:
    """A namespace path made absolute and normalised ('a//b/' -> '/a/b')."""
    norm = posixpath.normpath("/" + path.lstrip("/")) if path else "/"
    return "/" if norm == "//" else norm


@contextlib.contextmanager
def on_path(path: str) -> typing.Iterator[None]:
    """Attach path to a CurvineError that lacks one, so the error line names the file."""
    try:
        yield
    except CurvineError as e:
        if e.path is None:
            raise e.with_path(path) from None
        raise
