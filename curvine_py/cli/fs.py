"""`cv fs ...`: file operations on the cluster namespace through the SDK.

Transfers never expose half a file under its final name: `put` writes a hidden
temporary name in the target directory and renames it into place (the same
write-then-rename the KV-cache writers use), and `get` does the same locally, fsyncing
before the rename.  An interrupted transfer therefore leaves the old file (or nothing)
behind, not a truncated file that looks complete.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import io
import os
import posixpath
import secrets
import stat as stat_mod
import sys
import time
import typing

from curvine_py.cli import output, policy, watch
from curvine_py.cli import CliError, Context
from curvine_py.cli.paths import on_path, remote
from curvine_py.common.config import parse_size
from curvine_py.common.errors import ConfigError, CurvineError

if typing.TYPE_CHECKING:
    from curvine_py.sdk.results import FileStatus
    from curvine_py.sdk import Client
    from curvine_py.sdk.ufsadmin import UfsFileStatus

CHUNK = 4 << 20  # one block: what cat and stdin uploads move per call


# ---------------------------------------------------------------- helpers


def exists_as(client: "Client", path: str) -> "FileStatus | None":
    """stat(path), or None when it does not exist."""
    try:
        return client.stat(path)
    except CurvineError as e:
        if e.errno == errno.ENOENT:
            return None
        raise (e if e.path else e.with_path(path)) from None


def into_dir(client: "Client", dest: str, name: str, trailing_slash: bool) -> str:
    """cp/mv target rule: an existing directory (or 'dir/') receives `name` inside it."""
    st = exists_as(client, dest)
    if (st is not None and st.is_dir) or trailing_slash:
        return posixpath.join(dest, name)
    return dest


def file_type(mode: int) -> str:
    if stat_mod.S_ISDIR(mode):
        return "directory"
    if stat_mod.S_ISREG(mode):
        return "file"
    if stat_mod.S_ISLNK(mode):
        return "symlink"
    return "other"


def status_json(st: "FileStatus") -> dict[str, typing.Any]:
    """A FileStatus with exact values, for --json."""
    return {
        "path": st.path, "name": st.name, "type": file_type(st.mode), "ino": st.ino,
        "mode": st.mode, "permissions": f"{stat_mod.S_IMODE(st.mode):04o}", "size": st.size,
        "nlink": st.nlink, "uid": st.uid, "gid": st.gid, "atime_ns": st.atime_ns,
        "mtime_ns": st.mtime_ns, "ctime_ns": st.ctime_ns, "block_size": st.block_size,
        "replicas": st.replicas, "complete": st.complete,
    }


class Progress:
    """Byte progress of a transfer: a tqdm bar on a terminal, one summary line otherwise.

    Piped or redirected stderr gets no carriage-return animation, only the summary
    (suppressed by -q), so logs of scripted transfers stay readable.
    """

    def __init__(self, total: int | None, desc: str, quiet: bool) -> None:
        self.done = 0
        self.desc = desc
        self.quiet = quiet
        self.started = time.monotonic()
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                            file=sys.stderr, leave=False, dynamic_ncols=True)

    def __call__(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    def close(self, ok: bool) -> None:
        if self.bar is not None:
            self.bar.close()
        if ok and not self.quiet:
            took = time.monotonic() - self.started
            sys.stderr.write(f"{self.desc}: {output.format_size(self.done)} in "
                             f"{output.format_duration(took)} "
                             f"({output.format_rate(self.done, took)})\n")


# ---------------------------------------------------------------- listing and metadata


def cmd_ls(ctx: Context) -> int:
    """List a directory (or show one file), sorted by name."""
    a, c = ctx.args, ctx.client
    path = remote(a.path)
    with on_path(path):
        st = c.stat(path)
        entries = sorted(c.scandir(path), key=lambda s: s.name) if st.is_dir else [st]
    if a.json:
        output.print_json([status_json(s) for s in entries])
    elif a.long:
        rows = [(output.format_mode(s.mode), s.nlink, s.uid, s.gid,
                 output.format_size(s.size) if a.human else s.size,
                 output.format_time_ns(s.mtime_ns), s.name if st.is_dir else s.path)
                for s in entries]
        if rows:
            print(output.table(rows, right={1, 4}))
    else:
        for s in entries:
            print(s.name if st.is_dir else s.path)
    return 0


def cmd_stat(ctx: Context) -> int:
    """Show every attribute of a path (without following a final symlink)."""
    path = remote(ctx.args.path)
    with on_path(path):
        st = ctx.client.lstat(path)
        pol = ctx.client.cache_policy(path) if st.is_dir or st.is_file else None
        ufs = ctx.client.ufs.stat(path) if st.is_file else None
    if ctx.args.json:
        extra = {"ufs": dataclasses.asdict(ufs)} if ufs is not None and ufs.uri else {}
        output.print_json({**status_json(st), **({"cache": policy.policy_json(pol)} if pol else {}), **extra})
        return 0
    rows = [
        ("path", st.path), ("type", file_type(st.mode)),
        ("size", f"{st.size} ({output.format_size(st.size)})"),
        ("mode", f"{stat_mod.S_IMODE(st.mode):04o} ({output.format_mode(st.mode)})"),
        ("inode", st.ino), ("links", st.nlink), ("uid", st.uid), ("gid", st.gid),
        ("access", output.format_time_ns(st.atime_ns)),
        ("modify", output.format_time_ns(st.mtime_ns)),
        ("change", output.format_time_ns(st.ctime_ns)),
        ("block size", output.format_size(st.block_size)), ("replicas", st.replicas),
        ("complete", "yes" if st.complete else "no (open for writing)"),
        *(policy.policy_rows(pol) if pol else []),
        *(ufs_rows(ufs) if ufs is not None and ufs.uri else []),
    ]
    print(output.table([(f"{k}:", v) for k, v in rows]))
    return 0


def ufs_rows(u: "UfsFileStatus") -> list[tuple[str, str]]:
    """A UFS file's lines in `cv fs stat`: where it is in the UFS and how much is cached."""
    return [("ufs", u.uri), ("cached", f"{output.format_size(u.cached_bytes)} of {output.format_size(u.size)}"
                                        f" ({output.format_percent(u.cached_bytes, u.size)})"),
            ("persisted", u.state)]


