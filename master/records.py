"""Op records: every mutation of the namespace as a typed, versioned, immutable value.

A record is what the journal applies (``Namespace.apply``), stores in the ``oplog`` and,
with issue 23, what Raft replicates and every master replays.  So a record must carry
everything its op needs (the caller, the time, what the UFS answered) and nothing else,
and it must mean the same thing to a master of a later release.

- One frozen dataclass per op, with the envelope every op carries (``cred``,
  ``request_id``, ``client_id``, ``now_ns``) in the base ``Record``, and ``op`` (its
  name in the log) and ``VERSION`` as class attributes.  Fields are keyword-only.
- A record is checked when it is built (``__post_init__``): every field has its declared
  type (lists given for tuples become tuples), integers fit SQLite's signed 64 bits (or
  an unsigned 64 where the value never reaches SQL unchecked: ``U64``), and fields that
  only make sense together are checked together.  A malformed record raises
  ``CurvineError(EINVAL)`` where it is built, so applying one never meets a missing or
  mistyped field.
- ``to_json()`` / ``decode()`` are the log's encoding: ``{"op": NAME, "v": VERSION,
  ...fields}``, nested items as JSON objects, bytes as ``{"__bytes": hex}``, the cred as
  ``[uid, gid, [groups]]``.  Decoding an unknown op, or a version newer than this code's,
  is refused with a message saying so: a master never applies what it does not know.
  Versioning: a field added with a default keeps the version; a field removed, renamed
  or given another meaning bumps the op's ``VERSION``, and ``_upgrade`` turns the older
  form into the current one.

Results of applying a record are dicts typed by key (``store.Result``, a TypedDict: each
op family sets its keys), whose inodes are typed rows (``store.InodeRow``).  Not
dataclasses: the retry cache keeps a result as compact JSON and a retry decodes it back
as it was, with no type tag to choose a class by (journal.encode_result).
"""
from __future__ import annotations

import dataclasses
import errno
import json
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, Self, TypedDict, TypeVar

from curvine_py.common.errors import CurvineError, err
from curvine_py.master.posix import Cred
from curvine_py.master.store import Result

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
UNSIGNED64 = "u64"
U64 = Annotated[int, UNSIGNED64]
"""An integer up to 2**64 - 1 (checksums; values the op compares or bounds before any SQL)."""

ROOT = Cred(0, 0, frozenset())
"""The cred of the master's own records (housekeeping, eviction, UFS syncs)."""

RECORDS: dict[str, type[Record]] = {}
"""Every record type by its op name (filled as the classes below are defined)."""


Submit = Callable[["Record"], Result]
"""The journal's submit as its callers see it: a record in, its result out."""


class Envelope(TypedDict):
    """The fields every record carries, to pass on with ``**`` (service.py builds one
    from a ``pb.Caller``; an op that applies another op passes its own on)."""
    cred: Cred
    request_id: str
    client_id: str
    now_ns: int


# ---------------------------------------------------------------------- checking

T = TypeVar("T")


def _per_class(fn: Callable[[type], T]) -> Callable[[type], T]:
    """fn memoized per class: what a record type's fields need is worked out once, not at
    every build (functools.cache would do, but mypy will not take a class as its key)."""
    memo: dict[type, T] = {}

    def get(cls: type) -> T:
        got = memo.get(cls)
        if got is None:
            got = memo[cls] = fn(cls)
        return got
    return get


@_per_class
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, resolved type) of a dataclass's fields, resolved once per class."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


Checker = Callable[[Any, str], Any]


def _bad(where: str, what: str) -> CurvineError:
    return err(errno.EINVAL, f"{where}: {what}")


def _int_checker(unsigned: bool) -> Checker:
    lo, hi = (0, (1 << 64) - 1) if unsigned else (I64_MIN, I64_MAX)

    def check(value: Any, where: str) -> int:
        if value.__class__ is not int and (isinstance(value, bool) or not isinstance(value, int)):
            raise _bad(where, f"an integer expected, not {type(value).__name__}")
        if not lo <= value <= hi:
            raise _bad(where, f"{value} is out of range")
        return value
    return check


def _type_checker(kind: type) -> Checker:
    def check(value: Any, where: str) -> Any:
        if not isinstance(value, kind):
            raise _bad(where, f"{kind.__name__} expected, not {type(value).__name__}")
        return value
    return check


