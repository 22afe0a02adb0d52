"""The master's service: translates calls into namespace reads and journal records.

Its handlers are transport-neutral (``errors.handler``: request -> reply, our own
errors): the framed channel (master/framed.py) calls them directly, gRPC through
``rpc.grpc_servicer`` (master/main.py).

Reads run on a per-thread SQLite connection (WAL lets them proceed beside the
writer); mutations become op records given to the journal, and blocks they free are
queued for deletion on the workers holding them after the commit.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from typing import Any, Final, Iterable

from curvine_py.common.config import Config
from curvine_py.common.errors import ConfigError, CurvineError, NotLeader, Unavailable, err, handler
from curvine_py.common.security import READ, WRITE, BlockTokens
from curvine_py.common.tls import load as load_tls
from curvine_py.common.trash import TRASH_NAME, owner_of
from curvine_py.common.types import RENAME_EXCHANGE, ROOT_INO, SETATTR_SIZE
from curvine_py.common.version import package_version
from curvine_py.master import metrics, posix, schema
from curvine_py.master.capacity import Capacity
from curvine_py.master.eviction import Evictor
from curvine_py.master.group import Group, client_address, open_group
from curvine_py.master.journal import CHANGES_KEY, Journal
from curvine_py.master.loadjobs import LoadJobs
from curvine_py.master.locate import Locator
from curvine_py.master.locks import LockCall, LockTable
from curvine_py.master.namespace import LISTED_BLOCK, Namespace
from curvine_py.master.store import BlockRow, InodeRow, Result, UfsFileRow, to_u64
from curvine_py.master.placement import Placement
from curvine_py.master.records import (
    ROOT, Allocate, Commit, CommitBlock, Create, Envelope, ExpireLeases, Link, Mknod, OpenWrite, PruneOplog, Record,
    RegisterWorker, Removexattr, Rename, Renew, Rmdir, Setattr, Setxattr, UfsFree, Unlink,
)
from curvine_py.master.replication import Replicator
from curvine_py.master.sessions import LISTING, LISTING_MAX, Barrier, Key, Push, Sessions, cache_keys, key_of
from curvine_py.master.trashsweep import TrashOwners
from curvine_py.master.ufsmounts import UfsMounts
from curvine_py.master.ufsops import PERSISTED
from curvine_py.master.uploads import Uploader
from curvine_py.master.workerrpc import WorkerClients
from curvine_py.master.posix import R, W, Cred
from curvine_py.master.workers import Registry
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
U64_MAX = (1 << 64) - 1
PRUNE_EVERY_S = 10.0   # the housekeeping forgets retry-cache rows older than master.retry_cache_s this often
#                        (or every master.retry_cache_s, when that is shorter)
TRASH_SWEEP_S = 10.0   # the trash is looked at this often (or every half grace, if less)


# a result's cache-session entries (MasterService.submit)
WAIT_SEQ: Final = "_wait_seq"
EPOCH: Final = "_epoch"
LISTINGS: Final = "_listings"
OWN_KEYS: Final = "_own_keys"
# Records whose replies carry the caller's own invalidation (own_change): its mount's session
# is not pushed it (no wake-up, no acknowledgement on the mutation's path).
OWN_IN_REPLY = frozenset({"create", "mknod", "link", "unlink", "rmdir", "rename", "setattr", "commit",
                          "open_write", "allocate"})


def own_change(result: Result) -> dict[str, Any]:
    """A mutation reply's wait_seq and invalidated: what the caller's own session must
    forget (docs/wire.md "Cache sessions")."""
    return {"wait_seq": result.get(WAIT_SEQ, 0), "invalidated": cache_keys(result.get(OWN_KEYS, ()))}


def to_attr(row: InodeRow) -> pb.Attr:
    return pb.Attr(ino=row.ino, mode=row.mode, uid=row.uid, gid=row.gid, size=row.size, nlink=row.nlink,
                   atime_ns=row.atime_ns, mtime_ns=row.mtime_ns, ctime_ns=row.ctime_ns, rdev=row.rdev,
                   block_size=row.block_size, replicas=row.replicas, generation=row.generation,
                   allocated=row.allocated, complete=bool(row.complete), acl=bool(row.acl), kv=bool(row.kv))


def dirs_of(result: Result) -> list[pb.Attr]:
    return [to_attr(d) for d in result.get("dirs", ())]


def _u64(n: int) -> int:
    """n as a uint64 field can carry it: workers' reported dirs summed past 2^64 bytes
    (a broken or hostile report, found by fuzzing) made every later StatFs and Report fail."""
    return min(n, U64_MAX)


def _fill_listed(a: pb.Attr, r: tuple[Any, ...]) -> None:
    """A listing row's attributes (namespace.LISTING_COLUMNS' order, after the name) into a,
    in place: a third of the time of building an Attr per name and copying it in."""
    a.ino, a.mode, a.uid, a.gid, a.size, a.nlink, a.atime_ns, a.mtime_ns = r[1:9]
    a.ctime_ns, a.rdev, a.block_size, a.replicas, a.generation, a.allocated = r[9:15]
    a.complete, a.kv, a.acl = bool(r[15]), bool(r[16]), r[17] > 0


def _require_root(c: pb.Caller, what: str) -> None:
    if c.uid != 0:
        raise err(errno.EPERM, f"only root may {what}")


def cred_of(c: pb.Caller) -> Cred:
    return Cred(c.uid, c.gid, frozenset(c.groups) | {c.gid})


def envelope(c: pb.Caller) -> Envelope:
    """A record's envelope from the caller of a request (the journal stamps the time)."""
    return Envelope(cred=cred_of(c), request_id=c.request_id, client_id=c.client_id, now_ns=0)


def lock_call(r: pb.LockRequest) -> LockCall:
    """The lock table's view of a wire lock request (the mount is the caller's client id)."""
    if not r.caller.client_id:
        raise err(errno.EINVAL, "a lock needs the caller's client_id (its mount)")
    return LockCall(r.caller.client_id, r.ino, r.owner, r.flock, r.type, r.start, r.end, r.pid)


