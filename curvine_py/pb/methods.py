"""MasterService's methods, typed.  Generated from proto/curvine.proto by
proto/gen_methods.py (``make proto``): do not edit."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from google.protobuf.message import Message

from curvine_py.pb import curvine_pb2 as pb

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)


@dataclass(frozen=True)
class Method(Generic[Req, Rep]):
    """One MasterService method: its id on the framed wire, its name, its message classes."""
    id: int
    name: str
    request: type[Req]
    reply: type[Rep]


class Master:
    """MasterService: one attribute per method, in the service's order (its frame id)."""

    Lookup: Final = Method(0, "Lookup", pb.LookupRequest, pb.AttrReply)
    GetAttr: Final = Method(1, "GetAttr", pb.InodeRequest, pb.AttrReply)
    ResolvePath: Final = Method(2, "ResolvePath", pb.PathRequest, pb.AttrReply)
    SetAttr: Final = Method(3, "SetAttr", pb.SetAttrRequest, pb.AttrReply)
    Mknod: Final = Method(4, "Mknod", pb.MknodRequest, pb.AttrReply)
    Link: Final = Method(5, "Link", pb.LinkRequest, pb.AttrReply)
    Unlink: Final = Method(6, "Unlink", pb.UnlinkRequest, pb.DirsReply)
    Rmdir: Final = Method(7, "Rmdir", pb.UnlinkRequest, pb.DirsReply)
    Rename: Final = Method(8, "Rename", pb.RenameRequest, pb.DirsReply)
    ReadDir: Final = Method(9, "ReadDir", pb.ReadDirRequest, pb.ReadDirReply)
    Readlink: Final = Method(10, "Readlink", pb.InodeRequest, pb.ReadlinkReply)
    GetXattr: Final = Method(11, "GetXattr", pb.XattrRequest, pb.XattrReply)
    SetXattr: Final = Method(12, "SetXattr", pb.XattrRequest, pb.Empty)
    ListXattr: Final = Method(13, "ListXattr", pb.XattrRequest, pb.XattrReply)
    RemoveXattr: Final = Method(14, "RemoveXattr", pb.XattrRequest, pb.Empty)
    StatFs: Final = Method(15, "StatFs", pb.Empty, pb.StatFsReply)
    Open: Final = Method(16, "Open", pb.OpenRequest, pb.OpenReply)
    Create: Final = Method(17, "Create", pb.MknodRequest, pb.OpenReply)
    AllocateBlocks: Final = Method(18, "AllocateBlocks", pb.AllocateBlocksRequest, pb.AllocateBlocksReply)
    Commit: Final = Method(19, "Commit", pb.CommitRequest, pb.AttrReply)
    RenewLeases: Final = Method(20, "RenewLeases", pb.LeaseRequest, pb.LeaseReply)
    GetBlockLocations: Final = Method(21, "GetBlockLocations", pb.BlockLocationsRequest, pb.BlockLocationsReply)
    RegisterWorker: Final = Method(22, "RegisterWorker", pb.RegisterRequest, pb.RegisterReply)
    Heartbeat: Final = Method(23, "Heartbeat", pb.HeartbeatRequest, pb.HeartbeatReply)
    ReportBlocks: Final = Method(24, "ReportBlocks", pb.BlockReport, pb.Empty)
    GetRing: Final = Method(25, "GetRing", pb.Empty, pb.RingReply)
    Report: Final = Method(26, "Report", pb.Empty, pb.ReportReply)
    ReportBadBlock: Final = Method(27, "ReportBadBlock", pb.BadBlockRequest, pb.Empty)
    UfsMountAdd: Final = Method(28, "UfsMountAdd", pb.UfsMountRequest, pb.UfsMount)
    UfsMountRemove: Final = Method(29, "UfsMountRemove", pb.UfsPathRequest, pb.Empty)
    UfsMountList: Final = Method(30, "UfsMountList", pb.Empty, pb.UfsMountsReply)
    UfsMountGet: Final = Method(31, "UfsMountGet", pb.UfsMountIdRequest, pb.UfsMount)
    UfsStat: Final = Method(32, "UfsStat", pb.PathRequest, pb.UfsStatReply)
    Load: Final = Method(33, "Load", pb.LoadRequest, pb.LoadJob)
    LoadStatus: Final = Method(34, "LoadStatus", pb.LoadJobRequest, pb.LoadJobsReply)
    Free: Final = Method(35, "Free", pb.FreeRequest, pb.FreeReply)
    MasterStatus: Final = Method(36, "MasterStatus", pb.Empty, pb.MasterStatusReply)
    OpenSession: Final = Method(37, "OpenSession", pb.SessionRequest, pb.SessionReply)
    Beat: Final = Method(38, "Beat", pb.SessionBeat, pb.Empty)
    Lock: Final = Method(39, "Lock", pb.LockRequest, pb.LockReply)
    RenewLocks: Final = Method(40, "RenewLocks", pb.LockRenew, pb.LockRenewReply)
    Locate: Final = Method(41, "Locate", pb.LocateRequest, pb.LocateReply)


METHODS: tuple[Method[Message, Message], ...] = (
    Master.Lookup,
    Master.GetAttr,
    Master.ResolvePath,
    Master.SetAttr,
    Master.Mknod,
    Master.Link,
    Master.Unlink,
    Master.Rmdir,
    Master.Rename,
    Master.ReadDir,
    Master.Readlink,
    Master.GetXattr,
    Master.SetXattr,
    Master.ListXattr,
    Master.RemoveXattr,
    Master.StatFs,
    Master.Open,
    Master.Create,
    Master.AllocateBlocks,
    Master.Commit,
    Master.RenewLeases,
    Master.GetBlockLocations,
    Master.RegisterWorker,
    Master.Heartbeat,
    Master.ReportBlocks,
    Master.GetRing,
    Master.Report,
    Master.ReportBadBlock,
    Master.UfsMountAdd,
    Master.UfsMountRemove,
    Master.UfsMountList,
    Master.UfsMountGet,
    Master.UfsStat,
    Master.Load,
    Master.LoadStatus,
    Master.Free,
    Master.MasterStatus,
    Master.OpenSession,
    Master.Beat,
    Master.Lock,
    Master.RenewLocks,
    Master.Locate,
)
