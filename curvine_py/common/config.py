"""One TOML configuration for every process, overridable by environment and flags.

Every key lives in a section (``[master]``, ``[worker]``, ``[client]``, ``[fuse]``).
A key ``section.key`` can be overridden by the environment variable
``CURVINE_SECTION_KEY`` and by the command-line flag ``--section-key``; flags win
over the environment, which wins over the file, which wins over the defaults
below.  docs/config.md lists every key; ``cv config`` prints the effective values.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import socket
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

from curvine_py.common.errors import ConfigError

MiB = 1 << 20
# ./.curvine/curvine.toml: the config (and secret) of the local cluster `cv cluster start` runs here
DEFAULT_CONFIG_PATHS = ("./curvine.toml", "./.curvine/curvine.toml", "/etc/curvine/curvine.toml")


@dataclass
class ClusterConfig:
    """Settings every process of one cluster shares."""
    name: str = "curvine"
    secret: str = ""              # shared secret on every RPC (multi-host issue); "" = open
    data_congestion: str = "cubic"  # TCP congestion control of block-data sockets; "" = the system's default


@dataclass
class SecurityConfig:
    """Block tokens (common/security.py) and the local paths' trust (docs/security.md)."""
    block_token_ttl_s: float = 600.0   # a block token the master mints is good this long (renewed by clients)
    block_token_grace_s: float = 30.0  # a worker takes a token this long past its expiry (master/worker clock skew)
    # uids besides root and the worker's own that may use its local write socket
    local_uids: list[str] = field(default_factory=list)


@dataclass
class MasterConfig:
    """The metadata server."""
    bind: str = "0.0.0.0"
    port: int = 8995
    frame_port: int = 8996        # framed metadata channel, the clients' (docs/wire.md); 0 = ephemeral
    meta_dir: str = "./.curvine/master"
    sync: str = "normal"          # sqlite synchronous: "normal" survives process crashes, "full" power loss
    # default block size of new files: a 14 MiB KV chunk is one block, which a mount on a
    # replica's host hands to the kernel by passthrough (docs/kvcache.md "The default block size")
    block_size: int = 16 * MiB
    replicas: int = 2
    vnodes: int = 64              # virtual nodes per worker on the hash ring
    heartbeat_ms: int = 1000      # how often workers heartbeat
    worker_timeout_s: float = 30.0  # a worker silent this long is lost (its blocks are then re-replicated)
    replication_scan_s: float = 30.0  # how often every block's replica count is checked (besides events)
    lease_s: float = 60.0         # a writer's lease lasts this long without renewal
    retry_cache_s: float = 600.0  # how long request ids of mutations are remembered
    # mounts' cache leases (master/sessions.py, docs/wire.md): the longest one granted; a
    # mutation waits at most this for a silent mount, and a new leader this long; 0 = off
    cache_lease_s: float = 1.0
    # flock and POSIX locks (master/locks.py): a mount silent this long loses its locks;
    # a master that starts or becomes the leader grants none for this long (reclaims)
    lock_lease_s: float = 5.0
    # a client keeping files in the trash (unlinked while open) and silent this long is gone:
    # the leader removes those files (common/trash.py, master/trashsweep.py)
    trash_grace_s: float = 60.0
    rpc_threads: int = 16
    evict: bool = True            # evict least recently used files when the pool passes evict_high
    evict_high: float = 0.9       # usage fraction (pool or one worker) that starts eviction
    evict_low: float = 0.8        # eviction stops below this fraction
    evict_interval_s: float = 1.0  # how often usage is checked (an allocation past evict_high checks at once)
    ttl_sweep_s: float = 60.0     # how often files past their user.curvine.ttl are removed
    reads_flush_s: float = 10.0   # how often the last reads noted in memory are written down (LRU order)
    metrics_port: int = 9000      # Prometheus /metrics (docs/metrics.md); 0 = off
    # Three (or five) masters replicating the journal by Raft (docs/ha.md); "" = one master, no Raft.
    ip: str = "127.0.0.1"         # address clients, workers and the other masters reach this master at
    raft_port: int = 8994         # this master's Raft port (with raft_peers only)
    raft_peers: str = ""          # every master's ip:raft_port, comma-separated, this one's included
    election_timeout_s: float = 1.0  # a follower hearing no leader for 1-2x this starts an election
    snapshot_entries: int = 100000   # the Raft log is compacted into a SQLite snapshot past this many entries
    # the event feed (master/events.py, master/watch.py, docs/integrations.md)
    events_retention_s: float = 3600.0  # events older than this are pruned; a watcher's position must be newer
    events_max: int = 1_000_000   # ...and at most this many are kept
    watchers: int = 4             # watch streams served at once (each holds one of rpc_threads)
    watch_stall_s: float = 10.0   # a watcher that takes no events for this long while some wait is cut off


