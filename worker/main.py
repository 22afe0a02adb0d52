"""``curvine-worker``: the block server process.

Starts, in order: the disk I/O engine (``worker.io_engine``: io_uring, probed first in a
child process, or a thread pool; worker/ioengine.py), the block store (scans the data
dirs), the data channel, the UFS fetcher and mount cache (worker/ufsfetch.py,
ufsmounts.py), the gRPC control service, and the heartbeat.  When the worker is registered
with the master (or at once when ``worker.master`` is empty: standalone mode, used by
benchmarks) it prints one line to stdout::

    worker <id> data <ip>:<port> rpc <ip>:<port>

so launchers can wait for it and learn ephemeral ports (``--worker-data-port 0``).
SIGTERM/SIGINT stop it cleanly (exit 0); a bad configuration is one line on stderr and
exit 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc

from curvine_py.common import config, listener, metrics
from curvine_py.common.errors import ConfigError
from curvine_py.common.security import BlockTokens, SecretCheck
from curvine_py.common.rpc import add_port
from curvine_py.common.signals import StopSignals
from curvine_py.common.tls import Tls
from curvine_py.common.tls import load as load_tls
from curvine_py.pb import curvine_pb2
from curvine_py.worker import heartbeat as hb
from curvine_py.worker import service
from curvine_py.worker.blockstore import BlockStore, parse_dir_spec
from curvine_py.worker.dataserver import DataServer, chain_targets
from curvine_py.worker.ioengine import ENGINES, EngineChoice, IoEngine, start_engine
from curvine_py.worker.localwrite import LocalWriteServer
from curvine_py.worker.metrics import WorkerCollector
from curvine_py.worker.replication import CopyQueue
from curvine_py.worker.ufsfetch import BlockBuffers, UfsFetcher
from curvine_py.worker.ufsmounts import UfsMounts, master_resolver, no_master
from curvine_py.worker.ufspersist import Persister

log = logging.getLogger("curvine_py.worker")


def validate(cfg: config.Config) -> None:
    """Reject values that would only fail later, deep inside a thread."""
    w = cfg.worker
    for name in ("rpc_port", "data_port"):
        if not 0 <= getattr(w, name) <= 65535:
            raise ConfigError(f"worker.{name} must be a port number (0 = any)")
    if w.uring_entries < 2 or w.uring_entries > 32768:
        raise ConfigError("worker.uring_entries must be between 2 and 32768")
    if w.io_engine not in ENGINES:
        raise ConfigError(f"worker.io_engine must be one of {', '.join(ENGINES)}, not {w.io_engine!r}")
    if w.read_io not in ("sendfile", "pread", "uring"):
        raise ConfigError(f"worker.read_io must be \"sendfile\", \"pread\" or \"uring\", not {w.read_io!r}")
    if w.buffer_size < 4096 or w.buffer_size > 64 << 20:
        raise ConfigError("worker.buffer_size must be between 4KiB and 64MiB")
    if w.rpc_threads < 1:
        raise ConfigError("worker.rpc_threads must be at least 1")
    if w.reserve < 0:
        raise ConfigError("worker.reserve must not be negative")
    if not w.dirs:
        raise ConfigError("worker.dirs is empty")


class Worker:
    """All components of one worker process, started and stopped together."""

    def __init__(self, cfg: config.Config) -> None:
        self.cfg = cfg
        self.io: IoEngine | None = None
        self.io_choice: EngineChoice | None = None
        self.store: BlockStore | None = None
        self.data: DataServer | None = None
        self.local: LocalWriteServer | None = None
        self.rpc: grpc.Server | None = None
        self.rpc_port = 0
        self.heartbeat: hb.Heartbeat | None = None
        self.tls: Tls | None = None   # this worker's TLS (tls.enabled), loaded by start()
        self.copies: CopyQueue | None = None
        self.ufs_mounts: UfsMounts | None = None
        self.ufs_fetcher: UfsFetcher | None = None
        self.metrics: metrics.MetricsServer | None = None
        self.ready = threading.Event()

    def start(self) -> None:
        w = self.cfg.worker
        self.io, self.io_choice = start_engine(w.io_engine, self._probe_dir(), w.uring_entries)
        try:
            self.store = BlockStore(w.dirs, self.io, reserve=w.reserve, read_io=w.read_io,
                                    direct_io=w.direct_io, memory_cache=w.memory_cache)
        except OSError as e:
            raise ConfigError(f"cannot use worker.dirs: {e}") from None
        first_dir = self.store.dirs[0].path
        self.tls = load_tls(self.cfg.tls, "worker", f"worker {w.ip}:{w.data_port}")
        self.data = DataServer(self.store, w.bind, w.data_port, worker_id=hb.load_worker_id(first_dir),
                               secret=self.cfg.cluster.secret, piece_size=w.buffer_size,
                               congestion=self.cfg.cluster.data_congestion, cache_writes=w.cache_received,
                               tls=self.tls if self.tls and self.tls.data else None).start()
        self.data.tokens = self._block_tokens()   # not yet registered: no client holds a token yet
        if w.local_writes:
            data = self.data
            try:
                self.local = LocalWriteServer(self.store, data.port, lambda: data.worker_id,
                                              secret=self.cfg.cluster.secret, allowed_uids=self._local_uids(),
                                              token_grace_s=self.cfg.security.block_token_grace_s).start()
            except OSError as e:   # clients on this host then send their bytes over TCP
                log.warning("short-circuit writes off: cannot listen on the local write socket: %s", e)
        self._start_ufs()
        self._start_rpc()
        self.metrics = metrics.serve("worker", w.bind, w.metrics_port,
                                     [WorkerCollector(self.store, self.io_choice.name if self.io_choice else "")])
        if w.master:
            self.copies = CopyQueue(self.store, self.data.pool)
            self.heartbeat = hb.Heartbeat(w, self.store, self.rpc_port, self.data.port,
                                          on_registered=self._registered,
                                          secret=self.cfg.cluster.secret,
                                          on_replicate=self._replicate,
                                          io_engine=self.io_choice.name if self.io_choice else "",
                                          metrics_port=self.metrics.port if self.metrics else 0,
                                          tls=self.tls).start()
            self.store.on_full = self.heartbeat.kick
        else:
            log.warning("worker.master is empty: standalone mode, no master")
            self._announce(self.data.worker_id)

    def _block_tokens(self) -> BlockTokens:
        """The cluster's block tokens, with the configured ttl (of the tokens this worker
        mints for its UFS fetch forwards) and grace (past the expiry of those it checks)."""
        s = self.cfg.security
        try:
            return BlockTokens(self.cfg.cluster.secret, s.block_token_ttl_s, s.block_token_grace_s)
        except ValueError as e:
            raise ConfigError(f"security.block_token_*: {e}") from None

    def _local_uids(self) -> list[int]:
        """security.local_uids as numbers."""
        try:
            return [int(u) for u in self.cfg.security.local_uids]
        except ValueError:
            raise ConfigError(f"security.local_uids: not uids: {self.cfg.security.local_uids}") from None

    def _probe_dir(self) -> str:
        """Where the io_uring probe writes its test file: the first data dir, so it
        tries the filesystem (and O_DIRECT) the blocks will use."""
        path = os.path.abspath(parse_dir_spec(self.cfg.worker.dirs[0])[2])
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot use worker.dirs: {e}") from None
        return path

    def _replicate(self, cmd: "hb.curvine_pb2.ReplicateCommand") -> None:
        """A re-replication order from the master: push a local block to its new holders."""
        assert self.copies is not None
        targets = chain_targets([(t.ip, t.data_port, t.worker_id) for t in cmd.targets])
        self.copies.submit(cmd.block_id, targets, cmd.token)

    def _start_ufs(self) -> None:
        """The UFS side: the mount cache (looked up on the master over the heartbeat's
        link, once that exists) and the fetcher the data server's READs and the
        service's LoadBlocks share."""
        assert self.store is not None and self.data is not None
        self.ufs_mounts = UfsMounts(self._resolve_mount, self.cfg.ufs.timeout_s)
        self.ufs_fetcher = UfsFetcher(self.store, self.ufs_mounts, self.data.pool, self.cfg.cluster.secret,
                                      self.cfg.ufs.timeout_s, cache_writes=self.cfg.worker.cache_received,
                                      buffers=BlockBuffers())
        self.ufs_fetcher.tokens = self._block_tokens()
        self.data.ufs = self.ufs_fetcher

    def _resolve_mount(self, mount_id: int) -> curvine_pb2.UfsMount:
        if self.heartbeat is None:
            return no_master(mount_id)
        return master_resolver(self.heartbeat.link, self.cfg.ufs.timeout_s)(mount_id)

    def _ufs_parts(self) -> service.UfsParts:
        assert self.store is not None and self.data is not None and self.ufs_fetcher is not None
        assert self.ufs_mounts is not None
        data = self.data
        persister = Persister(self.store, self.ufs_mounts, data.pool, self.ufs_fetcher.buffers,
                              lambda: data.worker_id, self.cfg.ufs.timeout_s, tokens=self._block_tokens())
        return service.UfsParts(self.ufs_fetcher, persister, self.cfg.ufs.load_threads)

    def _start_rpc(self) -> None:
        w = self.cfg.worker
        assert self.store is not None and self.data is not None
        self.rpc = grpc.server(ThreadPoolExecutor(max_workers=w.rpc_threads, thread_name_prefix="rpc"),
                               options=[("grpc.so_reuseport", 0), *listener.grpc_server_options()],
                               interceptors=[SecretCheck(self.cfg.cluster.secret, "worker")])
        data = self.data
        service.add_to_server(service.WorkerService(self.store, lambda: data.worker_id, w.host,
                                                    ufs=self._ufs_parts()), self.rpc)
        self.rpc_port = add_port(self.rpc, f"{w.bind}:{w.rpc_port}", self.tls)
        if not self.rpc_port:
            raise OSError(f"cannot listen on {w.bind}:{w.rpc_port} for rpc")
        self.rpc.start()

    def _registered(self, worker_id: int) -> None:
        assert self.data is not None and self.store is not None
        if worker_id != self.data.worker_id:
            hb.save_worker_id(self.store.dirs[0].path, worker_id)
        self.data.worker_id = worker_id
        if not self.ready.is_set():
            self._announce(worker_id)

    def _announce(self, worker_id: int) -> None:
        assert self.data is not None
        ip = self.cfg.worker.ip
        print(f"worker {worker_id} data {ip}:{self.data.port} rpc {ip}:{self.rpc_port}", flush=True)
        self.ready.set()

    def stop(self) -> None:
        """Stop in reverse order; safe on a partially started worker."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.copies is not None:
            self.copies.close()
        if self.rpc is not None:
            self.rpc.stop(grace=2).wait()
        if self.local is not None:
            self.local.close()
        if self.data is not None:
            self.data.close()
        if self.ufs_fetcher is not None:
            self.ufs_fetcher.close()
        if self.ufs_mounts is not None:
            self.ufs_mounts.close()
        if self.io is not None:
            self.io.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="curvine-worker",
                                     description="curvine-py block server (stores and serves blocks)")
    config.add_flags(parser, ["cluster", "worker", "tls"])
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signals = StopSignals()
    worker: Worker | None = None
    try:
        cfg = config.load(args)
        validate(cfg)
        worker = Worker(cfg)
        worker.start()
    except ConfigError as e:
        print(f"curvine-worker: {e}", file=sys.stderr)
        if worker is not None:
            worker.stop()
        return 2
    except OSError as e:
        print(f"curvine-worker: {e}", file=sys.stderr)
        if worker is not None:
            worker.stop()
        return 1
    sig = signals.wait()
    log.info("signal %s: stopping", sig)
    worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