def cmd_free(ctx: Context) -> int:
    """Drop the cached blocks of UFS files; they stay readable (fetched again on read)."""
    path = remote(ctx.args.path)
    with on_path(path):
        r = ctx.client.ufs.free(path, ctx.args.recursive)
    note = f"; {r.skipped} kept (not in the UFS yet)" if r.skipped else ""
    print(f"freed {r.files} files ({output.format_size(r.bytes)}){note}")
    return 0


def cmd_du(ctx: Context) -> int:
    """Space used under a path: each entry of a directory then the total, or -s the total."""
    a, c = ctx.args, ctx.client
    path = remote(a.path)
    results: list[tuple[str, int, int, int]] = []
    with on_path(path):
        st = c.stat(path)
        if st.is_dir and not a.summary:
            for child in sorted(c.scandir(path), key=lambda s: s.name):
                child_path = posixpath.join(path, child.name)
                if child.is_dir:
                    results.append((child_path, *c.du(child_path)))
                else:
                    results.append((child_path, child.size, 1, 0))
        results.append((path, *c.du(path)) if st.is_dir else (path, st.size, 1, 0))
    if a.json:
        output.print_json([{"path": p, "bytes": b, "files": f, "dirs": d} for p, b, f, d in results])
    else:
        print(output.table([(output.format_size(b), f, d, p) for p, b, f, d in results],
                           headers=("SIZE", "FILES", "DIRS", "PATH"), right={0, 1, 2}))
    return 0


