"""The client core's Prometheus metrics: metadata calls, where read bytes come from, read-ahead.

Counted only in a process that serves them (``on``, set by the mount daemon when
``fuse.metrics_port`` is not 0; fuse/metrics.py adds its own): an SDK or ``cv`` process
pays nothing (a histogram observation costs ~3 us here, a counter's ~1 us).  The read
sources are the four of docs/metrics.md: ``passthrough`` (files the kernel reads from
a local block file itself, counted by the mount at open), ``memory`` (mount reads
answered from blocks already fetched), ``short_circuit`` (a block range read from a
replica's file on this host) and ``remote`` (a block range received from a worker).
"""
from __future__ import annotations

import typing

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from curvine_py.common.metrics import histogram

on = False   # count? (the mount sets it when it serves /metrics)
META_RPC_SECONDS = histogram("curvine_client_meta_rpc_duration_seconds",
                             "One metadata call to the master as the client saw it (retries included), by method",
                             ["method"])
READS = Counter("curvine_client_reads",
                "Reads by where their bytes came from: passthrough (file opens the kernel serves from a "
                "local block file or a staged copy), memory (mount reads answered from fetched blocks), "
                "short_circuit and remote (block ranges read from a local block file or from a worker)", ["source"])
READ_BYTES = Counter("curvine_client_read_bytes",
                     "Bytes read, by source (memory, short_circuit, remote; passthrough bytes never "
                     "reach the client)", ["source"])
READAHEAD_BLOCKS = Counter("curvine_client_readahead_blocks", "Blocks fetched ahead of a sequential reader")
READAHEAD_HITS = Counter("curvine_client_readahead_hits", "Blocks fetched ahead that a later read then used")
LOOKUP_FETCHES = Counter("curvine_client_lookup_fetches",
                         "Blocks fetched when their file was looked up (fuse.fetch_ahead)")
LOOKUP_FETCH_HITS = Counter("curvine_client_lookup_fetch_hits",
                            "Blocks fetched at a lookup that the open after it used (fuse.fetch_ahead)")
STAGED_BLOCKS = Counter("curvine_client_staged_blocks",
                        "Remote one-block files fetched whole into memory for the kernel to read (fuse.stage_remote)")
STAGE_HITS = Counter("curvine_client_stage_hits",
                     "Opens that found their block staged already (by a lookup, or an earlier open)")
# Counted in every process (a failure is rare, and the SDK's user wants it too): docs/metrics.md.
WRITE_VERIFY_FAILURES = Counter(
    "curvine_client_write_verify_failures",
    "Blocks whose bytes, as the workers confirmed them, were not the bytes acknowledged writes handed "
    "over: resent (the buffer held them: sent again) or lost (it did not: the file's close fails, "
    "nothing is committed)", ["outcome"])
for _outcome in ("resent", "lost"):
    WRITE_VERIFY_FAILURES.labels(_outcome)
SOURCES = ("passthrough", "memory", "short_circuit", "remote")
for _source in SOURCES:
    READS.labels(_source)
    READ_BYTES.labels(_source)
# Labelled children looked up once: the read path counts on every block and mount read.
SHORT_CIRCUIT_READS, SHORT_CIRCUIT_BYTES = READS.labels("short_circuit"), READ_BYTES.labels("short_circuit")
REMOTE_READS, REMOTE_BYTES = READS.labels("remote"), READ_BYTES.labels("remote")
MEMORY_READS, MEMORY_BYTES = READS.labels("memory"), READ_BYTES.labels("memory")
PASSTHROUGH_READS = READS.labels("passthrough")

# Counted in every process (rare: once per file and token life at most), so SDK users see it too.
TOKEN_RENEWALS = Counter("curvine_client_token_renewals",
                         "Block tokens renewed at the master after a worker refused one as expired, by access "
                         "(read: a block located again; write: a new block id)", ["access"])
for _access in ("read", "write"):   # exported at 0 from the start, as the other labelled counters
    TOKEN_RENEWALS.labels(_access)
_meta_children: dict[str, typing.Any] = {}

# What became of the directory listings the mount's metadata cache asked for at lookups
# (client/metacache.py, LookupRequest.listing_max), and of those it kept: churn (refused,
# stale, lost) is what its hold-off is for, too_large what LISTING_MAX leaves out.
LISTINGS = Counter("curvine_client_metadata_cache_listings",
                   "Directory listings asked for at lookups, by outcome: listed (kept: the directory's "
                   "lookups are answered by the mount), too_large (none given: more names than the mount "
                   "asks for, or a mode the mount cannot check), refused (none given: a change there raced "
                   "with it), stale (given, but a change pushed before it arrived undid it: not kept), lost "
                   "(kept, then taken by a change in its directory)", ["outcome"])
LISTING_OUTCOMES = ("listed", "too_large", "refused", "stale", "lost")
_listing_children = {_outcome: LISTINGS.labels(_outcome) for _outcome in LISTING_OUTCOMES}


def listing(outcome: str) -> None:
    """Count one of LISTING_OUTCOMES (in a mount that serves metrics: a call, not a
    Counter, so that the cache's code that counts stays one line)."""
    if on:
        _listing_children[outcome].inc()


def meta_seconds(method: str) -> typing.Any:
    """The latency histogram child of one metadata method (cached: one dict lookup a call)."""
    child = _meta_children.get(method)
    if child is None:
        child = _meta_children[method] = META_RPC_SECONDS.labels(method)
    return child


class ClientCollector(Collector):
    """Open files and dirty bytes of a VFS, read at scrape time without its locks
    (as client/state.py describes a hang: a scrape must never wait on one)."""

    def __init__(self, vfs: typing.Any) -> None:
        self.vfs = vfs

    def describe(self) -> list[typing.Any]:
        return []

    def collect(self) -> typing.Iterator[GaugeMetricFamily | CounterMetricFamily]:
        handles = dict(getattr(self.vfs, "_handles", {}))
        yield GaugeMetricFamily("curvine_client_open_files", "Open file handles", value=len(handles))
        yield GaugeMetricFamily("curvine_client_dirty_bytes",
                                "Bytes written and not yet shipped to workers", value=dirty_bytes(self.vfs))
        opens = getattr(self.vfs, "opens", None)   # the mount's OpenPolicy (client/vfs.py)
        yield GaugeMetricFamily("curvine_client_staged_bytes", "Bytes of remote blocks staged in memory for the "
                                "kernel (fuse.stage_remote; at most fuse.stage_bytes)",
                                value=opens.staged_bytes if opens is not None else 0)
        cache = getattr(self.vfs, "cache", None)   # the mount's metadata cache (client/metacache.py)
        if cache is not None:
            answers = CounterMetricFamily("curvine_client_metadata_cache", "Lookups and stats the kernel "
                                          "passed to the mount, by whether its metadata cache answered them "
                                          "(hit) or the master did (miss)", labels=["result"])
            answers.add_metric(["hit"], cache.hits)
            answers.add_metric(["miss"], cache.misses)
            yield answers
            yield GaugeMetricFamily("curvine_client_metadata_cache_sessions", "Cache sessions the mount "
                                    "opened with the master (a new one after each break)", value=cache.sessions)


def dirty_bytes(vfs: typing.Any) -> int:
    """Bytes in the dirty blocks of every writer of vfs (their written ranges)."""
    total = 0
    for st in list(dict(getattr(vfs, "_inodes", {})).values()):
        w = getattr(st, "writer", None)
        for db in list(dict(getattr(w, "dirty", {})).values()):
            total += sum(end - start for start, end in list(getattr(db, "ranges", ())))
    return total
