from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_CREATED: _ClassVar[EventKind]
    EVENT_REMOVED: _ClassVar[EventKind]
    EVENT_EVICTED: _ClassVar[EventKind]
    EVENT_REPLICA_ADDED: _ClassVar[EventKind]
    EVENT_REPLICA_LOST: _ClassVar[EventKind]
EVENT_CREATED: EventKind
EVENT_REMOVED: EventKind
EVENT_EVICTED: EventKind
EVENT_REPLICA_ADDED: EventKind
EVENT_REPLICA_LOST: EventKind

class Caller(_message.Message):
    __slots__ = ("uid", "gid", "groups", "request_id", "client_id", "session")
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    uid: int
    gid: int
    groups: _containers.RepeatedScalarFieldContainer[int]
    request_id: str
    client_id: str
    session: int
    def __init__(self, uid: _Optional[int] = ..., gid: _Optional[int] = ..., groups: _Optional[_Iterable[int]] = ..., request_id: _Optional[str] = ..., client_id: _Optional[str] = ..., session: _Optional[int] = ...) -> None: ...

class Attr(_message.Message):
    __slots__ = ("ino", "mode", "uid", "gid", "size", "nlink", "atime_ns", "mtime_ns", "ctime_ns", "rdev", "block_size", "replicas", "complete", "generation", "acl", "allocated", "kv")
    INO_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    CTIME_NS_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACL_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    ino: int
    mode: int
    uid: int
    gid: int
    size: int
    nlink: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    rdev: int
    block_size: int
    replicas: int
    complete: bool
    generation: int
    acl: bool
    allocated: int
    kv: bool
    def __init__(self, ino: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., nlink: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., ctime_ns: _Optional[int] = ..., rdev: _Optional[int] = ..., block_size: _Optional[int] = ..., replicas: _Optional[int] = ..., complete: _Optional[bool] = ..., generation: _Optional[int] = ..., acl: _Optional[bool] = ..., allocated: _Optional[int] = ..., kv: _Optional[bool] = ...) -> None: ...

class WorkerAddress(_message.Message):
    __slots__ = ("worker_id", "host", "ip", "rpc_port", "data_port")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    RPC_PORT_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    host: str
    ip: str
    rpc_port: int
    data_port: int
    def __init__(self, worker_id: _Optional[int] = ..., host: _Optional[str] = ..., ip: _Optional[str] = ..., rpc_port: _Optional[int] = ..., data_port: _Optional[int] = ...) -> None: ...

class BlockInfo(_message.Message):
    __slots__ = ("block_id", "offset", "length", "checksum", "workers", "token", "tier", "ufs")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    UFS_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    offset: int
    length: int
    checksum: int
    workers: _containers.RepeatedScalarFieldContainer[int]
    token: str
    tier: str
    ufs: UfsRange
    def __init__(self, block_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., workers: _Optional[_Iterable[int]] = ..., token: _Optional[str] = ..., tier: _Optional[str] = ..., ufs: _Optional[_Union[UfsRange, _Mapping]] = ...) -> None: ...

class UfsRange(_message.Message):
    __slots__ = ("mount_id", "key", "offset", "etag", "load", "timeout_ms")
    MOUNT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    mount_id: int
    key: str
    offset: int
    etag: str
    load: bool
    timeout_ms: int
    def __init__(self, mount_id: _Optional[int] = ..., key: _Optional[str] = ..., offset: _Optional[int] = ..., etag: _Optional[str] = ..., load: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("caller", "parent", "name", "one_block", "miss_ok", "listing_max")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ONE_BLOCK_FIELD_NUMBER: _ClassVar[int]
    MISS_OK_FIELD_NUMBER: _ClassVar[int]
    LISTING_MAX_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    parent: int
    name: str
    one_block: bool
    miss_ok: bool
    listing_max: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[str] = ..., one_block: _Optional[bool] = ..., miss_ok: _Optional[bool] = ..., listing_max: _Optional[int] = ...) -> None: ...

