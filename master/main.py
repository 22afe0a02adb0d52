"""``curvine-master``: the metadata server process."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from concurrent import futures

import grpc

from curvine_py.common import config
from curvine_py.common.errors import ConfigError
from curvine_py.common.memory import tune_malloc
from curvine_py.common.signals import StopSignals
from curvine_py.common.rpc import server_options
from curvine_py.common.security import SecretCheck
from curvine_py.master.service import MasterService
from curvine_py.pb import curvine_pb2_grpc as pb_grpc

log = logging.getLogger("curvine.master")


def build_server(cfg: config.Config) -> tuple[grpc.Server, MasterService, int]:
    """Create the store, the service and a started gRPC server; returns the bound port."""
    os.makedirs(cfg.master.meta_dir, exist_ok=True)
    service = MasterService(cfg, os.path.join(cfg.master.meta_dir, "meta.db"))
    service.journal.start()
    service.evictor.start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.master.rpc_threads,
                                                    thread_name_prefix="rpc"),
                         options=server_options(),
                         interceptors=[SecretCheck(cfg.cluster.secret, "master")])
    pb_grpc.add_MasterServiceServicer_to_server(service, server)
    try:
        port = server.add_insecure_port(f"{cfg.master.bind}:{cfg.master.port}")
    except RuntimeError:
        port = 0
    if port == 0:
        raise ConfigError(f"cannot listen on {cfg.master.bind}:{cfg.master.port} (port in use?)")
    server.start()
    return server, service, port


def _housekeeping_loop(service: MasterService, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            service.housekeeping()
        except Exception:
            log.exception("housekeeping failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="curvine-master", description="curvine-py metadata server")
    config.add_flags(parser, ["cluster", "master"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signals = StopSignals()
    tune_malloc()
    try:
        cfg = config.load(args)
        server, service, port = build_server(cfg)
    except (ConfigError, OSError) as e:
        print(f"curvine-master: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    threading.Thread(target=_housekeeping_loop, args=(service, stop), name="housekeeping", daemon=True).start()
    print(f"master listening on {cfg.master.bind}:{port} meta {cfg.master.meta_dir}", flush=True)
    sig = signals.wait()
    stop.set()
    log.info("signal %s: shutting down", sig)
    server.stop(grace=2).wait()
    service.evictor.stop()
    service.journal.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
