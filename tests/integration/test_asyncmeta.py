"""The mount's loop-side master client (client/asyncmeta.py) against a real master:
the same answers as the threads' client, the master's errnos as CurvineError, and
FastPathUnavailable (never a wrong answer) whenever the call must take the thread path."""
from __future__ import annotations

import errno
import socket
import typing

import pytest
import trio

from curvine_py.client.asyncmeta import AsyncMeta, FastPathUnavailable
from curvine_py.common.errors import CurvineError
from curvine_py.localcluster import LocalCluster
from curvine_py.pb import curvine_pb2 as pb

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client


def test_answers_match_the_thread_client(client: "Client", remote_dir: str) -> None:
    client.put_bytes(f"{remote_dir}/f", b"x" * 1000)
    parent = client.stat(remote_dir).ino
    client.meta.call("StatFs", pb.Empty())   # the threads' client learns the frame route
    route = client.meta.frame_route()
    assert route is not None and route[1] > 0
    fast = AsyncMeta(client.meta.frame_route)

    async def main() -> None:
        for _ in range(3):   # the connection is reused between calls
            got = (await fast.call("Lookup", client.meta.lookup_request(parent, "f"), 5)).attr
            assert got == client.meta.lookup(parent, "f")
        assert len(fast._idle) == 1
        attr = (await fast.call("GetAttr", client.meta.getattr_request(parent), 5)).attr
        assert attr.ino == parent and attr.mode == client.stat(remote_dir).mode
        with pytest.raises(CurvineError) as e:   # an answer, not a transport failure
            await fast.call("Lookup", client.meta.lookup_request(parent, "missing"), 5)
        assert e.value.errno == errno.ENOENT
        assert len(fast._idle) == 1            # and the connection is still good

        async def one(i: int) -> None:
            assert (await fast.call("Lookup", client.meta.lookup_request(parent, "f"), 5)).attr.size == 1000
        async with trio.open_nursery() as nursery:   # concurrent calls: one connection each
            for i in range(5):
                nursery.start_soon(one, i)
        fast.close()
    trio.run(main)


def test_a_sent_call_is_answered_later_and_its_connection_reused(client: "Client", remote_dir: str) -> None:
    """send() puts the request on the wire and returns; the master applies it whether or
    not the reply is awaited yet (the mount answers the kernel in between)."""
    parent = client.stat(remote_dir).ino
    client.meta.call("StatFs", pb.Empty())
    fast = AsyncMeta(client.meta.frame_route)
    req = client.meta.mknod_request(parent, "made", 0o100644, 0, 0)

    async def main() -> None:
        pending = await fast.send("Mknod", req, 5)
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
            await (await fast.send("Mknod", client.meta.mknod_request(parent, "made", 0o100644, 0, 0), 5)).reply()
        assert e.value.errno == errno.EEXIST and len(fast._idle) == 1
        fast.close()
    trio.run(main)


def test_no_route_or_no_server_means_the_thread_path(client: "Client") -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()                                   # nothing listens there now
    req = client.meta.getattr_request(1)

    async def main() -> None:
        with pytest.raises(FastPathUnavailable):
            await AsyncMeta(lambda: None).call("GetAttr", req, 5)
        with pytest.raises(FastPathUnavailable):
            await AsyncMeta(lambda: ("127.0.0.1", port, "")).call("GetAttr", req, 5)
    trio.run(main)


def test_wrong_secret_is_an_error_not_a_fallback(shared_cluster: LocalCluster, client: "Client") -> None:
    client.meta.call("StatFs", pb.Empty())
    route = client.meta.frame_route()
    assert route is not None
    fast = AsyncMeta(lambda: (route[0], route[1], "not-the-secret"))
    req = client.meta.getattr_request(1)

    async def main() -> None:
        for _ in range(2):
            with pytest.raises(CurvineError) as e:
                await fast.call("GetAttr", req, 5)
            assert e.value.errno == errno.EACCES and "secret" in str(e.value)
            assert not fast._idle   # the refused connection is not kept
    trio.run(main)


def test_a_silent_server_times_out_into_the_thread_path() -> None:
    """A peer that accepts but never says hello (a partitioned or wedged master)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]

        async def main() -> None:
            with trio.fail_after(5):
                with pytest.raises(FastPathUnavailable):
                    await AsyncMeta(lambda: ("127.0.0.1", port, "")).call(
                        "GetAttr", pb.InodeRequest(ino=1), 0.3)
        trio.run(main)