class PathRequest(_message.Message):
    __slots__ = ("caller", "path", "follow_symlinks")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_SYMLINKS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    path: str
    follow_symlinks: bool
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., path: _Optional[str] = ..., follow_symlinks: _Optional[bool] = ...) -> None: ...

class InodeRequest(_message.Message):
    __slots__ = ("caller", "ino")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ...) -> None: ...

class AttrReply(_message.Message):
    __slots__ = ("attr", "dirs", "blocks", "lease_seq", "wait_seq", "parent", "granted", "invalidated", "listing", "listed", "listing_blocks")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    DIRS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    WAIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    LISTING_FIELD_NUMBER: _ClassVar[int]
    LISTED_FIELD_NUMBER: _ClassVar[int]
    LISTING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    dirs: _containers.RepeatedCompositeFieldContainer[Attr]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    lease_seq: int
    wait_seq: int
    parent: Attr
    granted: _containers.RepeatedCompositeFieldContainer[CacheKey]
    invalidated: _containers.RepeatedCompositeFieldContainer[CacheKey]
    listing: _containers.RepeatedCompositeFieldContainer[DirEntry]
    listed: bool
    listing_blocks: bool
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., dirs: _Optional[_Iterable[_Union[Attr, _Mapping]]] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., lease_seq: _Optional[int] = ..., wait_seq: _Optional[int] = ..., parent: _Optional[_Union[Attr, _Mapping]] = ..., granted: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ..., invalidated: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ..., listing: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., listed: _Optional[bool] = ..., listing_blocks: _Optional[bool] = ...) -> None: ...

class DirsReply(_message.Message):
    __slots__ = ("dirs", "kept", "wait_seq", "lease_seq", "granted", "attr", "invalidated")
    DIRS_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    WAIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    dirs: _containers.RepeatedCompositeFieldContainer[Attr]
    kept: bool
    wait_seq: int
    lease_seq: int
    granted: _containers.RepeatedCompositeFieldContainer[CacheKey]
    attr: Attr
    invalidated: _containers.RepeatedCompositeFieldContainer[CacheKey]
    def __init__(self, dirs: _Optional[_Iterable[_Union[Attr, _Mapping]]] = ..., kept: _Optional[bool] = ..., wait_seq: _Optional[int] = ..., lease_seq: _Optional[int] = ..., granted: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ..., attr: _Optional[_Union[Attr, _Mapping]] = ..., invalidated: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ...) -> None: ...

class SetAttrRequest(_message.Message):
    __slots__ = ("caller", "ino", "valid", "mode", "uid", "gid", "size", "atime_ns", "mtime_ns")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ATIME_NS_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    valid: int
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., valid: _Optional[int] = ..., mode: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., atime_ns: _Optional[int] = ..., mtime_ns: _Optional[int] = ...) -> None: ...

class MknodRequest(_message.Message):
    __slots__ = ("caller", "parent", "name", "mode", "umask", "rdev", "symlink_target", "exclusive", "block_size", "open_flags")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UMASK_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    OPEN_FLAGS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    parent: int
    name: str
    mode: int
    umask: int
    rdev: int
    symlink_target: str
    exclusive: bool
    block_size: int
    open_flags: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[str] = ..., mode: _Optional[int] = ..., umask: _Optional[int] = ..., rdev: _Optional[int] = ..., symlink_target: _Optional[str] = ..., exclusive: _Optional[bool] = ..., block_size: _Optional[int] = ..., open_flags: _Optional[int] = ...) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("caller", "ino", "new_parent", "new_name")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    new_parent: int
    new_name: str
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[str] = ...) -> None: ...

class UnlinkRequest(_message.Message):
    __slots__ = ("caller", "parent", "name", "keep")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    parent: int
    name: str
    keep: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[str] = ..., keep: _Optional[_Iterable[int]] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("caller", "parent", "name", "new_parent", "new_name", "flags", "keep")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_PARENT_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    parent: int
    name: str
    new_parent: int
    new_name: str
    flags: int
    keep: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., parent: _Optional[int] = ..., name: _Optional[str] = ..., new_parent: _Optional[int] = ..., new_name: _Optional[str] = ..., flags: _Optional[int] = ..., keep: _Optional[_Iterable[int]] = ...) -> None: ...

