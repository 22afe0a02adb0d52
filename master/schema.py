"""The SQLite schema of the master's durable store (docs/formats.md explains every column)."""
from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import stat
import time
import typing

import xxhash

from curvine_py.common.errors import CurvineError
from curvine_py.common.types import DIR_SIZE, ROOT_INO
from curvine_py.master import acl

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> typing.Iterator[None]:
    """One write transaction (BEGIN IMMEDIATE: the write lock taken at its start, not at
    its first write), committed at the block's end, rolled back on any exception (which
    goes on): every migration below is all or nothing."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# 2: the oplog keeps request id -> result only (version 1 stored every record's JSON in an
# `op` column, and a row for records without a request id); see migrate().
# 3: dirents is a WITHOUT ROWID table keyed by (parent, seq), the listing order, with a
# unique index on (parent, name) (version 2: a rowid table, its (parent, name) key and a
# third b-tree for (parent, seq)); see dirents_by_seq().  The oplog keeps a request id
# that is 32 lowercase hex digits (the clients' uuid4) as its 16 bytes (request_key).  The
# event feed's positions are no longer AUTOINCREMENT's, and its host names are ids of a
# hosts table (events_by_host_id).
SCHEMA_VERSION = 3

# A directory's entries: the table itself is in listing order (a readdir reads one range of
# it; seq comes from one counter, so (parent, seq) is unique), and the lookup's index is on
# (parent, name_key(name)), a 31-bit hash (4 bytes), not on the name: the name is stored
# once, in the row, where every statement that finds a name compares it too (NAME_IS), so
# two names of one key are two rows, never confused.  dirents_ino (ino -> parent, seq)
# answers "which directory holds this inode" from the index alone.
DIRENTS = """
CREATE TABLE IF NOT EXISTS dirents (
  parent INTEGER NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, ino INTEGER NOT NULL,
  PRIMARY KEY (parent, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dirents_name ON dirents(parent, name_key(name));
CREATE INDEX IF NOT EXISTS dirents_ino ON dirents(ino);
"""


def name_key(name: str | None) -> int | None:
    """A name's key in dirents_name: the top 31 bits of its xxh3_64 (a 4-byte integer in
    SQLite's record).  Registered on every connection (open_db) as SQL's name_key(), which
    the index and the statements that find a name use; NULL (a Locate probe's padding)
    gives NULL, which matches nothing."""
    if not isinstance(name, str):
        return None
    return int(xxhash.xxh3_64_intdigest(name.encode("utf-8", "surrogatepass")) >> 33)


# Name ?b in directory ?a, in a WHERE clause of dirents (as NAME_IS.format(a=1, b=2), with
# the statement's parameters numbered): the key finds the rows in the index, the name
# picks its own among them.  Such statements say "dirents INDEXED BY dirents_name": without
# statistics SQLite's planner takes the table's (parent, seq) key instead (a directory scan).
# The name's comparison is "+name": name=? would let SQLite's constant propagation turn
# name_key(name) into name_key(?), which no index matches (then only parent=? is searched).
NAME_IS = "parent=?{a} AND name_key(name)=name_key(?{b}) AND +name=?{b}"
# A DELETE or UPDATE of name ?b in directory ?a: "WHERE " + NAME_AT.format(a=.., b=..).  The
# row is found by its key first, then written by its primary key: a statement that writes
# through the (non-unique) key index with triggers on dirents (the cache sessions', the
# event feed's) collects the rows in a temporary b-tree first (+40-60 us per unlink measured).
NAME_AT = "parent=?{a} AND seq=(SELECT seq FROM dirents INDEXED BY dirents_name WHERE " + NAME_IS + ")"

# The event feed (master/events.py).  pos is given by the journal (events.next_position:
# past the newest row and meta.events_floor), not by AUTOINCREMENT, which writes the
# sqlite_sequence table's page in every commit with an event.  host_id and event_hosts'
# host_id are rows of hosts (a host name once per store, not once per event and replica).
# A rename's old name is stored as what follows the first from_prefix characters it shares
# with the new one (x.tmp -> x.data: "tmp" and len("x.")): the feed reads it back whole.
EVENTS = """CREATE TABLE IF NOT EXISTS events (
  pos INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL, kind INTEGER NOT NULL,
  parent INTEGER NOT NULL, name TEXT NOT NULL, from_name TEXT NOT NULL, from_prefix INTEGER NOT NULL DEFAULT 0,
  ino INTEGER NOT NULL, size INTEGER NOT NULL, host_id INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS events_parent ON events(parent, pos);
CREATE TABLE IF NOT EXISTS event_hosts (
  ino INTEGER NOT NULL, host_id INTEGER NOT NULL, PRIMARY KEY (ino, host_id)
) WITHOUT ROWID;
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS inodes (
  ino INTEGER PRIMARY KEY,
  mode INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
  size INTEGER NOT NULL DEFAULT 0, nlink INTEGER NOT NULL DEFAULT 1,
  atime_ns INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
  rdev INTEGER NOT NULL DEFAULT 0,
  block_size INTEGER NOT NULL DEFAULT 0, replicas INTEGER NOT NULL DEFAULT 0,
  complete INTEGER NOT NULL DEFAULT 1, generation INTEGER NOT NULL DEFAULT 0,
  target TEXT,
  lease_id INTEGER NOT NULL DEFAULT 0, lease_client TEXT NOT NULL DEFAULT '',
  lease_expiry_ms INTEGER NOT NULL DEFAULT 0,
  acl BLOB, default_acl BLOB,
  kv INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS inodes_lease ON inodes(lease_expiry_ms) WHERE lease_id != 0;
""" + DIRENTS + """CREATE TABLE IF NOT EXISTS blocks (
  ino INTEGER NOT NULL, idx INTEGER NOT NULL, block_id INTEGER NOT NULL,
  length INTEGER NOT NULL, checksum INTEGER NOT NULL,
  PRIMARY KEY (ino, idx)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS blocks_id ON blocks(block_id);
CREATE TABLE IF NOT EXISTS pending_blocks (
  block_id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, lease_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS pending_ino ON pending_blocks(ino);
CREATE TABLE IF NOT EXISTS writers (
  lease_id INTEGER PRIMARY KEY, ino INTEGER NOT NULL, client TEXT NOT NULL,
  expiry_ms INTEGER NOT NULL, hard INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS writers_ino ON writers(ino);
CREATE INDEX IF NOT EXISTS writers_expiry ON writers(expiry_ms);
CREATE TABLE IF NOT EXISTS xattrs (
  ino INTEGER NOT NULL, name TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ino, name)
);
CREATE INDEX IF NOT EXISTS xattrs_name ON xattrs(name);
CREATE TABLE IF NOT EXISTS workers (
  storage_id TEXT PRIMARY KEY, worker_id INTEGER NOT NULL UNIQUE, host TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS oplog (
  seq INTEGER PRIMARY KEY, request_id TEXT NOT NULL, ts_ms INTEGER NOT NULL, result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS oplog_req ON oplog(request_id) WHERE request_id != '';
CREATE TABLE IF NOT EXISTS ufs_mounts (
  mount_id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, ino INTEGER NOT NULL UNIQUE,
  uri TEXT NOT NULL, options TEXT NOT NULL, write_mode TEXT NOT NULL,
  metadata_ttl_ms INTEGER NOT NULL, ttl_ms INTEGER NOT NULL, created_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ufs_dirs (
  ino INTEGER PRIMARY KEY, mount_id INTEGER NOT NULL, ukey TEXT NOT NULL, listed_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ufs_files (
  ino INTEGER PRIMARY KEY, mount_id INTEGER NOT NULL, ukey TEXT NOT NULL,
  state TEXT NOT NULL, etag TEXT NOT NULL DEFAULT '', ufs_size INTEGER NOT NULL DEFAULT 0,
  ufs_mtime_ns INTEGER NOT NULL DEFAULT 0, checked_ns INTEGER NOT NULL DEFAULT 0,
  dirty_ns INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '', attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ufs_files_pending ON ufs_files(dirty_ns) WHERE state = 'pending';
CREATE TABLE IF NOT EXISTS hosts (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
""" + EVENTS + """CREATE TABLE IF NOT EXISTS masters (
  raft_id TEXT PRIMARY KEY, address TEXT NOT NULL, frame_port INTEGER NOT NULL, term INTEGER NOT NULL
);
"""

COUNTERS = {"next_ino": ROOT_INO + 1, "next_block": 1, "next_seq": 16, "next_lease": 1,
            "next_worker": 1, "next_mount": 1, "schema_version": SCHEMA_VERSION, "raft_applied": 0,
            "events_floor": 0}


WRITER_CACHE_KIB = 65536          # the journal's connection: the hot pages of every mutation
READER_CACHE_KIB = 4096           # each serving thread's read connection (see open_db)
# The WAL file is cut back to this size when it is reset after a checkpoint: a burst of
# writes (or a VACUUM) that grew it does not keep the disk space.
WAL_SIZE_LIMIT = 16 << 20
# An existing store without incremental auto-vacuum (made before it was on) gets it at
# open with a one-time VACUUM when its live data is at most this big (a copy of it:
# ~0.1 s per 30 MB here); a bigger one is left as it is, with a warning.
VACUUM_AT_OPEN_MAX_BYTES = 256 << 20
INCREMENTAL = 2   # PRAGMA auto_vacuum's value for INCREMENTAL


def open_db(path: str, sync: str = "normal", reader: bool = False) -> sqlite3.Connection:
    """Open (and create if new) the store; WAL so readers never block the writer.

    Every thread serving calls (gRPC pool, one per frame connection) has its own read
    connection with a small private page cache (4 MiB at most: a hundred client
    connections cannot cost the master a private 64 MiB each).  Not a memory map: with
    one, SQLite unmaps and maps the file again at the first read after any write (strace:
    one munmap + mmap per read), which cost 30-40 us per read here, more in a process
    of many threads (each munmap stops them all to flush their TLBs); a write empties a
    reader's page cache either way."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.row_factory = sqlite3.Row
    conn.create_function("name_key", 1, name_key, deterministic=True)
    if not reader:   # a new store only (it takes effect before its first table); see init_db
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    conn.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB if reader else WRITER_CACHE_KIB}")
    return conn


def init_db(conn: sqlite3.Connection, block_size: int, replicas: int, now_ns: int | None = None) -> None:
    """Create the tables, the counters and the root directory if they are missing.  now_ns:
    the root's times (the clock's by default; 0 for a master of a Raft group, whose
    replicas must hold the same root: the group's first LeaderAnnounce sets them)."""
    upgrade(conn)
    with _immediate(conn):
        if conn.execute("SELECT 1 FROM inodes WHERE ino=?", (ROOT_INO,)).fetchone() is None:
            now = time.time_ns() if now_ns is None else now_ns
            conn.execute(
                "INSERT INTO inodes(ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns,"
                " block_size, replicas) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (ROOT_INO, stat.S_IFDIR | 0o755, 0, 0, DIR_SIZE, 2, now, now, now, block_size, replicas))
    keep_counts(conn)
    incremental_vacuum_on(conn)


def upgrade(conn: sqlite3.Connection) -> None:
    """Bring a store to this version's tables, columns and counters: a new one, one an
    older master made, or an older master's Raft snapshot just installed into this one
    (the backup replaces the whole schema: a newer follower would otherwise lack the
    tables it writes at its next apply)."""
    dirents_by_seq(conn)
    conn.executescript(SCHEMA)
    names_by_key(conn)
    migrate(conn)
    request_keys(conn)
    acl_columns(conn)
    allocated_column(conn)
    if "kv" not in [r[1] for r in conn.execute("PRAGMA table_info(inodes)")]:   # a store before KV directories
        conn.execute("ALTER TABLE inodes ADD COLUMN kv INTEGER NOT NULL DEFAULT 0")
    events_by_host_id(conn)
    reads_in_inodes(conn)
    with _immediate(conn):
        for key, value in COUNTERS.items():
            conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (key, value))


# Counts kept by triggers in the meta table, so that Report, StatFs and /metrics read one
# row instead of scanning every inode and block (count(*) at 10^6 files took 0.1-0.3 s and
# mapped the whole store into the master's memory, on every call).  key -> (table, the
# rows counted: a WHEN clause on NEW/OLD, or '' for all).
COUNTS = {
    "count_inodes": ("inodes", ""),
    "count_blocks": ("blocks", ""),
    "count_dirs": ("inodes", f"(ROW.mode & {stat.S_IFMT(0o170000)}) = {stat.S_IFDIR}"),
}


def keep_counts(conn: sqlite3.Connection) -> None:
    """Install the counting triggers and the counts where they are missing: a new store,
    one made before them, or a Raft snapshot of a master before them installed into this
    one (the backup replaces the schema, triggers included).  The triggers run inside each
    mutation's transaction, on every master of a group alike, so the counts stay exact."""
    with _immediate(conn):
        for key, (table, rows) in COUNTS.items():
            for event, row, delta in (("INSERT", "NEW", "+ 1"), ("DELETE", "OLD", "- 1")):
                when = f" WHEN {rows.replace('ROW.', row + '.')}" if rows else ""
                conn.execute(f"CREATE TRIGGER IF NOT EXISTS {key}_{event.lower()} AFTER {event} ON {table}{when}"
                             f" BEGIN UPDATE meta SET value = value {delta} WHERE key = '{key}'; END")
            if conn.execute("SELECT 1 FROM meta WHERE key=?", (key,)).fetchone() is None:
                where = f" WHERE {rows.replace('ROW.', '')}" if rows else ""
                total = conn.execute(f"SELECT count(*) FROM {table}{where}").fetchone()[0]
                conn.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (key, total))


def count(conn: sqlite3.Connection, key: str) -> int:
    """One of COUNTS, as the triggers keep it."""
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return int(row[0]) if row is not None else 0


# What a mutation changed, for the cache sessions (master/sessions.py): temporary
# triggers on the journal's connection write the keys into a temporary table, which the
# journal reads and empties in each record's savepoint (Journal._apply_one).  A name in a
# directory is (parent, name); an inode's attributes (ino, NULL); a directory's mode and
# owner, which a mount checks lookups against, (ino, '') (a create in it changes its
# times, not these); a directory's whole listing (ino, '/'), which every name change in
# it changes.  Only columns a client caches count: a lease renewal changes none.
ATTR_COLUMNS = ("mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns, rdev, block_size, replicas,"
                " complete, generation, target, acl, default_acl, kv")
CHANGES = "temp.cache_changes"


def track_changes(conn: sqlite3.Connection) -> None:
    """Install the change triggers on conn (temporary: this connection only, never in the
    file or a Raft snapshot)."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS cache_changes (ino INTEGER NOT NULL, name TEXT)")
    for name, when, rows in (
            ("names_in", "INSERT ON dirents", "(NEW.parent, NEW.name), (NEW.parent, '/')"),
            ("names_out", "DELETE ON dirents", "(OLD.parent, OLD.name), (OLD.parent, '/')"),
            ("names_moved", "UPDATE ON dirents",
             "(OLD.parent, OLD.name), (OLD.parent, '/'), (NEW.parent, NEW.name), (NEW.parent, '/')"),
            ("attrs_set", f"UPDATE OF {ATTR_COLUMNS} ON inodes", "(NEW.ino, NULL)"),
            ("perms_set", "UPDATE OF mode, uid, gid, acl ON inodes", "(NEW.ino, '')"),
            ("attrs_gone", "DELETE ON inodes", "(OLD.ino, NULL), (OLD.ino, '')")):
        conn.execute(f"CREATE TEMP TRIGGER IF NOT EXISTS cache_{name} AFTER {when}"
                     f" BEGIN INSERT INTO cache_changes(ino, name) VALUES {rows}; END")


def take_changes(conn: sqlite3.Connection) -> list[tuple[int, str | None]]:
    """The keys changed since the last call (track_changes), emptied."""
    if sqlite3.sqlite_version_info >= (3, 35, 0):   # one statement
        rows = conn.execute(f"DELETE FROM {CHANGES} RETURNING ino, name").fetchall()
    else:
        rows = conn.execute(f"SELECT ino, name FROM {CHANGES}").fetchall()
        if rows:
            conn.execute(f"DELETE FROM {CHANGES}")
    return list(dict.fromkeys((int(r[0]), r[1]) for r in rows))


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a store of schema 1 to this one: its oplog is rebuilt without the `op` column
    (every record's JSON, ~1 KB a mutation, which nothing read back), keeping the rows of
    the retry cache (those with a request id) and their results.  Every master of a group
    keeps the same rows, so their tables still agree.  Once per store, at open."""
    if "op" not in [r[1] for r in conn.execute("PRAGMA table_info(oplog)")]:
        return
    start = time.perf_counter()
    with _immediate(conn):
        conn.execute("CREATE TABLE oplog_v2 (seq INTEGER PRIMARY KEY, request_id TEXT NOT NULL,"
                     " ts_ms INTEGER NOT NULL, result TEXT NOT NULL)")
        kept = conn.execute("INSERT INTO oplog_v2(seq, request_id, ts_ms, result) SELECT seq, request_id, ts_ms,"
                            " COALESCE(result, '{}') FROM oplog WHERE request_id != ''").rowcount
        conn.execute("DROP TABLE oplog")
        conn.execute("ALTER TABLE oplog_v2 RENAME TO oplog")
        conn.execute("CREATE INDEX oplog_req ON oplog(request_id) WHERE request_id != ''")
        conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', 2)"
                     " ON CONFLICT(key) DO UPDATE SET value=excluded.value")
    log.info("meta.db: the oplog now keeps request ids and results only (%d retry-cache rows kept) in %.2f s",
             kept, time.perf_counter() - start)


def dirents_by_seq(conn: sqlite3.Connection) -> None:
    """Bring a store's dirents from schema 2 (a rowid table: the row, its (parent, name)
    key and a (parent, seq) index, each a b-tree a create writes) to DIRENTS (the row kept
    in (parent, seq) order, an index on (parent, name)): ~7-9 bytes and one b-tree less per
    name.  Once per store, at open (16 s for 10^6 names on a loaded 2-core machine), and after a Raft snapshot
    of an older master; the old table's pages are then free, given back by the
    housekeeping's reclaim.  The connection's temporary triggers on dirents (the cache
    sessions' and the event feed's) go with the old table and are made again on the new."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name='dirents'").fetchone()
    if row is None or "WITHOUT ROWID" in row[0].upper():
        return
    start = time.perf_counter()
    triggers = conn.execute("SELECT sql FROM sqlite_temp_master WHERE type='trigger' AND tbl_name='dirents'").fetchall()
    with _immediate(conn):
        table, *indexes = [sql for sql in DIRENTS.split(";") if sql.strip()]
        conn.execute("DROP TABLE IF EXISTS dirents_v3")
        conn.execute(table.replace("IF NOT EXISTS dirents", "dirents_v3"))
        moved = conn.execute("INSERT INTO dirents_v3(parent, seq, name, ino)"
                             " SELECT parent, seq, name, ino FROM dirents ORDER BY parent, seq").rowcount
        conn.execute("DROP TABLE dirents")
        conn.execute("ALTER TABLE dirents_v3 RENAME TO dirents")
        for sql in indexes:   # one by one: executescript would commit the transaction first
            conn.execute(sql)
        for (sql,) in triggers:   # stored as "CREATE TRIGGER ...": TEMP again, or it would land in main
            conn.execute(re.sub(r"^\s*CREATE\s+TRIGGER\b", "CREATE TEMP TRIGGER", sql, count=1, flags=re.IGNORECASE))
    log.info("meta.db: dirents keyed by (parent, seq) now (%d names moved) in %.2f s", moved,
             time.perf_counter() - start)


def names_by_key(conn: sqlite3.Connection) -> None:
    """Bring a store's dirents_name from a unique index on (parent, name), which held each
    name a second time (~80 of a 62-character name's ~330 bytes at rest), to DIRENTS' index
    on (parent, name_key(name)).  Once per store, at open, and after a Raft snapshot of an
    older master.  (An older master cannot write a store with this index: it lacks
    name_key.)"""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type='index' AND name='dirents_name'").fetchone()
    if row is None or "name_key" in row[0]:
        return
    start = time.perf_counter()
    index = next(sql for sql in DIRENTS.split(";") if "dirents_name" in sql)
    with _immediate(conn):
        conn.execute("DROP INDEX dirents_name")
        conn.execute(index)
    log.info("meta.db: dirents_name on (parent, name_key(name)) now in %.2f s", time.perf_counter() - start)


def events_by_host_id(conn: sqlite3.Connection) -> None:
    """Bring a store's event feed from schema 2 (events.pos AUTOINCREMENT, host names as
    text in events and event_hosts, whole old names) to EVENTS: the same rows at the same
    positions (their old names whole: from_prefix 0), each
    host name once in hosts (ids in name order: every master of a group migrates its own
    copy of the same rows to the same ids).  The newest position AUTOINCREMENT handed out
    stays below every later one: it is the newest row's, or the pruned floor's (a table
    pruned empty); a sequence past both (rows deleted by hand) becomes the floor, which
    tells a watcher behind it that events were lost.  Once per store, at open, and after
    a Raft snapshot of an older master (a table of events_retention_s of events)."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(events)")]
    if not cols or "from_prefix" in cols:
        return
    if "host_id" in cols:   # (schema 3 as this session first made it, never released)
        conn.execute("ALTER TABLE events ADD COLUMN from_prefix INTEGER NOT NULL DEFAULT 0")
        return
    start = time.perf_counter()
    host = "e.host" if "host" in cols else "''"   # (a store of the first feed had no host column)
    with _immediate(conn):
        seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name='events'").fetchone()
        newest = conn.execute("SELECT ifnull(max(pos), 0) FROM events").fetchone()[0]
        floor = conn.execute("SELECT ifnull(max(value), 0) FROM meta WHERE key='events_floor'").fetchone()[0]
        if seq is not None and seq[0] > max(newest, floor):
            conn.execute("INSERT INTO meta(key, value) VALUES ('events_floor', ?)"
                         " ON CONFLICT(key) DO UPDATE SET value=excluded.value", (seq[0],))
        conn.execute(f"INSERT OR IGNORE INTO hosts(name) SELECT name FROM (SELECT {host} AS name FROM events e"
                     " UNION SELECT host FROM event_hosts) WHERE name != '' ORDER BY name")
        table, index, hosts_table = [sql for sql in EVENTS.split(";") if sql.strip()]
        conn.execute("DROP TABLE IF EXISTS events_v3")
        conn.execute("DROP TABLE IF EXISTS event_hosts_v3")
        conn.execute(table.replace("IF NOT EXISTS events", "events_v3"))
        conn.execute(hosts_table.replace("IF NOT EXISTS event_hosts", "event_hosts_v3"))
        moved = conn.execute(
            "INSERT INTO events_v3(pos, ts_ms, kind, parent, name, from_name, ino, size, host_id)"
            " SELECT e.pos, e.ts_ms, e.kind, e.parent, e.name, e.from_name, e.ino, e.size, ifnull(h.id, 0)"
            f" FROM events e LEFT JOIN hosts h ON h.name = {host} ORDER BY pos").rowcount
        conn.execute("INSERT INTO event_hosts_v3(ino, host_id) SELECT e.ino, h.id FROM event_hosts e"
                     " JOIN hosts h ON h.name = e.host ORDER BY e.ino, h.id")
        conn.execute("DROP TABLE events")   # (its sqlite_sequence row goes with it)
        conn.execute("DROP TABLE event_hosts")
        conn.execute("ALTER TABLE events_v3 RENAME TO events")
        conn.execute("ALTER TABLE event_hosts_v3 RENAME TO event_hosts")
        conn.execute(index)
    log.info("meta.db: the event feed's positions without AUTOINCREMENT, hosts by id (%d events moved) in %.2f s",
             moved, time.perf_counter() - start)


# inodes.last_read_ms of a file never read: a 6-byte value below every read's time (it is
# 2004-11-04), so each row is made with the room a read's time takes, and writing one does
# not grow the row (rows grown in place split their full pages: +14 B per file measured).
NEVER_READ_MS = 1 << 40


def reads_in_inodes(conn: sqlite3.Connection) -> None:
    """Give a store the inodes' ``last_read_ms`` column (when a file was last opened for
    reading, in ms: the eviction's LRU order; NEVER_READ_MS until then), moving in a
    ``reads`` table of an older store or Raft snapshot (ino -> last_read_ns, a row of
    ~16 bytes per file read, against 7 in the inode's row), which then goes.  Once per store."""
    has_reads = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='reads'").fetchone()
    has_column = "last_read_ms" in [r[1] for r in conn.execute("PRAGMA table_info(inodes)")]
    if has_column and not has_reads:
        return
    with _immediate(conn):
        if not has_column:
            conn.execute(f"ALTER TABLE inodes ADD COLUMN last_read_ms INTEGER NOT NULL DEFAULT {NEVER_READ_MS}")
        if has_reads:
            moved = conn.execute(
                "UPDATE inodes SET last_read_ms = max(last_read_ms,"
                " (SELECT r.last_read_ns / 1000000 FROM reads r WHERE r.ino = inodes.ino))"
                " WHERE ino IN (SELECT ino FROM reads)").rowcount
            conn.execute("DROP TABLE reads")
            log.info("meta.db: %d last reads moved into the inodes' last_read_ms", moved)


def request_key(rid: str) -> str | bytes:
    """How the oplog stores (and looks up) request id rid: the 16 bytes of a uuid4's 32
    lowercase hex digits (what clients send: 32 bytes less per row in the table and in its
    index), any other id as it is (a blob never equals a text, so no two ids share a key)."""
    if len(rid) == 32:
        try:
            key = bytes.fromhex(rid)
        except ValueError:
            return rid
        if key.hex() == rid:
            return key
    return rid


def request_keys(conn: sqlite3.Connection) -> None:
    """Bring a store's retry cache from schema 2 to 3: its request ids as request_key
    stores them (a retry of a request answered before the upgrade still finds its row),
    and meta.schema_version to 3.  Once per store (a few hundred thousand rows at most:
    master.retry_cache_s of mutations)."""
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is not None and row[0] >= SCHEMA_VERSION:   # (none: a new store, or one from before the key)
        return
    with _immediate(conn):
        rows = conn.execute("SELECT seq, request_id FROM oplog WHERE typeof(request_id) = 'text'"
                            " AND length(request_id) = 32").fetchall()
        keys = [(key, seq) for seq, rid in rows if isinstance(key := request_key(rid), bytes)]
        conn.executemany("UPDATE oplog SET request_id=? WHERE seq=?", keys)
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (SCHEMA_VERSION,))
    log.info("meta.db: schema %d (%d retry-cache request ids stored as bytes)", SCHEMA_VERSION, len(keys))


def acl_columns(conn: sqlite3.Connection) -> None:
    """Give a store made before ACLs were enforced its inodes' ``acl`` and ``default_acl``
    columns, and move the ACL xattrs it kept unenforced (rows of the xattrs table) into
    them: valid ones become enforced (the mode's bits are left as they were), invalid ones
    are dropped with a warning.  At open, and after a Raft snapshot from an older master."""
    if "acl" in [r[1] for r in conn.execute("PRAGMA table_info(inodes)")]:
        return
    with _immediate(conn):
        conn.execute("ALTER TABLE inodes ADD COLUMN acl BLOB")
        conn.execute("ALTER TABLE inodes ADD COLUMN default_acl BLOB")
        rows = conn.execute("SELECT ino, name, value FROM xattrs WHERE name IN (?, ?)", acl.NAMES).fetchall()
        for ino, name, value in rows:
            try:
                parsed = acl.parse(bytes(value))
            except CurvineError as e:
                log.warning("inode %d: its %s xattr is not a valid ACL (%s): dropped", ino, name, e)
                continue
            if parsed is not None and not (name == acl.ACCESS and parsed.minimal):
                column = "acl" if name == acl.ACCESS else "default_acl"
                conn.execute(f"UPDATE inodes SET {column}=? WHERE ino=?", (parsed.to_bytes(), ino))
        conn.execute("DELETE FROM xattrs WHERE name IN (?, ?)", acl.NAMES)
    log.info("meta.db: inodes have ACL columns now (%d ACL xattrs moved into them)", len(rows))


# inodes.allocated, the bytes a file's blocks hold (Attr.allocated, st_blocks), kept by
# these triggers on blocks inside each mutation's transaction: every master of a group
# holds the same value, and reading an inode's attributes scans none of its blocks.
ALLOCATED_TRIGGERS = {
    "allocated_insert": "AFTER INSERT ON blocks BEGIN"
                        " UPDATE inodes SET allocated = allocated + NEW.length WHERE ino = NEW.ino; END",
    "allocated_delete": "AFTER DELETE ON blocks BEGIN"
                        " UPDATE inodes SET allocated = allocated - OLD.length WHERE ino = OLD.ino; END",
    "allocated_update": "AFTER UPDATE OF ino, length ON blocks BEGIN"
                        " UPDATE inodes SET allocated = allocated - OLD.length WHERE ino = OLD.ino;"
                        " UPDATE inodes SET allocated = allocated + NEW.length WHERE ino = NEW.ino; END",
}


def allocated_column(conn: sqlite3.Connection) -> None:
    """Give a store (a new one, one made before st_blocks counted blocks, or such a
    master's Raft snapshot) the inodes' ``allocated`` column, summed once from its
    blocks, and the triggers that keep it."""
    with _immediate(conn):
        if "allocated" not in [r[1] for r in conn.execute("PRAGMA table_info(inodes)")]:
            conn.execute("ALTER TABLE inodes ADD COLUMN allocated INTEGER NOT NULL DEFAULT 0")
            conn.execute("UPDATE inodes SET allocated = (SELECT sum(length) FROM blocks b WHERE b.ino = inodes.ino)"
                         " WHERE ino IN (SELECT DISTINCT ino FROM blocks)")
        for name, body in ALLOCATED_TRIGGERS.items():
            conn.execute(f"CREATE TRIGGER IF NOT EXISTS {name} {body}")


def incremental_vacuum_on(conn: sqlite3.Connection) -> None:
    """Make sure the store can give freed pages back (auto_vacuum=INCREMENTAL; the master's
    housekeeping then releases them in bounded steps, Journal.reclaim).  A new store has it
    from open_db; an older one needs a VACUUM (a full copy), done here when its live data
    is small enough, else logged with the way to do it offline."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == INCREMENTAL:
        return
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    pages, free = conn.execute("PRAGMA page_count").fetchone()[0], conn.execute("PRAGMA freelist_count").fetchone()[0]
    live = (pages - free) * page
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    if live > VACUUM_AT_OPEN_MAX_BYTES:
        log.warning("%s holds %d MB and does not give freed space back (it was made before auto_vacuum): "
                    "stop the master and run: sqlite3 %s 'DROP INDEX dirents_name; PRAGMA auto_vacuum=INCREMENTAL;"
                    " VACUUM' (the sqlite3 shell lacks name_key: the master makes that index again at open)",
                    path, live >> 20, path)
        return
    start, before = time.perf_counter(), conn.execute("PRAGMA page_count").fetchone()[0] * page
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("VACUUM")
    log.info("%s: auto_vacuum=INCREMENTAL set by a one-time VACUUM in %.2f s (%d -> %d bytes)", path or "meta.db",
             time.perf_counter() - start, before, conn.execute("PRAGMA page_count").fetchone()[0] * page)
