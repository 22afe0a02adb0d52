"""What the three CSI services share: status errors, the cluster a request names, SDK clients.

Every failure a CO sees is a gRPC status with the spec's code and a message that says
what to fix (``CsiError``); a pool error (``CurvineError``) becomes the code its errno
means; anything else is a bug, logged with its traceback and answered INTERNAL.
"""
from __future__ import annotations

import copy
import errno
import functools
import logging
import posixpath
import threading
import typing
from dataclasses import dataclass

import grpc

from curvine_py.common.config import Config
from curvine_py.common.errors import CurvineError
from curvine_py.pb import csi_pb2 as csi

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client

log = logging.getLogger("curvine.csi")

# Keys of a request's `secrets` (a Kubernetes Secret named by the StorageClass or PV):
SECRET_MASTER = "master"
SECRET_SECRET = "secret"
# A request must not sit for the SDK's default two minutes on an unreachable master:
# kubelet and the provisioner time out first and retry anyway.
CLIENT_RETRY_S = 15.0

Code = grpc.StatusCode
_CODE_OF_ERRNO = {
    errno.ENOENT: Code.NOT_FOUND, errno.ENOTDIR: Code.NOT_FOUND,
    errno.EACCES: Code.PERMISSION_DENIED, errno.EPERM: Code.PERMISSION_DENIED,
    errno.EEXIST: Code.ALREADY_EXISTS, errno.EINVAL: Code.INVALID_ARGUMENT,
    errno.ENOSPC: Code.RESOURCE_EXHAUSTED, errno.EDQUOT: Code.RESOURCE_EXHAUSTED,
    errno.EHOSTDOWN: Code.UNAVAILABLE, errno.ETIMEDOUT: Code.UNAVAILABLE,
    errno.ECONNREFUSED: Code.UNAVAILABLE, errno.EAGAIN: Code.UNAVAILABLE,
}


class CsiError(Exception):
    """A request refused or failed with this status code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> CsiError:
    return CsiError(Code.INVALID_ARGUMENT, message)


def rpc(fn: typing.Callable[..., typing.Any]) -> typing.Callable[..., typing.Any]:
    """A servicer method whose errors end as the CO's status (outside the try: abort raises)."""

    @functools.wraps(fn)
    def wrapper(self: object, request: typing.Any, context: grpc.ServicerContext) -> typing.Any:
        try:
            return fn(self, request, context)
        except CsiError as e:
            code, message = e.code, e.message
        except CurvineError as e:
            code, message = _CODE_OF_ERRNO.get(e.errno or 0, Code.INTERNAL), str(e)
        except Exception as e:   # a bug: the CO gets one line, the log the traceback
            log.exception("%s failed", fn.__name__)
            code, message = Code.INTERNAL, f"{type(e).__name__}: {e}"
        log.info("%s: %s %s", fn.__name__, code.name, message)
        context.abort(code, message)
    return wrapper


def volume_path(volume_id: str) -> str:
    """A volume id is the volume's directory in the pool: absolute, normalized."""
    if not volume_id:
        raise invalid("volume_id is required")
    if not volume_id.startswith("/") or "\0" in volume_id:
        raise invalid(f"volume_id {volume_id!r} is not an absolute pool path such as /models/kv")
    return posixpath.normpath(volume_id).replace("//", "/")


def absolute_path(field: str, path: str) -> str:
    """A node path the CO hands over (target_path, volume_path): required and absolute."""
    if not path:
        raise invalid(f"{field} is required")
    if not path.startswith("/") or "\0" in path:
        raise invalid(f"{field} {path!r} is not an absolute path")
    return posixpath.normpath(path)


def check_capability(cap: csi.VolumeCapability) -> None:
    """Pool directories are filesystems that any number of nodes may read and write."""
    if cap.HasField("block"):
        raise invalid("block volumes are not supported: a curvine volume is a filesystem "
                      "(use volumeMode: Filesystem)")
    if not cap.HasField("mount"):
        raise invalid("volume_capability.access_type is required (mount)")


def is_readonly_mode(cap: csi.VolumeCapability) -> bool:
    modes = csi.VolumeCapability.AccessMode
    return cap.access_mode.mode in (modes.SINGLE_NODE_READER_ONLY, modes.MULTI_NODE_READER_ONLY)


@dataclass(frozen=True)
class Cluster:
    """The cluster a request is for: the driver's configured one, or its secrets' master/secret."""
    master: str
    secret: str

    @classmethod
    def of(cls, config: Config, secrets: typing.Mapping[str, str]) -> "Cluster":
        return cls(secrets.get(SECRET_MASTER) or config.client.master,
                   secrets.get(SECRET_SECRET) or config.cluster.secret)


class Clients:
    """One SDK client per cluster, made on first use and shared by the server's threads."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._clients: dict[Cluster, Client] = {}

    def get(self, cluster: Cluster) -> "Client":
        from curvine_py.sdk import Client
        with self._lock:
            client = self._clients.get(cluster)
            if client is None:
                cfg = copy.deepcopy(self.config)
                cfg.client.master, cfg.cluster.secret = cluster.master, cluster.secret
                cfg.client.retry_s = min(cfg.client.retry_s, CLIENT_RETRY_S)
                client = self._clients[cluster] = Client(master=cluster.master, config=cfg)
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
