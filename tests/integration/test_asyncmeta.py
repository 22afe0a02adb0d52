"""The mount's master client on its trio loop (client/asyncmeta.py) against a real master:
the same answers as the threads' client, the master's errnos as CurvineError, its own
route learning, and retries (never a wrong answer) while the master cannot be reached."""
from __future__ import annotations

import errno
import signal
import socket
import time
import typing
from pathlib import Path

import pytest
import trio

from curvine_py.client.asyncmeta import AsyncMeta
from curvine_py.common.errors import Unreached
from curvine_py.client.metaclient import MasterClient
from curvine_py.common.errors import CurvineError
from curvine_py.cluster.local import LocalCluster
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master
from tests.conftest import client_config, start_cluster

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client


def test_answers_match_the_thread_client(client: "Client", remote_dir: str) -> None:
    client.put_bytes(f"{remote_dir}/f", b"x" * 1000)
    parent = client.stat(remote_dir).ino
    client.meta.call(Master.StatFs, pb.Empty())   # the threads' client learns the frame route
    route = client.meta.frame_route()
    assert route is not None and route[1] > 0
    fast = AsyncMeta(client.meta)

    async def main() -> None:
        for _ in range(3):   # the connection is reused between calls
            got = (await fast.call(Master.Lookup, client.meta.lookup_request(parent, "f"), 5)).attr
            assert got == client.meta.lookup(parent, "f")
        assert len(fast._idle) == 1
        attr = (await fast.call(Master.GetAttr, client.meta.getattr_request(parent), 5)).attr
        assert attr.ino == parent and attr.mode == client.stat(remote_dir).mode
        with pytest.raises(CurvineError) as e:   # an answer, not a transport failure
            await fast.call(Master.Lookup, client.meta.lookup_request(parent, "missing"), 5)
        assert e.value.errno == errno.ENOENT
        assert len(fast._idle) == 1            # and the connection is still good

        async def one(i: int) -> None:
            assert (await fast.call(Master.Lookup, client.meta.lookup_request(parent, "f"), 5)).attr.size == 1000
        async with trio.open_nursery() as nursery:   # concurrent calls: one connection each
            for i in range(5):
                nursery.start_soon(one, i)
        fast.close()
    trio.run(main)


def test_a_sent_call_is_answered_later_and_its_connection_reused(client: "Client", remote_dir: str) -> None:
    """send() puts the request on the wire and returns; the master applies it whether or
    not the reply is awaited yet (the mount answers the kernel in between)."""
    parent = client.stat(remote_dir).ino
    client.meta.call(Master.StatFs, pb.Empty())
    fast = AsyncMeta(client.meta)
    req = client.meta.mknod_request(parent, "made", 0o100644, 0, 0)

    async def main() -> None:
        pending = await fast.send(Master.Mknod, req, 5)
        assert len(fast._idle) == 0   # the connection is the pending call's until its reply
        with trio.fail_after(5):      # applied before anyone awaits the reply
            while True:
                try:
                    client.meta.lookup(parent, "made")
                    break
                except CurvineError:
                    await trio.sleep(0.01)
        assert (await pending.reply()).attr.ino == client.meta.lookup(parent, "made").ino
        assert len(fast._idle) == 1
        with pytest.raises(CurvineError) as e:   # the same name again: the master's answer, later
            await (await fast.send(Master.Mknod, client.meta.mknod_request(parent, "made", 0o100644, 0, 0), 5)).reply()
        assert e.value.errno == errno.EEXIST and len(fast._idle) == 1
        fast.close()
    trio.run(main)


def test_a_client_that_knows_no_route_learns_it_itself(shared_cluster: LocalCluster) -> None:
    """A fresh client: the loop's first call asks the master for its frame port (GetRing,
    the one thread hop), then calls over frames."""
    meta = MasterClient(shared_cluster.master_address, client_config(shared_cluster).client, shared_cluster.secret)
    assert meta.frame_route() is None

    async def main() -> None:
        fast = AsyncMeta(meta)
        assert (await fast.call(Master.GetAttr, meta.getattr_request(1))).attr.ino == 1
        assert meta.frame_route() is not None
        fast.close()
    trio.run(main)
    meta.close()


