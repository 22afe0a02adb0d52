"""The UFS providers against real stores: moto's S3 server, SeaweedFS, and a directory.

Each test runs on a fresh prefix of one bucket per server (or a fresh tmp dir), so the
servers are started once per session (tests/conftest.py: moto_s3, seaweed_s3).
"""
from __future__ import annotations

import concurrent.futures
import errno
import os
import socket
import threading
import time
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.processes import free_ports
from curvine_py.testing.s3servers import S3Server
from curvine_py.ufs import ObjectInfo, Ufs, UfsError, open_ufs

MiB = 1 << 20
BUCKET = "cv-ufs-tests"
BACKENDS = ["moto", "seaweed", "file"]


class Store(typing.NamedTuple):
    ufs: Ufs
    kind: str                      # moto | seaweed | file
    server: S3Server | None
    prefix: str                    # the mount's prefix in BUCKET ("" for file)
    root: Path | None              # the directory of a file:// mount


def s3_options(server: S3Server, **extra: str) -> dict[str, str]:
    return {"endpoint_url": server.endpoint, "region": server.region, "access_key_id": server.access_key,
            "secret_access_key": server.secret_key, **extra}


@pytest.fixture(scope="module")
def buckets() -> set[str]:
    return set()


def s3_server(request: pytest.FixtureRequest, kind: str, buckets: set[str]) -> S3Server:
    server = request.getfixturevalue(f"{kind}_s3")
    if kind not in buckets:
        server.make_bucket(BUCKET)
        buckets.add(kind)
    return server


def make_store(request: pytest.FixtureRequest, kind: str, tmp_path: Path, buckets: set[str],
               **options: str) -> Store:
    if kind == "file":
        root = tmp_path / "nas"
        root.mkdir(exist_ok=True)
        return Store(open_ufs(f"file://{root}", options), kind, None, "", root)
    server = s3_server(request, kind, buckets)
    prefix = f"t-{os.urandom(4).hex()}"
    return Store(open_ufs(f"s3://{BUCKET}/{prefix}", s3_options(server, **options), timeout_s=10),
                 kind, server, prefix, None)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path, buckets: set[str]) -> typing.Iterator[Store]:
    s = make_store(request, request.param, tmp_path, buckets, **({} if request.param == "file" else
                                                                {"part_size": "5MiB"}))
    try:
        yield s
    finally:
        s.ufs.close()


def names(entries: typing.Iterable[ObjectInfo]) -> dict[str, bool]:
    """key -> is_dir, asserting each key comes once."""
    out: dict[str, bool] = {}
    for e in entries:
        assert e.key not in out, f"{e.key} listed twice"
        out[e.key] = e.is_dir
    return out