@dataclass
class WorkerConfig:
    """A block server."""
    master: str = "127.0.0.1:8995"  # where this worker registers and heartbeats (masters: comma-separated)
    bind: str = "0.0.0.0"
    ip: str = "127.0.0.1"         # address clients and peers use to reach this worker
    host: str = ""                # host identity for placement; "" = the hostname
    rpc_port: int = 8997
    data_port: int = 8999
    dirs: list[str] = field(default_factory=lambda: ["[SSD]./.curvine/worker/data"])
    reserve: int = 256 * MiB      # free space left untouched on each data dir's disk
    io_engine: str = "auto"       # disk I/O: "auto" | "uring" | "threads" (worker/ioengine.py, docs/worker.md)
    uring_entries: int = 128
    buffer_size: int = 1 * MiB    # piece size of the data channel
    read_io: str = "sendfile"     # block reads: "sendfile" (checked in place, sent from page cache), "pread", "uring"
    direct_io: bool = True        # write block files with O_DIRECT where the filesystem allows (docs/worker.md)
    cache_received: bool = True   # ...except blocks arriving over the network: in the page cache (docs/worker.md)
    memory_cache: int = 0         # bytes of RAM keeping recently written blocks for reads (worker/memtier.py); 0 = off
    local_writes: bool = True     # clients on this host may write block files themselves (worker/localwrite.py)
    rpc_threads: int = 8
    metrics_port: int = 9001      # Prometheus /metrics (docs/metrics.md); 0 = off


@dataclass
class ClientConfig:
    """The client core: SDK, CLI, and mount."""
    master: str = "127.0.0.1:8995"  # the master's gRPC address; several masters: comma-separated
    host: str = ""                # this client's host identity (local-replica preference); "" = hostname
    block_size: int = 0           # block size of files this client creates; 0 = inherit from the directory
    read_ahead_blocks: int = 4    # blocks fetched ahead of a sequential reader
    buffer_pool_bytes: int = 256 * MiB  # block buffers per block size (64 of 4 MiB, 16 of 16 MiB); docs/config.md
    rpc_timeout_s: float = 30.0   # one attempt of a metadata call
    retry_s: float = 120.0        # how long a metadata call keeps retrying an unreachable master
    data_timeout_s: float = 10.0  # a data-channel socket silent this long fails (writes)
    read_timeout_s: float = 2.0   # a replica silent this long during a read: read the other replica
    tune_malloc: bool = True      # keep freed large buffers in malloc's heap (see common/memory.py)
    short_circuit: bool = True    # read replicas on this host from their block files (client/shortcircuit.py)
    short_circuit_writes: bool = True  # write a replica on this host into its block file (client/localwrite.py)
    cache_local_writes: bool = False  # ...through the page cache, whatever worker.direct_io says (KV chunks read soon)


@dataclass
class FuseConfig:
    """The mount."""
    attr_timeout_s: float = 1.0
    entry_timeout_s: float = 1.0
    negative_timeout_s: float = 0.0
    # names and attributes cached in the mount under the master's leases, kept true by its
    # pushes (client/metacache.py): lookups and stats the kernel's cache missed need no call
    metadata_cache: bool = True
    # ...and what its pushes take leaves the kernel's caches too (fuse/notify.py); its cost
    # on LMCache's path through the mount is within the noise (docs/config.md, issue 39)
    kernel_invalidation: bool = True
    direct_io: bool = False
    direct_io_reads: bool = False  # read-only opens of complete files bypass the page cache (see docs/config.md)
    direct_io_creates: bool = True  # files created write-only are written past the page cache (docs/config.md)
    max_read_ahead: int = 16 * MiB  # superseded by read_ahead_kb, read by nothing (kept: old config files name it)
    # the mount's kernel read-ahead (KiB, its bdi's read_ahead_kb, set after FUSE_INIT:
    # fuse/readahead.py); 0 = leave the kernel's (128 KiB: one FUSE read per 128 KiB)
    read_ahead_kb: int = 4096
    passthrough: bool = True  # the kernel reads one-block files with a local replica itself (fuse/passthrough.py)
    verify_ahead: bool = True  # a lookup of such a file checks its block file in the background (client/mount/)
    fetch_ahead: bool = False  # a lookup of a one-block file with no replica here fetches it (client/mount/)
    stage_remote: bool = False  # such a file is fetched whole into memory and read by the kernel (client/mount/)
    stage_bytes: int = 256 * MiB  # memory for staged blocks (stage_remote); a block that does not fit reads normally
    request_timeout_s: float = 60.0  # unanswered this long: EIO, logged with the state (fuse/watchdog.py); 0 = never
    metrics_port: int = 9002      # the mount's /metrics; taken: an ephemeral port (docs/metrics.md); 0 = off
    metrics_bind: str = "127.0.0.1"  # the address /metrics listens on (0.0.0.0: scraped from other hosts)


