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
import socket
import sys
import threading
import time
import typing
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, Histogram, Info, disable_created_metrics, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from curvine_py.common import listener
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
HTTP_TIMEOUT_S = 10.0   # a /metrics connection silent this long (idle, or half a request) is closed
HTTP_MAX_CONNS = 64     # connections served at once (fewer under a low descriptor limit)


class _QuietHandler(WSGIRequestHandler):
    """prometheus-client's handler with a socket timeout (StreamRequestHandler.timeout):
    an idle or half-open peer holds its thread HTTP_TIMEOUT_S, not forever.  Logs nothing
    per request (a flood of garbage is one line per 10 s, by the server)."""
    timeout = HTTP_TIMEOUT_S
    server: "_HttpServer"

    def parse_request(self) -> bool:
        self.server.request_line_read(self.connection)   # no longer evictable
        return bool(super().parse_request())

    def log_message(self, format: str, *args: typing.Any) -> None:
        pass


class _HttpServer(ThreadingWSGIServer):
    """prometheus-client's thread-per-connection server (what start_http_server runs),
    with the limits of common/listener.py: at most max_conns connections, and at the cap
    the oldest that has not sent its request line yet is closed to make room (only when
    every one is inside a request is the new one refused); accept failures (EMFILE) back
    off and are logged once per 10 s instead of spinning the accept loop; a failed request
    is one line per 10 s, not a traceback on stderr each."""
    request_queue_size = listener.BACKLOG
    max_conns = HTTP_MAX_CONNS

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        self._conns: dict[socket.socket, listener.Conn] = {}
        self._conns_lock = threading.Lock()
        self._failures = listener.FailureLog("metrics")
        self._delay = 0.0
        super().__init__(*args, **kwargs)

    def get_request(self) -> tuple[socket.socket, typing.Any]:
        try:
            request = super().get_request()
        except OSError as e:   # socketserver drops it and selects again: at once, for ever, on EMFILE
            if e.errno not in (errno.ECONNABORTED, errno.EINTR, errno.EAGAIN):
                self._failures.note("accept failed", e)
                self._delay = min(listener.BACKOFF_S[1], max(listener.BACKOFF_S[0], 2 * self._delay))
                time.sleep(self._delay)
            raise
        self._delay = 0.0
        return request

    def process_request(self, request: typing.Any, client_address: typing.Any) -> None:
        with self._conns_lock:
            full = len(self._conns) >= self.max_conns
        if full:
            if not self._evict():
                self._failures.note("a connection was refused", ConnectionRefusedError(
                    f"at the cap of {self.max_conns} connections, each inside a request"))
                self.shutdown_request(request)
                return
            self._failures.note("a connection made room for a new one", ConnectionResetError(
                f"at the cap of {self.max_conns} connections"))
        with self._conns_lock:
            self._conns[request] = listener.Conn(request, client_address)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: typing.Any, client_address: typing.Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def request_line_read(self, sock: socket.socket) -> None:
        conn = self._conns.get(sock)
        if conn is not None:
            conn.working()

    def _forget(self, request: socket.socket) -> None:
        with self._conns_lock:
            self._conns.pop(request, None)

    def _evict(self) -> bool:
        """Close the oldest connection still waiting for its request line."""
        now = time.monotonic()
        with self._conns_lock:
            ranked = [(r, id(c), c) for c in self._conns.values() if (r := c.rank(now)) is not None]
        if not ranked:
            return False
        min(ranked)[2].cut("at the cap")
        return True

    def handle_error(self, request: typing.Any, client_address: typing.Any) -> None:
        e = sys.exc_info()[1]
        self._failures.note("a request failed", e or Exception("unknown"), trace=not isinstance(e, OSError))


def start_http_server(port: int, bind: str) -> tuple[WSGIServer, threading.Thread]:
    """prometheus_client.start_http_server with _HttpServer and _QuietHandler."""
    family, _, _, _, address = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server_class: type[_HttpServer] = type("_HttpServer", (_HttpServer,), {
        "address_family": family,
        "max_conns": max(4, min(HTTP_MAX_CONNS, listener.descriptor_limit() // 16))})
    server: WSGIServer = make_server(str(address[0]), int(address[1]), make_wsgi_app(REGISTRY), server_class,
                                     handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread


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