def payload(n: int, seed: int = 1) -> bytes:
    block = os.urandom(64 * 1024) if seed else b"\0" * 65536
    return (block * (n // len(block) + 1))[:n]


# ------------------------------------------------------------ objects and directories

def test_put_stat_list_nested(store: Store) -> None:
    u = store.ufs
    u.put("a/b/c.bin", b"ccc")
    u.put("a/x", b"xx")
    u.mkdir("a")            # a marker next to objects under the same prefix
    u.mkdir("m")            # an empty directory: only its marker
    u.put("top", b"t")
    assert names(u.list("")) == {"a": True, "m": True, "top": False}
    assert names(u.list("a")) == {"a/b": True, "a/x": False}     # keys from the mount root
    assert names(u.list("a/b")) == {"a/b/c.bin": False}
    assert names(u.list("m")) == {}
    x = u.stat("a/x")
    assert x is not None and (x.size, x.is_dir) == (2, False) and x.etag and x.mtime_ns > 0
    assert abs(x.mtime_ns / 1e9 - time.time()) < 120
    for d in ("a", "a/b", "m", ""):
        info = u.stat(d)
        assert info is not None and info.is_dir, d
    assert u.stat("nothing") is None and u.stat("a/nothing") is None
    listed = {e.key: e for e in u.list("a")}
    assert listed["a/x"].size == 2 and listed["a/x"].etag == x.etag


def test_list_paginates_past_1000_keys(request: pytest.FixtureRequest, tmp_path: Path, buckets: set[str]) -> None:
    """ListObjectsV2 returns at most 1000 keys a page (moto only: fast to fill)."""
    s = make_store(request, "moto", tmp_path, buckets)
    keys = [f"many/k{i:05d}" for i in range(1010)] + [f"many/sub{i}/x" for i in range(3)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s.ufs.put(k, b""), keys))
    listed = names(s.ufs.list("many"))
    assert len(listed) == 1013
    assert sum(listed.values()) == 3


def test_read_into_ranges(store: Store) -> None:
    data = payload(3 * MiB + 123)
    store.ufs.put("obj", data)
    buf = memoryview(bytearray(MiB))
    for offset, length in ((0, MiB), (12345, 4096), (2 * MiB + 7, MiB), (len(data) - 100, 100)):
        n = store.ufs.read_into("obj", offset, buf[:length])
        assert n == length and bytes(buf[:n]) == data[offset:offset + length], offset
    # past the end: what is there, then nothing
    assert store.ufs.read_into("obj", len(data) - 10, buf) == 10 and bytes(buf[:10]) == data[-10:]
    assert store.ufs.read_into("obj", len(data), buf) == 0
    assert store.ufs.read_into("obj", 0, buf[:0]) == 0
    with pytest.raises(UfsError) as e:
        store.ufs.read_into("missing", 0, buf)
    assert e.value.errno == errno.ENOENT


def test_one_ufs_serves_many_threads(store: Store) -> None:
    """Workers share one Ufs per mount: parallel ranged reads, each into its own buffer."""
    data = payload(4 * MiB)
    store.ufs.put("shared", data)

    def read(i: int) -> bool:
        buf = memoryview(bytearray(256 * 1024))
        off = (i * 256 * 1024) % len(data)
        return store.ufs.read_into("shared", off, buf) == len(buf) and buf == data[off:off + len(buf)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, range(32)))


def test_writer_multipart(store: Store) -> None:
    """12 MiB through 5 MiB parts (S3's minimum), fed in 1 MiB views of a reused buffer."""
    data = payload(12 * MiB + 5)
    w = store.ufs.writer("big/obj")
    view = memoryview(data)
    for i in range(0, len(data), MiB):
        w.write(view[i:i + MiB])
    assert store.ufs.stat("big/obj") is None      # invisible until close
    info = w.close()
    assert info.size == len(data) and not info.is_dir
    if store.kind != "file":
        assert info.etag.strip('"').endswith("-3")    # three parts: a multipart upload
    else:
        assert info.etag == f"{info.size}:{info.mtime_ns}"
    got = memoryview(bytearray(len(data)))
    assert store.ufs.read_into("big/obj", 0, got) == len(data) and got == data
    assert store.ufs.stat("big/obj") == info


def test_small_writer_is_one_put(store: Store) -> None:
    w = store.ufs.writer("small")
    w.write(b"abc")
    w.write(memoryview(b"defg")[1:])
    info = w.close()
    assert info.size == 6
    if store.kind != "file":
        assert "-" not in info.etag
    buf = memoryview(bytearray(6))
    assert store.ufs.read_into("small", 0, buf) == 6 and bytes(buf) == b"abcefg"
    assert store.ufs.writer("empty").close().size == 0


def test_abort_leaves_nothing(store: Store) -> None:
    """An aborted upload shows nowhere, and an object it would have replaced is intact."""
    store.ufs.put("keep", b"old")
    for key in ("gone", "keep"):
        w = store.ufs.writer(key)
        w.write(payload(7 * MiB))   # more than one part: the multipart upload was started
        w.abort()
        w.abort()                   # idempotent
    assert store.ufs.stat("gone") is None
    assert names(store.ufs.list("")) == {"keep": False}
    buf = memoryview(bytearray(10))
    assert store.ufs.read_into("keep", 0, buf) == 3 and bytes(buf[:3]) == b"old"
    if store.root is not None:
        assert sorted(os.listdir(store.root)) == ["keep"]


