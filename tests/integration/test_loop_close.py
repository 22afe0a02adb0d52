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
    client.meta.call("Commit", req)
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
    client.meta.call("Commit", req)
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
        client.meta.call("Commit", req)
    assert e.value.errno in (errno.EBADF, errno.EPERM, errno.EBUSY, errno.ESTALE, errno.EINVAL)
    w.close_sent(ok=False)
    assert not w.closed and w.lease_id in client.core.leases
    w.close()                                  # the ordinary close still works
    assert client.get_bytes(f"{remote_dir}/retry") == b"kept and more"