@dataclass
class UfsConfig:
    """The under storage behind UFS mounts (docs/ufs.md): read by the masters and workers."""
    timeout_s: float = 30.0       # one UFS call (HEAD, list, ranged GET, upload part) fails after this
    metadata_ttl_s: float = 30.0  # default of `cv ufs mount --metadata-ttl`
    upload_threads: int = 2       # the master's write-back uploads running at once
    upload_retry_max_s: float = 60.0  # backoff cap between retries of a failing write-back upload
    upload_delay_s: float = 1.0   # write-back: uploaded once closed this long (a .tmp renamed meanwhile: once)
    part_size: int = 16 * MiB     # multipart upload part size
    load_threads: int = 4         # cv load: blocks fetched at once per job


@dataclass
class TlsConfig:
    """Mutual TLS on every TCP channel (common/tls.py, docs/security.md)."""
    enabled: bool = False         # TLS with client certificates on gRPC, the framed channel and block data
    ca: str = ""                  # the cluster CA certificate (PEM); its key beside it (ca.key) issues missing ones
    cert: str = ""                # this process's certificate; "" = <ca dir>/<role>.pem
    key: str = ""                 # its private key (mode 0600); "" = the certificate's path with .key
    data: bool = False            # also the block-data channel (costs >50% of KV writes: docs/security.md)


@dataclass
class Config:
    """The whole configuration; one instance per process."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    master: MasterConfig = field(default_factory=MasterConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    fuse: FuseConfig = field(default_factory=FuseConfig)
    ufs: UfsConfig = field(default_factory=UfsConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)

    def section(self, name: str) -> typing.Any:
        return getattr(self, name)


SECTIONS = tuple(f.name for f in dataclasses.fields(Config))


def _field_types(section_obj: typing.Any) -> dict[str, typing.Any]:
    return _types_of(section_obj.__class__)


@functools.cache
def _types_of(section: type) -> dict[str, typing.Any]:
    """Evaluated once per section class: get_type_hints costs ~1 ms a call, and it was
    called for every key applied: a full config file took 31 ms to load, now 1.4 ms."""
    hints = typing.get_type_hints(section)
    return {f.name: hints[f.name] for f in dataclasses.fields(section)}


def parse_size(text: str | int) -> int:
    """Parse '4MiB', '100GB', '1.5G', '4096' into bytes (binary units for K/M/G/T)."""
    if isinstance(text, int):
        return text
    s = text.strip().upper().replace(" ", "")
    units = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
             "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40,
             "TIB": 1 << 40}
    i = len(s)
    while i > 0 and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    num, unit = s[:i], s[i:]
    if not num or unit not in units:
        raise ConfigError(f"not a size: {text!r} (use e.g. 4MiB, 100GB)")
    try:
        return int(float(num) * units[unit])
    except (ValueError, OverflowError):   # "1.2.3", or "1e999" (infinite)
        raise ConfigError(f"not a size: {text!r}") from None


def _coerce(value: typing.Any, typ: typing.Any, key: str) -> typing.Any:
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            low = str(value).strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is int:
            if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
                return parse_size(value)
            return int(value)
        if typ is float:
            return float(value)
        if typ is str:
            return str(value)
        if typing.get_origin(typ) is list:
            if isinstance(value, str):
                return [v for v in value.split(",") if v]
            return [str(v) for v in value]
    except (ValueError, TypeError, OverflowError, ConfigError):   # OverflowError: int(inf) of `port = inf`
        raise ConfigError(f"bad value for {key}: {value!r}") from None
    return value


def _apply(cfg: Config, section: str, key: str, value: typing.Any, origin: str) -> None:
    sec = cfg.section(section)
    types = _field_types(sec)
    if key not in types:
        raise ConfigError(f"unknown configuration key {section}.{key} (in {origin})")
    setattr(sec, key, _coerce(value, types[key], f"{section}.{key}"))


def load_file(cfg: Config, path: str | Path) -> None:
    """Merge a TOML file into cfg."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:   # TOML is UTF-8: tomllib decodes first
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    for section, values in data.items():
        if section not in SECTIONS or not isinstance(values, dict):
            raise ConfigError(f"{path}: unknown section [{section}]")
        for key, value in values.items():
            _apply(cfg, section, key, value, str(path))