class ReadDirRequest(_message.Message):
    __slots__ = ("caller", "ino", "offset", "limit", "plus")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PLUS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    offset: int
    limit: int
    plus: bool
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ..., plus: _Optional[bool] = ...) -> None: ...

class DirEntry(_message.Message):
    __slots__ = ("name", "ino", "mode", "offset", "attr", "blocks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ino: int
    mode: int
    offset: int
    attr: Attr
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    def __init__(self, name: _Optional[str] = ..., ino: _Optional[int] = ..., mode: _Optional[int] = ..., offset: _Optional[int] = ..., attr: _Optional[_Union[Attr, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ...) -> None: ...

class ReadDirReply(_message.Message):
    __slots__ = ("entries", "eof")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DirEntry]
    eof: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[DirEntry, _Mapping]]] = ..., eof: _Optional[bool] = ...) -> None: ...

class ReadlinkReply(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class XattrRequest(_message.Message):
    __slots__ = ("caller", "ino", "name", "value", "flags")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    name: str
    value: bytes
    flags: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., name: _Optional[str] = ..., value: _Optional[bytes] = ..., flags: _Optional[int] = ...) -> None: ...

class XattrReply(_message.Message):
    __slots__ = ("value", "names")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, value: _Optional[bytes] = ..., names: _Optional[_Iterable[str]] = ...) -> None: ...

class StatFsReply(_message.Message):
    __slots__ = ("capacity", "used", "available", "files", "block_size")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    used: int
    available: int
    files: int
    block_size: int
    def __init__(self, capacity: _Optional[int] = ..., used: _Optional[int] = ..., available: _Optional[int] = ..., files: _Optional[int] = ..., block_size: _Optional[int] = ...) -> None: ...

class OpenRequest(_message.Message):
    __slots__ = ("caller", "ino", "flags", "write")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    flags: int
    write: bool
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., flags: _Optional[int] = ..., write: _Optional[bool] = ...) -> None: ...

class OpenReply(_message.Message):
    __slots__ = ("attr", "blocks", "lease_id", "lease_expires_ms", "workers", "dirs", "ufs", "soft_lease", "lease_seq", "wait_seq", "granted", "invalidated")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    DIRS_FIELD_NUMBER: _ClassVar[int]
    UFS_FIELD_NUMBER: _ClassVar[int]
    SOFT_LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASE_SEQ_FIELD_NUMBER: _ClassVar[int]
    WAIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    lease_id: int
    lease_expires_ms: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAddress]
    dirs: _containers.RepeatedCompositeFieldContainer[Attr]
    ufs: UfsFile
    soft_lease: bool
    lease_seq: int
    wait_seq: int
    granted: _containers.RepeatedCompositeFieldContainer[CacheKey]
    invalidated: _containers.RepeatedCompositeFieldContainer[CacheKey]
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., lease_id: _Optional[int] = ..., lease_expires_ms: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerAddress, _Mapping]]] = ..., dirs: _Optional[_Iterable[_Union[Attr, _Mapping]]] = ..., ufs: _Optional[_Union[UfsFile, _Mapping]] = ..., soft_lease: _Optional[bool] = ..., lease_seq: _Optional[int] = ..., wait_seq: _Optional[int] = ..., granted: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ..., invalidated: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ...) -> None: ...

class AllocateBlocksRequest(_message.Message):
    __slots__ = ("caller", "ino", "lease_id", "count", "exclude_workers", "prefer_host", "unreachable")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PREFER_HOST_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    lease_id: int
    count: int
    exclude_workers: _containers.RepeatedScalarFieldContainer[int]
    prefer_host: str
    unreachable: _containers.RepeatedCompositeFieldContainer[UnreachableWorker]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., lease_id: _Optional[int] = ..., count: _Optional[int] = ..., exclude_workers: _Optional[_Iterable[int]] = ..., prefer_host: _Optional[str] = ..., unreachable: _Optional[_Iterable[_Union[UnreachableWorker, _Mapping]]] = ...) -> None: ...

