"""Random namespace operations through the SDK against a simple in-memory model."""
from __future__ import annotations

import errno
import posixpath
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from curvine_py import Client, CurvineError

NAMES = st.sampled_from(["a", "b", "c", "d"])
DATA = st.binary(max_size=64) | st.sampled_from([b"", b"x" * 5000, bytes(range(256)) * 40])


def run_machine(client: Client) -> None:
    class Namespace(RuleBasedStateMachine):
        """Model: path -> bytes for files, path -> None for directories."""

        def __init__(self) -> None:
            super().__init__()
            self.root = f"/stateful-{uuid.uuid4().hex[:8]}"
            client.mkdir(self.root)
            self.model: dict[str, bytes | None] = {self.root: None}

        def dirs(self) -> list[str]:
            return sorted(p for p, v in self.model.items() if v is None)

        def files(self) -> list[str]:
            return sorted(p for p, v in self.model.items() if v is not None)

        def expect(self, fn, code: int | None) -> None:  # type: ignore[no-untyped-def]
            if code is None:
                fn()
                return
            with pytest.raises(CurvineError) as e:
                fn()
            assert e.value.errno == code, (e.value, code)

        def _where(self, data, name) -> str:  # type: ignore[no-untyped-def]
            return posixpath.join(data.draw(st.sampled_from(self.dirs())), name)

        @rule(data=st.data(), name=NAMES)
        def mkdir(self, data, name) -> None:  # type: ignore[no-untyped-def]
            path = self._where(data, name)
            code = errno.EEXIST if path in self.model else None
            self.expect(lambda: client.mkdir(path), code)
            self.model.setdefault(path, None)

        @rule(data=st.data(), name=NAMES, payload=DATA)
        def put(self, data, name, payload) -> None:  # type: ignore[no-untyped-def]
            path = self._where(data, name)
            code = errno.EISDIR if self.model.get(path, b"") is None else None
            self.expect(lambda: client.put_bytes(path, payload), code)
            if code is None:
                self.model[path] = payload

        @precondition(lambda self: self.files())
        @rule(data=st.data())
        def remove(self, data) -> None:  # type: ignore[no-untyped-def]
            path = data.draw(st.sampled_from(self.files()))
            client.remove(path)
            del self.model[path]

        @precondition(lambda self: len(self.dirs()) > 1)
        @rule(data=st.data())
        def rmdir(self, data) -> None:  # type: ignore[no-untyped-def]
            path = data.draw(st.sampled_from(self.dirs()[1:]))
            busy = any(p.startswith(path + "/") for p in self.model)
            self.expect(lambda: client.rmdir(path), errno.ENOTEMPTY if busy else None)
            if not busy:
                del self.model[path]

        @precondition(lambda self: len(self.model) > 1)
        @rule(data=st.data(), name=NAMES)
        def rename(self, data, name) -> None:  # type: ignore[no-untyped-def]
            src = data.draw(st.sampled_from(sorted(self.model)[1:]))
            dst = self._where(data, name)
            code = self._rename_errno(src, dst)
            self.expect(lambda: client.rename(src, dst), code)
            if code is None and src != dst:
                moved = {p: v for p, v in self.model.items() if p == src or p.startswith(src + "/")}
                for p in moved:
                    del self.model[p]
                self.model.pop(dst, None)
                for p, v in moved.items():
                    self.model[dst + p[len(src):]] = v

        def _rename_errno(self, src: str, dst: str) -> int | None:
            if src == dst:
                return None
            if dst.startswith(src + "/"):
                return errno.EINVAL
            if dst not in self.model:
                return None
            src_dir, dst_dir = self.model[src] is None, self.model[dst] is None
            if src_dir and not dst_dir:
                return errno.ENOTDIR
            if dst_dir and not src_dir:
                return errno.EISDIR
            if dst_dir and any(p.startswith(dst + "/") for p in self.model):
                return errno.ENOTEMPTY
            return None

        @precondition(lambda self: self.files())
        @rule(data=st.data())
        def get(self, data) -> None:  # type: ignore[no-untyped-def]
            path = data.draw(st.sampled_from(self.files()))
            assert client.get_bytes(path) == self.model[path]

        @invariant()
        def listings_match(self) -> None:
            for d in self.dirs():
                want = sorted(posixpath.basename(p) for p in self.model if posixpath.dirname(p) == d and p != d)
                assert sorted(client.listdir(d)) == want, d

    Namespace.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None,
                                           suppress_health_check=list(HealthCheck))
    Namespace.TestCase().runTest()


@pytest.mark.timeout(600)
def test_namespace_matches_model(client: Client) -> None:
    run_machine(client)
