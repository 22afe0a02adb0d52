"""The mount's policy at lookups and opens (``MountOpens``), given to the VFS by the mount.

The VFS asks it what a lookup should ask the master for, what to start after a lookup,
and what an open hands the kernel: the local replica's block file or a staged copy to
read by itself, and whether the kernel caches a file's pages.  The SDK gives the VFS
none of it (client/vfs.py ``SdkOpens``), so a program reading through the SDK starts no
check ahead, fetch ahead or staging, and reads no ``[fuse]`` setting.

A file under a KV directory (``Attr.kv``, docs/kvcache.md) is one block, so a mount on a
replica's host hands it to the kernel by passthrough with default settings.  Staging it
from a remote host at its open, per file, was tried and left out: with 96 chunks opened at
once (LMCache's retrieve) the reads took 150 s against 40 s without it, and the fetch at
lookup had lost the same way (issue 43); both stay ``fuse.stage_remote``/``fetch_ahead``.
"""
from __future__ import annotations

import stat
import typing

from curvine_py.client.core import ClientCore
from curvine_py.client.mount import staging
from curvine_py.client.mount.fetchahead import FetchAhead, readable
from curvine_py.client.mount.localfiles import LocalFiles, one_block
from curvine_py.client.mount.lookups import Lookups
from curvine_py.client.mount.staging import Staged, StagedBlocks
from curvine_py.client.reader import FileReader
from curvine_py.pb import curvine_pb2 as pb


class MountOpens:
    """Which files the kernel reads itself and which blocks are fetched ahead, with the
    kernel cache modes, from the ``[fuse]`` section (docs/config.md)."""

    def __init__(self, core: ClientCore) -> None:
        fuse = core.cfg.fuse
        self.core = core
        # The kernel asks for a directory's attributes again after every create/unlink in
        # it (it invalidates them): the VFS answers from what its own change returned.
        self.dir_attr_ttl = fuse.attr_timeout_s
        self.direct_reads = fuse.direct_io_reads
        self.direct_creates = fuse.direct_io_creates
        self.lookups = Lookups()   # running ones: the checks and fetches ahead start in their pauses
        self.local = LocalFiles(core, fuse.verify_ahead, self.lookups)   # files the kernel may read itself
        self.ahead = FetchAhead(core, lookups=self.lookups) if fuse.fetch_ahead else None   # blocks fetched at lookups
        self.stage: StagedBlocks | None = None   # remote blocks staged for the kernel (start_passthrough)

    def start_passthrough(self) -> None:
        """The kernel took FUSE passthrough (fuse/passthrough.py): hand it local replicas'
        block files, and stage remote blocks when fuse.stage_remote is on."""
        self.local.enabled = True
        self.core.executor.submit(self.local.warm)
        if self.core.cfg.fuse.stage_remote:
            self.stage = staging.start(self.core, self.lookups)

    @property
    def one_block(self) -> bool:
        """Should a lookup ask for a one-block file's block (to check or fetch it ahead)?"""
        return self.local.wanted or self.ahead is not None

    @property
    def staged_bytes(self) -> int:
        """Bytes of remote blocks staged for the kernel now (curvine_client_staged_bytes)."""
        return self.stage.staged_bytes if self.stage is not None else 0

    def looking_up(self) -> Lookups:
        """The context of a lookup's call to the master: no fetch ahead starts meanwhile."""
        return self.lookups

    def after_lookup(self, attr: pb.Attr, blocks: typing.Sequence[pb.BlockInfo]) -> None:
        """A one-block file looked up: its local block checked ahead, or its remote one
        fetched or staged ahead.  On the mount's event loop at each stat of a run (most
        answered by a listing, VFS._listed_lookup), so whether the block is local is asked
        once here (BlockPaths.local_replica), not by each of them: ~40-65 us -> ~10 per
        lookup (docs/kvcache.md)."""
        block = one_block(attr, blocks)
        if block is None or not stat.S_ISREG(attr.mode):
            return
        if self.core.paths.local_replica(block) is not None:
            if self.local.enabled:   # (LocalFiles.block_of's test; the kernel reads it by passthrough)
                self.local.check_ahead(attr, block)
            return
        if readable(self.core, block) is None:
            return
        if self.stage is not None and self.stage.ahead:   # (fetch_ahead: the kernel reads what is staged)
            self.stage.stage_ahead(attr, block)
        elif self.ahead is not None:
            self.ahead.fetch_ahead(attr, block)

    def opened(self, ino: int, reader: FileReader, reply: pb.OpenReply, flags: int,
               prefetch: bool) -> tuple[pb.BlockInfo | None, Staged | None]:
        """A read-only open: a block fetched ahead goes to its reader, and the file's block
        the kernel will read by itself, a local replica's or a staged copy (or neither)."""
        if self.ahead is not None:
            self.ahead.hand_over(reader)
        self.lookups.opened()   # the reads begin: the other fetches ahead need not wait out a pause
        local = self.local.block_of(reply.attr, reply.blocks, flags)
        if local is not None or not prefetch or self.stage is None:
            return local, None
        block = self.stage.block_of(reply.attr, reply.blocks, flags)
        return None, self.stage.acquire(ino, block) if block is not None else None

    def staged_file(self, staged: Staged) -> int | None:
        """A descriptor of the staged copy (fetched now if it is not yet); None if that fails."""
        return self.stage.file_of(staged) if self.stage is not None else None

    def release(self, staged: Staged) -> None:
        if self.stage is not None:
            self.stage.release(staged)

    def drop_unused(self) -> int:
        """Drop staged copies and blocks fetched ahead that nothing uses; bytes of staged copies."""
        dropped = self.stage.drop_unused() if self.stage is not None else 0
        if self.ahead is not None:
            while self.ahead.reclaim():
                pass
        return dropped

    def stop_staging(self) -> None:
        stage, self.stage = self.stage, None
        if stage is not None:
            stage.close()

    def close(self) -> None:
        self.local.close()
        if self.ahead is not None:
            self.ahead.close()
        self.stop_staging()