def test_copy_delete_mkdir_rmdir(store: Store) -> None:
    u = store.ufs
    src = u.put("src/a", b"payload")
    dst = u.copy("src/a", "dst/b")
    assert (dst.size, dst.is_dir) == (7, False)
    if store.kind != "file":
        assert dst.etag == src.etag               # same bytes, same MD5 ETag
    buf = memoryview(bytearray(7))
    assert u.read_into("dst/b", 0, buf) == 7 and bytes(buf) == b"payload"
    with pytest.raises(UfsError) as e:
        u.copy("nope", "x")
    assert e.value.errno == errno.ENOENT
    u.delete("src/a")
    u.delete("src/a")                              # missing: fine
    u.delete("never/was")
    assert u.stat("src/a") is None
    u.mkdir("d")
    assert (info := u.stat("d")) is not None and info.is_dir
    listed = names(u.list(""))
    # "src" stays a directory on file systems, and on SeaweedFS (its filer has real
    # folders, cleaned up later); on moto a prefix with no object under it is gone
    assert listed.items() >= {"dst": True, "d": True}.items() and set(listed) <= {"dst", "d", "src"}
    u.rmdir("d")
    assert u.stat("d") is None
    u.rmdir("d")                                   # missing: fine


# ------------------------------------------------------------ bad input

@pytest.mark.parametrize("uri", [
    "bucket/prefix", "", "gs://bucket", "s3://", "s3:///prefix", "s3://user:pw@bucket",
    "s3://bucket/a/../b", "s3://bucket?region=x", "file://relative/dir", "file:///srv/../etc", "file:relative",
])
def test_bad_uri_is_einval(uri: str) -> None:
    with pytest.raises(UfsError) as e:
        open_ufs(uri, {})
    assert e.value.errno == errno.EINVAL
    assert "\n" not in str(e.value) and str(e.value)


@pytest.mark.parametrize("uri,options", [
    ("s3://bucket", {"nope": "1"}),
    ("s3://bucket", {"virtual_hosted_style": "maybe"}),
    ("s3://bucket", {"part_size": "1MiB"}),
    ("s3://bucket", {"part_size": "lots"}),
    ("s3://bucket", {"endpoint_url": "127.0.0.1:9000"}),
    ("file:///tmp", {"endpoint_url": "http://x"}),
])
def test_bad_option_is_einval(uri: str, options: dict[str, str]) -> None:
    with pytest.raises(UfsError) as e:
        open_ufs(uri, options)
    assert e.value.errno == errno.EINVAL
    assert "\n" not in str(e.value) and str(e.value)


def test_keys_cannot_escape(store: Store) -> None:
    for key in ("../x", "a/../../x", "/abs", "a//b", "./a", "dir/"):
        with pytest.raises(UfsError) as e:
            store.ufs.put(key, b"x")
        assert e.value.errno == errno.EINVAL, key
        with pytest.raises(UfsError):
            store.ufs.stat(key)


# ------------------------------------------------------------ faults

def check_fails(uri: str, options: dict[str, str], code: int, timeout_s: float = 10.0) -> float:
    """open_ufs + check() fails with errno code and one line; returns the seconds it took."""
    t0 = time.monotonic()
    with pytest.raises(UfsError) as e:
        open_ufs(uri, options, timeout_s=timeout_s).check()
    took = time.monotonic() - t0
    assert e.value.errno == code, str(e.value)
    assert "\n" not in str(e.value) and uri in str(e.value)
    return took


@pytest.mark.parametrize("kind", ["moto", "seaweed"])
def test_missing_bucket_is_enoent(request: pytest.FixtureRequest, kind: str, buckets: set[str]) -> None:
    server = s3_server(request, kind, buckets)
    open_ufs(f"s3://{BUCKET}", s3_options(server)).check()
    check_fails("s3://no-such-bucket-here", s3_options(server), errno.ENOENT)


def test_missing_directory_is_enoent(tmp_path: Path) -> None:
    check_fails(f"file://{tmp_path}/nope", {}, errno.ENOENT)
    open_ufs(f"file://{tmp_path}", {}).check()


def test_wrong_secret_is_eacces(request: pytest.FixtureRequest, buckets: set[str]) -> None:
    """SeaweedFS with an identity configured checks signatures (moto accepts any key)."""
    server = s3_server(request, "seaweed", buckets)
    bad = s3_options(server, secret_access_key="not-the-secret")
    check_fails(f"s3://{BUCKET}", bad, errno.EACCES)
    check_fails(f"s3://{BUCKET}", s3_options(server, access_key_id="nobody"), errno.EACCES)
    with pytest.raises(UfsError) as e:
        open_ufs(f"s3://{BUCKET}", bad).stat("x")
    assert e.value.errno == errno.EACCES


