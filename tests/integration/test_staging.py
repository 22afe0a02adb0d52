"""Remote one-block files staged in memory for the kernel (client/mount/staging.py,
fuse.stage_remote), through a real local cluster: the mount's own VFS on a host with no
worker, then a real mount whose reads of such files the kernel serves from the staged
copy (FUSE passthrough).  A staged copy holds the block's bytes and nothing else, a file
rewritten is staged anew, memory stays within fuse.stage_bytes (blocks in use are kept,
what does not fit reads through the mount), a mapping of a dropped copy keeps its
bytes, and a drop of the caches (`cv bench --drop-caches`) drops the copies not in use."""
from __future__ import annotations

import errno
import json
import mmap
import os
import subprocess
import time
import typing
from pathlib import Path

import pytest

from curvine_py.cli.bench.workloads import DROP_CACHES_XATTR, drop_caches
from curvine_py.cli.stats import scrape
from curvine_py.client.mount import staging
from curvine_py.client.mount.policy import MountOpens
from curvine_py.client.mount.staging import AHEAD_LIMIT
from curvine_py.client.vfs import VFS
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.sdk import Client
from curvine_py.pb.methods import Master
from tests.conftest import CV, FAST_MASTER_FLAGS, client_config
from tests.integration.test_verify_ahead import lookup, opens_of
from tests.pyfuse3_features import needs_passthrough

MiB = 1 << 20
SIZE = 3 * MiB + 5          # one block of the default 4 MiB


def make_vfs(cluster: LocalCluster, budget: int) -> tuple[Client, VFS]:
    """A mount's VFS on a host with no worker, staging (as fuse/passthrough.start makes it)."""
    cfg = client_config(cluster)
    cfg.client.host = "no-worker-here"
    cfg.fuse.fetch_ahead = True
    cfg.fuse.stage_remote = True
    cfg.fuse.stage_bytes = budget
    client = Client(master=cluster.master_address, config=cfg)
    opens = MountOpens(client.core)
    vfs = VFS(client.core, opens=opens)
    opens.local.enabled = True
    opens.stage = staging.start(client.core)
    if opens.stage is None:
        vfs.close()
        client.close()
        pytest.skip("no huge-page tmpfs here (fsopen/fsmount refused): nothing is staged")
    return client, vfs


@pytest.fixture
def stage_vfs(shared_cluster: LocalCluster) -> typing.Iterator[VFS]:
    client, vfs = make_vfs(shared_cluster, 8 * MiB)
    try:
        yield vfs
    finally:
        vfs.close()
        client.close()


def stage_of(vfs: VFS) -> staging.StagedBlocks:
    stage = opens_of(vfs).stage
    assert stage is not None
    return stage


def backing_bytes(vfs: VFS, ino: int) -> bytes | None:
    """Open ino as the mount does, read the file the kernel would be given (None: not
    staged, read through the mount), release."""
    opened = vfs.run(vfs.open(ino, os.O_RDONLY, vfs.meta.identity))
    try:
        if not opened.backed:
            return None
        fd = vfs.backing_file(opened.fh)
        assert fd is not None
        try:
            return os.pread(fd, 2 * SIZE, 0)
        finally:
            os.close(fd)
    finally:
        vfs.run(vfs.release(opened.fh))


def test_an_open_is_answered_with_a_staged_copy_kept_after_its_close(stage_vfs: VFS, client: Client,
                                                                     remote_dir: str) -> None:
    data = os.urandom(SIZE)
    client.put_bytes(f"{remote_dir}/chunk", data)
    stage = stage_of(stage_vfs)
    attr = lookup(stage_vfs, f"{remote_dir}/chunk")
    assert backing_bytes(stage_vfs, attr.ino) == data          # the block's bytes, no more
    assert stage.staged_bytes == SIZE                          # kept after the close
    (entry,) = stage._table.values()
    assert backing_bytes(stage_vfs, attr.ino) == data          # the second open: the same copy
    assert list(stage._table.values()) == [entry] and entry.users == 0


def test_a_lookup_stages_the_block_before_the_open(stage_vfs: VFS, client: Client, remote_dir: str) -> None:
    data = os.urandom(SIZE)
    client.put_bytes(f"{remote_dir}/chunk", data)
    attr = lookup(stage_vfs, f"{remote_dir}/chunk")
    (entry,) = stage_of(stage_vfs)._table.values()
    entry.done.result(timeout=10)                              # fetched by the lookup's queue
    assert backing_bytes(stage_vfs, attr.ino) == data