class MasterService:
    """One instance per master process."""

    rpc_seconds = metrics.RPC_SECONDS   # every handler call is timed there (common/errors.py)

    def __init__(self, cfg: Config, db_path: str) -> None:
        self.cfg = cfg
        self.db_path = db_path
        conn = schema.open_db(db_path, cfg.master.sync)
        in_group = bool(cfg.master.raft_peers.strip())
        schema.init_db(conn, cfg.master.block_size, cfg.master.replicas, now_ns=0 if in_group else None)
        self.writer_ns = Namespace(conn, cfg.master.block_size, cfg.master.replicas)
        self.journal = Journal(self.writer_ns)
        self.frame_port = 0   # the framed metadata server's port once main.py started it (0 = none)
        self.metrics_port = 0   # the /metrics port once main.py started it (0 = none)
        # alone, or one of a Raft group (docs/ha.md): who serves, and how records become durable
        self.address = client_address(cfg.master) if in_group else f"{cfg.master.bind}:{cfg.master.port}"
        self.tls = load_tls(cfg.tls, "master", f"master {self.address}")   # None: TLS off
        self.group: Group = open_group(cfg.master, cfg.cluster.secret, self.journal, db_path, self.address,
                                       lambda: self.frame_port, self.tls)
        self._served_term = self.group.term if not in_group else -1
        self._term_lock = threading.Lock()
        self._last_prune = 0.0
        self.registry = Registry(cfg.master.worker_timeout_s)
        self.placement = Placement(self.registry, cfg.master.vnodes)
        self._local = threading.local()
        self.lease_ms = int(cfg.master.lease_s * 1000)
        self.capacity = Capacity(self.registry, self.placement, cfg.master.heartbeat_ms / 1000)
        self.evictor = Evictor(cfg.master, db_path, self.registry, self.capacity, self.submit, self.leading)
        try:
            self.tokens = BlockTokens(cfg.cluster.secret, cfg.security.block_token_ttl_s,
                                      cfg.security.block_token_grace_s)
        except ValueError as e:
            raise ConfigError(f"security.block_token_*: {e}") from None
        self.started = time.monotonic()
        self.replicator = Replicator(self.registry, self.placement, self.tokens, grace_s=cfg.master.worker_timeout_s,
                                     scan_interval_s=cfg.master.replication_scan_s)
        self.ufs = UfsMounts(lambda: self.ns, self.submit, cfg.ufs.timeout_s)
        self.worker_rpc = WorkerClients(self.registry, cfg.cluster.secret, self.tls)
        self.uploader = Uploader(cfg.ufs, lambda: self.ns, self.submit, self.ufs, self.worker_rpc, self.file_blocks,
                                 self.leading)
        # mounts' cache sessions; the journal tracks changes from the first one on (a
        # cluster without mounts pays nothing: 10-15% of a mutation's CPU here)
        self.sessions = Sessions(cfg.master.cache_lease_s, lambda: self.group.term)
        self.locks = LockTable(cfg.master.lock_lease_s)
        self.locks.new_term()   # a (re)started master: the mounts reclaim their locks first
        # who keeps files in the trash (their lock-lease renewals), and when it was last swept
        self.trash = TrashOwners(cfg.master.trash_grace_s)
        self._last_trash_sweep = 0.0
        self.loads = LoadJobs(lambda: self.ns, self.ufs, self.worker_rpc, self.file_blocks, cfg.ufs.load_threads,
                              cfg.ufs.timeout_s, self.evictor.note_read)
        # Locate: many paths at once, and LMCache's expiring locks (master/locate.py)
        self.locator = Locator(lambda: self.ns, self.registry, self.evictor.pins, self.ufs.fresh_dir)

    # ------------------------------------------------------------------ plumbing
    @property
    def ns(self) -> Namespace:
        """This thread's read connection."""
        ns = getattr(self._local, "ns", None)
        if ns is None:
            ns = Namespace(schema.open_db(self.db_path, self.cfg.master.sync, reader=True), self.cfg.master.block_size,
                           self.cfg.master.replicas)
            self._local.ns = ns
        return ns

    def close_thread_reader(self) -> None:
        """This thread's read connection closed (a frame connection's thread ending): each
        holds 2 files (the db and its WAL), which the GC would close only some time later."""
        ns = getattr(self._local, "ns", None)
        if ns is not None:
            self._local.ns = None
            ns.conn.close()

    def serving(self) -> None:
        """Let a call through on the ready leader only; a follower answers NotLeader with the
        leader it knows (docs/ha.md).  The first call of a new term first drops what a
        leader keeps in memory (workers, block locations, replication orders): the workers
        register again with this master, and no block is judged under-replicated before
        one worker timeout passed."""
        if not self.group.ready():
            raise NotLeader(self.group.leader_address())
        term = self.group.term
        if term != self._served_term:
            with self._term_lock:
                if term != self._served_term:
                    log.info("leading term %d: waiting %.0f s for the workers' reports before judging replicas",
                             term, self.cfg.master.worker_timeout_s)
                    self.registry.clear()
                    self.replicator.restart(self.cfg.master.worker_timeout_s)
                    self.locks.new_term()
                    self.trash.new_term()
                    self.started = time.monotonic()
                    self._served_term = term

    def leading(self) -> bool:
        """Is this master the group's leader (its background work runs only then)?"""
        try:
            self.serving()
        except NotLeader:
            return False
        return True

    @handler
    def MasterStatus(self, request: pb.Empty) -> pb.MasterStatusReply:
        """Every master answers, whatever its role (cv report's masters table)."""
        return self.group.status()

    def submit(self, rec: Record, session: int = 0) -> Result:
        """Apply rec; answered once the mounts that cached what it changed were told
        (master/sessions.py).  session: the caller's cache session, whose own push number
        and the change's epoch the result then carries (WAIT_SEQ, EPOCH)."""
        result = self.group.submit(rec)
        if result.get("freed"):
            self.registry.free_blocks(result["freed"])
        barrier: Barrier | None = result.pop(CHANGES_KEY, None)
        if barrier is not None:
            result[WAIT_SEQ] = self.sessions.wait(barrier, session)
            result[EPOCH] = barrier.epoch
            result[LISTINGS] = barrier.listings(session)
            result[OWN_KEYS] = own = barrier.keys.get(session, [])
            if own:   # until the reply carries them (answered)
                self._local.own = (session, result[WAIT_SEQ], own)
        else:
            self.sessions.wait_grace()   # a previous leader's mounts may still cache what it changed
        return result

    def _looked_up(self, request: pb.LookupRequest, epoch: int, row: InodeRow | None, d: InodeRow,
                   under_ufs: bool) -> pb.AttrReply:
        """Lookup's reply (row None: the name is missing), with a lease when the caller's
        session may cache it (read at epoch): the name, the inode's attributes and the
        directory's mode, with which the mount checks a later caller's search permission
        itself.  Not under a UFS mount: its names change behind the master's back
        (metadata_ttl_s); not "." or "..": a move changes "..", and no key says so.  Not
        the mode of a directory with an access ACL: its mode alone cannot answer who may
        search it, so the mount asks the master for each lookup in it it has not cached."""
        reply = pb.AttrReply(attr=to_attr(row) if row is not None else None)
        if request.caller.session and not under_ufs and request.name not in (".", ".."):
            mode_key = not d.acl
            keys: list[Key] = [(request.parent, request.name)]
            if mode_key:
                keys.append((request.parent, ""))
            if row is not None:
                keys.append((row.ino, None))
            if mode_key and request.listing_max:   # (without the mode, the mount cannot answer from it)
                reply.lease_seq = self._listed(request, epoch, keys, reply)
            if not reply.lease_seq:
                reply.lease_seq = self.sessions.grant(request.caller.session, keys, epoch)
            if reply.lease_seq and mode_key:
                reply.parent.CopyFrom(to_attr(d))
        return reply

    def _listed(self, request: pb.LookupRequest, epoch: int, keys: list[Key], reply: pb.AttrReply) -> int:
        """Lookup's lease with the directory's whole listing in reply (its names and their
        attributes, and the listing key, which every name change there takes), when it has
        at most listing_max names (and LISTING_MAX): the mount answers its next lookups
        there, hits and misses, itself.  0: no listing (too large, or changed since epoch:
        the caller grants the name alone).  With one_block, each complete one-block file's
        block too (_listed_blocks)."""
        parent, most = request.parent, min(request.listing_max, LISTING_MAX)
        if request.one_block:
            listing = self.ns.listing_with_blocks(parent, most)
        else:
            listing = self.ns.listing(parent, most)
        if listing is None:
            return 0
        more: list[Key] = [(parent, LISTING)]
        more += [(parent, r[0]) for r in listing]
        more += [(r[1], None) for r in listing]
        seq = self.sessions.grant(request.caller.session, keys + more, epoch)
        if seq and request.one_block:
            self._listed_blocks(request, listing, reply)
        elif seq:
            add = reply.listing.add
            for r in listing:
                _fill_listed(add(name=r[0]).attr, r)
        reply.listed = bool(seq)
        return seq

    def _listed_blocks(self, request: pb.LookupRequest, listing: list[tuple[Any, ...]], reply: pb.AttrReply) -> None:
        """The listing (namespace.listing_with_blocks' rows) with its one-block files'
        blocks, each in its DirEntry, as that file's own Lookup with one_block gives it (a
        read token when the caller may read the file): the mount checks or fetches them
        ahead without a Lookup per file.  One pass over the rows, each entry filled in
        place; a token per block, all of one expiry; a file's readability judged once per
        (mode, uid, gid) when it has no ACL.  A fresh mount's first stat waits for this."""
        cred, mint, replicas = cred_of(request.caller), self.tokens.minter(READ), self.registry.replicas
        judged: dict[tuple[int, int, int], bool] = {}   # (mode, uid, gid) -> readable, files without an ACL
        add, name = reply.listing.add, None
        e: Any = None   # (the DirEntry of the row's name)
        for r in listing:
            if r[0] != name:   # (a file of two blocks comes twice, one row after the other)
                name = r[0]
                e = add(name=name)
                _fill_listed(e.attr, r)
            idx, bid, length, checksum, acl_value = r[LISTED_BLOCK:]
            if bid is None:
                continue
            readable: bool | None
            if acl_value:
                readable = posix.allowed(r[2], r[3], r[4], cred, R, bytes(acl_value))
            else:
                who = r[2:5]
                readable = judged.get(who)
                if readable is None:
                    readable = judged[who] = posix.allowed(r[2], r[3], r[4], cred, R)
            e.blocks.add(block_id=bid, offset=idx * r[11], length=length,   # (_block_info's, in place)
                         checksum=to_u64(checksum),
                         workers=replicas(bid), token=mint(bid) if readable else "")
        reply.listing_blocks = True

    def answered(self, ok: bool) -> None:
        """A call's end (group.LeaderOnly): a mutation that failed after its commit (a
        write-through upload, say) pushes its caller's own invalidation, which its reply
        was to carry, to the caller's session now."""
        own = getattr(self._local, "own", None)
        if own is not None:
            self._local.own = None
            if not ok:
                self.sessions.deliver(*own)

    def _mutation_lease(self, caller: pb.Caller, result: Result, name: tuple[int, str, int] | None = None,
                        more: list[Key] | None = None) -> tuple[int, list[Key]]:
        """What the caller's session may cache after its own mutation, as new as the
        mutation's epoch (nothing for a retried mutation's remembered result: it may be
        old): the name it made (parent, name, ino), more keys (a new directory's listing
        and mode), and the complete listings it held that the change took (its own change:
        the reply brings what changed).  (lease_seq, the listing and mode keys granted)."""
        if not caller.session or EPOCH not in result:
            return 0, []
        granted = [*(more or ()), *result.get(LISTINGS, ())]
        keys = list(granted)
        if name is not None:
            parent, n, ino = name
            if self.ns.ufs_dir(parent) is not None:
                return 0, []
            keys += [(parent, n), (ino, None)]
        if not keys:
            return 0, []
        seq = self.sessions.grant(caller.session, keys, result[EPOCH])
        return (seq, granted) if seq else (0, [])

    def open_session(self, request: pb.SessionRequest, push: Push) -> pb.SessionReply:
        """The framed channel's OpenSession: that connection becomes the session's stream."""
        self.serving()
        if not self.sessions.enabled:
            raise err(errno.EOPNOTSUPP, "cache sessions are off on this master (master.cache_lease_s = 0)")
        if self.journal.on_change is None:   # before the session exists: its grants see every change
            self.journal.track(self._changed)
        return self.sessions.open(request.lease_ms, push, request.caller.client_id)

    def _changed(self, keys: list[Key], rec: Record) -> Barrier:
        """The journal's on_change: the sessions told of a committed record's changes."""
        return self.sessions.changed(keys, rec.client_id if rec.op in OWN_IN_REPLY else "")

    def session_broken(self, session: int) -> None:
        """The session's stream closed (master/framed.py)."""
        self.sessions.broken(session)

    @handler
    def OpenSession(self, request: pb.SessionRequest) -> pb.SessionReply:
        raise err(errno.EOPNOTSUPP, "a cache session needs the framed channel (master.frame_port)")

    @handler
    def Beat(self, request: pb.SessionBeat) -> pb.Empty:
        if not self.sessions.beat(request.session, request.acked, map(key_of, request.forgotten)):
            raise err(errno.ESTALE, f"cache session {request.session} has ended (its lease ran out)")
        return pb.Empty()

    @handler
    def Lock(self, request: pb.LockRequest) -> pb.LockReply:
        """flock and POSIX locks (master/locks.py): granted, or the lock in the way."""
        c = lock_call(request)
        if request.test:
            found = self.locks.test(c)
        else:
            found = self.locks.set(c, request.wait)
        reply = pb.LockReply(granted=found is None, lease_ms=int(self.locks.lease_s * 1000))
        if found is not None:
            reply.conflict.CopyFrom(pb.LockRange(type=found.type, start=found.start, end=found.end, pid=found.pid))
        return reply

    @handler
    def RenewLocks(self, request: pb.LockRenew) -> pb.LockRenewReply:
        reclaim = [lock_call(r) for r in request.reclaim]
        if any(c.client != request.caller.client_id for c in reclaim):   # (found by fuzzing: a KeyError)
            raise err(errno.EINVAL, "RenewLocks: a mount reclaims its own locks only (each one's caller is its own)")
        held = self.locks.renew(request.caller.client_id, reclaim)
        self.trash.heard(request.caller.client_id)   # (a renewal is also a keeper of trash saying it lives)
        return pb.LockRenewReply(held=held, lease_ms=int(self.locks.lease_s * 1000))

    def _blocks(self, rows: Iterable[BlockRow], block_size: int, mode: str = READ,
                ino: int = 0) -> tuple[list[pb.BlockInfo], list[pb.WorkerAddress]]:
        """Block infos of file ino's rows, with where each lies in the UFS if it is a UFS file."""
        infos = [self._block_info(b, block_size, mode) for b in rows]
        f = self.ns.ufs_file(ino) if ino else None
        if f is not None and f.etag:
            self._add_ufs(ino, f, infos)
        return infos, self._addresses(w for info in infos for w in info.workers)

    def _add_ufs(self, ino: int, f: UfsFileRow, infos: list[pb.BlockInfo]) -> None:
        """Where each block lies in the UFS object.  Every block of a persisted file is in
        it; of a file changed since (pending), only the slots it has not rewritten (their
        checksum is 0: cut from the object, never written here).  A block with no live
        replica is loaded by its placement targets (room-aware)."""
        ufs = pb.UfsRange(mount_id=f.mount_id, key=f.ukey, etag=f.etag,
                          timeout_ms=int(self.cfg.ufs.timeout_s * 1000))
        replicas = self.ns.inode(ino).replicas or self.cfg.master.replicas
        for info in infos:
            if f.state != PERSISTED and info.checksum:
                continue
            info.ufs.CopyFrom(ufs)
            info.ufs.offset = info.offset
            if not info.workers:
                info.ufs.load = True
                info.workers.extend(self.capacity.place(info.block_id, replicas, info.length))

    def file_blocks(self, ino: int) -> tuple[InodeRow, list[pb.BlockInfo], list[pb.WorkerAddress]]:
        """A file's row and its blocks with read tokens (UFS loads and uploads)."""
        row, rows = self.ns.file_blocks(ino)
        blocks, workers = self._blocks(rows, row.block_size, READ, ino)
        return row, blocks, workers

    def _block_info(self, b: BlockRow, block_size: int, mode: str | None) -> pb.BlockInfo:
        """One block as clients see it, with a token for mode (None: none, for a caller
        that only reads its own host's block file)."""
        return pb.BlockInfo(block_id=b.block_id, offset=b.idx * block_size, length=b.length,
                            checksum=b.checksum, workers=self.registry.replicas(b.block_id),
                            token=self.tokens.mint(b.block_id, mode) if mode else "")

    def _addresses(self, wids: Iterable[int]) -> list[pb.WorkerAddress]:
        out = []
        for wid in sorted(set(wids)):
            w = self.registry.get(wid)
            if w is not None:
                out.append(w.address())
        return out

    def _wait_for_workers(self) -> None:
        """Right after a (re)start the master knows no workers until they register again:
        a writer then gets UNAVAILABLE, which clients retry like an unreachable master,
        instead of an ENOSPC that would fail the write."""
        if time.monotonic() - self.started < self.cfg.master.worker_timeout_s and not self.registry.live_workers():
            raise Unavailable("the master is starting: no worker has registered yet")

    def _open_reply(self, result: Result) -> pb.OpenReply:
        attr = result["attr"]
        mode = WRITE if result.get("lease_id") else READ
        blocks, workers = self._blocks(self.ns.blocks(attr.ino), attr.block_size, mode, attr.ino)
        return pb.OpenReply(attr=to_attr(attr), blocks=blocks, workers=workers,
                            lease_id=result.get("lease_id", 0), lease_expires_ms=result.get("lease_expiry_ms", 0),
                            dirs=dirs_of(result), soft_lease=bool(result.get("soft")), **own_change(result))

    # ------------------------------------------------------------------ namespace reads
    @handler
    def Lookup(self, request: pb.LookupRequest) -> pb.AttrReply:
        under_ufs = self.ufs.fresh_dir(request.parent)
        epoch = self.sessions.epoch()
        row, d = self.ns.lookup_in(cred_of(request.caller), request.parent, request.name)
        if row is None and not request.miss_ok:
            raise err(errno.ENOENT)
        reply = self._looked_up(request, epoch, row, d, under_ufs)
        if row is None:
            return reply
        a = reply.attr
        if request.one_block and a.complete and stat.S_ISREG(a.mode) and 0 < a.size <= a.block_size:
            mode = READ if posix.allowed(a.mode, a.uid, a.gid, cred_of(request.caller), R, row.acl) else None
            reply.blocks.extend(self._block_info(b, a.block_size, mode) for b in self.ns.blocks(a.ino))
        return reply

    @handler
    def GetAttr(self, request: pb.InodeRequest) -> pb.AttrReply:
        epoch = self.sessions.epoch()
        row = self.ns.inode(request.ino)
        lease = 0
        if request.caller.session and self.ns.ufs_dir(request.ino) is None:
            lease = self.sessions.grant(request.caller.session, [(request.ino, None)], epoch)
        return pb.AttrReply(attr=to_attr(row), lease_seq=lease)

    @handler
    def ResolvePath(self, request: pb.PathRequest) -> pb.AttrReply:
        row = self.ns.resolve(cred_of(request.caller), request.path, request.follow_symlinks, self.ufs.fresh_dir)
        return pb.AttrReply(attr=to_attr(row))

    @handler
    def ReadDir(self, request: pb.ReadDirRequest) -> pb.ReadDirReply:
        limit = request.limit or 1000
        if not request.offset:
            self.ufs.fresh_dir(request.ino)
        rows = self.ns.readdir(cred_of(request.caller), request.ino, request.offset, limit, request.plus)
        entries = [pb.DirEntry(name=r.name, ino=r.ino, mode=r.mode, offset=r.seq,
                               attr=to_attr(r.attr) if r.attr is not None else None) for r in rows]
        return pb.ReadDirReply(entries=entries, eof=len(rows) < min(limit, 10000))

    @handler
    def Readlink(self, request: pb.InodeRequest) -> pb.ReadlinkReply:
        return pb.ReadlinkReply(target=self.ns.readlink(request.ino))

    @handler
    def GetXattr(self, request: pb.XattrRequest) -> pb.XattrReply:
        return pb.XattrReply(value=self.ns.getxattr(cred_of(request.caller), request.ino, request.name))

    @handler
    def ListXattr(self, request: pb.XattrRequest) -> pb.XattrReply:
        return pb.XattrReply(names=self.ns.listxattr(cred_of(request.caller), request.ino))

    @handler
    def StatFs(self, request: pb.Empty) -> pb.StatFsReply:
        live = self.registry.live_workers()
        cap, used = _u64(sum(w.capacity for w in live)), _u64(sum(w.used for w in live))
        files, _ = self.ns.counts()
        return pb.StatFsReply(capacity=cap, used=used, available=max(0, cap - used), files=files,
                              block_size=self.cfg.master.block_size)

    # ------------------------------------------------------------------ namespace mutations
    @handler
    def SetAttr(self, request: pb.SetAttrRequest) -> pb.AttrReply:
        rec = Setattr(**envelope(request.caller), ino=request.ino, valid=request.valid, mode=request.mode,
                      uid=request.uid, gid=request.gid, size=request.size, atime_ns=request.atime_ns,
                      mtime_ns=request.mtime_ns)
        result = self.submit(rec, request.caller.session)
        attr = result["attr"]
        if request.valid & SETATTR_SIZE and not (attr.lease_id and not attr.complete):
            self._persisted(request.ino)   # truncate(path), or of a file created unwritten: no close uploads it
        return pb.AttrReply(attr=to_attr(attr), **own_change(result))

    @handler
    def Mknod(self, request: pb.MknodRequest) -> pb.AttrReply:
        if stat.S_ISDIR(request.mode) and not request.symlink_target:
            self.ufs.mkdir(request.parent, request.name)
        rec = Mknod(**envelope(request.caller), parent=request.parent, name=request.name, mode=request.mode,
                    umask=request.umask, rdev=request.rdev, target=request.symlink_target, exclusive=True,
                    block_size=request.block_size)
        result = self.submit(rec, request.caller.session)
        return self._made(request.caller, request.parent, request.name, result)

    def _made(self, caller: pb.Caller, parent: int, name: str, result: Result) -> pb.AttrReply:
        """Mknod's and Link's reply: the new name may be cached at once by its maker, and
        a new directory's listing (empty: complete) and mode too (not when it has an
        access ACL, inherited: see _looked_up)."""
        attr = result["attr"]
        ino = attr.ino
        new_dir: list[Key] = [(ino, LISTING)] if stat.S_ISDIR(attr.mode) else []
        if new_dir and not attr.acl:
            new_dir.append((ino, ""))
        seq, granted = self._mutation_lease(caller, result, (parent, name, ino), new_dir)
        return pb.AttrReply(attr=to_attr(attr), dirs=dirs_of(result), **own_change(result),
                            lease_seq=seq, granted=cache_keys(granted))

    @handler
    def Create(self, request: pb.MknodRequest) -> pb.OpenReply:
        self.ufs.fresh_dir(request.parent)
        rec = Create(**envelope(request.caller), parent=request.parent, name=request.name, mode=request.mode,
                     umask=request.umask, exclusive=request.exclusive, block_size=request.block_size,
                     flags=request.open_flags, lease_ms=self.lease_ms)
        result = self.submit(rec, request.caller.session)
        if result.get("soft") and self._write_through(result["attr"].ino):
            self._persisted(result["attr"].ino)   # in the UFS at once: a close unwritten commits nothing
        reply = self._open_reply(result)
        seq, granted = self._mutation_lease(request.caller, result, (request.parent, request.name,
                                                                     result["attr"].ino))
        reply.lease_seq = seq
        reply.granted.extend(cache_keys(granted))
        return reply

    @handler
    def Link(self, request: pb.LinkRequest) -> pb.AttrReply:
        rec = Link(**envelope(request.caller), ino=request.ino, new_parent=request.new_parent,
                   new_name=request.new_name)
        result = self.submit(rec, request.caller.session)
        return self._made(request.caller, request.new_parent, request.new_name, result)

    @handler
    def Unlink(self, request: pb.UnlinkRequest) -> pb.DirsReply:
        self.ufs.unlink(request.parent, request.name)
        result = self.submit(Unlink(**envelope(request.caller), parent=request.parent, name=request.name,
                                    keep=tuple(request.keep)), request.caller.session)
        return self._removed(request.caller, result)

    def _removed(self, caller: pb.Caller, result: Result) -> pb.DirsReply:
        """Unlink's and Rmdir's reply: the complete listings the caller keeps."""
        seq, granted = self._mutation_lease(caller, result)
        return pb.DirsReply(dirs=dirs_of(result), kept=bool(result.get("kept")), **own_change(result),
                            lease_seq=seq, granted=cache_keys(granted))

    @handler
    def Rmdir(self, request: pb.UnlinkRequest) -> pb.DirsReply:
        child = self.ns.child(request.parent, request.name)
        if child is not None:
            self.ufs.fresh_dir(child.ino)   # names only the UFS has make it non-empty
        result = self.submit(Rmdir(**envelope(request.caller), parent=request.parent, name=request.name),
                             request.caller.session)
        self.ufs.rmdir(request.parent, request.name)
        return self._removed(request.caller, result)

    @handler
    def Rename(self, request: pb.RenameRequest) -> pb.DirsReply:
        if owner_of(request.new_name) is not None:   # a name kept in the trash: its client lives now
            self.trash.heard(request.caller.client_id)
        rec = Rename(**envelope(request.caller), parent=request.parent, name=request.name,
                     new_parent=request.new_parent, new_name=request.new_name, flags=request.flags,
                     keep=tuple(request.keep))
        result = self.ufs.rename(request.parent, request.name, request.new_parent, request.new_name,
                                 request.flags, lambda: self.submit(rec, request.caller.session))
        reply = pb.DirsReply(dirs=dirs_of(result), kept=bool(result.get("kept")), **own_change(result))
        moved = None   # (an exchange moves two names: the listings could not stay complete)
        if request.caller.session and not request.flags & RENAME_EXCHANGE:
            moved = self.ns.child(request.new_parent, request.new_name)
        if moved is not None and not reply.kept:   # (read after the commit: a later change's epoch denies it)
            seq, granted = self._mutation_lease(request.caller, result,
                                                (request.new_parent, request.new_name, moved.ino))
            if seq:
                reply.lease_seq = seq
                reply.attr.CopyFrom(to_attr(moved))
                reply.granted.extend(cache_keys(granted))
        return reply

    @handler
    def SetXattr(self, request: pb.XattrRequest) -> pb.Empty:
        self.submit(Setxattr(**envelope(request.caller), ino=request.ino, name=request.name,
                             value=bytes(request.value), flags=request.flags), request.caller.session)
        return pb.Empty()

    @handler
    def RemoveXattr(self, request: pb.XattrRequest) -> pb.Empty:
        self.submit(Removexattr(**envelope(request.caller), ino=request.ino, name=request.name),
                    request.caller.session)
        return pb.Empty()

    # ------------------------------------------------------------------ file data
    @handler
    def Open(self, request: pb.OpenRequest) -> pb.OpenReply:
        self.ufs.fresh_file(request.ino)
        if request.write:
            rec = OpenWrite(**envelope(request.caller), ino=request.ino, flags=request.flags,
                            lease_ms=self.lease_ms)
            return self._open_reply(self.submit(rec, request.caller.session))
        row = self.ns.inode(request.ino)
        if stat.S_ISDIR(row.mode):
            raise err(errno.EISDIR)
        acc = request.flags & os.O_ACCMODE
        want = {os.O_RDONLY: R, os.O_WRONLY: W}.get(acc, R | W)
        posix.require(row, cred_of(request.caller), want)
        self.evictor.note_read(row.ino)
        return self._open_reply({"attr": row})

    @handler
    def AllocateBlocks(self, request: pb.AllocateBlocksRequest) -> pb.AllocateBlocksReply:
        self._wait_for_workers()
        # place first (cheap, may fail with ENOSPC) so a full pool allocates nothing
        tier = self.evictor.tier_of(self.ns.conn, request.ino)
        self.evictor.place(0, 1, self.cfg.master.block_size, tier=tier)
        result = self.submit(Allocate(**envelope(request.caller), ino=request.ino, lease_id=request.lease_id,
                                      count=request.count or 1), request.caller.session)
        self.registry.report_unreachable(request.unreachable)
        exclude = frozenset(request.exclude_workers) | self.registry.unreachable()
        blocks, wids = [], set()
        for bid in result["block_ids"]:
            targets = self.evictor.place(bid, result["replicas"], result["block_size"], exclude, tier,
                                         request.prefer_host)
            wids.update(targets)
            blocks.append(pb.BlockInfo(block_id=bid, workers=targets, token=self.tokens.mint(bid, WRITE),
                                       tier=tier))
        self.evictor.after_allocate()
        return pb.AllocateBlocksReply(blocks=blocks, workers=self._addresses(wids), **own_change(result))

    @handler
    def Commit(self, request: pb.CommitRequest) -> pb.AttrReply:
        blocks = tuple(CommitBlock(b.block_id, b.offset, b.length, b.checksum) for b in request.blocks)
        rec = Commit(**envelope(request.caller), ino=request.ino, lease_id=request.lease_id, size=request.size,
                     blocks=blocks, release=request.release, mtime_ns=request.mtime_ns, holes=tuple(request.holes),
                     truncate_to=request.truncate_to if request.truncated else -1)
        result = self.submit(rec, request.caller.session)
        on_disk: dict[int, int] = {}
        for b in request.blocks:
            for wid in b.workers:
                self.registry.add_replica(b.block_id, wid)
                on_disk[wid] = on_disk.get(wid, 0) + b.length
        self.capacity.note_committed(on_disk)
        if request.release:
            self._persisted(request.ino)
        return pb.AttrReply(attr=to_attr(result["attr"]), **own_change(result))

    def _persisted(self, ino: int) -> None:
        """A UFS file's new bytes are complete: write-through uploads them now (the caller's
        close waits, and fails with the upload's error); write-back queues them."""
        f = self.ns.ufs_file(ino)
        if f is None or f.state == PERSISTED:
            return
        if self.ufs.get(f.mount_id).write_mode == "through":
            self.uploader.persist(ino, final=True)
        else:
            self.uploader.kick()

    def _write_through(self, ino: int) -> bool:
        f = self.ns.ufs_file(ino)
        return f is not None and self.ufs.get(f.mount_id).write_mode == "through"

    @handler
    def RenewLeases(self, request: pb.LeaseRequest) -> pb.LeaseReply:
        # no request id: renewals are naturally idempotent (and need no retry-cache row)
        rec = Renew(cred=cred_of(request.caller), client_id=request.caller.client_id,
                    lease_ids=tuple(request.lease_ids), lease_ms=self.lease_ms)
        return pb.LeaseReply(expired=self.submit(rec)["expired"])

    @handler
    def GetBlockLocations(self, request: pb.BlockLocationsRequest) -> pb.BlockLocationsReply:
        """The file's blocks with read tokens, for a caller Open would let read it (EACCES
        otherwise: the tokens are the data), or for the holder of its write lease (a
        writer opened with W only reads back the blocks it patches: Open gave it write
        tokens, which read too); that holder's shipped, uncommitted blocks get fresh
        write tokens (client/reader.py)."""
        row, rows = self.ns.file_blocks(request.ino)
        writer = self.ns.is_writer(request.ino, request.lease_id, request.caller.client_id)
        if not writer:
            posix.require(row, cred_of(request.caller), R)
        blocks, workers = self._blocks(rows, row.block_size, READ, request.ino)
        asked = list(request.pending) if writer else []
        pending = [pb.BlockInfo(block_id=bid, token=self.tokens.mint(bid, WRITE))
                   for bid in self.ns.pending_of(request.ino, request.lease_id, asked)]
        return pb.BlockLocationsReply(attr=to_attr(row), blocks=blocks, workers=workers, pending=pending)

    @handler
    def Locate(self, request: pb.LocateRequest) -> pb.LocateReply:
        """Up to 1,000 paths: attributes or errno, holders of all blocks, tier; pins (master/locate.py)."""
        return self.locator.locate(request)

    @handler
    def ReportBadBlock(self, request: pb.BadBlockRequest) -> pb.Empty:
        """A reader found a replica whose bytes fail their checksum: drop that copy (never
        the last one) and copy the block again from a good one."""
        holders = self.registry.replicas(request.block_id)
        if request.worker_id in holders and len(holders) > 1:
            self.registry.delete_on(request.worker_id, [request.block_id])
            log.warning("block %d on worker %d reported bad (%s); dropping that copy", request.block_id,
                        request.worker_id, request.reason)
        self.replicator.suspect([request.block_id])
        return pb.Empty()

    # ------------------------------------------------------------------ cluster
    @handler
    def RegisterWorker(self, request: pb.RegisterRequest) -> pb.RegisterReply:
        if not request.storage_id or not request.ip or not request.data_port:
            raise err(errno.EINVAL, "registration needs storage_id, ip and data_port")
        result = self.group.submit(RegisterWorker(storage_id=request.storage_id, host=request.host))
        self.registry.register(result["worker_id"], request)
        self.replicator.worker_restarted(result["worker_id"])
        return pb.RegisterReply(worker_id=result["worker_id"], heartbeat_ms=self.cfg.master.heartbeat_ms)

    @handler
    def Heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        w, revived = self.registry.heartbeat(request.worker_id, list(request.dirs))
        if w is None:
            return pb.HeartbeatReply(reregister=True)
        if revived:   # its copies count again: blocks copied meanwhile now have one too many
            self.replicator.suspect(set(w.blocks))
        if request.HasField("report"):
            self._apply_report(request.worker_id, request.report)
            self.capacity.note_added(request.worker_id, sum(b.length for b in request.report.added))
        self.evictor.on_heartbeat()   # fresh usage: this worker's deletes may leave in this reply
        return pb.HeartbeatReply(delete_blocks=self.registry.take_deletes(request.worker_id),
                                 ring_epoch=self.placement.ring().epoch,
                                 replicate=self.replicator.take(request.worker_id))

    @handler
    def ReportBlocks(self, request: pb.BlockReport) -> pb.Empty:
        if self.registry.get(request.worker_id) is None:
            raise err(errno.ENOENT, f"unknown worker {request.worker_id}; register first")
        self._apply_report(request.worker_id, request)
        return pb.Empty()

    def _apply_report(self, wid: int, report: pb.BlockReport) -> None:
        """Count valid replicas; tell the worker to delete blocks no file (or writer) needs,
        and copies beyond the file's replica count (a lost worker that came back after its
        blocks were copied elsewhere)."""
        for b in report.removed:
            self.registry.remove_replica(b, wid)
        if report.removed:
            self.replicator.suspect(list(report.removed))   # deleted or found corrupt by the worker
        added = list(report.added)
        stale: list[int] = []
        conn = self.ns.conn
        for i in range(0, len(added), 500):
            chunk = added[i:i + 500]
            ids = [b.block_id for b in chunk]
            marks = ",".join("?" * len(ids))
            # Pending first: a commit on another thread moves a block from pending_blocks to
            # blocks, never back; read in the other order, a block committed between the two
            # reads was in neither and its fresh replica was deleted as stale.
            # (One read transaction also makes both reads one snapshot.)
            conn.execute("BEGIN")
            try:
                pending = {r[0] for r in conn.execute(
                    f"SELECT block_id FROM pending_blocks WHERE block_id IN ({marks})", ids)}
                known = {r[0]: (r[1], r[2]) for r in conn.execute(
                    f"SELECT b.block_id, b.length, i.replicas FROM blocks b JOIN inodes i ON i.ino = b.ino "
                    f"WHERE b.block_id IN ({marks})", ids)}
            finally:
                conn.execute("COMMIT")
            for b in chunk:
                k = known.get(b.block_id)
                if b.block_id in pending or (k is not None and b.length >= k[0]
                                             and len(self.registry.replicas(b.block_id)) < k[1]):
                    self.registry.add_replica(b.block_id, wid)
                    self.replicator.confirmed(b.block_id)
                elif k is None or wid not in self.registry.replicas(b.block_id):
                    stale.append(b.block_id)
        if stale:
            self.registry.delete_on(wid, stale)

    @handler
    def GetRing(self, request: pb.Empty) -> pb.RingReply:
        ring = self.placement.ring()
        nodes = [pb.RingNode(worker_id=n.worker_id, host=n.host) for n in ring.nodes.values()]
        return pb.RingReply(epoch=ring.epoch, vnodes=ring.vnodes, nodes=nodes,
                            workers=self._addresses(ring.nodes), frame_port=self.frame_port)

    @handler
    def Report(self, request: pb.Empty) -> pb.ReportReply:
        statuses = []
        now = time.monotonic()
        for w in sorted(self.registry.workers.values(), key=lambda w: w.worker_id):
            statuses.append(pb.WorkerStatus(
                address=w.address(), state="live" if w.live else "lost", capacity=_u64(w.capacity), used=_u64(w.used),
                dirs=w.dirs, blocks=len(w.blocks), last_heartbeat_ms=int((now - w.last_heartbeat) * 1000),
                io_engine=w.io_engine, metrics_port=w.metrics_port))
        live = self.registry.live_workers()
        files, nblocks = self.ns.counts()
        return pb.ReportReply(workers=statuses, ring_epoch=self.placement.ring().epoch,
                              capacity=_u64(sum(w.capacity for w in live)), used=_u64(sum(w.used for w in live)),
                              files=files, blocks=nblocks, under_replicated=self.under_replicated(),
                              master_address=self.address, version=package_version(),
                              evicted_files=self.evictor.evicted_files, evicted_bytes=self.evictor.evicted_bytes,
                              expired_files=self.evictor.expired_files, metrics_port=self.metrics_port)

    # ------------------------------------------------------------------ under storage (docs/ufs.md)
    @handler
    def UfsMountAdd(self, request: pb.UfsMountRequest) -> pb.UfsMount:
        _require_root(request.caller, "mount a UFS")
        return self.ufs.mount(request.mount, cred_of(request.caller)).to_pb(secrets=False)

    @handler
    def UfsMountRemove(self, request: pb.UfsPathRequest) -> pb.Empty:
        _require_root(request.caller, "unmount a UFS")
        self.registry.free_blocks(self.ufs.umount(request.path, request.force))
        return pb.Empty()

    @handler
    def UfsMountList(self, request: pb.Empty) -> pb.UfsMountsReply:
        return pb.UfsMountsReply(mounts=[m.to_pb(secrets=False) for m in self.ufs.all()])

    @handler
    def UfsMountGet(self, request: pb.UfsMountIdRequest) -> pb.UfsMount:
        """For workers: the mount with its credentials (the cluster secret guards the call)."""
        return self.ufs.get(request.mount_id).to_pb(secrets=True)

    @handler
    def UfsStat(self, request: pb.PathRequest) -> pb.UfsStatReply:
        row = self.ns.resolve(cred_of(request.caller), request.path, request.follow_symlinks, self.ufs.fresh_dir)
        reply = pb.UfsStatReply(attr=to_attr(row))
        f = self.ns.ufs_file(row.ino)
        if f is not None:
            m = self.ufs.get(f.mount_id)
            state = f.state
            if self.uploader.uploading(row.ino):
                state = "uploading"
            elif state == "pending":
                state = "pending upload"
            elif state == "failed":
                state = f"failed: {f.message}"
            cached = sum(b.length for b in self.ns.blocks(row.ino) if self.registry.replicas(b.block_id))
            reply.ufs.CopyFrom(pb.UfsFile(mount_id=m.mount_id, uri=m.object_uri(f.ukey), state=state,
                                          cached_bytes=cached, etag=f.etag))
        return reply

    @handler
    def Load(self, request: pb.LoadRequest) -> pb.LoadJob:
        return self.loads.start(cred_of(request.caller), request.path, request.recursive)

    @handler
    def LoadStatus(self, request: pb.LoadJobRequest) -> pb.LoadJobsReply:
        return pb.LoadJobsReply(jobs=self.loads.status(request.job_id))

    @handler
    def Free(self, request: pb.FreeRequest) -> pb.FreeReply:
        cred = cred_of(request.caller)
        row = self.ns.resolve(cred, request.path)
        if stat.S_ISDIR(row.mode) and not request.recursive:
            raise err(errno.EISDIR, f"{request.path} is a directory (free it with -r)")
        inos = [row.ino] if not stat.S_ISDIR(row.mode) else self.ns.files_below(row.ino)
        result = self.submit(UfsFree(inos=tuple(inos)))
        return pb.FreeReply(files=result["files"], bytes=result["bytes"], skipped=result["skipped"])

    def under_replicated(self) -> int:
        """Committed blocks with fewer live replicas than their file asks for."""
        return len(self.replicator.scan(self.ns.conn))

    # ------------------------------------------------------------------ housekeeping
    def housekeeping(self) -> None:
        """Run by a timer thread: on the leader, liveness of workers, expired write leases,
        re-replication, the retry cache's pruning; then, on every master (followers prune
        too, by the leader's records), a bounded step of giving meta.db's free pages back."""
        if self.leading():
            self._lead_housekeeping()
        self.sessions.expire()
        self.journal.reclaim()

    def _sweep_trash(self) -> None:
        """Remove the trash names of clients not heard for master.trash_grace_s (their
        mounts died with files unlinked while open: master/trashsweep.py), which frees
        the files' blocks; at most every TRASH_SWEEP_S."""
        now = time.monotonic()
        if now - self._last_trash_sweep < min(TRASH_SWEEP_S, self.trash.grace_s / 2):
            return
        self._last_trash_sweep = now
        trash = self.ns.child(ROOT_INO, TRASH_NAME)
        if trash is None:
            return
        names = [r[0] for r in self.ns.conn.execute("SELECT name FROM dirents WHERE parent=?", (trash.ino,))]
        for name in self.trash.stale(names):
            try:
                self.submit(Unlink(cred=ROOT, request_id="", client_id="", now_ns=0, parent=trash.ino, name=name))
                log.warning("trash: removed %s, kept by a client not heard for %.0f s (its mount died "
                            "with the file open)", name, self.trash.grace_s)
            except CurvineError as e:   # (removed meanwhile by its owner's last close)
                log.info("trash: %s: %s", name, e)

    def _lead_housekeeping(self) -> None:
        self.locks.expire()
        self._sweep_trash()
        for wid in self.registry.check_liveness():
            self.replicator.worker_lost(wid)
        self.replicator.tick(self.ns.conn)
        now_ms = time.time_ns() // 1_000_000
        if self.ns.conn.execute("SELECT 1 FROM writers WHERE expiry_ms < ? UNION ALL SELECT 1 FROM inodes"
                                " WHERE lease_id != 0 AND lease_expiry_ms < ? LIMIT 1", (now_ms, now_ms)).fetchone():
            self.submit(ExpireLeases())
        if time.monotonic() - self._last_prune >= min(PRUNE_EVERY_S, self.cfg.master.retry_cache_s):
            self._last_prune = time.monotonic()
            self.submit(PruneOplog(before_ms=now_ms - int(self.cfg.master.retry_cache_s * 1000)))
