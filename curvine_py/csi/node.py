"""CSI Node: publish a pool directory at a pod's target path, unpublish it, report usage.

The mounts themselves are staging.StagingMounts's; this module checks each request as
the spec asks (INVALID_ARGUMENT for a missing or relative path, NOT_FOUND for a volume
the pool does not have) and answers from the mount table.
"""
from __future__ import annotations

import logging
import os
import typing

import grpc

from curvine_py.csi.common import Clients, Cluster, CsiError, absolute_path, check_capability, invalid, \
    is_readonly_mode, rpc, volume_path
from curvine_py.common.mounttable import mount_at, read_mounts
from curvine_py.csi.mounts import FUSE_TYPE
from curvine_py.csi.staging import StagingMounts
from curvine_py.pb import csi_pb2 as csi
from curvine_py.pb import csi_pb2_grpc

if typing.TYPE_CHECKING:
    from curvine_py.common.config import Config

log = logging.getLogger("curvine.csi")
Code = grpc.StatusCode


def node_path(field: str, path: str) -> str:
    """A target path as the mount table spells it: its parent resolved (kubelet's dir may be
    reached through a symlink), never the path itself (a FUSE mount there may hang a stat)."""
    path = absolute_path(field, path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, config: "Config", clients: Clients, staging: StagingMounts, node_id: str) -> None:
        self.config = config
        self.clients = clients
        self.staging = staging
        self.node_id = node_id

    @rpc
    def NodePublishVolume(self, request: csi.NodePublishVolumeRequest, context: grpc.ServicerContext
                          ) -> csi.NodePublishVolumeResponse:
        path = volume_path(request.volume_id)
        target = node_path("target_path", request.target_path)
        if not request.HasField("volume_capability"):
            raise invalid("volume_capability is required")
        check_capability(request.volume_capability)
        cluster = Cluster.of(self.config, request.secrets)
        st = self.clients.get(cluster).stat(path)   # ENOENT: NOT_FOUND, with the path
        if not st.is_dir:
            raise CsiError(Code.NOT_FOUND, f"volume {path} is not a directory in the pool")
        readonly = request.readonly or is_readonly_mode(request.volume_capability)
        self.staging.publish(cluster, path, target, readonly)
        return csi.NodePublishVolumeResponse()

    @rpc
    def NodeUnpublishVolume(self, request: csi.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
                            ) -> csi.NodeUnpublishVolumeResponse:
        volume_path(request.volume_id)   # required; the mount table alone says what is mounted
        self.staging.unpublish(node_path("target_path", request.target_path))
        return csi.NodeUnpublishVolumeResponse()

    @rpc
    def NodeGetVolumeStats(self, request: csi.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
                           ) -> csi.NodeGetVolumeStatsResponse:
        volume_path(request.volume_id)
        where = node_path("volume_path", request.volume_path)
        entry = mount_at(read_mounts(), where)
        if entry is None or entry.fstype != FUSE_TYPE:
            raise CsiError(Code.NOT_FOUND, f"volume {request.volume_id} is not published at {where}")
        try:
            s = os.statvfs(where)
        except OSError as e:   # ENOTCONN: the mount daemon died
            condition = csi.VolumeCondition(abnormal=True, message=f"{where}: {e.strerror}")
            return csi.NodeGetVolumeStatsResponse(volume_condition=condition)
        unit = csi.VolumeUsage
        return csi.NodeGetVolumeStatsResponse(usage=[
            unit(unit=unit.BYTES, total=s.f_blocks * s.f_frsize, available=s.f_bavail * s.f_frsize,
                 used=(s.f_blocks - s.f_bfree) * s.f_frsize),
            unit(unit=unit.INODES, total=s.f_files, available=s.f_favail, used=s.f_files - s.f_ffree),
        ], volume_condition=csi.VolumeCondition(abnormal=False, message="mounted"))

    @rpc
    def NodeGetCapabilities(self, request: csi.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
                            ) -> csi.NodeGetCapabilitiesResponse:
        rpc_type = csi.NodeServiceCapability.RPC(type=csi.NodeServiceCapability.RPC.GET_VOLUME_STATS)
        return csi.NodeGetCapabilitiesResponse(capabilities=[csi.NodeServiceCapability(rpc=rpc_type)])

    @rpc
    def NodeGetInfo(self, request: csi.NodeGetInfoRequest, context: grpc.ServicerContext
                    ) -> csi.NodeGetInfoResponse:
        return csi.NodeGetInfoResponse(node_id=self.node_id)
