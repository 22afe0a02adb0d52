"""The placement map: a consistent hash ring over workers, versioned by an epoch.

Each worker owns ``vnodes`` points on a 64-bit ring (xxh3 of "worker_id#i").  A
block's replicas are the first ``n`` workers on *distinct hosts* met clockwise from
xxh3(block_id).  Adding or removing a worker only moves the blocks whose arc it
gains or loses.  Master and clients build the same ring from the same node list,
so a client holding the current epoch can compute a block's location itself.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import xxhash


@dataclass(frozen=True)
class RingNode:
    worker_id: int
    host: str


def _h(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def block_point(block_id: int) -> int:
    return _h(block_id.to_bytes(8, "little"))


class HashRing:
    """An immutable ring; build a new one (with a new epoch) when membership changes."""

    def __init__(self, nodes: list[RingNode], vnodes: int = 64, epoch: int = 0) -> None:
        self.epoch = epoch
        self.vnodes = vnodes
        self.nodes = {n.worker_id: n for n in nodes}
        points: list[tuple[int, int]] = []
        for n in nodes:
            for i in range(vnodes):
                points.append((_h(f"{n.worker_id}#{i}".encode()), n.worker_id))
        points.sort()
        self._keys = [p for p, _ in points]
        self._owners = [w for _, w in points]

    def __len__(self) -> int:
        return len(self.nodes)

    def place(self, key: int, n: int, exclude: frozenset[int] = frozenset(), prefer_host: str = "") -> list[int]:
        """The first n workers on distinct hosts clockwise from key (fewer if fewer hosts);
        with prefer_host, the first worker clockwise on that host comes first (a writer's
        own host: its replica is written there without the network)."""
        if not self._keys or n <= 0:
            return []
        out: list[int] = []
        hosts: set[str] = set()
        start = bisect.bisect_left(self._keys, key)
        total = len(self._keys)
        if prefer_host:
            for step in range(total):
                wid = self._owners[(start + step) % total]
                if self.nodes[wid].host == prefer_host and wid not in exclude:
                    out.append(wid)
                    hosts.add(prefer_host)
                    break
        for step in range(total):
            if len(out) == n:
                break
            wid = self._owners[(start + step) % total]
            node = self.nodes[wid]
            if wid in exclude or wid in out or node.host in hosts:
                continue
            out.append(wid)
            hosts.add(node.host)
        return out

    def place_block(self, block_id: int, n: int, exclude: frozenset[int] = frozenset(),
                    prefer_host: str = "") -> list[int]:
        return self.place(block_point(block_id), n, exclude, prefer_host)