def test_no_server_is_retried_until_retry_s_then_one_error(client: "Client") -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()                                   # nothing listens there now
    req = client.meta.getattr_request(1)
    saved = client.meta.cfg.retry_s
    client.meta.cfg.retry_s = 0.5

    async def main() -> None:
        fast = AsyncMeta(client.meta, lambda: ("127.0.0.1", port, ""))
        waits: list[int] = []
        fast.before_wait = lambda: waits.append(1)
        t0 = trio.current_time()
        with pytest.raises(CurvineError) as e:
            await fast.call(Master.GetAttr, req, 5)
        assert e.value.errno == errno.EHOSTDOWN and f"127.0.0.1:{port}" in str(e.value)
        assert 0.4 < trio.current_time() - t0 < 3 and len(waits) >= 2

        def give_up() -> None:   # the mount's watchdog: a request given up stops retrying
            raise RuntimeError("given up")
        fast.before_wait = give_up
        with pytest.raises(RuntimeError):
            await fast.call(Master.GetAttr, req, 5)
        with pytest.raises(Unreached):   # send() is one attempt
            await fast.send(Master.GetAttr, req, 5)
    try:
        trio.run(main)
    finally:
        client.meta.cfg.retry_s = saved


def test_wrong_secret_is_an_error_not_a_fallback(shared_cluster: LocalCluster, client: "Client") -> None:
    client.meta.call(Master.StatFs, pb.Empty())
    route = client.meta.frame_route()
    assert route is not None
    fast = AsyncMeta(client.meta, lambda: (route[0], route[1], "not-the-secret"))
    req = client.meta.getattr_request(1)

    async def main() -> None:
        for _ in range(2):
            with pytest.raises(CurvineError) as e:
                await fast.call(Master.GetAttr, req, 5)
            assert e.value.errno == errno.EACCES and "secret" in str(e.value)
            assert not fast._idle   # the refused connection is not kept
    trio.run(main)


def test_a_silent_server_is_a_timeout_retried_then_etimedout(client: "Client") -> None:
    """A peer that accepts but never says hello (a partitioned or wedged master)."""
    saved = client.meta.cfg.retry_s
    client.meta.cfg.retry_s = 1.0
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]

        async def main() -> None:
            with trio.fail_after(5):
                with pytest.raises(CurvineError) as e:
                    await AsyncMeta(client.meta, lambda: ("127.0.0.1", port, "")).call(
                        Master.GetAttr, pb.InodeRequest(ino=1), 0.3)
                assert e.value.errno == errno.ETIMEDOUT
        try:
            trio.run(main)
        finally:
            client.meta.cfg.retry_s = saved



def test_an_attempt_waits_no_longer_than_retry_s_on_a_stopped_master(tmp_path: Path) -> None:
    """With the default rpc_timeout_s (30 s) and retry_s = 1 s, a master stopped (SIGSTOP)
    after both clients' connections were made fails each client's next call in about a
    second, not after one 30 s attempt: the threads' client and the mount loop's."""
    cluster = start_cluster(tmp_path / "c", workers=1)
    try:
        cfg = client_config(cluster)
        cfg.client.retry_s = 1.0
        assert cfg.client.rpc_timeout_s >= 30
        meta = MasterClient(cluster.master_address, cfg.client, cfg.cluster.secret)
        fast = AsyncMeta(meta)
        meta.call(Master.GetAttr, meta.getattr_request(1))       # the route is learned, a connection kept
        trio.run(fast.call, Master.GetAttr, meta.getattr_request(1))
        cluster.kill_master(signal.SIGSTOP, wait=False)
        try:
            t0 = time.monotonic()
            with pytest.raises(CurvineError) as e:
                meta.call(Master.GetAttr, meta.getattr_request(1))
            assert e.value.errno == errno.ETIMEDOUT and time.monotonic() - t0 < 6, time.monotonic() - t0

            async def main() -> None:
                with trio.fail_after(6):
                    with pytest.raises(CurvineError) as e:
                        await fast.call(Master.GetAttr, meta.getattr_request(1))
                    assert e.value.errno == errno.ETIMEDOUT
            trio.run(main)
        finally:
            cluster.kill_master(signal.SIGCONT, wait=False)
        fast.close()
        meta.close()
    finally:
        cluster.stop()
