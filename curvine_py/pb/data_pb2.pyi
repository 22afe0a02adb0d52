from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_NONE: _ClassVar[Op]
    WRITE_OPEN: _ClassVar[Op]
    WRITE_DATA: _ClassVar[Op]
    WRITE_COMMIT: _ClassVar[Op]
    READ: _ClassVar[Op]
    REPLY: _ClassVar[Op]
    DATA: _ClassVar[Op]
OP_NONE: Op
WRITE_OPEN: Op
WRITE_DATA: Op
WRITE_COMMIT: Op
READ: Op
REPLY: Op
DATA: Op

class ChainTarget(_message.Message):
    __slots__ = ("ip", "port", "worker_id")
    IP_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ip: str
    port: int
    worker_id: int
    def __init__(self, ip: _Optional[str] = ..., port: _Optional[int] = ..., worker_id: _Optional[int] = ...) -> None: ...

class DataHeader(_message.Message):
    __slots__ = ("op", "block_id", "offset", "length", "checksum", "payload_len", "chain", "errno", "message", "acked", "token", "tier", "tier_name", "align", "chunk_sums", "ufs_mount", "ufs_key", "ufs_offset", "ufs_length", "ufs_etag", "chunk_size", "cached")
    OP_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_LEN_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    ERRNO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TIER_NAME_FIELD_NUMBER: _ClassVar[int]
    ALIGN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SUMS_FIELD_NUMBER: _ClassVar[int]
    UFS_MOUNT_FIELD_NUMBER: _ClassVar[int]
    UFS_KEY_FIELD_NUMBER: _ClassVar[int]
    UFS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    UFS_LENGTH_FIELD_NUMBER: _ClassVar[int]
    UFS_ETAG_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    op: Op
    block_id: int
    offset: int
    length: int
    checksum: int
    payload_len: int
    chain: _containers.RepeatedCompositeFieldContainer[ChainTarget]
    errno: int
    message: str
    acked: _containers.RepeatedScalarFieldContainer[int]
    token: str
    tier: int
    tier_name: str
    align: int
    chunk_sums: _containers.RepeatedScalarFieldContainer[int]
    ufs_mount: int
    ufs_key: str
    ufs_offset: int
    ufs_length: int
    ufs_etag: str
    chunk_size: int
    cached: bool
    def __init__(self, op: _Optional[_Union[Op, str]] = ..., block_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., checksum: _Optional[int] = ..., payload_len: _Optional[int] = ..., chain: _Optional[_Iterable[_Union[ChainTarget, _Mapping]]] = ..., errno: _Optional[int] = ..., message: _Optional[str] = ..., acked: _Optional[_Iterable[int]] = ..., token: _Optional[str] = ..., tier: _Optional[int] = ..., tier_name: _Optional[str] = ..., align: _Optional[int] = ..., chunk_sums: _Optional[_Iterable[int]] = ..., ufs_mount: _Optional[int] = ..., ufs_key: _Optional[str] = ..., ufs_offset: _Optional[int] = ..., ufs_length: _Optional[int] = ..., ufs_etag: _Optional[str] = ..., chunk_size: _Optional[int] = ..., cached: _Optional[bool] = ...) -> None: ...
