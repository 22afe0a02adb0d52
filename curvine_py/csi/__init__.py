"""The CSI driver: the pool as Kubernetes volumes (docs/csi.md).

``cv csi node`` serves the CSI Identity and Node services on a node: each published
volume is a bind mount of one FUSE mount daemon per (cluster, pool directory), found
again from the node's mount table after a restart.  ``cv csi controller`` serves Identity
and Controller: CreateVolume/DeleteVolume make and remove a pool directory.  The gRPC
contract is the CSI spec's (proto/csi.proto, compiled into curvine_py.pb.csi_pb2).
"""
from __future__ import annotations

DRIVER_NAME = "csi.curvine.io"   # the CSIDriver object's name and the StorageClass's provisioner
DEFAULT_STATE_DIR = "/var/lib/curvine-csi"   # `cv csi node --state-dir`: staging mounts, pid files, logs