def apply_env(cfg: Config, environ: typing.Mapping[str, str] = os.environ) -> None:
    """Apply CURVINE_SECTION_KEY variables (and CURVINE_MASTER for the client's master).

    A variable named for a section but no key of it (CURVINE_WORKER_IO_ENGIN) is an error,
    as an unknown key in the file is: a typo silently ignored would run with the default.
    Other CURVINE_* variables (CURVINE_CONF, CURVINE_RUN_DIR, ...) are not settings."""
    if environ.get("CURVINE_MASTER"):
        cfg.client.master = environ["CURVINE_MASTER"]
    for name, value in environ.items():
        section, key = _setting_of(name)
        if section:
            _apply(cfg, section, key, value, name)


def _setting_of(name: str) -> tuple[str, str]:
    """(section, key) a CURVINE_SECTION_KEY variable names; ("", "") for any other name."""
    for section in SECTIONS:
        prefix = f"CURVINE_{section.upper()}_"
        if name.startswith(prefix) and len(name) > len(prefix):
            return section, name[len(prefix):].lower()
    return "", ""


def add_flags(parser: argparse.ArgumentParser, sections: typing.Iterable[str] = SECTIONS) -> None:
    """Add --config and one --section-key flag per key, all defaulting to 'unset'."""
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    defaults = Config()
    for section in sections:
        group = parser.add_argument_group(f"[{section}] settings")
        for key in _field_types(defaults.section(section)):
            flag = f"--{section}-{key}".replace("_", "-")
            group.add_argument(flag, dest=f"cfg__{section}__{key}", default=None, metavar="V",
                               help=f"default {getattr(defaults.section(section), key)!r}")


def load(args: argparse.Namespace | None = None, path: str | None = None) -> Config:
    """Defaults, then the file (--config, $CURVINE_CONF or ./curvine.toml), then env, then flags."""
    cfg = Config()
    path = path or (getattr(args, "config", None) if args else None) or os.environ.get("CURVINE_CONF")
    if path:
        load_file(cfg, path)
    else:
        for candidate in DEFAULT_CONFIG_PATHS:
            if os.path.exists(candidate):
                load_file(cfg, candidate)
                break
    apply_env(cfg)
    if args is not None:
        for name, value in vars(args).items():
            if name.startswith("cfg__") and value is not None:
                _, section, key = name.split("__", 2)
                _apply(cfg, section, key, value, f"--{section}-{key}")
    return cfg


def addresses(text: str) -> tuple[str, ...]:
    """The "host:port" entries of a comma-separated list (client.master, worker.master,
    master.raft_peers): blanks stripped, empties and repeats dropped, order kept."""
    out: list[str] = []
    for part in text.split(","):
        a = part.strip()
        if a and a not in out:
            out.append(a)
    return tuple(out)


def host_identity(configured: str) -> str:
    """A node's host identity for placement: configured, else the hostname."""
    return configured or socket.gethostname()


def to_toml(cfg: Config) -> str:
    """Render cfg as TOML (for `cv config` and the files `cv cluster start` writes)."""
    lines: list[str] = []
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for key, value in dataclasses.asdict(cfg.section(section)).items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: typing.Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + "".join(_toml_char(c) for c in str(value)) + '"'


def _toml_char(c: str) -> str:
    """c as a TOML basic string holds it: quote, backslash and control characters (but
    tab) escaped; a value with a newline printed raw was a file that no longer loaded."""
    if c in '"\\':
        return "\\" + c
    if (c < " " and c != "\t") or c == "\x7f":
        return f"\\u{ord(c):04x}"
    return c
