"""`cv fs pin|unpin|ttl|set-tier|policy`: cache policies of files and directory trees.

They are xattrs on the namespace (``user.curvine.pin``, ``user.curvine.ttl``,
``user.curvine.tier``; docs/eviction.md), so the same settings are visible through a
mount with getfattr.  Bad values come back from the master as one EINVAL line.
`cv fs policy PATH --kv` marks a KV directory (``user.curvine.kv``, kept in the inode
and copied down to what is made below it; docs/kvcache.md).
"""
from __future__ import annotations

import typing

from curvine_py.cli import Context, output
from curvine_py.cli.paths import on_path, remote
from curvine_py.common.policy import TIERS, format_ttl

if typing.TYPE_CHECKING:
    from curvine_py.sdk.results import CachePolicy


def _paths(ctx: Context) -> list[str]:
    return [remote(p) for p in ctx.args.paths]


def cmd_pin(ctx: Context) -> int:
    for path in _paths(ctx):
        with on_path(path):
            ctx.client.pin(path)
    return 0


def cmd_unpin(ctx: Context) -> int:
    for path in _paths(ctx):
        with on_path(path):
            ctx.client.unpin(path)
    return 0


def cmd_ttl(ctx: Context) -> int:
    path = remote(ctx.args.path)
    with on_path(path):
        ctx.client.set_ttl(path, None if ctx.args.ttl in ("none", "off") else ctx.args.ttl)
    return 0


def cmd_set_tier(ctx: Context) -> int:
    path = remote(ctx.args.path)
    with on_path(path):
        ctx.client.set_tier(path, None if ctx.args.tier == "any" else ctx.args.tier)
    return 0


def cmd_policy(ctx: Context) -> int:
    """Set what the flags name (--kv, --no-kv); with none, show the path's policy."""
    path = remote(ctx.args.path)
    with on_path(path):
        if ctx.args.kv is not None:
            ctx.client.set_kv(path, ctx.args.kv)
            return 0
        rows = policy_rows(ctx.client.cache_policy(path))
    print(output.table([(f"{k}:", v) for k, v in rows]))
    return 0


def policy_rows(p: "CachePolicy") -> list[tuple[str, str]]:
    """Rows for `cv fs stat`: each setting and where it comes from."""
    def origin(where: str) -> str:
        return f" (from {where})" if where else ""
    return [
        ("pinned", f"yes{origin(p.pinned_by)}" if p.pinned else "no"),
        ("ttl", f"{format_ttl(p.ttl_s)}{origin(p.ttl_from)}" if p.ttl_s else "none"),
        ("tier", f"{p.tier}{origin(p.tier_from)}" if p.tier else "any"),
        ("kv", f"yes{origin(p.kv_from)}" if p.kv else "no"),
    ]


def policy_json(p: "CachePolicy") -> dict[str, typing.Any]:
    return {"pinned": p.pinned, "pinned_by": p.pinned_by or None, "ttl_s": p.ttl_s,
            "ttl_from": p.ttl_from or None, "tier": p.tier or None, "tier_from": p.tier_from or None,
            "kv": p.kv, "kv_from": p.kv_from or None}


def register(add: typing.Callable[..., typing.Any]) -> None:
    """Add the policy commands through fs.register's `add`."""
    p = add("pin", cmd_pin, "exempt files or directory trees from eviction and TTL")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p = add("unpin", cmd_unpin, "remove a pin set on these paths")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p = add("ttl", cmd_ttl, "remove files under PATH this long after their last change (e.g. 7d, 12h, "
                            "3600; 'none' clears)")
    p.add_argument("path", metavar="PATH")
    p.add_argument("ttl", metavar="TTL")
    p = add("set-tier", cmd_set_tier, "new blocks under PATH prefer this tier (falls back when it is full)")
    p.add_argument("path", metavar="PATH")
    p.add_argument("tier", metavar="TIER", choices=[*TIERS, "any"], type=str.lower,
                   help=f"one of {', '.join(TIERS)}, or any")
    p = add("policy", cmd_policy, "show a path's cache policy, or set what a flag names")
    p.add_argument("path", metavar="PATH")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--kv", dest="kv", action="store_const", const=True, default=None,
                    help="a KV directory: files made below it have 16 MiB blocks unless their client names "
                         "a block size, so a KV chunk of up to 16 MiB is one block, which any mount on a "
                         "replica's host hands to the kernel (docs/kvcache.md); so are subdirectories made "
                         "below it")
    kv.add_argument("--no-kv", dest="kv", action="store_const", const=False,
                    help="no longer a KV directory (what was made below it keeps its setting)")
