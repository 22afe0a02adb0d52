"""``curvine-master``: the metadata server process."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc

from curvine_py.common import config, listener, metrics
from curvine_py.common.errors import ConfigError
from curvine_py.common.memory import tune_malloc
from curvine_py.common.signals import StopSignals
from curvine_py.common.rpc import add_port, grpc_servicer, server_options
from curvine_py.common.security import SecretCheck
from curvine_py.master.framed import FrameServer
from curvine_py.master.group import LeaderOnly
from curvine_py.master.metrics import MasterCollector
from curvine_py.master.service import MasterService
from curvine_py.master.watch import Watchers
from curvine_py.master.workers import CHECK_EVERY_S
from curvine_py.pb import curvine_pb2_grpc as pb_grpc

log = logging.getLogger("curvine.master")

# With TLS, what only a worker's certificate may call: a client certificate cannot join
# the pool as a worker, report blocks, or read a UFS mount's credentials.
_WORKERS = frozenset({"worker"})
WORKERS_ONLY = {m: _WORKERS for m in ("RegisterWorker", "Heartbeat", "ReportBlocks", "UfsMountGet")}


@dataclass
class Servers:
    """The running master: its service and the two servers that serve it."""
    service: MasterService
    grpc: grpc.Server
    port: int
    frames: FrameServer   # the clients' metadata channel
    watchers: Watchers    # the event feed's streams (EventService, on the gRPC port)
    metrics: metrics.MetricsServer | None = None   # None when master.metrics_port = 0

    def stop(self, grace: float = 2.0) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.frames.stop()
        self.watchers.stop()
        self.grpc.stop(grace=grace).wait()
        self.service.evictor.stop()
        self.service.uploader.stop()
        self.service.group.stop()


def start_frames(cfg: config.Config, service: MasterService) -> FrameServer:
    """The framed metadata server (docs/wire.md) on master.frame_port: every client's
    metadata calls go there, so it cannot be switched off (build_server refuses -1)."""
    frames = FrameServer(LeaderOnly(service), cfg.cluster.secret, cfg.master.bind, cfg.master.frame_port,
                         thread_done=service.close_thread_reader, sessions=service, tls=service.tls)
    try:
        service.frame_port = frames.start().port
    except OSError as e:
        raise ConfigError(f"cannot listen on {cfg.master.bind}:{cfg.master.frame_port} "
                          f"(master.frame_port; port in use?): {e.strerror}") from None
    return frames


def build_server(cfg: config.Config) -> Servers:
    """Create the store, the service and the started servers.

    Frames start before gRPC: a client learns the frame port over gRPC, so whenever
    gRPC answers the frame port answers too."""
    if not 0 < cfg.master.watchers < cfg.master.rpc_threads:
        raise ConfigError(f"master.watchers = {cfg.master.watchers}: each watch holds one of master.rpc_threads "
                          f"({cfg.master.rpc_threads}), which the workers' heartbeats need too: use 1 to "
                          f"{cfg.master.rpc_threads - 1}")
    if cfg.master.frame_port < 0:
        raise ConfigError(f"master.frame_port = {cfg.master.frame_port}: clients make their metadata calls on "
                          "it, so it cannot be off (0 = an ephemeral port)")
    if not cfg.master.trash_grace_s > 0:
        raise ConfigError(f"master.trash_grace_s = {cfg.master.trash_grace_s}: a client keeping an unlinked open "
                          "file must have time to say it lives; use seconds > 0 (the default is 60)")
    os.makedirs(cfg.master.meta_dir, exist_ok=True)
    service = MasterService(cfg, os.path.join(cfg.master.meta_dir, "meta.db"))
    service.journal.start()
    service.evictor.start()
    service.uploader.start()
    frames = start_frames(cfg, service)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.master.rpc_threads,
                                                    thread_name_prefix="rpc"),
                         options=server_options() + listener.grpc_server_options(),
                         interceptors=[SecretCheck(cfg.cluster.secret, "master")])
    pb_grpc.add_MasterServiceServicer_to_server(
        grpc_servicer(LeaderOnly(service), "MasterService", WORKERS_ONLY), server)
    watchers = Watchers(service, cfg.master, service.journal.events)
    pb_grpc.add_EventServiceServicer_to_server(watchers, server)
    port = add_port(server, f"{cfg.master.bind}:{cfg.master.port}", service.tls)
    if port == 0:
        frames.stop()
        watchers.stop()
        raise ConfigError(f"cannot listen on {cfg.master.bind}:{cfg.master.port} (port in use?)")
    server.start()
    return Servers(service, server, port, frames, watchers)


def serve_metrics(cfg: config.Config, servers: Servers) -> None:
    """/metrics on master.metrics_port (its port then in `cv report --json`, for `cv stats`)."""
    try:
        servers.metrics = metrics.serve("master", cfg.master.bind, cfg.master.metrics_port,
                                        [MasterCollector(servers.service)])
    except ConfigError:
        servers.stop(grace=0)
        raise
    servers.service.metrics_port = servers.metrics.port if servers.metrics is not None else 0


def _housekeeping_loop(servers: Servers, stop: threading.Event) -> None:
    while not stop.wait(CHECK_EVERY_S):
        try:
            servers.service.housekeeping()
            servers.watchers.housekeeping()
        except Exception:
            log.exception("housekeeping failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="curvine-master", description="curvine-py metadata server")
    config.add_flags(parser, ["cluster", "master", "tls"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signals = StopSignals()
    tune_malloc()
    try:
        cfg = config.load(args)
        servers = build_server(cfg)
        serve_metrics(cfg, servers)
    except (ConfigError, OSError) as e:
        print(f"curvine-master: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    threading.Thread(target=_housekeeping_loop, args=(servers, stop), name="housekeeping",
                     daemon=True).start()
    print(f"master listening on {cfg.master.bind}:{servers.port} frames {servers.service.frame_port} "
          f"meta {cfg.master.meta_dir}", flush=True)
    sig = signals.wait()
    stop.set()
    log.info("signal %s: shutting down", sig)
    servers.stop(grace=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
