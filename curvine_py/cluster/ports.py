"""Which ports the daemons of a local cluster listen on, decided in one place.

Two ways, both giving a ``PortPlan``: the documented scheme (``documented``: what
``cv cluster start`` uses, so that clients and a second start find the cluster on the
same ports) and free ports picked all at once (``picked``: tests run many clusters side
by side; picking them in one batch keeps a daemon's ephemeral bind from landing on a port
chosen here for another daemon that has not bound it yet).

The documented scheme, from the first master's gRPC port P (8995) for K masters and N
workers (K = 1 is the layout a single master always had)::

    master i     gRPC P+2i, frames P+2i+1          (8995/8996 with one master)
    worker i     rpc B+2i, data B+2i+1, B = P+2K    (8997/8998, 8999/9000 with one master)
    metrics      M = B+2N: master i M+i, worker i M+K+i, the mount M+K+N
    Raft (K>1)   master i R+i, R = M+K+N+1

Three masters and two workers from 8995: masters 8995/8996, 8997/8998, 8999/9000;
workers 9001/9002, 9003/9004; metrics 9005-9007 (masters), 9008-9009 (workers), 9010
(mount); Raft 9011-9013.  With an explicit B a master's frame port that falls among the
workers' ports becomes ephemeral (0: clients learn it from the master).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

from curvine_py.cluster.processes import free_ports


@dataclass(frozen=True)
class MasterPorts:
    """One master's ports.  frame 0: ephemeral (clients ask the master for it);
    raft 0: a single master, without Raft."""
    grpc: int
    frame: int
    raft: int
    metrics: int


@dataclass(frozen=True)
class PortPlan:
    """Every port of a cluster: masters, workers' (rpc, data) pairs, metrics."""
    masters: tuple[MasterPorts, ...]
    workers: tuple[tuple[int, int], ...]
    worker_metrics: tuple[int, ...]
    mount_metrics: int

    def labelled(self) -> list[tuple[int, str]]:
        """Each fixed port of a daemon with what it is for (ephemeral ones left out)."""
        single = len(self.masters) == 1
        out: list[tuple[int, str]] = []
        for i, m in enumerate(self.masters):
            name = "master" if single else f"master{i}"
            out += [(m.grpc, name), (m.frame, f"{name} frames"), (m.raft, f"{name} raft"),
                    (m.metrics, f"{name} metrics")]
        for i, (rpc, data) in enumerate(self.workers):
            out += [(rpc, f"worker{i} rpc"), (data, f"worker{i} data"),
                    (self.worker_metrics[i], f"worker{i} metrics")]
        return [(port, what) for port, what in out if port]

    def moved(self, moves: dict[int, int]) -> "PortPlan":
        """The same plan with each port in moves replaced by its new one."""
        def m(port: int) -> int:
            return moves.get(port, port) if port else port
        return PortPlan(tuple(MasterPorts(m(x.grpc), m(x.frame), m(x.raft), m(x.metrics)) for x in self.masters),
                        tuple((m(rpc), m(data)) for rpc, data in self.workers),
                        tuple(m(p) for p in self.worker_metrics), m(self.mount_metrics))

    def clash(self) -> str | None:
        """Two daemons given one port ("port 9001: master1 and worker0 rpc"), or None."""
        users: dict[int, list[str]] = collections.defaultdict(list)
        for port, what in self.labelled():
            users[port].append(what)
        for port, names in users.items():
            if len(names) > 1:
                return f"port {port}: {' and '.join(names)}"
        return None


def documented(masters: int, workers: int, master_port: int, base_port: int | None = None) -> PortPlan:
    """The scheme of the module docstring; base_port (B) defaults to P + 2K."""
    base = base_port if base_port is not None else master_port + 2 * masters
    worker_range = range(base, base + 2 * workers)
    metrics = base + 2 * workers
    raft = metrics + masters + workers + 1
    plan = []
    for i in range(masters):
        frame = master_port + 2 * i + 1
        plan.append(MasterPorts(master_port + 2 * i, 0 if frame in worker_range else frame,
                                raft + i if masters > 1 else 0, metrics + i))
    return PortPlan(tuple(plan), tuple((base + 2 * i, base + 2 * i + 1) for i in range(workers)),
                    tuple(metrics + masters + i for i in range(workers)), metrics + masters + workers)


def picked(masters: int, workers: int, host: str, base_port: int | None = None) -> PortPlan:
    """Free ports for every master; the workers' and metrics ports too unless base_port
    is given (then they follow the documented scheme from it)."""
    raft = masters if masters > 1 else 0
    n = 2 * masters + raft + (0 if base_port is not None else masters + 3 * workers + 1)
    ports = iter(free_ports(n, host))
    grpc = [next(ports) for _ in range(masters)]
    frames = [next(ports) for _ in range(masters)]
    rafts = [next(ports) for _ in range(raft)] or [0] * masters
    if base_port is not None:
        scheme = documented(masters, workers, grpc[0], base_port)
        metrics = [m.metrics for m in scheme.masters]
        return PortPlan(tuple(MasterPorts(g, f, r, m) for g, f, r, m in zip(grpc, frames, rafts, metrics)),
                        scheme.workers, scheme.worker_metrics, scheme.mount_metrics)
    pairs = tuple((next(ports), next(ports)) for _ in range(workers))
    metrics = [next(ports) for _ in range(masters)]
    return PortPlan(tuple(MasterPorts(g, f, r, m) for g, f, r, m in zip(grpc, frames, rafts, metrics)),
                    pairs, tuple(next(ports) for _ in range(workers)), next(ports))
