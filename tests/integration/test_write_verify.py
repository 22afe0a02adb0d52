"""Every block is checked against the writes acknowledged into it before it is committed
(client/dirtyblock.py records, FileWriter._verified), on a real cluster through the SDK.

Bytes a block's buffer lost fail the close with EIO: nothing is committed, the event is
logged at ERROR with the file's bytes and counted; bytes that went out wrong from a right
buffer are sent again and the file is exact.  (The streamed case, whose sent bytes the
stream hashes: tests/integration/test_streamed_writes.py.)
"""
from __future__ import annotations

import errno
import logging
import os
import typing

import pytest

from curvine_py import Client, CurvineError
from curvine_py.client import metrics
from curvine_py.client import writer as writermod
from tests.integration.test_streamed_writes import check_blocks, writer_of

MiB = 1 << 20


def failures(outcome: str) -> float:
    return typing.cast(float, metrics.WRITE_VERIFY_FAILURES.labels(outcome)._value.get())


def test_a_lost_byte_of_an_out_of_order_block_fails_the_close(client: Client, caplog: pytest.LogCaptureFixture
                                                               ) -> None:
    """Writes that leave gaps (no stream: the block is shipped whole at close, its gaps
    filled); a byte of one write changed in the buffer before the ship."""
    client.put_bytes("/lost", b"before")
    data = os.urandom(3 * MiB)
    lost_before = failures("lost")
    with caplog.at_level(logging.ERROR, logger="curvine_py.client.writer"):
        with pytest.raises(CurvineError) as e:
            with client.open("/lost", "wb") as f:
                f.seek(2 * MiB)
                f.write(data[2 * MiB:])
                f.seek(100)
                f.write(data[100:MiB])
                assert not writer_of(f).streams
                writer_of(f).dirty[0].view[2 * MiB + 7] ^= 0xFF
    assert e.value.errno == errno.EIO
    assert client.get_bytes("/lost") in (b"", b"before")   # truncated by the open, or as before
    assert failures("lost") == lost_before + 1
    assert any("/lost" in r.getMessage() and f"[{2 * MiB}, {3 * MiB})" in r.getMessage() for r in caplog.records)


def test_bytes_that_went_out_wrong_are_sent_again(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ship of a block stores other bytes than its buffer's (what a buffer
    handed to two owners, or a send path bug, would do); the check sees the workers'
    checksum differ from the records while the buffer still holds them: sent again."""
    real = writermod.store_block
    spoiled: list[int] = []

    def spoil_once(core: typing.Any, offset: int, data: memoryview, target: typing.Any, owned: typing.Any,
                   elsewhere: typing.Any) -> typing.Any:
        if spoiled:
            return real(core, offset, data, target, owned, elsewhere)
        copy = bytearray(data)
        copy[12345] ^= 1
        spoiled.append(offset)
        return real(core, offset, memoryview(copy), target, None, elsewhere)

    monkeypatch.setattr(writermod, "store_block", spoil_once)
    data = os.urandom(5 * MiB + 99)
    resent_before = failures("resent")
    with client.open("/resent", "wb") as f:
        f.seek(MiB)            # out of order: shipped whole, through store_block
        f.write(data[MiB:])
        f.seek(0)
        f.write(data[:MiB])
    assert spoiled and failures("resent") == resent_before + 1
    check_blocks(client, "/resent", data)


def test_a_closed_writer_refuses_a_write(client: Client) -> None:
    """The lost write's path (issue 37): a write that reaches a writer another close has
    closed raises WriterClosed -- taken in, nothing would ever ship it."""
    with client.open("/closed", "wb") as f:
        f.write(b"x" * 1000)
        w = writer_of(f)
        w.close()   # what another descriptor's close does in the mount
        with pytest.raises(writermod.WriterClosed):
            w.pwrite(1000, b"y")
        with pytest.raises(writermod.WriterClosed):
            w.truncate(10)
    assert client.get_bytes("/closed") == b"x" * 1000