def test_lookups_beyond_the_limit_are_staged_as_earlier_ones_are_opened(shared_cluster: LocalCluster,
                                                                         client: Client, remote_dir: str) -> None:
    """LMCache looks up every chunk of a prompt first: AHEAD_LIMIT of them are staged, the
    rest remembered, and each open of a staged one lets the next looked-up one in."""
    owner, vfs = make_vfs(shared_cluster, 64 * MiB)
    try:
        files = [os.urandom(MiB + i) for i in range(AHEAD_LIMIT + 2)]
        inos = []
        for i, data in enumerate(files):
            client.put_bytes(f"{remote_dir}/c{i}", data)
            inos.append(lookup(vfs, f"{remote_dir}/c{i}").ino)
        stage = stage_of(vfs)
        assert sorted(e.ino for e in stage._table.values()) == sorted(inos[:AHEAD_LIMIT])
        assert len(stage._later) == 2
        for i, data in enumerate(files):
            assert backing_bytes(vfs, inos[i]) == data
            if i == 0:      # the first open let the ninth lookup in
                assert inos[AHEAD_LIMIT] in {e.ino for e in stage._table.values()}
        assert not stage._later
    finally:
        vfs.close()
        owner.close()


def test_a_lookup_without_a_read_token_stages_nothing(stage_vfs: VFS, client: Client, remote_dir: str) -> None:
    """A caller who may not read the file gets its block without a token (the master's
    Lookup): its open will fail, so nothing is fetched for it."""
    client.put_bytes(f"{remote_dir}/chunk", os.urandom(SIZE))
    meta = stage_vfs.meta
    request = meta.lookup_request(client.stat(remote_dir).ino, "chunk")
    request.one_block = True
    reply = meta.call(Master.Lookup, request)
    assert stage_vfs.core.cfg.cluster.secret and reply.blocks[0].token
    tokenless = pb.BlockInfo()
    tokenless.CopyFrom(reply.blocks[0])
    tokenless.token = ""
    stage = stage_of(stage_vfs)
    opens_of(stage_vfs).after_lookup(reply.attr, [tokenless])
    assert not stage._table and not stage._later
    opens_of(stage_vfs).after_lookup(reply.attr, list(reply.blocks))   # the same lookup with a token is staged
    assert [e.ino for e in stage._table.values()] == [reply.attr.ino]


def test_a_rewritten_file_is_staged_anew(stage_vfs: VFS, client: Client, remote_dir: str) -> None:
    old, new = os.urandom(SIZE), os.urandom(SIZE - 7)
    client.put_bytes(f"{remote_dir}/chunk", old)
    ino = lookup(stage_vfs, f"{remote_dir}/chunk").ino
    assert backing_bytes(stage_vfs, ino) == old
    client.put_bytes(f"{remote_dir}/chunk", new)
    assert backing_bytes(stage_vfs, lookup(stage_vfs, f"{remote_dir}/chunk").ino) == new


def test_memory_stays_within_the_budget_and_blocks_in_use_stay(stage_vfs: VFS, client: Client,
                                                              remote_dir: str) -> None:
    """Budget 8 MiB, blocks of 3 MiB: two fit.  Unused ones go least recently used first;
    with two held open, a third file reads through the mount, byte-exact."""
    files = {f"c{i}": os.urandom(SIZE) for i in range(3)}
    inos = {}
    for name, data in files.items():
        client.put_bytes(f"{remote_dir}/{name}", data)
        inos[name] = lookup(stage_vfs, f"{remote_dir}/{name}").ino
    stage = stage_of(stage_vfs)
    for name, data in files.items():
        assert backing_bytes(stage_vfs, inos[name]) == data
        assert stage.staged_bytes <= 8 * MiB
    assert [e.block.length for e in stage._table.values()] == [SIZE, SIZE]

    held = [stage_vfs.run(stage_vfs.open(inos[n], os.O_RDONLY, stage_vfs.meta.identity)) for n in ("c1", "c2")]
    try:
        assert all(o.backed for o in held)
        opened = stage_vfs.run(stage_vfs.open(inos["c0"], os.O_RDONLY, stage_vfs.meta.identity))
        try:
            assert not opened.backed                           # no room: read through the mount
            assert stage_vfs.read(opened.fh, 0, SIZE + 1) == files["c0"]
        finally:
            stage_vfs.run(stage_vfs.release(opened.fh))
    finally:
        for o in held:
            stage_vfs.run(stage_vfs.release(o.fh))
    assert stage.staged_bytes <= 8 * MiB