def _str_checker(value: Any, where: str) -> str:
    """Text SQLite can store: a str that is valid UTF-8 (no lone surrogates, which a
    surrogateescape'd file name of a file:// UFS listing may hold)."""
    if not isinstance(value, str):
        raise _bad(where, f"str expected, not {type(value).__name__}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _bad(where, f"{value!r} is not valid UTF-8") from None
    return value


def _bytes_checker(value: Any, where: str) -> bytes:
    if value.__class__ is bytes:
        return typing.cast(bytes, value)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise _bad(where, f"bytes expected, not {type(value).__name__}")
    return bytes(value)


def _optional_checker(inner: Checker) -> Checker:
    def check(value: Any, where: str) -> Any:
        return None if value is None else inner(value, where)
    return check


def _tuple_checker(args: tuple[Any, ...]) -> Checker:
    """tuple[X, ...] or a fixed tuple[X, Y]; a list given for one becomes a tuple."""
    variadic = len(args) == 2 and args[1] is Ellipsis
    each = [_checker(a) for a in (args[:1] if variadic else args)]

    def check(value: Any, where: str) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise _bad(where, f"a sequence expected, not {type(value).__name__}")
        if variadic:
            one = each[0]
            return tuple(one(v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(each):
            raise _bad(where, f"{len(each)} items expected, not {len(value)}")
        return tuple(c(v, f"{where}[{i}]") for i, (c, v) in enumerate(zip(each, value)))
    return check


def _checker(hint: Any) -> Checker:
    """The check of a field of type hint: returns the value (sequences as tuples) or
    raises EINVAL.  Built once per field (a record is built on every mutation)."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        return _int_checker(UNSIGNED64 in extras) if base is int else _checker(base)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _optional_checker(_checker(inner))
    if origin is tuple:
        return _tuple_checker(typing.get_args(hint))
    if hint is int:
        return _int_checker(unsigned=False)
    if hint is bytes:
        return _bytes_checker
    if hint is str:
        return _str_checker
    return _type_checker(hint)


@_per_class
def _defaults(cls: type) -> dict[str, Any]:
    """The fields of cls that have a default, with it (Record.of_checked)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@_per_class
def _checkers(cls: type) -> tuple[tuple[str, str, Checker], ...]:
    """(name, where for errors, check) of each field of cls."""
    label = getattr(cls, "op", "") or cls.__name__
    return tuple((name, f"{label}.{name}", _checker(hint)) for name, hint in _fields(cls))


@dataclass(frozen=True)
class Checked:
    """A frozen dataclass whose fields are checked against their types when it is built."""

    def __post_init__(self) -> None:
        for name, where, check in _checkers(type(self)):
            value = getattr(self, name)
            checked = check(value, where)
            if checked is not value:
                object.__setattr__(self, name, checked)   # the one way to normalize a frozen field
        self._validate()

    def _validate(self) -> None:
        """Rules across fields (a record overrides it); raise EINVAL through _bad."""


class Item(Checked):
    """A nested value of a record (a committed block, a listing entry, ...)."""


# ---------------------------------------------------------------------- the log's encoding

def _plain(value: Any) -> Any:
    """A field's JSON form."""
    if isinstance(value, Cred):
        return [value.uid, value.gid, sorted(value.groups)]
    if isinstance(value, bytes):
        return {"__bytes": value.hex()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Item):
        return {name: _plain(getattr(value, name)) for name, _ in _fields(type(value))}
    return value


@_per_class
def _encoded(cls: type) -> tuple[str, ...]:
    """The fields of cls that json.dumps cannot take as they are (see _plain)."""
    return tuple(name for name, hint in _fields(cls) if _needs_plain(hint))


def _needs_plain(hint: Any) -> bool:
    """Does a value of type hint hold a cred, bytes or an item (what json.dumps cannot write)?"""
    args = typing.get_args(hint)
    if args:
        return typing.get_origin(hint) is not Annotated and any(_needs_plain(a) for a in args if a is not Ellipsis)
    return hint is bytes or hint is Cred or (isinstance(hint, type) and issubclass(hint, Item))


def _typed(hint: Any, value: Any, where: str) -> Any:
    """A field from its JSON form (the inverse of _plain); _check validates it afterwards."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        return _typed(typing.get_args(hint)[0], value, where)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)][0]
        return None if value is None else _typed(inner, value, where)
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(hint)
        each = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        if len(each) != len(value):
            return value   # _check says what is wrong with it
        return tuple(_typed(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(each, value)))
    if hint is bytes and isinstance(value, dict) and "__bytes" in value:
        try:
            return bytes.fromhex(value["__bytes"])
        except (TypeError, ValueError):
            raise _bad(where, "bad hex bytes") from None
    if hint is Cred and isinstance(value, list) and len(value) == 3:
        return Cred(value[0], value[1], frozenset(value[2]))
    if isinstance(hint, type) and issubclass(hint, Item) and isinstance(value, dict):
        return _build(hint, value, where)
    return value


def _build(cls: type[Checked], data: dict[str, Any], where: str) -> Any:
    """cls from the JSON object data; unknown or missing fields are EINVAL."""
    hints = dict(_fields(cls))
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise _bad(where, f"unknown fields {', '.join(unknown)}")
    kwargs = {k: _typed(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:   # a required field is missing
        raise _bad(where, str(e)) from None


def json_default(o: Any) -> Any:
    """The json.dumps default of the journal's results: bytes as {"__bytes": hex}, as in records."""
    if isinstance(o, (bytes, bytearray, memoryview)):
        return {"__bytes": bytes(o).hex()}
    raise TypeError(f"not serializable: {type(o)}")


# ---------------------------------------------------------------------- records

@dataclass(frozen=True, kw_only=True)
class Record(Checked):
    """The envelope: who asked (cred), the request id of the retry cache ('' = none), the
    client holding leases, and the time of the op (0 until the journal stamps it: an
    op reads the clock only through it, so a replay at another time gives the same state)."""

    op: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    cred: Cred = ROOT
    request_id: str = ""
    client_id: str = ""
    now_ns: int = 0

    def __init_subclass__(cls, op: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if op:
            if op in RECORDS:
                raise TypeError(f"two records named {op!r}")
            cls.op = op
            RECORDS[op] = cls

    def envelope(self) -> Envelope:
        """This record's envelope, for a record this op applies in turn."""
        return Envelope(cred=self.cred, request_id=self.request_id, client_id=self.client_id, now_ns=self.now_ns)

    def at(self, now_ns: int) -> Self:
        """This record stamped with the time (the journal's, at submit): a copy with now_ns
        set, not checked again as ``dataclasses.replace`` would (its __post_init__ checks
        every field: ~6 us of each mutation's ~250 in process); the other fields were."""
        stamped = object.__new__(type(self))
        stamped.__dict__.update(vars(self), now_ns=int(now_ns))
        return stamped

    @classmethod
    def of_checked(cls, **fields: Any) -> Self:
        """A record of cls made by an op from another record's fields, already checked
        (a create's mknod): built without checking them again, the rest at their defaults.
        Only for values of the declared types (never a caller's raw input)."""
        made = object.__new__(cls)
        made.__dict__.update(_defaults(cls), **fields)
        return made

    def to_json(self) -> str:
        """The record as the oplog (and the Raft log) stores it."""
        body: dict[str, Any] = {"op": self.op, "v": self.VERSION, **vars(self)}
        for name in _encoded(type(self)):
            body[name] = _plain(body[name])
        return json.dumps(body)

    @classmethod
    def _upgrade(cls, fields: dict[str, Any], version: int) -> dict[str, Any]:
        """The fields of a record written at an older version, as this version has them
        (every record is at version 1 so far: nothing to do)."""
        return fields


def decode(text: str | bytes) -> Record:
    """A record from its to_json() form; refuses what this code cannot apply as written."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise err(errno.EINVAL, f"an op record that is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise err(errno.EINVAL, "an op record must be a JSON object")
    name, version = data.pop("op", None), data.pop("v", None)
    cls = RECORDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise err(errno.ENOSYS, f"unknown op record {name!r}: this master applies {', '.join(sorted(RECORDS))}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise err(errno.EINVAL, f"op record {name!r} without a valid version (\"v\": {version!r})")
    if version > cls.VERSION:
        raise err(errno.EPROTO, f"op record {name!r} is version {version}, newer than this master's "
                                f"{cls.VERSION}: upgrade this master before it applies that log")
    return typing.cast(Record, _build(cls, cls._upgrade(data, version), name))


# ---------------------------------------------------------------------- names (namespace.py)

@dataclass(frozen=True, kw_only=True)
class Mknod(Record, op="mknod"):
    """A file, directory, symlink (target), FIFO, socket or device (rdev) in parent.
    exclusive=False lets an existing regular file answer (open with O_CREAT)."""
    parent: int
    name: str
    mode: int
    umask: int = 0
    rdev: int = 0
    target: str = ""
    exclusive: bool = True
    block_size: int = 0   # 0: the parent's (or the default)


@dataclass(frozen=True, kw_only=True)
class Link(Record, op="link"):
    ino: int
    new_parent: int
    new_name: str


@dataclass(frozen=True, kw_only=True)
class Unlink(Record, op="unlink"):
    """keep: inodes the caller has open; a name that is the last link of one is left (kept)."""
    parent: int
    name: str
    keep: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Rmdir(Record, op="rmdir"):
    parent: int
    name: str


@dataclass(frozen=True, kw_only=True)
class Rename(Record, op="rename"):
    """flags: RENAME_NOREPLACE | RENAME_EXCHANGE; keep: as Unlink.keep, for the target."""
    parent: int
    name: str
    new_parent: int
    new_name: str
    flags: int = 0
    keep: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Setattr(Record, op="setattr"):
    """Only the fields whose SETATTR_* bit is in valid are read.  size is checked by the op
    (EFBIG past 2**50), so it may be any unsigned 64-bit value here."""
    ino: int
    valid: int
    mode: int = 0
    uid: int = 0
    gid: int = 0
    size: U64 = 0
    atime_ns: int = 0
    mtime_ns: int = 0


@dataclass(frozen=True, kw_only=True)
class Setxattr(Record, op="setxattr"):
    """flags: XATTR_CREATE | XATTR_REPLACE."""
    ino: int
    name: str
    value: bytes
    flags: int = 0


@dataclass(frozen=True, kw_only=True)
class Removexattr(Record, op="removexattr"):
    ino: int
    name: str


@dataclass(frozen=True, kw_only=True)
class RegisterWorker(Record, op="register_worker"):
    """A worker's storage id gets (or keeps) its worker id."""
    storage_id: str
    host: str


# ---------------------------------------------------------------------- file data (files.py)

@dataclass(frozen=True, kw_only=True)
class Create(Record, op="create"):
    """Mknod of a regular file (or open of an existing one, exclusive=False) plus its write
    lease; flags: the open's os.O_* flags (O_TRUNC truncates an existing file)."""
    parent: int
    name: str
    mode: int
    lease_ms: int
    umask: int = 0
    exclusive: bool = True
    block_size: int = 0
    flags: int = 0


@dataclass(frozen=True, kw_only=True)
class OpenWrite(Record, op="open_write"):
    ino: int
    lease_ms: int
    flags: int = 0


@dataclass(frozen=True, kw_only=True)
class Allocate(Record, op="allocate"):
    """count new block ids under the lease (which this makes hard).  The lease id is only
    compared, so any unsigned 64-bit value is a stale lease (ESTALE), not a bad record."""
    ino: int
    lease_id: U64
    count: int


@dataclass(frozen=True)
class CommitBlock(Item):
    """A written block: its id (from Allocate), its offset in the file, length, xxh3."""
    block_id: int
    offset: int
    length: int
    checksum: U64


@dataclass(frozen=True, kw_only=True)
class Commit(Record, op="commit"):
    """Install blocks and set the size; release gives up the lease (the close)."""
    ino: int
    lease_id: U64
    size: int
    blocks: tuple[CommitBlock, ...] = ()
    release: bool = False
    mtime_ns: int = 0    # 0: now_ns
    truncate_to: int = -1   # >= 0: the writer cut the file there since its last commit (files.py op_commit)
    holes: tuple[int, ...] = ()   # slots emptied after blocks are installed (a punched whole block)


@dataclass(frozen=True, kw_only=True)
class Renew(Record, op="renew"):
    lease_ids: tuple[int, ...]
    lease_ms: int


@dataclass(frozen=True, kw_only=True)
class ExpireLeases(Record, op="expire_leases"):
    """Release the leases lapsed at now_ns (soft ones all, hard ones in batches)."""


# ---------------------------------------------------------------------- the bounded cache (cacheops.py)

@dataclass(frozen=True)
class LastRead(Item):
    ino: int
    last_read_ns: int


@dataclass(frozen=True, kw_only=True)
class RecordReads(Record, op="record_reads"):
    reads: tuple[LastRead, ...]


@dataclass(frozen=True)
class Victim(Item):
    """A file the evictor chose, at the generation it saw (a file rewritten since stays)."""
    ino: int
    generation: int


@dataclass(frozen=True, kw_only=True)
class Evict(Record, op="evict"):
    """reason: "lru" (watermarks) or "ttl" (the TTL sweep); the op treats both alike."""
    victims: tuple[Victim, ...]
    reason: str = "lru"


# ---------------------------------------------------------------------- UFS mounts (ufsops.py)

@dataclass(frozen=True, kw_only=True)
class UfsMount(Record, op="ufs_mount"):
    """Make the empty directory ino (at path) the root of a mount of uri.  options: the
    provider's (name, value) pairs, sorted."""
    path: str
    ino: int
    uri: str
    write_mode: str
    metadata_ttl_ms: int
    ttl_ms: int
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class UfsUmount(Record, op="ufs_umount"):
    path: str
    force: bool = False


@dataclass(frozen=True)
class SyncEntry(Item):
    """One entry of a UFS listing."""
    name: str
    is_dir: bool
    size: int
    mtime_ns: int
    etag: str


@dataclass(frozen=True, kw_only=True)
class UfsSyncDir(Record, op="ufs_sync_dir"):
    """Directory ino's UFS listing, as the master got it before submitting the record."""
    ino: int
    entries: tuple[SyncEntry, ...]


@dataclass(frozen=True, kw_only=True)
class UfsRefresh(Record, op="ufs_refresh"):
    """A HEAD of file ino's object: gone (deleted in the UFS), or its size, mtime and etag."""
    ino: int
    gone: bool = False
    size: int = 0
    mtime_ns: int = 0
    etag: str = ""


@dataclass(frozen=True, kw_only=True)
class UfsState(Record, op="ufs_state"):
    """The end of an upload of generation to key: uploaded (etag, mtime_ns of the new
    object) or failed (message; final: for good, no retry)."""
    ino: int
    generation: int
    key: str
    etag: str | None = None
    mtime_ns: int = 0
    message: str = ""
    final: bool = False

    def _validate(self) -> None:
        if self.etag is None and not self.message:
            raise _bad(self.op, "an upload's outcome needs an etag (uploaded) or a message (failed)")


@dataclass(frozen=True, kw_only=True)
class UfsFree(Record, op="ufs_free"):
    """cv fs free: drop the cached blocks of these files (persisted UFS files only)."""
    inos: tuple[int, ...]



# ---------------------------------------------------------------------- the masters (groupops.py)

@dataclass(frozen=True, kw_only=True)
class LeaderAnnounce(Record, op="leader_announce"):
    """The first record of a leader's term (docs/ha.md): once it is applied the leader has
    applied everything committed before it and serves calls; every master learns from it
    where that leader answers clients, to name it in a NotLeader."""
    term: int
    raft_id: str
    address: str
    frame_port: int


@dataclass(frozen=True, kw_only=True)
class PruneOplog(Record, op="prune_oplog"):
    """Forget the retry cache's rows older than before_ms (submitted by the leader's
    housekeeping, so every master prunes at the same point of the log)."""
    before_ms: int


# ---------------------------------------------------------------------- the event feed (events.py)

@dataclass(frozen=True)
class HostChange(Item):
    """A host came to hold every block of file ino (held), or no longer does."""
    ino: int
    host: str
    held: bool


@dataclass(frozen=True, kw_only=True)
class ReplicaChanges(Record, op="replica_changes"):
    """What the leader's registry says changed about which hosts hold files whole, against
    the feed's last word (the event_hosts table): replica events (master/replicafeed.py)."""
    changes: tuple[HostChange, ...]


@dataclass(frozen=True, kw_only=True)
class PruneEvents(Record, op="prune_events"):
    """Forget the event feed's events older than before_ms, and all but the newest keep
    (submitted by the leader, so every master keeps the same events at the same positions)."""
    before_ms: int
    keep: int