class UnreachableWorker(_message.Message):
    __slots__ = ("worker_id", "age_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    age_s: float
    def __init__(self, worker_id: _Optional[int] = ..., age_s: _Optional[float] = ...) -> None: ...

class AllocateBlocksReply(_message.Message):
    __slots__ = ("blocks", "workers", "wait_seq", "invalidated")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SEQ_FIELD_NUMBER: _ClassVar[int]
    INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAddress]
    wait_seq: int
    invalidated: _containers.RepeatedCompositeFieldContainer[CacheKey]
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerAddress, _Mapping]]] = ..., wait_seq: _Optional[int] = ..., invalidated: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("caller", "ino", "lease_id", "size", "blocks", "release", "mtime_ns", "holes", "truncated", "truncate_to")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    HOLES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TO_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    lease_id: int
    size: int
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    release: bool
    mtime_ns: int
    holes: _containers.RepeatedScalarFieldContainer[int]
    truncated: bool
    truncate_to: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., lease_id: _Optional[int] = ..., size: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., release: _Optional[bool] = ..., mtime_ns: _Optional[int] = ..., holes: _Optional[_Iterable[int]] = ..., truncated: _Optional[bool] = ..., truncate_to: _Optional[int] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("caller", "lease_ids")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("expired",)
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    expired: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, expired: _Optional[_Iterable[int]] = ...) -> None: ...

class BlockLocationsRequest(_message.Message):
    __slots__ = ("caller", "ino", "lease_id", "pending")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    lease_id: int
    pending: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., lease_id: _Optional[int] = ..., pending: _Optional[_Iterable[int]] = ...) -> None: ...

class BlockLocationsReply(_message.Message):
    __slots__ = ("attr", "blocks", "workers", "pending")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAddress]
    pending: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerAddress, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ...) -> None: ...

class UfsMount(_message.Message):
    __slots__ = ("mount_id", "path", "uri", "options", "write_mode", "metadata_ttl_ms", "ttl_ms", "created_ns")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MOUNT_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    WRITE_MODE_FIELD_NUMBER: _ClassVar[int]
    METADATA_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    mount_id: int
    path: str
    uri: str
    options: _containers.ScalarMap[str, str]
    write_mode: str
    metadata_ttl_ms: int
    ttl_ms: int
    created_ns: int
    def __init__(self, mount_id: _Optional[int] = ..., path: _Optional[str] = ..., uri: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., write_mode: _Optional[str] = ..., metadata_ttl_ms: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., created_ns: _Optional[int] = ...) -> None: ...

class UfsMountRequest(_message.Message):
    __slots__ = ("caller", "mount")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    MOUNT_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    mount: UfsMount
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., mount: _Optional[_Union[UfsMount, _Mapping]] = ...) -> None: ...

class UfsPathRequest(_message.Message):
    __slots__ = ("caller", "path", "force")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    path: str
    force: bool
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., path: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class UfsMountIdRequest(_message.Message):
    __slots__ = ("mount_id",)
    MOUNT_ID_FIELD_NUMBER: _ClassVar[int]
    mount_id: int
    def __init__(self, mount_id: _Optional[int] = ...) -> None: ...

class UfsMountsReply(_message.Message):
    __slots__ = ("mounts",)
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    mounts: _containers.RepeatedCompositeFieldContainer[UfsMount]
    def __init__(self, mounts: _Optional[_Iterable[_Union[UfsMount, _Mapping]]] = ...) -> None: ...

