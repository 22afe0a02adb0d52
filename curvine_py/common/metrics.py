"""What every daemon's Prometheus endpoint shares: the server, build info, buckets, timing.

Each daemon (master, worker, mount) is its own process with prometheus-client's default
registry; its metrics are defined in its own ``metrics`` module (``master/metrics.py``,
``worker/metrics.py``, ``client/metrics.py`` for the client core, ``fuse/metrics.py``)
and served here on ``<section>.metrics_port`` (0 = no server).  docs/metrics.md lists
every metric; the names follow Prometheus' conventions: ``curvine_`` prefix, base
units, ``_total`` counters, labels of low cardinality (never a path or a file name).
"""
from __future__ import annotations

import errno
import logging
import platform
import threading
import typing
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, Histogram, Info, disable_created_metrics, start_http_server
from prometheus_client.registry import Collector

from curvine_py.common.errors import ConfigError
from curvine_py.common.version import package_version

log = logging.getLogger(__name__)
# No `*_created` series beside every counter and histogram: they double what a scrape
# carries and no dashboard here uses them (this module is imported before any metric).
disable_created_metrics()
# Seconds, from a framed metadata call (~50 us) to a block fetch that waited on a disk
# or a lost replica (seconds): wide enough that p50 and p99 both land inside a bucket.
LATENCY_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
                   100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0, 30.0)
# A journal batch holds 1..256 records (master/journal.py MAX_BATCH).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_BUILD = Info("curvine_build", "The running curvine-py: version, Python, and which daemon this is")


@dataclass
class MetricsServer:
    """A running /metrics endpoint (prometheus-client's WSGI server on a daemon thread)."""
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(role: str, bind: str, port: int, collectors: typing.Iterable[Collector] = (),
          fallback: bool = False) -> MetricsServer | None:
    """Serve this process's metrics on bind:port; None when port is 0 (metrics off).

    collectors: scrape-time collectors of this daemon (gauges read from its state when
    Prometheus asks), registered only here, so a process that builds a daemon's objects
    without serving them (a test) registers nothing twice.  fallback: a port in use is
    replaced by an ephemeral one, with one log line (mounts: several run on one host);
    otherwise it is a ConfigError, like the daemon's other ports.
    """
    _BUILD.info({"version": package_version(), "python": platform.python_version(), "role": role})
    if port == 0:
        log.info("metrics off (%s.metrics_port = 0)", _section(role))
        return None
    for c in collectors:
        REGISTRY.register(c)
    try:
        server, thread = start_http_server(port, bind)
    except OSError as e:
        if not (fallback and e.errno == errno.EADDRINUSE):
            raise ConfigError(f"cannot serve metrics on {bind}:{port} ({_section(role)}.metrics_port; "
                              f"port in use?): {e.strerror}") from None
        server, thread = start_http_server(0, bind)
        log.warning("metrics port %d is in use: serving /metrics on port %d instead", port,
                    server.server_address[1])
    running = MetricsServer(server, thread)
    log.info("metrics on http://%s:%d/metrics", bind, running.port)
    return running


def _section(role: str) -> str:
    return "fuse" if role == "mount" else role


def histogram(name: str, doc: str, labels: typing.Sequence[str] = (),
              buckets: typing.Sequence[float] = LATENCY_BUCKETS) -> Histogram:
    """A latency histogram with the shared buckets."""
    return Histogram(name, doc, list(labels), buckets=tuple(buckets))
