"""A writer closed by one Commit that the mount sends from its event loop
(FileWriter.close_request_nowait / close_sent): only when nothing is left to ship or
wait for, and a failed Commit leaves the writer able to close the ordinary way."""
from __future__ import annotations

import errno
import os
import stat
import typing

import pytest

from curvine_py.client.writer import FileWriter
from curvine_py.common.errors import CurvineError
from curvine_py.pb.methods import Master, Method

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client

MiB = 1 << 20


def new_writer(client: "Client", path: str) -> FileWriter:
    parent = client.stat(os.path.dirname(path)).ino
    reply = client.meta.create(parent, os.path.basename(path), stat.S_IFREG | 0o644, os.O_WRONLY | os.O_CREAT)
    return FileWriter(client.core, reply)


def test_an_unwritten_file_closes_with_one_commit(client: "Client", remote_dir: str) -> None:
    w = new_writer(client, f"{remote_dir}/empty")
    req = w.close_request_nowait()
    assert req is not None and req.release and w.closed
    client.meta.call(Master.Commit, req)
    w.close_sent(ok=True)
    assert w.closed and w.lease_id not in client.core.leases
    st = client.stat(f"{remote_dir}/empty")
    assert st.size == 0 and st.complete
    with client.open(f"{remote_dir}/empty", "ab") as f:   # the lease is free for the next writer
        f.write(b"next")
    assert client.get_bytes(f"{remote_dir}/empty") == b"next"


def test_landed_blocks_are_committed_by_it(client: "Client", remote_dir: str) -> None:
    data = os.urandom(5 * MiB + 3)
    w = new_writer(client, f"{remote_dir}/landed")
    w.pwrite(0, data[:MiB + 1])
    assert w.close_request_nowait() is None and not w.closed   # a dirty block: close() must ship it
    w.pwrite(MiB + 1, data[MiB + 1:])
    w.flush()                                                    # everything shipped and committed
    w.pwrite(len(data), b"!")
    w.flush()
    req = w.close_request_nowait()
    assert req is not None and req.size == len(data) + 1
    client.meta.call(Master.Commit, req)
    w.close_sent(ok=True)
    assert client.get_bytes(f"{remote_dir}/landed") == data + b"!"


def test_a_failed_commit_reopens_the_writer_for_an_ordinary_close(client: "Client", remote_dir: str) -> None:
    w = new_writer(client, f"{remote_dir}/retry")
    w.pwrite(0, b"kept")
    w.flush()
    w.pwrite(4, b" and more")
    w.flush()
    req = w.close_request_nowait()
    assert req is not None
    req.lease_id += 1000                       # the master refuses a lease that is not this file's
    with pytest.raises(CurvineError) as e:
        client.meta.call(Master.Commit, req)
    assert e.value.errno in (errno.EBADF, errno.EPERM, errno.EBUSY, errno.ESTALE, errno.EINVAL)
    w.close_sent(ok=False)
    assert not w.closed and w.lease_id in client.core.leases
    w.close()                                  # the ordinary close still works
    assert client.get_bytes(f"{remote_dir}/retry") == b"kept and more"


def test_a_close_after_in_order_writes_lands_its_streamed_blocks_without_a_flush(client: "Client",
                                                                                   remote_dir: str) -> None:
    """The KV chunk's close on the mount's loop: land_nowait finishes the streams of the
    blocks written in order (no thread, no block id to ask for), and once they are on
    their workers one Commit closes the file."""
    data = os.urandom(3 * MiB + 5)
    w = new_writer(client, f"{remote_dir}/streamed")
    for off in range(0, len(data), 256 * 1024):
        w.pwrite(off, data[off:off + 256 * 1024])
    assert w.streams, "in-order writes stream their block"
    landing = w.land_nowait()
    assert landing is not None and not w.dirty and not w.closed
    for f in landing:
        f.result(30)
    req = w.close_request_nowait()
    assert req is not None and req.size == len(data)
    client.meta.call(Master.Commit, req)
    w.close_sent(ok=True)
    assert client.get_bytes(f"{remote_dir}/streamed") == data


def test_a_close_after_a_write_out_of_order_is_left_to_the_flush(client: "Client", remote_dir: str) -> None:
    w = new_writer(client, f"{remote_dir}/gap")
    w.pwrite(MiB, b"after a hole")   # the block's start was never written: its bytes are read first
    assert w.land_nowait() is None and w.dirty
    w.close()
    assert client.get_bytes(f"{remote_dir}/gap") == bytes(MiB) + b"after a hole"


def test_the_vfs_close_of_a_chunk_written_in_order_is_landed_then_committed(client: "Client",
                                                                             remote_dir: str) -> None:
    """VFS.flush of that chunk, driven as the mount drives it: a Landed step and one Commit,
    no Blocking step (no thread hop), and the file complete."""
    import trio

    from curvine_py.client.vfs import VFS, Blocking, Landed

    vfs = client.vfs
    me = client.meta.identity
    parent = client.stat(remote_dir).ino
    data = os.urandom(3 * MiB + 5)
    opened = vfs.run(vfs.create(parent, "chunk", 0o644, os.O_WRONLY | os.O_CREAT, 0o022, me))
    for off in range(0, len(data), 256 * 1024):
        vfs.write(opened.fh, off, data[off:off + 256 * 1024])
    steps: list[str] = []

    async def call(method: Method[typing.Any, typing.Any], request: typing.Any) -> typing.Any:
        steps.append(method.name)
        return client.meta.call(method, request)

    async def blocking(fn: typing.Callable[..., typing.Any], *args: typing.Any) -> typing.Any:
        steps.append("Blocking")
        return fn(*args)

    async def landed(futures: list[typing.Any]) -> None:
        steps.append("Landed")
        for f in futures:
            f.result(30)

    async def close() -> None:
        await VFS.drive(vfs.flush(opened.fh), call, blocking, landed)
    trio.run(close)
    vfs.run(vfs.release(opened.fh))
    assert steps == ["Landed", "Commit"], steps
    assert issubclass(Landed, Blocking)   # VFS.run (the SDK) waits for the same step in its thread
    assert client.get_bytes(f"{remote_dir}/chunk") == data
