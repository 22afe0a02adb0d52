"""Random interleavings of writes, reads, closes and worker failures on a tiny block pool.

A real 3-worker cluster and a client core whose pool holds 3 blocks of 4 MiB, so more
files are open part-written, and more blocks are being read, than there are buffers: the
state in which the mount hung under LMCache (shared/findings/lmcache-concurrency).  Each
step runs its actions on threads at once and must end within a deadline: a waiter that
nothing wakes fails the step with the pool's state.  Closed files read back exactly what
was written; when everything is closed, every buffer is back in the pool.
"""
from __future__ import annotations

import os
import threading
import typing
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from curvine_py.client.reader import FileReader
from curvine_py.client.writer import FileWriter
from curvine_py.common.errors import CurvineError
from curvine_py.common.types import ROOT_INO
from curvine_py.cluster.local import LocalCluster
from curvine_py.sdk import Client
from tests.conftest import client_config

MiB = 1 << 20
BLOCK = 4 * MiB
STEP_DEADLINE_S = 60.0
MAX_OPEN = 6
FILE_MAX = 3 * BLOCK

pytestmark = pytest.mark.timeout(900)


def run_at_once(actions: list[typing.Callable[[], None]], client: Client) -> None:
    """Run actions on threads at once; every one must finish within the deadline."""
    errors: list[BaseException] = []

    def guarded(fn: typing.Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:   # re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(a,), daemon=True) for a in actions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(STEP_DEADLINE_S)
        if t.is_alive():
            pools = "; ".join(str(p.stats()) for p in client.core.pools())
            raise AssertionError(f"a step did not finish in {STEP_DEADLINE_S:.0f} s (stuck waiter): {pools}")
    if errors:
        raise errors[0]


def make_machine(cluster: LocalCluster, client: Client) -> type[RuleBasedStateMachine]:
    core = client.core

    class PoolStates(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.open: list[tuple[FileWriter, bytearray]] = []
            self.closed: dict[int, bytes] = {}      # ino -> committed content
            self.readers: list[tuple[FileReader, int]] = []
            self.faulted = False                     # a worker was killed while files were open

        def _new_writer(self) -> tuple[FileWriter, bytearray]:
            reply = core.meta.create(ROOT_INO, f"ps-{uuid.uuid4().hex[:10]}", 0o100644,
                                     os.O_WRONLY | os.O_CREAT, block_size=BLOCK)
            return FileWriter(core, reply), bytearray()

        @precondition(lambda self: len(self.open) < MAX_OPEN)
        @rule(n=st.integers(1, 3))
        def open_writers(self, n: int) -> None:
            for _ in range(min(n, MAX_OPEN - len(self.open))):
                self.open.append(self._new_writer())

        @precondition(lambda self: self.open or self.readers)
        @rule(data=st.data())
        def concurrent_step(self, data: st.DataObject) -> None:
            """Writes to several open files and reads of closed ones, all at once; a file
            gets at most one action per step (one writer thread per file, as the kernel
            sends a file's writes one after another)."""
            actions: list[typing.Callable[[], None]] = []
            for w, model in self.open:
                if not data.draw(st.booleans()):
                    continue
                offset = data.draw(st.integers(0, FILE_MAX - 1))
                length = data.draw(st.sampled_from([28, 4096, MiB, MiB + 28, 2 * MiB, BLOCK]))
                length = min(length, FILE_MAX - offset)
                payload = os.urandom(length)
                if len(model) < offset + length:
                    model.extend(bytes(offset + length - len(model)))
                model[offset:offset + length] = payload
                actions.append(lambda w=w, o=offset, p=payload: self._write(w, o, p))
            for r, ino in self.readers:
                if data.draw(st.booleans()):
                    actions.append(lambda r=r, ino=ino: self._check_read(r, ino))
            run_at_once(actions, client)

        def _write(self, w: FileWriter, offset: int, payload: bytes) -> None:
            try:
                w.pwrite(offset, payload)
            except CurvineError:
                if not self.faulted:
                    raise

        def _check_read(self, r: FileReader, ino: int) -> None:
            want = self.closed[ino]
            got = bytearray(len(want))
            assert r.pread(0, memoryview(got)) == len(want)
            assert bytes(got) == want, f"inode {ino}: read back other bytes than were written"

        @precondition(lambda self: self.open)
        @rule(data=st.data())
        def close_some(self, data: st.DataObject) -> None:
            picked = data.draw(st.lists(st.sampled_from(range(len(self.open))), min_size=1, unique=True))
            closing = [self.open[i] for i in picked]
            self.open = [x for i, x in enumerate(self.open) if i not in picked]
            results: dict[int, bytes | None] = {}

            def close(w: FileWriter, model: bytearray) -> None:
                try:
                    w.close()
                    results[w.ino] = bytes(model)
                except CurvineError:
                    if not self.faulted:
                        raise
                    results[w.ino] = None   # failed whole: the file keeps its last commit (empty)

            run_at_once([lambda w=w, m=m: close(w, m) for w, m in closing], client)
            for ino, content in results.items():
                if content is not None:
                    self.closed[ino] = content
                    self.readers.append((FileReader(core, core.meta.open(ino, os.O_RDONLY, write=False)), ino))

        @precondition(lambda self: self.readers)
        @rule()
        def drop_readers(self) -> None:
            for r, _ in self.readers:
                r.close()
            self.readers = []

        @precondition(lambda self: self.open)
        @rule(worker=st.integers(0, 2))
        def worker_fails_and_returns(self, worker: int) -> None:
            """A worker dies while files are open part-written, and comes back."""
            self.faulted = True
            cluster.kill_worker(worker)
            cluster.restart_worker(worker)

        def teardown(self) -> None:
            for w, _ in self.open:
                try:
                    w.close()
                except CurvineError:
                    w.abort()
            for r, _ in self.readers:
                r.close()
            for pool in core.pools():
                s = pool.stats()
                assert s.free == s.created and s.waiters == 0, f"buffers not given back: {s}"

    return PoolStates


def test_no_interleaving_leaves_a_waiter_nothing_wakes(cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(workers=3)
    cfg = client_config(cluster)
    cfg.client.buffer_pool_bytes = 3 * BLOCK
    cfg.client.data_timeout_s = 5.0
    with Client(master=cluster.master_address, config=cfg) as client:
        machine = make_machine(cluster, client)
        machine.TestCase.settings = settings(max_examples=8, stateful_step_count=12, deadline=None,
                                             suppress_health_check=list(HealthCheck))
        machine.TestCase().runTest()
