"""CSI Controller: a volume is a directory of the pool, made and removed through the SDK.

CreateVolume makes ``<baseDir>/<name>`` (the volume id is that pool path), with the
block size the StorageClass asks for (``blockSize``: a KV chunk that fits one block is
read by FUSE passthrough), and records the requested capacity in an xattr of the
directory, which it returns.  The capacity is a label, not a quota: the pool bounds its
own usage by eviction (docs/eviction.md).  Both calls are idempotent as the spec asks:
CreateVolume again with the same name and parameters returns the same volume; an
incompatible capacity or block size is ALREADY_EXISTS; DeleteVolume of a missing
volume is OK.  DeleteVolume removes only directories CreateVolume made (they carry the
capacity xattr): a static volume's data (``volumeHandle: /models/kv``) is never removed.
"""
from __future__ import annotations

import errno
import logging
import posixpath
import typing
from dataclasses import dataclass

import grpc

from curvine_py.common.config import parse_size
from curvine_py.common.errors import ConfigError, CurvineError
from curvine_py.csi.common import Clients, Cluster, CsiError, check_capability, invalid, rpc, volume_path
from curvine_py.pb import csi_pb2 as csi
from curvine_py.pb import csi_pb2_grpc

if typing.TYPE_CHECKING:
    from curvine_py.common.config import Config
    from curvine_py.sdk import Client

log = logging.getLogger("curvine.csi")

CAPACITY_XATTR = "user.curvine.csi.capacity"   # bytes, decimal; marks a directory CreateVolume made
DEFAULT_BASE_DIR = "/csi"
PARAM_BASE_DIR = "baseDir"
PARAM_BLOCK_SIZE = "blockSize"
# Keys the external-provisioner adds itself (secret references, --extra-create-metadata).
PROVISIONER_PREFIX = "csi.storage.k8s.io/"
Code = grpc.StatusCode


@dataclass(frozen=True)
class VolumeRequest:
    """A CreateVolume request, checked: where the directory goes and what it must have."""
    path: str
    capacity: int        # bytes recorded (required_bytes, else limit_bytes, else 0)
    limit: int           # 0 = no upper bound
    block_size: int      # 0 = inherit the parent directory's

    @classmethod
    def of(cls, request: csi.CreateVolumeRequest) -> "VolumeRequest":
        name = request.name
        if not name:
            raise invalid("name is required")
        if "/" in name or name in (".", "..") or "\0" in name:
            raise invalid(f"name {name!r} must be one path component (a PVC's pv-name is)")
        if not request.volume_capabilities:
            raise invalid("volume_capabilities is required")
        for cap in request.volume_capabilities:
            check_capability(cap)
        params = dict(request.parameters)
        unknown = sorted(k for k in params if k not in (PARAM_BASE_DIR, PARAM_BLOCK_SIZE)
                         and not k.startswith(PROVISIONER_PREFIX))
        if unknown:
            raise invalid(f"unknown parameter(s) {', '.join(unknown)} (known: {PARAM_BASE_DIR}, {PARAM_BLOCK_SIZE})")
        base = volume_path(params.get(PARAM_BASE_DIR, DEFAULT_BASE_DIR))
        required, limit = request.capacity_range.required_bytes, request.capacity_range.limit_bytes
        if required < 0 or limit < 0 or (limit and required > limit):
            raise CsiError(Code.OUT_OF_RANGE, f"capacity_range {required}..{limit} is not a range of bytes")
        return cls(posixpath.join(base, name), required or limit, limit, _block_size(params.get(PARAM_BLOCK_SIZE)))

    def fits(self, capacity: int) -> bool:
        """Does an existing volume of this capacity satisfy the request's range?"""
        wanted = self.capacity
        return capacity >= wanted and (not self.limit or capacity <= self.limit)


def _block_size(text: str | None) -> int:
    if text is None:
        return 0
    try:
        size = parse_size(text)
    except ConfigError as e:
        raise invalid(f"{PARAM_BLOCK_SIZE}: {e}") from None
    if size <= 0 or size % 4096:
        raise invalid(f"{PARAM_BLOCK_SIZE} {text!r} must be a positive multiple of 4KiB (e.g. 16MiB)")
    return size