def test_a_drop_of_the_caches_drops_unused_copies_and_keeps_those_in_use(stage_vfs: VFS, client: Client,
                                                                          remote_dir: str) -> None:
    """What `cv bench --drop-caches` asks of a mount (fuse/ops.py DROP_CACHES_XATTR): a
    cold read must not find the mount's copies, but an open file keeps its own."""
    files = {f"c{i}": os.urandom(SIZE) for i in range(2)}
    inos = {}
    for name, data in files.items():
        client.put_bytes(f"{remote_dir}/{name}", data)
        inos[name] = lookup(stage_vfs, f"{remote_dir}/{name}").ino
        assert backing_bytes(stage_vfs, inos[name]) == data
    stage = stage_of(stage_vfs)
    assert stage.staged_bytes == 2 * SIZE
    held = stage_vfs.run(stage_vfs.open(inos["c1"], os.O_RDONLY, stage_vfs.meta.identity))
    try:
        assert held.backed
        assert stage_vfs.drop_caches() == SIZE
        assert stage.staged_bytes == SIZE and [e.ino for e in stage._table.values()] == [inos["c1"]]
    finally:
        stage_vfs.run(stage_vfs.release(held.fh))
    assert stage_vfs.drop_caches() == SIZE and stage.staged_bytes == 0
    assert backing_bytes(stage_vfs, inos["c0"]) == files["c0"]     # fetched again


def test_a_block_larger_than_the_budget_reads_through_the_mount(shared_cluster: LocalCluster, client: Client,
                                                                remote_dir: str) -> None:
    small, vfs = make_vfs(shared_cluster, 2 * MiB)
    try:
        data = os.urandom(SIZE)
        client.put_bytes(f"{remote_dir}/chunk", data)
        ino = lookup(vfs, f"{remote_dir}/chunk").ino
        opened = vfs.run(vfs.open(ino, os.O_RDONLY, vfs.meta.identity))
        try:
            assert not opened.backed
            assert vfs.read(opened.fh, 0, SIZE + 1) == data
        finally:
            vfs.run(vfs.release(opened.fh))
        assert stage_of(vfs).staged_bytes == 0
    finally:
        vfs.close()
        small.close()


def test_a_copy_that_cannot_be_made_leaves_the_file_read_through_the_mount(stage_vfs: VFS, client: Client,
                                                                            remote_dir: str) -> None:
    """A staging tmpfs too full for the block (ENOSPC when its space is reserved, never a
    SIGBUS through the mapping): the open's backing file is None, the handle reads the
    usual way, byte-exact, and nothing stays staged."""
    stage = stage_of(stage_vfs)
    os.close(stage.dirfd)
    stage.dirfd = staging.huge_tmpfs(1 * MiB)
    data = os.urandom(SIZE)
    client.put_bytes(f"{remote_dir}/chunk", data)
    ino = lookup(stage_vfs, f"{remote_dir}/chunk").ino
    opened = stage_vfs.run(stage_vfs.open(ino, os.O_RDONLY, stage_vfs.meta.identity))
    try:
        assert opened.backed
        assert stage_vfs.backing_file(opened.fh) is None
        assert stage_vfs.read(opened.fh, 0, SIZE + 1) == data
    finally:
        stage_vfs.run(stage_vfs.release(opened.fh))
    assert stage.staged_bytes == 0 and not stage._table