def cmd_df(ctx: Context) -> int:
    """Capacity and usage of the whole pool."""
    s = ctx.client.statfs()
    if ctx.args.json:
        output.print_json({"capacity": s.capacity, "used": s.used, "available": s.available,
                           "files": s.files, "block_size": s.block_size})
        return 0
    print(output.table([(output.format_size(s.capacity), output.format_size(s.used),
                         output.format_size(s.available), output.format_percent(s.used, s.capacity),
                         s.files)],
                       headers=("CAPACITY", "USED", "AVAILABLE", "USE%", "FILES"),
                       right={0, 1, 2, 3, 4}))
    return 0


def worker_json(w: typing.Any) -> dict[str, typing.Any]:
    """A worker reference as shown everywhere: id, host identity, rpc and data address."""
    return {"id": w.worker_id, "host": w.host, "address": f"{w.ip}:{w.rpc_port}",
            "data_address": f"{w.ip}:{w.data_port}"}


def cmd_blocks(ctx: Context) -> int:
    """Where a file's blocks are: id, offset, length, checksum and the workers holding each."""
    path = remote(ctx.args.path)
    with on_path(path):
        st = ctx.client.stat(path)
        if st.is_dir:
            raise CurvineError(errno.EISDIR, "is a directory", path)
        blocks = ctx.client.block_locations(path)
    if ctx.args.json:
        output.print_json({"path": path, "size": st.size, "blocks": [
            {"id": b.block_id, "offset": b.offset, "length": b.length,
             "checksum": output.format_checksum(b.checksum),
             "workers": [worker_json(w) for w in b.workers]} for b in blocks]})
        return 0
    print(f"{path}: {st.size} bytes in {len(blocks)} block(s), {st.replicas} replica(s) wanted")
    rows = [(b.block_id, b.offset, b.length, output.format_checksum(b.checksum),
             ", ".join(f"{w.worker_id}@{w.host} ({w.ip}:{w.data_port})" for w in b.workers) or "-")
            for b in blocks]
    if rows:
        print(output.table(rows, headers=("BLOCK", "OFFSET", "LENGTH", "CHECKSUM", "WORKERS"),
                           right={1, 2}))
    return 0


def cmd_locate(ctx: Context) -> int:
    """Where files live, many at once (one master call per 1,000): each one's size, the
    hosts holding all of its blocks, its tier.  Exit 1 when any path is absent."""
    paths = [remote(p) for p in ctx.args.paths]
    if ctx.args.prefix:
        return _locate_prefix(ctx, paths)
    got = ctx.client.locate(paths)
    if ctx.args.json:
        output.print_json([{"path": g.path, "found": g.found, "size": g.status.size if g.status else None,
                            "hosts": list(g.hosts), "tier": g.tier,
                            "error": os.strerror(g.errno) if g.errno else None} for g in got])
    else:
        rows = [(g.path, g.status.size if g.status else "-", ",".join(g.hosts) or "-", g.tier or "-")
                if g.found else (g.path, "-", f"({os.strerror(g.errno)})", "-") for g in got]
        print(output.table(rows, headers=("PATH", "SIZE", "HOSTS WITH EVERY BLOCK", "TIER"), right={1}))
    return 0 if all(g.found for g in got) else 1


def _locate_prefix(ctx: Context, paths: list[str]) -> int:
    """`cv fs locate --prefix`: for chunks named in prefix order, how many leading ones
    each host holds whole (Client.prefix_hosts)."""
    counts = ctx.client.prefix_hosts(paths)
    if ctx.args.json:
        output.print_json({"chunks": len(paths), "hosts": counts})
    else:
        rows = [(host, n, f"{100 * n / len(paths):.0f}%") for host, n in counts.items()]
        print(output.table(rows, headers=("HOST", "LEADING CHUNKS", "OF PREFIX"), right={1, 2}))
    return 0


