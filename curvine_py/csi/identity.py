"""CSI Identity: who the plugin is, what it offers, whether it is ready."""
from __future__ import annotations

import typing

import grpc

from curvine_py.csi import DRIVER_NAME
from curvine_py.csi.common import CsiError, rpc
from curvine_py.common.version import package_version
from curvine_py.pb import csi_pb2 as csi
from curvine_py.pb import csi_pb2_grpc


class Identity(csi_pb2_grpc.IdentityServicer):
    """ready: the serving process's own health check (the node's: /dev/fuse and mount work);
    it returns None when ready, else the reason."""

    def __init__(self, ready: typing.Callable[[], str | None] = lambda: None) -> None:
        self._ready = ready

    @rpc
    def GetPluginInfo(self, request: csi.GetPluginInfoRequest, context: grpc.ServicerContext
                      ) -> csi.GetPluginInfoResponse:
        return csi.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=package_version())

    @rpc
    def GetPluginCapabilities(self, request: csi.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
                              ) -> csi.GetPluginCapabilitiesResponse:
        # The plugin as a whole has a controller (cv csi controller); the node server says so
        # too, as the spec asks of every instance of one plugin.
        service = csi.PluginCapability.Service(type=csi.PluginCapability.Service.CONTROLLER_SERVICE)
        return csi.GetPluginCapabilitiesResponse(capabilities=[csi.PluginCapability(service=service)])

    @rpc
    def Probe(self, request: csi.ProbeRequest, context: grpc.ServicerContext) -> csi.ProbeResponse:
        reason = self._ready()
        if reason is not None:
            raise CsiError(grpc.StatusCode.FAILED_PRECONDITION, reason)
        response = csi.ProbeResponse()
        response.ready.value = True
        return response