class UfsFile(_message.Message):
    __slots__ = ("mount_id", "uri", "state", "cached_bytes", "etag")
    MOUNT_ID_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    mount_id: int
    uri: str
    state: str
    cached_bytes: int
    etag: str
    def __init__(self, mount_id: _Optional[int] = ..., uri: _Optional[str] = ..., state: _Optional[str] = ..., cached_bytes: _Optional[int] = ..., etag: _Optional[str] = ...) -> None: ...

class UfsStatReply(_message.Message):
    __slots__ = ("attr", "ufs")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    UFS_FIELD_NUMBER: _ClassVar[int]
    attr: Attr
    ufs: UfsFile
    def __init__(self, attr: _Optional[_Union[Attr, _Mapping]] = ..., ufs: _Optional[_Union[UfsFile, _Mapping]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("caller", "path", "recursive")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    path: str
    recursive: bool
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class LoadJob(_message.Message):
    __slots__ = ("job_id", "path", "state", "files", "total_bytes", "loaded_bytes", "failed_blocks", "started_ns", "finished_ns", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FAILED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STARTED_NS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_NS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    path: str
    state: str
    files: int
    total_bytes: int
    loaded_bytes: int
    failed_blocks: int
    started_ns: int
    finished_ns: int
    message: str
    def __init__(self, job_id: _Optional[int] = ..., path: _Optional[str] = ..., state: _Optional[str] = ..., files: _Optional[int] = ..., total_bytes: _Optional[int] = ..., loaded_bytes: _Optional[int] = ..., failed_blocks: _Optional[int] = ..., started_ns: _Optional[int] = ..., finished_ns: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class LoadJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class LoadJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[LoadJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[LoadJob, _Mapping]]] = ...) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ("caller", "path", "recursive")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    path: str
    recursive: bool
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class FreeReply(_message.Message):
    __slots__ = ("files", "bytes", "skipped")
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    files: int
    bytes: int
    skipped: int
    def __init__(self, files: _Optional[int] = ..., bytes: _Optional[int] = ..., skipped: _Optional[int] = ...) -> None: ...

class DataDir(_message.Message):
    __slots__ = ("path", "tier", "capacity", "used")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    path: str
    tier: str
    capacity: int
    used: int
    def __init__(self, path: _Optional[str] = ..., tier: _Optional[str] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("host", "ip", "rpc_port", "data_port", "dirs", "storage_id", "io_engine", "metrics_port")
    HOST_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    RPC_PORT_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    DIRS_FIELD_NUMBER: _ClassVar[int]
    STORAGE_ID_FIELD_NUMBER: _ClassVar[int]
    IO_ENGINE_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    host: str
    ip: str
    rpc_port: int
    data_port: int
    dirs: _containers.RepeatedCompositeFieldContainer[DataDir]
    storage_id: str
    io_engine: str
    metrics_port: int
    def __init__(self, host: _Optional[str] = ..., ip: _Optional[str] = ..., rpc_port: _Optional[int] = ..., data_port: _Optional[int] = ..., dirs: _Optional[_Iterable[_Union[DataDir, _Mapping]]] = ..., storage_id: _Optional[str] = ..., io_engine: _Optional[str] = ..., metrics_port: _Optional[int] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("worker_id", "heartbeat_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    heartbeat_ms: int
    def __init__(self, worker_id: _Optional[int] = ..., heartbeat_ms: _Optional[int] = ...) -> None: ...

class BlockReport(_message.Message):
    __slots__ = ("worker_id", "full", "added", "removed")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    full: bool
    added: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    removed: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[int] = ..., full: _Optional[bool] = ..., added: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., removed: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "dirs", "report")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DIRS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    dirs: _containers.RepeatedCompositeFieldContainer[DataDir]
    report: BlockReport
    def __init__(self, worker_id: _Optional[int] = ..., dirs: _Optional[_Iterable[_Union[DataDir, _Mapping]]] = ..., report: _Optional[_Union[BlockReport, _Mapping]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("reregister", "delete_blocks", "ring_epoch", "replicate")
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    DELETE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    delete_blocks: _containers.RepeatedScalarFieldContainer[int]
    ring_epoch: int
    replicate: _containers.RepeatedCompositeFieldContainer[ReplicateCommand]
    def __init__(self, reregister: _Optional[bool] = ..., delete_blocks: _Optional[_Iterable[int]] = ..., ring_epoch: _Optional[int] = ..., replicate: _Optional[_Iterable[_Union[ReplicateCommand, _Mapping]]] = ...) -> None: ...

class ReplicateCommand(_message.Message):
    __slots__ = ("block_id", "length", "checksum", "targets", "token")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    checksum: int
    targets: _containers.RepeatedCompositeFieldContainer[WorkerAddress]
    token: str
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[WorkerAddress, _Mapping]]] = ..., token: _Optional[str] = ...) -> None: ...

class BadBlockRequest(_message.Message):
    __slots__ = ("caller", "block_id", "worker_id", "reason")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    block_id: int
    worker_id: int
    reason: str
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., block_id: _Optional[int] = ..., worker_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("address", "state", "capacity", "used", "dirs", "blocks", "last_heartbeat_ms", "io_engine", "metrics_port")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    DIRS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    IO_ENGINE_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    address: WorkerAddress
    state: str
    capacity: int
    used: int
    dirs: _containers.RepeatedCompositeFieldContainer[DataDir]
    blocks: int
    last_heartbeat_ms: int
    io_engine: str
    metrics_port: int
    def __init__(self, address: _Optional[_Union[WorkerAddress, _Mapping]] = ..., state: _Optional[str] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., dirs: _Optional[_Iterable[_Union[DataDir, _Mapping]]] = ..., blocks: _Optional[int] = ..., last_heartbeat_ms: _Optional[int] = ..., io_engine: _Optional[str] = ..., metrics_port: _Optional[int] = ...) -> None: ...

class RingNode(_message.Message):
    __slots__ = ("worker_id", "host")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    host: str
    def __init__(self, worker_id: _Optional[int] = ..., host: _Optional[str] = ...) -> None: ...

class RingReply(_message.Message):
    __slots__ = ("epoch", "vnodes", "nodes", "workers", "frame_port")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    VNODES_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FRAME_PORT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    vnodes: int
    nodes: _containers.RepeatedCompositeFieldContainer[RingNode]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAddress]
    frame_port: int
    def __init__(self, epoch: _Optional[int] = ..., vnodes: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[RingNode, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerAddress, _Mapping]]] = ..., frame_port: _Optional[int] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("workers", "ring_epoch", "capacity", "used", "files", "blocks", "under_replicated", "master_address", "version", "evicted_files", "evicted_bytes", "expired_files", "metrics_port")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    RING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FILES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FILES_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    ring_epoch: int
    capacity: int
    used: int
    files: int
    blocks: int
    under_replicated: int
    master_address: str
    version: str
    evicted_files: int
    evicted_bytes: int
    expired_files: int
    metrics_port: int
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., ring_epoch: _Optional[int] = ..., capacity: _Optional[int] = ..., used: _Optional[int] = ..., files: _Optional[int] = ..., blocks: _Optional[int] = ..., under_replicated: _Optional[int] = ..., master_address: _Optional[str] = ..., version: _Optional[str] = ..., evicted_files: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., expired_files: _Optional[int] = ..., metrics_port: _Optional[int] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("caller", "lease_ms")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    lease_ms: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class SessionReply(_message.Message):
    __slots__ = ("session", "lease_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    session: int
    lease_ms: int
    def __init__(self, session: _Optional[int] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class SessionBeat(_message.Message):
    __slots__ = ("session", "acked", "forgotten")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    session: int
    acked: int
    forgotten: _containers.RepeatedCompositeFieldContainer[CacheKey]
    def __init__(self, session: _Optional[int] = ..., acked: _Optional[int] = ..., forgotten: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ...) -> None: ...

class CacheKey(_message.Message):
    __slots__ = ("ino", "name", "entry")
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    ino: int
    name: str
    entry: bool
    def __init__(self, ino: _Optional[int] = ..., name: _Optional[str] = ..., entry: _Optional[bool] = ...) -> None: ...

class Invalidation(_message.Message):
    __slots__ = ("seq", "keys")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    keys: _containers.RepeatedCompositeFieldContainer[CacheKey]
    def __init__(self, seq: _Optional[int] = ..., keys: _Optional[_Iterable[_Union[CacheKey, _Mapping]]] = ...) -> None: ...

class MasterStatusReply(_message.Message):
    __slots__ = ("address", "raft_address", "role", "term", "commit_index", "applied_index", "last_log_index", "leader", "leader_raft", "pid", "frame_port", "ready", "peers")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_RAFT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FRAME_PORT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    address: str
    raft_address: str
    role: str
    term: int
    commit_index: int
    applied_index: int
    last_log_index: int
    leader: str
    leader_raft: str
    pid: int
    frame_port: int
    ready: bool
    peers: _containers.RepeatedCompositeFieldContainer[PeerStatus]
    def __init__(self, address: _Optional[str] = ..., raft_address: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., last_log_index: _Optional[int] = ..., leader: _Optional[str] = ..., leader_raft: _Optional[str] = ..., pid: _Optional[int] = ..., frame_port: _Optional[int] = ..., ready: _Optional[bool] = ..., peers: _Optional[_Iterable[_Union[PeerStatus, _Mapping]]] = ...) -> None: ...

class PeerStatus(_message.Message):
    __slots__ = ("raft_address", "connected", "match_index")
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    raft_address: str
    connected: bool
    match_index: int
    def __init__(self, raft_address: _Optional[str] = ..., connected: _Optional[bool] = ..., match_index: _Optional[int] = ...) -> None: ...

class LocateRequest(_message.Message):
    __slots__ = ("caller", "paths", "pin_ms", "unpin", "brief", "dir", "names")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    PIN_MS_FIELD_NUMBER: _ClassVar[int]
    UNPIN_FIELD_NUMBER: _ClassVar[int]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    DIR_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    paths: _containers.RepeatedScalarFieldContainer[str]
    pin_ms: int
    unpin: bool
    brief: bool
    dir: str
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., paths: _Optional[_Iterable[str]] = ..., pin_ms: _Optional[int] = ..., unpin: _Optional[bool] = ..., brief: _Optional[bool] = ..., dir: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ...) -> None: ...

class Located(_message.Message):
    __slots__ = ("errno", "attr", "hosts", "tier")
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    ATTR_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    errno: int
    attr: Attr
    hosts: _containers.RepeatedScalarFieldContainer[str]
    tier: str
    def __init__(self, errno: _Optional[int] = ..., attr: _Optional[_Union[Attr, _Mapping]] = ..., hosts: _Optional[_Iterable[str]] = ..., tier: _Optional[str] = ...) -> None: ...

class LocateReply(_message.Message):
    __slots__ = ("files", "whole")
    FILES_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[Located]
    whole: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, files: _Optional[_Iterable[_Union[Located, _Mapping]]] = ..., whole: _Optional[_Iterable[bool]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("caller", "path", "resume", "since")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    path: str
    resume: bool
    since: int
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., path: _Optional[str] = ..., resume: _Optional[bool] = ..., since: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("position", "kind", "name", "from_name", "ino", "size", "time_ms", "hosts", "host")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FROM_NAME_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    position: int
    kind: EventKind
    name: str
    from_name: str
    ino: int
    size: int
    time_ms: int
    hosts: _containers.RepeatedScalarFieldContainer[str]
    host: str
    def __init__(self, position: _Optional[int] = ..., kind: _Optional[_Union[EventKind, str]] = ..., name: _Optional[str] = ..., from_name: _Optional[str] = ..., ino: _Optional[int] = ..., size: _Optional[int] = ..., time_ms: _Optional[int] = ..., hosts: _Optional[_Iterable[str]] = ..., host: _Optional[str] = ...) -> None: ...

class WatchReply(_message.Message):
    __slots__ = ("events", "through")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WatchEvent]
    through: int
    def __init__(self, events: _Optional[_Iterable[_Union[WatchEvent, _Mapping]]] = ..., through: _Optional[int] = ...) -> None: ...

class LockRequest(_message.Message):
    __slots__ = ("caller", "ino", "owner", "flock", "type", "start", "end", "pid", "test", "wait")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    INO_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    FLOCK_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TEST_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    ino: int
    owner: int
    flock: bool
    type: int
    start: int
    end: int
    pid: int
    test: bool
    wait: bool
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., ino: _Optional[int] = ..., owner: _Optional[int] = ..., flock: _Optional[bool] = ..., type: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., pid: _Optional[int] = ..., test: _Optional[bool] = ..., wait: _Optional[bool] = ...) -> None: ...

class LockReply(_message.Message):
    __slots__ = ("granted", "conflict", "lease_ms")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    conflict: LockRange
    lease_ms: int
    def __init__(self, granted: _Optional[bool] = ..., conflict: _Optional[_Union[LockRange, _Mapping]] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class LockRange(_message.Message):
    __slots__ = ("type", "start", "end", "pid")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    type: int
    start: int
    end: int
    pid: int
    def __init__(self, type: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class LockRenew(_message.Message):
    __slots__ = ("caller", "reclaim")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_FIELD_NUMBER: _ClassVar[int]
    caller: Caller
    reclaim: _containers.RepeatedCompositeFieldContainer[LockRequest]
    def __init__(self, caller: _Optional[_Union[Caller, _Mapping]] = ..., reclaim: _Optional[_Iterable[_Union[LockRequest, _Mapping]]] = ...) -> None: ...

class LockRenewReply(_message.Message):
    __slots__ = ("held", "lease_ms")
    HELD_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    held: bool
    lease_ms: int
    def __init__(self, held: _Optional[bool] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class WorkerInfoReply(_message.Message):
    __slots__ = ("worker_id", "host", "dirs", "blocks", "version")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    DIRS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    host: str
    dirs: _containers.RepeatedCompositeFieldContainer[DataDir]
    blocks: int
    version: str
    def __init__(self, worker_id: _Optional[int] = ..., host: _Optional[str] = ..., dirs: _Optional[_Iterable[_Union[DataDir, _Mapping]]] = ..., blocks: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class BlockRequest(_message.Message):
    __slots__ = ("block_id",)
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    def __init__(self, block_id: _Optional[int] = ...) -> None: ...

class BlockStatReply(_message.Message):
    __slots__ = ("exists", "length", "checksum", "path", "tier")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    length: int
    checksum: int
    path: str
    tier: str
    def __init__(self, exists: _Optional[bool] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., path: _Optional[str] = ..., tier: _Optional[str] = ...) -> None: ...

class LoadBlocksRequest(_message.Message):
    __slots__ = ("blocks", "workers")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAddress]
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerAddress, _Mapping]]] = ...) -> None: ...

class LoadBlocksReply(_message.Message):
    __slots__ = ("loaded", "failed", "message")
    LOADED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    loaded: _containers.RepeatedScalarFieldContainer[int]
    failed: _containers.RepeatedScalarFieldContainer[int]
    message: str
    def __init__(self, loaded: _Optional[_Iterable[int]] = ..., failed: _Optional[_Iterable[int]] = ..., message: _Optional[str] = ...) -> None: ...

class PersistRequest(_message.Message):
    __slots__ = ("mount_id", "key", "size", "blocks", "workers")
    MOUNT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    mount_id: int
    key: str
    size: int
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAddress]
    def __init__(self, mount_id: _Optional[int] = ..., key: _Optional[str] = ..., size: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerAddress, _Mapping]]] = ...) -> None: ...

class PersistReply(_message.Message):
    __slots__ = ("etag", "mtime_ns")
    ETAG_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    etag: str
    mtime_ns: int
    def __init__(self, etag: _Optional[str] = ..., mtime_ns: _Optional[int] = ...) -> None: ...
