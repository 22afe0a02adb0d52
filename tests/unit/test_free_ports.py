"""free_ports (curvine_py/cluster/processes.py): ports a server can still bind when it starts.

A port found by binding port 0 comes from the kernel's ephemeral range, which outgoing
connections draw from too: a Raft master's link to a peer not started yet took such a
port as its local port before the peer's server bound it (last stop's CI lost a test to
a master that died at its start).  So the ports are taken outside that range."""
from __future__ import annotations

import socket

from curvine_py.cluster.processes import LOCAL_IP, _ephemeral_range, free_ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    lo, hi = _ephemeral_range()
    ports = free_ports(32)
    assert len(set(ports)) == 32
    assert not [p for p in ports if lo <= p <= hi], (lo, hi, ports)
    socks = []
    try:
        for p in ports:   # each one is free now
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((LOCAL_IP, p))
    finally:
        for s in socks:
            s.close()


def test_a_port_held_by_a_listener_is_never_handed_out() -> None:
    lo, _ = _ephemeral_range()
    held = []
    try:
        for port in range(max(1024, lo - 600), lo):   # most of the ports just below the range
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((LOCAL_IP, port))
                s.listen()
            except OSError:
                s.close()
                continue
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        assert not taken & set(free_ports(200))
    finally:
        for s in held:
            s.close()
