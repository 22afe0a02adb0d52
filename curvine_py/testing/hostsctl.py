"""`python -m curvine_py.testing.hostsctl up|status|down`: network-namespace hosts by hand.

The command line of ``testhosts`` (which makes the hosts) and ``netcluster`` (a cluster on
them), apart from both so that neither imports the other: ``up --cluster DIR`` leaves
hosts and a cluster running for a debugging session, ``status`` lists the runs on this
machine, ``down`` removes them (and those whose creator died).
"""
from __future__ import annotations

import argparse
import sys

from curvine_py.cluster.local import ClusterError
from curvine_py.testing.netcluster import NetCluster
from curvine_py.testing.testhosts import (
    SUBNET_PREFIX, Hosts, HostsError, link_up, owner_alive, read_states, pid_alive, reap_stale, teardown_state,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m curvine_py.testing.hostsctl",
                                description="Network-namespace hosts for multi-host tests (root only).")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create hosts (and optionally a cluster) that stay until `down`")
    up.add_argument("--hosts", type=int, default=4)
    up.add_argument("--prefix", default="cvt")
    up.add_argument("--cluster", metavar="DIR", help="also start a cluster: master on host 0, workers on the others")
    sub.add_parser("status", help="list the runs on this machine")
    down = sub.add_parser("down", help="remove the runs made by `up` and those whose creator died")
    down.add_argument("ids", nargs="*", help="only these runs (see `status`)")
    down.add_argument("--force", action="store_true",
                      help="also runs whose creator still runs (another test session's!)")
    return p


def _up(args: argparse.Namespace) -> int:
    hosts = Hosts(args.hosts, args.prefix, keep=True)
    try:
        for h in hosts.hosts:
            print(f"{h.name}\t{h.ip}\tnsenter --net={h.netns_path} -- CMD")
        print(f"gateway\t{hosts.gateway_ip}")
        if args.cluster:
            if args.hosts < 2:
                raise HostsError("a cluster needs at least 2 hosts (master + a worker)")
            c = NetCluster(hosts, args.cluster, worker_hosts=range(1, args.hosts), die_with_parent=False)
            c.start()
            print(f"cluster\t{c.master_address}\tconfig {c.config_path}")
    except BaseException:
        teardown_state(hosts.state)
        raise
    return 0


def _status() -> int:
    for s in read_states():
        owner = "up (kept)" if s.get("keep") else (
            f"pid {s['owner_pid']}" + ("" if owner_alive(s) else " (dead: `down` removes it)"))
        alive = sum(pid_alive(p, t) for p, t in s.get("pids", []))
        print(f"{s['id']}\t{SUBNET_PREFIX}.{s['octet']}.0/24\t{owner}\t{len(s['netns'])} hosts\t"
              f"{alive} processes\t{len(s.get('mounts', []))} mounts")
        for name, ip, veth in zip(s["netns"], s["ips"], s["veths"]):
            print(f"  {name}\t{ip}\t{'up' if link_up(veth) else 'CUT or missing'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "up":
            return _up(args)
        if args.cmd == "status":
            return _status()
        removed = reap_stale(args.ids, kept=True, force=args.force)
        print(f"removed {len(removed)} run(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    except (HostsError, ClusterError) as e:
        print(f"testhosts: {e}", file=sys.stderr)
        detail = getattr(e, "detail", "")
        if detail:
            print(detail, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
