"""Target: the CSI driver's requests (curvine_py/csi/), as Kubernetes' sidecars send them
to the Identity, Controller and Node services, answered against a real master
(fuzz/realmaster.py) through the SDK client the driver uses.

Requests are well-formed messages of each method's type with fuzzed fields; path fields
often start with "/", and parameters often use the known keys, so that checks past the
first one are reached.  Secrets are dropped: they may name another master, which the
driver would dial (a host on the network, or another engineer's cluster here).

The node's mounts are not made: publish and unpublish of its staging (StagingMounts)
are replaced by a check of the arguments the Node hands them (absolute, normalized
paths), since a fuzzed target path would be bind-mounted or removed, as root, anywhere on
this machine.  Everything before them (validation, the pool lookups) runs for real.

Checks: each handler answers or raises CsiError or CurvineError (which the driver's rpc
wrapper turns into a status code); any other exception is a finding (the wrapper would
log it and answer INTERNAL)."""
from __future__ import annotations

import posixpath
import shutil
import tempfile
import typing

from curvine_py.common.config import Config
from curvine_py.common.errors import CurvineError
from curvine_py.csi.common import Clients, Cluster, CsiError
from curvine_py.csi.controller import PARAM_BASE_DIR, PARAM_BLOCK_SIZE, PROVISIONER_PREFIX, Controller
from curvine_py.csi.identity import Identity
from curvine_py.csi.node import Node
from curvine_py.csi.staging import StagingMounts
from curvine_py.pb import csi_pb2 as csi
from fuzz.draw import Draw, fill
from fuzz.harness import MAX_INPUT, Finding, Lazy, run
from fuzz.realmaster import MASTER, master

CALLS_PER_INPUT = 4
PATH_FIELDS = {"volume_id", "target_path", "volume_path", "staging_target_path"}
PARAM_KEYS = (PARAM_BASE_DIR, PARAM_BLOCK_SIZE, PROVISIONER_PREFIX + "pvc/name")


class CheckedStaging(StagingMounts):
    """StagingMounts less its mounts: the arguments checked, nothing mounted or removed."""

    def publish(self, cluster: Cluster, subdir: str, target: str, readonly: bool) -> None:
        _normal("publish subdir", subdir)
        _normal("publish target", target)

    def unpublish(self, target: str) -> None:
        _normal("unpublish target", target)


def _normal(what: str, path: str) -> None:
    if not path.startswith("/") or "\0" in path or posixpath.normpath(path) != path:
        raise Finding(f"the node handed its staging a {what} that is no absolute normal path: {path!r}")


Call = tuple[typing.Any, str, type]   # a servicer, one of its methods' names, its request type


def _start() -> tuple[list[Call], typing.Callable[[], None]]:
    """Every CSI call the driver answers, on servicers whose SDK clients reach the master."""
    cfg = Config()
    cfg.client.master = f"127.0.0.1:{master().port}"
    clients = Clients(cfg)
    state = tempfile.mkdtemp(prefix="fuzz-csi-")
    node = Node(cfg, clients, CheckedStaging(state), "fuzz-node")
    calls: list[Call] = []
    for servicer in (Identity(), Controller(cfg, clients), node):
        service = csi.DESCRIPTOR.services_by_name[type(servicer).__bases__[0].__name__.removesuffix("Servicer")]
        for m in service.methods:
            if hasattr(getattr(type(servicer), m.name, None), "__wrapped__"):
                calls.append((servicer, m.name, getattr(csi, m.input_type.name)))

    def stop() -> None:
        clients.close()
        shutil.rmtree(state, ignore_errors=True)
    return calls, stop


SERVICES: Lazy[list[Call]] = Lazy(_start)
services = SERVICES.get


def close() -> None:
    SERVICES.close()
    MASTER.close()


def fuzz_one(data: bytes) -> None:
    draw = Draw(data[:MAX_INPUT])
    for _ in range(CALLS_PER_INPUT):
        if draw.left() <= 0:
            break
        servicer, name, request_type = draw.choice(services())
        request = request_type()
        fill(request, draw)
        _steer(request, draw)
        try:
            getattr(type(servicer), name).__wrapped__(servicer, request, None)
        except (CsiError, CurvineError):
            pass


def _steer(request: typing.Any, draw: Draw) -> None:
    """Paths that look like paths and parameters with known keys, often; no secrets."""
    for field in request.DESCRIPTOR.fields:
        if field.name in PATH_FIELDS and draw.byte() % 4:
            setattr(request, field.name, "/" + getattr(request, field.name).lstrip("/"))
    if "secrets" in request.DESCRIPTOR.fields_by_name:
        request.secrets.clear()
    if "parameters" in request.DESCRIPTOR.fields_by_name and draw.byte() & 1:
        for _ in range(draw.byte() % 3):
            request.parameters[draw.choice(PARAM_KEYS)] = draw.text(24)


def main() -> None:
    services()
    run(fuzz_one)


if __name__ == "__main__":
    main()