def test_a_mapping_of_a_dropped_copy_keeps_its_bytes(stage_vfs: VFS, client: Client, remote_dir: str) -> None:
    """A reader's mmap of a passthrough file maps the staged file itself: a copy is never
    rewritten, so the mapping outlives the copy's place in the table unchanged."""
    first = os.urandom(SIZE)
    client.put_bytes(f"{remote_dir}/first", first)
    ino = lookup(stage_vfs, f"{remote_dir}/first").ino
    opened = stage_vfs.run(stage_vfs.open(ino, os.O_RDONLY, stage_vfs.meta.identity))
    fd = stage_vfs.backing_file(opened.fh)
    assert fd is not None
    mapping = mmap.mmap(fd, SIZE, prot=mmap.PROT_READ)
    os.close(fd)
    stage_vfs.run(stage_vfs.release(opened.fh))
    try:
        for i in range(3):      # three more blocks push the first one out of an 8 MiB budget
            client.put_bytes(f"{remote_dir}/other{i}", os.urandom(SIZE))
            assert backing_bytes(stage_vfs, lookup(stage_vfs, f"{remote_dir}/other{i}").ino) is not None
        assert all(e.ino != ino for e in stage_of(stage_vfs)._table.values())
        assert mapping[:] == first
    finally:
        mapping.close()


@needs_passthrough
@pytest.mark.skipif(not fuse_available(), reason="no FUSE mount here")
def test_a_mount_with_no_replica_here_has_the_kernel_read_staged_copies(tmp_path: Path) -> None:
    """A real mount (short-circuit off: no replica counts as local) with stage_remote: reads,
    preads and an mmap of one-block files come back byte-exact, and the opens were
    answered with backing files (the passthrough count), none read by the mount."""
    c = LocalCluster(tmp_path / "cluster", workers=2, mount=str(tmp_path / "mnt"), die_with_parent=True,
                     extra_master_flags=FAST_MASTER_FLAGS,
                     env={"CURVINE_CLIENT_SHORT_CIRCUIT": "false", "CURVINE_FUSE_STAGE_REMOTE": "true",
                          "CURVINE_FUSE_FETCH_AHEAD": "true"}).start(timeout=60)
    try:
        log = Path(next(p.log for p in c.processes if p.name == "fuse"))
        if "not staged" in log.read_text():
            pytest.skip(log.read_text().split("not staged", 1)[1].splitlines()[0])
        files = {f"chunk{i}": os.urandom(SIZE - i) for i in range(4)}
        with Client(master=c.master_address, config=client_config(c)) as client:
            for name, data in files.items():
                client.put_bytes(f"/{name}", data)
        mnt = Path(c.mount or "")
        fuse = next(p.metrics for p in c.processes if p.name == "fuse")
        before = scrape(fuse)
        for name, data in files.items():
            assert (mnt / name).stat().st_size == len(data)   # the lookup stages it
            with open(mnt / name, "rb", buffering=0) as f:
                assert f.read() == data
                assert os.pread(f.fileno(), 4096, 1_000_000) == data[1_000_000:1_004_096]
                with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                    assert m[len(data) - 100:] == data[-100:]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:      # counters are read as the mount updates them
            after = scrape(fuse)
            if after.total("curvine_client_staged_blocks_total") >= len(files):
                break
            time.sleep(0.1)
        assert after.total("curvine_client_staged_blocks_total") - before.total("curvine_client_staged_blocks_total") \
            == len(files)
        assert after.total("curvine_client_reads_total", source="passthrough") \
            - before.total("curvine_client_reads_total", source="passthrough") >= len(files)
        assert after.total("curvine_client_read_bytes_total", source="memory") \
            == before.total("curvine_client_read_bytes_total", source="memory")   # no read reached the mount
        assert 0 < after.total("curvine_client_staged_bytes") <= 256 * MiB
        out = subprocess.run([CV, "stats", "--metrics", fuse, "--json", "--interval", "0.2"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["staged"] == sum(len(d) for d in files.values())   # all four, kept

        assert not_root_setxattr(mnt, DROP_CACHES_XATTR) in (errno.EPERM, errno.EACCES)
        assert drop_caches(mnt / "chunk0")                 # as `cv bench --drop-caches` does
        assert scrape(fuse).total("curvine_client_staged_bytes") == 0
        with open(mnt / "chunk1", "rb") as f:              # read again: staged again
            assert f.read() == files["chunk1"]
        assert scrape(fuse).total("curvine_client_staged_bytes") == len(files["chunk1"])
    finally:
        c.stop()


def not_root_setxattr(path: Path, name: str) -> int:
    """The errno of setting name on path as user nobody (0: it was set); path is opened
    first, as root, so nobody need not reach it."""
    fd = os.open(path, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.setxattr(fd, name, b"1")
        except OSError as e:
            code = e.errno or 1
        os._exit(code)
    os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