# ---------------------------------------------------------------- namespace changes


def size_arg(text: str) -> int:
    """An argparse type: '16MiB', '4M', '65536' in bytes."""
    try:
        return parse_size(text)
    except (ConfigError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_mkdir(ctx: Context) -> int:
    for p in ctx.args.paths:
        path = remote(p)
        with on_path(path):
            ctx.client.mkdir(path, parents=ctx.args.parents, exist_ok=ctx.args.parents,
                             block_size=ctx.args.block_size, kv=ctx.args.kv)
    return 0


def cmd_touch(ctx: Context) -> int:
    for p in ctx.args.paths:
        path = remote(p)
        with on_path(path):
            ctx.client.touch(path)
    return 0


def cmd_rm(ctx: Context) -> int:
    """Remove files; directories (bottom-up) only with -r; -f ignores missing paths."""
    a, c = ctx.args, ctx.client
    for p in a.paths:
        path = remote(p)
        if path == "/":
            raise CliError("/: refusing to remove the root directory")
        with on_path(path):
            try:
                st = c.lstat(path)
            except CurvineError as e:
                if a.force and e.errno == errno.ENOENT:
                    continue
                raise
            if not st.is_dir:
                c.remove(path)
            elif not a.recursive:
                raise CliError(f"{path}: is a directory (use -r)")
            else:
                for top, _dirs, files in reversed(list(c.walk(path))):
                    for name in files:
                        with on_path(posixpath.join(top, name)):
                            c.remove(posixpath.join(top, name))
                    with on_path(top):
                        c.rmdir(top)
    return 0


def cmd_mv(ctx: Context) -> int:
    """Rename; a destination that is an existing directory receives the source inside it."""
    src = remote(ctx.args.src)
    dst = into_dir(ctx.client, remote(ctx.args.dst), posixpath.basename(src),
                   ctx.args.dst.endswith("/"))
    with on_path(src):
        ctx.client.rename(src, dst)
    return 0


# ---------------------------------------------------------------- data


def cmd_cat(ctx: Context) -> int:
    """Stream files to stdout, binary-safe, through one reused buffer."""
    out = sys.stdout.buffer
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    for p in ctx.args.paths:
        path = remote(p)
        with on_path(path), ctx.client.open(path, "rb") as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                out.write(view[:n])
    out.flush()
    return 0


@contextlib.contextmanager
def staged_upload(c: "Client", dest: str, size: int | None, quiet: bool
                  ) -> typing.Iterator[tuple[str, Progress]]:
    """Yield (temporary remote name, progress) for an upload to dest; on success rename
    the temporary into place, on any failure remove it.  Errors name dest, not the
    temporary, because dest is what the user asked for."""
    tmp = posixpath.join(posixpath.dirname(dest),
                         f".{posixpath.basename(dest)}.cv-put-{secrets.token_hex(4)}")
    progress = Progress(size, f"put {dest}", quiet)
    ok = False
    try:
        try:
            yield tmp, progress
            c.rename(tmp, dest)
        except CurvineError as e:
            if e.path is None or e.path == tmp:
                code = e.errno or errno.EIO
                raise CurvineError(code, e.strerror or os.strerror(code), dest) from None
            raise
        ok = True
    finally:
        progress.close(ok)
        if not ok:
            with contextlib.suppress(Exception):
                c.remove(tmp)


def _upload(c: "Client", local: str, dest: str, quiet: bool) -> None:
    """One local file to dest (see staged_upload)."""
    with staged_upload(c, dest, os.stat(local).st_size, quiet) as (tmp, progress):
        c.put_file(local, tmp, callback=progress)


def _upload_stdin(c: "Client", dest: str, quiet: bool) -> None:
    """stdin to dest, one reused buffer at a time."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    stdin = typing.cast(io.BufferedReader, sys.stdin.buffer)
    with staged_upload(c, dest, None, quiet) as (tmp, progress), c.open(tmp, "wb") as f:
        while n := stdin.readinto(buf):
            f.write(view[:n])
            progress(n)


def cmd_put(ctx: Context) -> int:
    """Upload a local file ('-' = stdin), or a directory tree with -r."""
    a, c = ctx.args, ctx.client
    dest = remote(a.path)
    if a.local == "-":
        _upload_stdin(c, dest, a.quiet)
        return 0
    st = os.stat(a.local)  # a missing local file ends as `cv: LOCAL: No such file or directory`
    name = os.path.basename(os.path.normpath(a.local))
    dest = into_dir(c, dest, name, a.path.endswith("/"))
    if not stat_mod.S_ISDIR(st.st_mode):
        _upload(c, a.local, dest, a.quiet)
        return 0
    if not a.recursive:
        raise CliError(f"{a.local}: is a directory (use -r)")
    for top, dirs, files in os.walk(a.local):
        dirs.sort()
        rel = os.path.relpath(top, a.local)
        rdir = dest if rel == "." else posixpath.join(dest, *rel.split(os.sep))
        with on_path(rdir):
            c.mkdir(rdir, parents=True, exist_ok=True)
        for fname in sorted(files):
            _upload(c, os.path.join(top, fname), posixpath.join(rdir, fname), a.quiet)
    return 0


def _download(c: "Client", src: str, local: str, size: int, quiet: bool) -> None:
    """One remote file to local, written as cp writes it.  A symlink is followed to what it
    names (a dangling one: that name is created, as a shell's > does).  A regular file or
    a new name: through a hidden temporary name, fsynced, renamed into place (an
    interrupted get leaves the old file or nothing).  Anything else -- a device, a FIFO, a
    socket -- is opened and written in place: renaming over it would destroy it (a get to
    /dev/full once left a 5 MB regular file there); a socket then fails to open."""
    local = os.path.realpath(local)
    try:
        in_place = not stat_mod.S_ISREG(os.stat(local).st_mode)
    except FileNotFoundError:
        in_place = False
    directory, name = os.path.split(local)
    tmp = local if in_place else os.path.join(directory, f".{name}.cv-get-{secrets.token_hex(4)}")
    progress = Progress(size, f"get {src}", quiet)
    ok = False
    try:
        try:
            with on_path(src):
                c.get_file(src, tmp, callback=progress)
            if not in_place:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, local)
        except OSError as e:  # a local error names the target (not the temporary, not nothing)
            if not isinstance(e, CurvineError) and e.filename in (None, tmp):
                raise OSError(e.errno, e.strerror, local) from None
            raise
        ok = True
    finally:
        progress.close(ok)
        if not ok and not in_place:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def cmd_get(ctx: Context) -> int:
    """Download a file (LOCAL '-' = stdout), or a directory tree with -r."""
    a, c = ctx.args, ctx.client
    src = remote(a.path)
    with on_path(src):
        st = c.stat(src)
    if a.local == "-":
        if st.is_dir:
            raise CliError(f"{src}: is a directory")
        ctx.args.paths = [src]
        return cmd_cat(ctx)
    local = a.local
    if os.path.isdir(local) or local.endswith(os.sep):
        local = os.path.join(local, posixpath.basename(src) or "root")
    if not st.is_dir:
        _download(c, src, local, st.size, a.quiet)
        return 0
    if not a.recursive:
        raise CliError(f"{src}: is a directory (use -r)")
    for top, _dirs, files in c.walk(src):
        rel = posixpath.relpath(top, src)
        ldir = local if rel == "." else os.path.join(local, *rel.split("/"))
        os.makedirs(ldir, exist_ok=True)
        for fname in sorted(files):
            rpath = posixpath.join(top, fname)
            with on_path(rpath):
                size = c.stat(rpath).size
            _download(c, rpath, os.path.join(ldir, fname), size, a.quiet)
    return 0


# ---------------------------------------------------------------- parser


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `cv fs` and its commands.  Long on purpose: one declaration per command, in the
    order `cv fs --help` lists them, with no logic between; split up, a flag would be
    harder to find, not easier."""
    fs = sub.add_parser("fs", parents=[common], help="file operations (ls, put, get, ...)",
                        description="File operations on the cluster's namespace.")
    cmds = fs.add_subparsers(dest="fs_command", metavar="COMMAND", required=True)

    def add(name: str, func: typing.Callable[[Context], int], help: str,
            json_flag: bool = False) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(func=func)
        if json_flag:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = add("ls", cmd_ls, "list a directory", json_flag=True)
    p.add_argument("-l", dest="long", action="store_true", help="long format")
    p.add_argument("-H", "--human", action="store_true", help="sizes in KiB/MiB/GiB with -l")
    p.add_argument("path", nargs="?", default="/", metavar="PATH")

    p = add("mkdir", cmd_mkdir, "create directories")
    p.add_argument("-p", dest="parents", action="store_true",
                   help="create missing parents; no error if it exists")
    p.add_argument("--block-size", type=size_arg, default=0, metavar="SIZE",
                   help="block size of the files created below it (e.g. 16MiB: a KV chunk of up to "
                        "16 MiB is one block, read by FUSE passthrough on a replica's host); "
                        "default: the parent's")
    p.add_argument("--kv", action="store_true",
                   help="a KV directory (cv fs policy --kv): its files have 16 MiB blocks unless their "
                        "client names a block size (a KV chunk of up to 16 MiB is one block)")
    p.add_argument("paths", nargs="+", metavar="PATH")

    p = add("put", cmd_put, "upload a local file ('-' reads stdin)")
    p.add_argument("-r", "--recursive", action="store_true", help="upload a directory tree")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary")
    p.add_argument("local", metavar="LOCAL")
    p.add_argument("path", metavar="PATH")

    p = add("get", cmd_get, "download a file ('-' writes stdout)")
    p.add_argument("-r", "--recursive", action="store_true", help="download a directory tree")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or summary")
    p.add_argument("path", metavar="PATH")
    p.add_argument("local", metavar="LOCAL")

    p = add("cat", cmd_cat, "write files to stdout")
    p.add_argument("paths", nargs="+", metavar="PATH")

    p = add("touch", cmd_touch, "create empty files or update modification times")
    p.add_argument("paths", nargs="+", metavar="PATH")

    p = add("rm", cmd_rm, "remove files (directories with -r)")
    p.add_argument("-r", "--recursive", action="store_true", help="remove directories and contents")
    p.add_argument("-f", "--force", action="store_true", help="ignore missing paths")
    p.add_argument("paths", nargs="+", metavar="PATH")

    p = add("mv", cmd_mv, "rename or move")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")

    p = add("stat", cmd_stat, "show a path's attributes", json_flag=True)
    p.add_argument("path", metavar="PATH")

    p = add("free", cmd_free, "drop cached blocks of UFS files (they stay readable from the UFS)")
    p.add_argument("path", metavar="PATH")
    p.add_argument("-r", "--recursive", action="store_true", help="a directory tree")

    p = add("du", cmd_du, "space used under a path", json_flag=True)
    p.add_argument("-s", dest="summary", action="store_true", help="only the total")
    p.add_argument("path", nargs="?", default="/", metavar="PATH")

    add("df", cmd_df, "capacity and usage of the pool", json_flag=True)

    policy.register(add)
    watch.register(add)

    p = add("blocks", cmd_blocks, "show a file's blocks and the workers holding them",
            json_flag=True)
    p.add_argument("path", metavar="PATH")

    p = add("locate", cmd_locate, "where files live: the hosts holding all of each one's blocks, and its tier",
            json_flag=True)
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--prefix", action="store_true",
                   help="PATHs are chunks in prefix order: per host, how many leading chunks it holds whole")