def test_unreachable_endpoint_is_eio_in_time() -> None:
    port = free_ports(1)[0]    # nobody listens there
    took = check_fails("s3://bkt", {"endpoint_url": f"http://127.0.0.1:{port}", "access_key_id": "k",
                                    "secret_access_key": "s"}, errno.EIO, timeout_s=3)
    assert took < 4


def test_silent_endpoint_is_eio_within_the_timeout() -> None:
    """A server that accepts connections and never answers: the timeout ends the call."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        conns: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    conns.append(listener.accept()[0])
                except OSError:
                    pass
        t = threading.Thread(target=accept, daemon=True)
        t.start()
        try:
            port = listener.getsockname()[1]
            opts = {"endpoint_url": f"http://127.0.0.1:{port}", "access_key_id": "k", "secret_access_key": "s"}
            took = check_fails("s3://bkt", opts, errno.EIO, timeout_s=2)
            assert 1.5 < took < 4
            t0 = time.monotonic()
            with pytest.raises(UfsError) as e:
                open_ufs("s3://bkt", opts, timeout_s=2).read_into("k", 0, memoryview(bytearray(10)))
            assert e.value.errno == errno.EIO and time.monotonic() - t0 < 4
        finally:
            stop.set()
            t.join(2)
            for c in conns:
                c.close()


# ------------------------------------------------------------ credentials from the environment

def test_credentials_from_env_and_aws_files(request: pytest.FixtureRequest, buckets: set[str],
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No keys in the options: the AWS environment variables, else the shared credentials
    file and AWS_PROFILE (on SeaweedFS, which refuses wrong keys)."""
    server = s3_server(request, "seaweed", buckets)
    opts = {"endpoint_url": server.endpoint}
    monkeypatch.setenv("HOME", str(tmp_path))     # no developer's ~/.aws
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    open_ufs(f"s3://{BUCKET}", opts).check()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    check_fails(f"s3://{BUCKET}", opts, errno.EACCES)

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = nobody\naws_secret_access_key = wrong\n\n"
                     f"[cv]\naws_access_key_id = {server.access_key}\n"
                     f"aws_secret_access_key = {server.secret_key}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    check_fails(f"s3://{BUCKET}", opts, errno.EACCES)        # [default]: wrong keys
    monkeypatch.setenv("AWS_PROFILE", "cv")
    open_ufs(f"s3://{BUCKET}", opts).check()
    monkeypatch.delenv("AWS_PROFILE")
    open_ufs(f"s3://{BUCKET}", opts | {"profile": "cv"}).check()


# ------------------------------------------------------------ file:// specifics

def test_local_upload_is_hidden_until_close(tmp_path: Path) -> None:
    u = open_ufs(f"file://{tmp_path}", {})
    w = u.writer("d/f")
    w.write(b"12345")
    assert u.stat("d/f") is None and names(u.list("d")) == {}
    info = w.close()
    assert info.etag == f"5:{os.stat(tmp_path / 'd' / 'f').st_mtime_ns}"
    assert names(u.list("d")) == {"d/f": False}
    (tmp_path / "d" / "sub").mkdir()
    with pytest.raises(UfsError) as e:
        u.rmdir("d")                                 # not empty
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(UfsError) as e:
        list(u.list("d/f"))
    assert e.value.errno == errno.ENOTDIR


# ------------------------------------------------------------ an outage (last: restarts the shared server)

def test_seaweed_outage_then_recovery(request: pytest.FixtureRequest, buckets: set[str]) -> None:
    """stop() makes reads fail with EIO at once; start() on the same dir and port brings
    the objects back, and the same Ufs (its connection pool) works again."""
    server = s3_server(request, "seaweed", buckets)
    u = open_ufs(f"s3://{BUCKET}/outage", s3_options(server), timeout_s=3)
    u.put("obj", b"survives")
    buf = memoryview(bytearray(8))
    server.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(UfsError) as e:
            u.read_into("obj", 0, buf)
        assert e.value.errno == errno.EIO and time.monotonic() - t0 < 4
    finally:
        server.start()
    assert u.read_into("obj", 0, buf) == 8 and bytes(buf) == b"survives"