class Controller(csi_pb2_grpc.ControllerServicer):
    def __init__(self, config: "Config", clients: Clients) -> None:
        self.config = config
        self.clients = clients

    def _client(self, secrets: typing.Mapping[str, str]) -> "Client":
        return self.clients.get(Cluster.of(self.config, secrets))

    @rpc
    def CreateVolume(self, request: csi.CreateVolumeRequest, context: grpc.ServicerContext
                     ) -> csi.CreateVolumeResponse:
        want = VolumeRequest.of(request)
        client = self._client(request.secrets)
        client.mkdir(posixpath.dirname(want.path), parents=True, exist_ok=True)
        try:
            client.mkdir(want.path, block_size=want.block_size)
            made = True
        except CurvineError as e:
            if e.errno != errno.EEXIST:
                raise
            made = False
        capacity = self._settle(client, want, made)
        log.info("CreateVolume %s: %s (capacity %d)", request.name, "made" if made else "exists", capacity)
        volume = csi.Volume(volume_id=want.path, capacity_bytes=capacity)
        return csi.CreateVolumeResponse(volume=volume)

    def _settle(self, client: "Client", want: VolumeRequest, made: bool) -> int:
        """The volume's recorded capacity: written now for a new (or half-made) directory,
        else checked against the request (ALREADY_EXISTS when it does not fit)."""
        st = client.stat(want.path)
        if not st.is_dir:
            raise CsiError(Code.ALREADY_EXISTS, f"{want.path} exists in the pool and is not a directory")
        recorded = _recorded_capacity(client, want.path)
        if recorded is None:   # new, or a retry after a crash between mkdir and setxattr
            if not made and want.block_size and st.block_size != want.block_size:
                raise CsiError(Code.ALREADY_EXISTS, f"{want.path} exists with block size {st.block_size}, "
                                                    f"not {want.block_size}")
            client.setxattr(want.path, CAPACITY_XATTR, str(want.capacity).encode())
            return want.capacity
        if not want.fits(recorded):
            raise CsiError(Code.ALREADY_EXISTS, f"volume {want.path} exists with capacity {recorded} bytes, "
                                                f"outside the requested range")
        if want.block_size and st.block_size != want.block_size:
            raise CsiError(Code.ALREADY_EXISTS, f"volume {want.path} exists with block size {st.block_size}, "
                                                f"not {want.block_size}")
        return recorded

    @rpc
    def DeleteVolume(self, request: csi.DeleteVolumeRequest, context: grpc.ServicerContext
                     ) -> csi.DeleteVolumeResponse:
        path = volume_path(request.volume_id)
        client = self._client(request.secrets)
        if not client.exists(path):
            return csi.DeleteVolumeResponse()
        if _recorded_capacity(client, path) is None:
            raise CsiError(Code.FAILED_PRECONDITION, f"{path} was not made by CreateVolume (no {CAPACITY_XATTR}): "
                                                     "its data is left alone")
        _remove_tree(client, path)
        log.info("DeleteVolume %s: removed", path)
        return csi.DeleteVolumeResponse()

    @rpc
    def ValidateVolumeCapabilities(self, request: csi.ValidateVolumeCapabilitiesRequest,
                                   context: grpc.ServicerContext) -> csi.ValidateVolumeCapabilitiesResponse:
        path = volume_path(request.volume_id)
        if not request.volume_capabilities:
            raise invalid("volume_capabilities is required")
        if not self._client(request.secrets).stat(path).is_dir:
            raise CsiError(Code.NOT_FOUND, f"volume {path} is not a directory in the pool")
        for cap in request.volume_capabilities:
            try:
                check_capability(cap)
            except CsiError as e:   # unsupported: not confirmed, and why
                return csi.ValidateVolumeCapabilitiesResponse(message=e.message)
        confirmed = csi.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=request.volume_context, volume_capabilities=request.volume_capabilities,
            parameters=request.parameters)
        return csi.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    @rpc
    def ControllerGetCapabilities(self, request: csi.ControllerGetCapabilitiesRequest,
                                  context: grpc.ServicerContext) -> csi.ControllerGetCapabilitiesResponse:
        rpc_type = csi.ControllerServiceCapability.RPC(type=csi.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME)
        return csi.ControllerGetCapabilitiesResponse(capabilities=[csi.ControllerServiceCapability(rpc=rpc_type)])


def _recorded_capacity(client: "Client", path: str) -> int | None:
    try:
        return int(client.getxattr(path, CAPACITY_XATTR).decode())
    except CurvineError as e:
        if e.errno == errno.ENODATA:
            return None
        raise
    except ValueError:
        raise CsiError(Code.INTERNAL, f"{path}: {CAPACITY_XATTR} is not a number of bytes") from None


def _remove_tree(client: "Client", path: str) -> None:
    """Files first, then directories bottom-up (as `cv fs rm -r`); a name already gone is fine
    (a DeleteVolume retried while the first one still runs)."""
    for top, _dirs, files in reversed(list(client.walk(path))):
        for name in files:
            _missing_ok(client.remove, posixpath.join(top, name))
        _missing_ok(client.rmdir, top)


def _missing_ok(fn: typing.Callable[[str], None], path: str) -> None:
    try:
        fn(path)
    except CurvineError as e:
        if e.errno != errno.ENOENT:
            raise
