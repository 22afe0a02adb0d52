"""deploy/: the Kubernetes manifests, the container entrypoint and image, the systemd units.

There is no Kubernetes cluster here, so every piece is checked by what does run here:
- the manifests by ``kubernetes-validate --strict`` (the API's own schemas, bundled),
  ``yamllint`` and, where kubectl exists, ``kubectl kustomize`` (the renderer apply -k uses);
- what they say about the code by the code itself (no drift): each container of our image
  goes through the real entrypoint (``CURVINE_ENTRYPOINT_PRINT``) and the real parsers and
  configuration loader (tests/unit/deploy_probe.py), with the ConfigMap's curvine.toml and
  the container's environment; its ports, probes, annotations and volumes are then
  compared with that effective configuration; the CSI names with ``curvine_py.csi``, the
  StorageClass's parameters with the controller's own request check;
- the entrypoint's supervision of ``cv csi node`` by killing a real one;
- the systemd units by ``systemd-analyze verify``;
- the image by building it, where docker or podman can (else skipped with the reason).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from curvine_py.common import config as cfgmod

yaml = pytest.importorskip("yaml", reason="PyYAML is missing: install the dev extra (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
EXAMPLES = K8S / "examples"
ENTRYPOINT = DEPLOY / "container" / "entrypoint.sh"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"
SYSTEMD = DEPLOY / "systemd"
PROBE = Path(__file__).with_name("deploy_probe.py")
BIN = Path(sys.executable).parent          # this venv's console scripts (cv, curvine-master, ...)
IMAGE_NAME = "curvine-py"
CONF_MOUNT = "/etc/curvine"                # where the entrypoint looks for curvine.toml
# What the kubelet fills fieldRefs with, for the test: a documentation address (RFC 5737)
# and a node name; the secret the pods get (the Secret's own value is the placeholder the
# entrypoint refuses, checked in test_secret_placeholder_is_refused).
FIELD_VALUES = {"spec.nodeName": "node-a", "status.hostIP": "192.0.2.10", "status.podIP": "192.0.2.10",
                "metadata.name": "pod-0"}
TEST_SECRET = "a-secret-for-the-manifest-test"
# CURVINE_* variables the code reads that are not configuration keys (docs/config.md).
NON_KEY_VARIABLES = {"CURVINE_CONF", "CURVINE_MASTER", "CURVINE_DEBUG", "CURVINE_RUN_DIR"}
# The ports each role's container must declare: port name -> configuration key.
ROLE_PORTS = {
    "master": {"grpc": "master.port", "frames": "master.frame_port", "metrics": "master.metrics_port"},
    "worker": {"rpc": "worker.rpc_port", "data": "worker.data_port", "metrics": "worker.metrics_port"},
    "csi-node": {"metrics": "fuse.metrics_port"},
    "csi-controller": {},
}


def package_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


# ---------------------------------------------------------------- reading the manifests


@dataclass
class Obj:
    """One Kubernetes object and the file it is in."""
    path: Path
    body: dict[str, typing.Any]

    @property
    def kind(self) -> str:
        return self.body["kind"]

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]


def manifest_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")


def all_manifest_files() -> list[Path]:
    return manifest_files(K8S) + manifest_files(EXAMPLES)


@functools.cache
def objects() -> tuple[Obj, ...]:
    out = []
    for path in all_manifest_files():
        with open(path) as f:
            out += [Obj(path, doc) for doc in yaml.safe_load_all(f) if doc]
    return tuple(out)


def find(kind: str, name: str | None = None, directory: Path | None = None) -> list[Obj]:
    return [o for o in objects() if o.kind == kind and (name is None or o.name == name)
            and (directory is None or o.path.parent == directory)]


def one(kind: str, name: str | None = None, directory: Path | None = None) -> Obj:
    found = find(kind, name, directory)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o.name for o in found]}"
    return found[0]


def kustomization(directory: Path) -> dict[str, typing.Any]:
    with open(directory / "kustomization.yaml") as f:
        return yaml.safe_load(f)


NAMESPACE = "curvine"   # checked against the kustomization and the Namespace object below


def pod_spec(obj: Obj) -> dict[str, typing.Any]:
    return obj.body["spec"]["template"]["spec"]


def workloads() -> list[Obj]:
    return [o for o in objects() if o.kind in ("Deployment", "StatefulSet", "DaemonSet")]


@dataclass
class Container:
    """A container of one of our image's workloads, with what it needs to be run here."""
    workload: Obj
    body: dict[str, typing.Any]
    env: dict[str, str] = field(default_factory=dict)   # resolved as kubelet would

    @property
    def id(self) -> str:
        return f"{self.workload.kind}/{self.workload.name}/{self.body['name']}"

    @property
    def spec(self) -> dict[str, typing.Any]:
        return pod_spec(self.workload)

    @property
    def role(self) -> str:
        return self.args[0]

    @property
    def args(self) -> list[str]:
        assert "command" not in self.body, f"{self.id}: our image's command is its entrypoint; give args"
        return [expand(a, self.env) for a in self.body["args"]]

    def ports(self) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in self.body.get("ports", [])}

    def mounts(self) -> list[tuple[str, dict[str, typing.Any], dict[str, typing.Any]]]:
        """(mountPath, the volumeMount, its volume) of every volumeMount."""
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        claims = {c["metadata"]["name"]: {"name": c["metadata"]["name"], "claimTemplate": c}
                  for c in self.workload.body["spec"].get("volumeClaimTemplates", [])}
        out = []
        for m in self.body.get("volumeMounts", []):
            vol = volumes.get(m["name"]) or claims.get(m["name"])
            assert vol is not None, f"{self.id}: volumeMount {m['name']} has no volume"
            out.append((m["mountPath"], m, vol))
        return out


def expand(text: str, env: typing.Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) references in args and env values (unknown ones stay as they are)."""
    return re.sub(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def secret_value(name: str, key: str) -> str:
    secret = one("Secret", name)
    data = secret.body.get("stringData", {})
    assert key in data, f"Secret {name} has no key {key}"
    return data[key]


def resolve_env(c: Container, namespace: str) -> dict[str, str]:
    """The container's environment as kubelet would make it (fieldRefs: FIELD_VALUES)."""
    env: dict[str, str] = {}
    for item in c.body.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            env[item["name"]] = namespace if path == "metadata.namespace" else FIELD_VALUES[path]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret_value(ref["name"], ref["key"])   # it must exist
            env[item["name"]] = TEST_SECRET
        else:
            raise AssertionError(f"{c.id}: env {item['name']}: a source this test does not know: {source}")
    return env


@functools.cache
def our_containers() -> tuple[Container, ...]:
    out = []
    for w in workloads():
        namespace = NAMESPACE if w.path.parent == K8S else "default"
        for body in pod_spec(w)["containers"]:
            if body["image"].split(":")[0] == IMAGE_NAME:
                c = Container(w, body)
                c.env = resolve_env(c, namespace)
                out.append(c)
    return tuple(out)


def container(role: str) -> Container:
    found = [c for c in our_containers() if c.role == role]
    assert len(found) == 1, f"expected one container with role {role}, found {[c.id for c in found]}"
    return found[0]


@functools.cache
def configmap_toml(tmp: str) -> Path:
    """The ConfigMap's curvine.toml as the file the pods see."""
    cm = one("ConfigMap", "curvine-config")
    path = Path(tmp) / "curvine.toml"
    path.write_text(cm.body["data"]["curvine.toml"])
    return path


@pytest.fixture(scope="module")
def toml_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return configmap_toml(str(tmp_path_factory.mktemp("conf")))


def entrypoint_env(extra: typing.Mapping[str, str], conf: Path | os.PathLike[str] | str) -> dict[str, str]:
    """A clean environment: no developer CURVINE_* settings, this venv first in PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURVINE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    env["CURVINE_CONF"] = str(conf)
    return env


def entrypoint_argv(args: list[str], env: dict[str, str]) -> list[str]:
    """The command the entrypoint runs for args (its print mode)."""
    r = subprocess.run(["sh", str(ENTRYPOINT), *args], env=dict(env, CURVINE_ENTRYPOINT_PRINT="1"),
                       capture_output=True, timeout=30)
    assert r.returncode == 0, f"entrypoint {args}: {r.stderr.decode()}"
    return r.stdout.decode().split("\0")[:-1]


def probe(argv: list[str], env: dict[str, str]) -> dict[str, typing.Any]:
    """The effective configuration of the daemon argv starts (its real parser and loader)."""
    r = subprocess.run([sys.executable, str(PROBE), *argv], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{shlex.join(argv)}: exit {r.returncode}: {r.stderr.strip()}"
    return json.loads(r.stdout)["config"]


def key(cfg: dict[str, typing.Any], dotted: str) -> typing.Any:
    section, name = dotted.split(".")
    return cfg[section][name]


_EFFECTIVE: dict[tuple[str, str], tuple[list[str], dict[str, typing.Any]]] = {}


def effective(c: Container, conf: Path) -> tuple[list[str], dict[str, typing.Any]]:
    """(the command the entrypoint runs, that command's effective configuration): one
    probe per container, shared by the tests."""
    if (c.id, str(conf)) not in _EFFECTIVE:
        env = entrypoint_env(c.env, conf)
        argv = entrypoint_argv(c.args, env)
        _EFFECTIVE[c.id, str(conf)] = argv, probe(argv, env)
    return _EFFECTIVE[c.id, str(conf)]


def under(path: str, directory: str) -> bool:
    return PurePosixPath(path) == PurePosixPath(directory) or PurePosixPath(directory) in PurePosixPath(path).parents


def pyfuse3_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("pyfuse3") is not None


# ---------------------------------------------------------------- linters and schemas


def test_yamllint_passes() -> None:
    pytest.importorskip("yamllint", reason="yamllint is missing: install the dev extra")
    r = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint"), str(DEPLOY)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_yamllint_config_finds_problems(tmp_path: Path) -> None:
    """The committed config lints: a misindented, duplicate-key manifest fails it."""
    pytest.importorskip("yamllint", reason="yamllint is missing: install the dev extra")
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n   name: x\n  name: y\ndata: {a: yes}\n")
    r = subprocess.run([sys.executable, "-m", "yamllint", "--strict", "-c", str(ROOT / ".yamllint"), str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "indentation" in r.stdout and "truthy" in r.stdout, r.stdout


def kubernetes_validate(files: list[Path]) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is missing: install the dev extra")
    return subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", *map(str, files)],
                          capture_output=True, text=True, timeout=300)


def test_manifests_validate_strictly() -> None:
    """Every object passes the API schema with unknown fields refused.  kubernetes-validate
    only warns (exit 0) for a kind it has no schema for, so every object must be reported
    as passed: CSIDriver and StorageClass are in its schemas (storage.k8s.io/v1)."""
    files = all_manifest_files()
    r = kubernetes_validate(files)
    assert r.returncode == 0, r.stdout + r.stderr
    passed = re.findall(r"^INFO (\S+) passed for resource (\S+) against", r.stdout, re.M)
    others = [line for line in r.stdout.splitlines() if not line.startswith("INFO ")]
    assert not others, others
    expected = sorted((str(o.path), f"{o.kind.lower()}/{o.name}") for o in objects())
    assert sorted(passed) == expected
    assert {"CSIDriver", "StorageClass", "DaemonSet", "StatefulSet"} <= {o.kind for o in objects()}


def test_strict_validation_refuses_a_misspelt_field(tmp_path: Path) -> None:
    """--strict is what catches a field Kubernetes would silently drop."""
    node = next(o for o in objects() if o.kind == "DaemonSet" and o.name == "curvine-csi-node")
    text = node.path.read_text().replace("mountPropagation: Bidirectional", "mountPropogation: Bidirectional", 1)
    assert "mountPropogation" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    r = kubernetes_validate([bad])
    assert r.returncode != 0 and "mountPropogation" in r.stdout, r.stdout


@pytest.mark.parametrize("directory", [K8S, EXAMPLES], ids=["k8s", "examples"])
def test_kustomization_lists_every_manifest(directory: Path) -> None:
    k = kustomization(directory)
    assert sorted(k["resources"]) == sorted(p.name for p in manifest_files(directory))


def test_namespace() -> None:
    k = kustomization(K8S)
    assert k["namespace"] == NAMESPACE == one("Namespace").name
    for o in objects():   # the kustomization sets it: a namespace in a file would be overridden anyway
        assert "namespace" not in o.body["metadata"], f"{o.path}: {o.kind}/{o.name}"
    for o in find("ClusterRoleBinding") + find("RoleBinding"):
        for s in o.body["subjects"]:
            assert s["namespace"] == NAMESPACE, f"{o.kind}/{o.name}"


def test_kubectl_kustomize_renders() -> None:
    """What `kubectl apply -k` would send: every object, in the namespace, our image tagged."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomizations are checked by the tests above only")
    for directory in (K8S, EXAMPLES):
        r = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
        mine = [o.body for o in objects() if o.path.parent == directory]
        assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == \
            sorted((d["kind"], d["metadata"]["name"]) for d in mine)
        if directory == K8S:
            cluster_scoped = {"Namespace", "CSIDriver", "StorageClass", "ClusterRole", "ClusterRoleBinding"}
            for d in rendered:
                assert d["metadata"].get("namespace") == (None if d["kind"] in cluster_scoped else NAMESPACE), d
                for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                    if c["image"].startswith(IMAGE_NAME):
                        assert c["image"] == f"{IMAGE_NAME}:{package_version()}"


def test_the_documented_overlay_renders(tmp_path: Path) -> None:
    """docs/deploy.md's overlay (registry, secret) as kubectl would render it: the Secret
    replaced by the overlay's, our image renamed, nothing else changed."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the overlay of docs/deploy.md is not rendered")
    section = (ROOT / "docs" / "deploy.md").read_text().split("### 2. An overlay", 1)[1]
    overlay = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S)[1])
    assert overlay["resources"] == ["../deploy/k8s"]
    (tmp_path / "deploy").symlink_to(DEPLOY)   # the overlay sits beside deploy/, as the doc says
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    (tmp_path / "my-cluster" / "secret.env").write_text(f"cluster-secret={TEST_SECRET}\n")
    r = subprocess.run([kubectl, "kustomize", str(tmp_path / "my-cluster")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == \
        sorted((o.kind, o.name) for o in objects() if o.path.parent == K8S)
    (secret,) = [d for d in rendered if d["kind"] == "Secret" and d["metadata"]["name"] == "curvine-secret"]
    import base64
    assert base64.b64decode(secret["data"]["cluster-secret"]).decode() == TEST_SECRET
    assert secret["metadata"]["namespace"] == NAMESPACE
    (image,) = overlay["images"]
    ours = {c["image"] for d in rendered for c in d.get("spec", {}).get("template", {}).get("spec", {})
            .get("containers", []) if IMAGE_NAME in c["image"]}
    assert ours == {f"{image['newName']}:{package_version()}"} and image["newTag"] == package_version()


# ---------------------------------------------------------------- drift: manifests vs code


def test_image_tag_is_the_package_version() -> None:
    version = package_version()
    containers = our_containers()
    assert {c.role for c in containers} == set(ROLE_PORTS)
    for c in containers:
        assert c.body["image"] == f"{IMAGE_NAME}:{version}", c.id
    assert kustomization(K8S)["images"] == [{"name": IMAGE_NAME, "newTag": version}]
    # and every tag written in the deploy files and docs (build commands, examples)
    for path in [*DEPLOY.rglob("*"), ROOT / "docs" / "deploy.md"]:
        if path.is_file() and path.suffix in ("", ".md", ".yaml", ".sh", ".service"):
            for tag in re.findall(rf"\b{IMAGE_NAME}:(\d[\w.+-]*)", path.read_text()):
                assert tag.rstrip(".") == version, f"{path}: {IMAGE_NAME}:{tag}"


def test_configmap_toml_loads_with_every_key_known(toml_path: Path) -> None:
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, toml_path)    # an unknown section or key raises ConfigError
    data = tomllib.loads(toml_path.read_text())
    assert data["master"]["meta_dir"] == cfg.master.meta_dir
    # the ports the manifests declare are the documented defaults (docs/config.md, docs/deploy.md)
    defaults = dataclasses.asdict(cfgmod.Config())
    ports = {f"{s}.{k}": v for s, values in data.items() for k, v in values.items() if k.endswith("port")}
    assert set(ports) == {k for keys in ROLE_PORTS.values() for k in keys.values()}
    for dotted, value in ports.items():
        assert value == key(defaults, dotted), f"{dotted} = {value}, the default is {key(defaults, dotted)}"
    # the loader does refuse what the file could get wrong
    bad = toml_path.with_name("bad.toml")
    bad.write_text(toml_path.read_text().replace("[worker]\n", "[worker]\nmetric_port = 1\n", 1))
    with pytest.raises(cfgmod.ConfigError, match="worker.metric_port"):
        cfgmod.load_file(cfgmod.Config(), bad)


def test_environment_variables_are_configuration_keys() -> None:
    """apply_env ignores a CURVINE_* name that is no key: a typo would be silently lost."""
    defaults = dataclasses.asdict(cfgmod.Config())
    keys = {f"CURVINE_{s}_{k}".upper() for s in cfgmod.SECTIONS for k in defaults[s]}
    for c in our_containers():
        for name in c.env:
            if name.startswith("CURVINE_"):
                assert name in keys or name in NON_KEY_VARIABLES, f"{c.id}: {name} is not a configuration key"


@pytest.mark.parametrize("role", sorted(ROLE_PORTS))
def test_container_command_ports_and_probes_match_the_code(role: str, toml_path: Path) -> None:
    c = container(role)
    argv, cfg = effective(c, toml_path)
    assert Path(argv[0]).name in ("curvine-master", "curvine-worker", "cv")
    ports = c.ports()
    expected = {name: key(cfg, k) for name, k in ROLE_PORTS[role].items()}
    assert ports == expected, f"{c.id}: container ports {ports}, configuration {expected}"
    assert all(p > 0 for p in ports.values()), f"{c.id}: a port the configuration turned off: {ports}"
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        p = c.body.get(kind)
        if p is None:
            continue
        action = p.get("tcpSocket") or p.get("httpGet")
        assert action is not None, f"{c.id}: {kind} is neither tcpSocket nor httpGet"
        port = ports.get(action["port"], action["port"])
        assert port in ports.values(), f"{c.id}: {kind} probes port {action['port']}, not one it serves"
        if "httpGet" in p:   # only the Prometheus endpoint speaks HTTP
            assert (action["path"], port) == ("/metrics", ports["metrics"]), f"{c.id}: {kind}"
    annotations = c.workload.body["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") == "true":
        assert int(annotations["prometheus.io/port"]) == ports["metrics"], c.id
        assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"
    # the ConfigMap is where the entrypoint looks for curvine.toml
    conf = [(p, v) for p, _, v in c.mounts() if p == CONF_MOUNT]
    assert conf and conf[0][1].get("configMap", {}).get("name") == "curvine-config", f"{c.id}: {CONF_MOUNT}"


def test_master_service_and_storage(toml_path: Path) -> None:
    c = container("master")
    _, cfg = effective(c, toml_path)
    sts = c.workload
    assert sts.kind == "StatefulSet" and sts.body["spec"]["replicas"] == 1
    svc = one("Service", sts.body["spec"]["serviceName"])
    assert svc.body["spec"]["clusterIP"] == "None"
    assert svc.body["spec"]["selector"] == sts.body["spec"]["selector"]["matchLabels"]
    assert {p["port"]: p["targetPort"] for p in svc.body["spec"]["ports"]} == \
        {number: name for name, number in c.ports().items()}
    meta = [m for path, m, vol in c.mounts() if "claimTemplate" in vol and under(cfg["master"]["meta_dir"], path)]
    assert meta, f"master.meta_dir {cfg['master']['meta_dir']} is not on the StatefulSet's volume claim"
    # every daemon finds the master at the pod's stable name through the headless service
    address = f"{sts.name}-0.{svc.name}.{NAMESPACE}.svc.cluster.local:{cfg['master']['port']}"
    for role in ROLE_PORTS:
        _, other = effective(container(role), toml_path)
        assert other["client"]["master"] == address, role
        assert other["worker"]["master"] == address, role


def test_worker_dirs_are_host_paths_seen_by_the_node_plugin(toml_path: Path) -> None:
    """The client finds a local replica's block file under the worker's data dir path
    (short-circuit, passthrough): the node plugin's mounts must see the same paths."""
    from curvine_py.worker.blockstore import parse_dir_spec
    worker, node = container("worker"), container("csi-node")
    _, wcfg = effective(worker, toml_path)
    _, ncfg = effective(node, toml_path)
    assert wcfg["worker"]["dirs"] != cfgmod.WorkerConfig().dirs, "the workers keep the default ./.curvine dir"
    for spec in wcfg["worker"]["dirs"]:
        tier, capacity, path = parse_dir_spec(spec)
        assert spec.startswith(f"[{tier}:") and capacity, f"{spec}: a data dir without its tier and capacity"
        for c, writable in ((worker, True), (node, False)):
            found = [(p, m, v) for p, m, v in c.mounts() if under(path, p)]
            assert found, f"{c.id}: data dir {path} is not mounted"
            mount_path, mount, vol = found[0]
            assert vol.get("hostPath", {}).get("path") == mount_path, f"{c.id}: {mount_path} is not the same host path"
            assert bool(mount.get("readOnly")) is not writable, f"{c.id}: {mount_path} readOnly"
    # one host identity and the node's network for both (docs/deploy.md)
    assert wcfg["worker"]["host"] == ncfg["client"]["host"] == FIELD_VALUES["spec.nodeName"]
    assert wcfg["worker"]["ip"] == FIELD_VALUES["status.hostIP"]
    for c in (worker, node):
        assert c.spec.get("hostNetwork") is True and c.spec.get("dnsPolicy") == "ClusterFirstWithHostNet", c.id
    assert worker.spec["nodeSelector"] == {"curvine.io/worker": "true"}


def test_csi_names_sockets_and_propagation(toml_path: Path) -> None:
    from curvine_py.csi import DRIVER_NAME
    from curvine_py.csi.server import Endpoint
    assert one("CSIDriver").name == DRIVER_NAME
    assert one("StorageClass").body["provisioner"] == DRIVER_NAME
    for pv in find("PersistentVolume"):
        assert pv.body["spec"]["csi"]["driver"] == DRIVER_NAME
    plugin_dir = f"/var/lib/kubelet/plugins/{DRIVER_NAME}"

    def sidecar(c: Container, image: str) -> dict[str, typing.Any]:
        found = [s for s in c.spec["containers"] if s["image"].split(":")[0].endswith(image)]
        assert len(found) == 1, f"{c.workload.name}: no {image} sidecar"
        return found[0]

    def flags(body: dict[str, typing.Any]) -> dict[str, str]:
        return dict(a.removeprefix("--").split("=", 1) for a in body["args"] if "=" in a)

    def mount_of(body: dict[str, typing.Any], spec: dict[str, typing.Any], path: str) -> tuple[str, dict]:
        volumes = {v["name"]: v for v in spec["volumes"]}
        for m in body["volumeMounts"]:
            if under(path, m["mountPath"]):
                return m["name"], volumes[m["name"]]
        raise AssertionError(f"{body['name']}: {path} is not on a volume")

    for role, image in (("csi-node", "csi-node-driver-registrar"), ("csi-controller", "csi-provisioner")):
        c = container(role)
        argv, _ = effective(c, toml_path)
        endpoint = Endpoint.parse(argv[argv.index("--endpoint") + 1])
        car = sidecar(c, image)
        assert flags(car)["csi-address"] == endpoint.socket_path, c.id
        socket_dir = str(PurePosixPath(endpoint.socket_path).parent)
        assert mount_of(c.body, c.spec, endpoint.socket_path)[0] == mount_of(car, c.spec, socket_dir)[0], c.id
        if role == "csi-node":
            assert flags(car)["kubelet-registration-path"] == f"{plugin_dir}/{PurePosixPath(endpoint.socket_path).name}"
            assert mount_of(c.body, c.spec, endpoint.socket_path)[1]["hostPath"]["path"] == plugin_dir
            assert mount_of(car, c.spec, "/registration")[1]["hostPath"]["path"] == "/var/lib/kubelet/plugins_registry"
            state_dir = argv[argv.index("--state-dir") + 1]
            assert argv[argv.index("--node-id") + 1] == FIELD_VALUES["spec.nodeName"]
            assert c.body["securityContext"]["privileged"] is True
            for path in ("/var/lib/kubelet/pods", state_dir):   # the mounts made here are the node's
                m = [m for p, m, v in c.mounts() if p == path and v["hostPath"]["path"] == path]
                assert m and m[0]["mountPropagation"] == "Bidirectional", f"{c.id}: {path}"
            assert c.workload.body["spec"]["updateStrategy"]["type"] == "OnDelete"
            assert "livenessProbe" not in c.body, "a failed liveness probe restarts the container: the mounts die"


def test_storageclass_parameters_are_accepted_by_the_controller() -> None:
    """The controller's own check of a CreateVolume, with the StorageClass's parameters
    as csi-provisioner sends them."""
    from curvine_py.csi.controller import VolumeRequest
    from curvine_py.pb import csi_pb2 as csi
    sc = one("StorageClass").body
    pvc = one("PersistentVolumeClaim", "kv-scratch")
    assert pvc.body["spec"]["storageClassName"] == one("StorageClass").name
    cap = csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(),
                               access_mode=csi.VolumeCapability.AccessMode(
                                   mode=csi.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER))
    storage = cfgmod.parse_size(pvc.body["spec"]["resources"]["requests"]["storage"].replace("i", "iB"))
    request = csi.CreateVolumeRequest(name="pvc-0a1b", parameters=sc["parameters"], volume_capabilities=[cap],
                                      capacity_range=csi.CapacityRange(required_bytes=storage))
    v = VolumeRequest.of(request)
    assert v.path == f"{sc['parameters']['baseDir']}/pvc-0a1b"
    assert v.block_size == cfgmod.parse_size(sc["parameters"]["blockSize"]) == 16 << 20
    assert v.capacity == 100 << 30


def test_static_volume_and_the_command_that_makes_its_directory() -> None:
    """The static PV names a pool directory; the command its comment (and docs/deploy.md)
    gives to make it parses with cv's parser and makes that directory."""
    from curvine_py.cli.main import build_parser
    pv = one("PersistentVolume", "kv-cache")
    handle = pv.body["spec"]["csi"]["volumeHandle"]
    assert PurePosixPath(handle).is_absolute()
    pvc = one("PersistentVolumeClaim", "kv-cache")
    assert pvc.body["spec"]["volumeName"] == pv.name
    assert pvc.body["spec"]["storageClassName"] == pv.body["spec"]["storageClassName"] == ""
    line = next(ln for ln in pv.path.read_text().splitlines() if " cv fs mkdir " in ln)
    argv = shlex.split(line.split(" -- ", 1)[1])
    assert argv[:3] == ["cv", "fs", "mkdir"]
    args = build_parser().parse_args(argv[1:])
    assert args.paths == [handle] and args.parents
    assert args.block_size == cfgmod.parse_size(one("StorageClass").body["parameters"]["blockSize"])


def test_lmcache_example_writes_into_the_volume() -> None:
    deploy = one("Deployment", "vllm-lmcache")
    spec = pod_spec(deploy)
    (c,) = spec["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    conf_file = PurePosixPath(env["LMCACHE_CONFIG_FILE"])
    cm = one("ConfigMap", mounts[str(conf_file.parent)]["configMap"]["name"])
    lm = yaml.safe_load(cm.body["data"][conf_file.name])
    assert lm["remote_url"].startswith("fs://")
    from urllib.parse import urlparse
    kv_dir = urlparse(lm["remote_url"]).path
    claim = mounts[kv_dir]["persistentVolumeClaim"]["claimName"]
    assert find("PersistentVolumeClaim", claim, EXAMPLES), f"{claim} is not an example claim"
    assert env["PYTHONHASHSEED"] == "0"
    assert deploy.body["spec"]["replicas"] >= 2


def test_secret_placeholder_is_refused(toml_path: Path) -> None:
    """The Secret ships with a placeholder; the entrypoint refuses to start any role with it."""
    placeholder = secret_value("curvine-secret", "cluster-secret")
    assert f"SECRET_PLACEHOLDER={placeholder}\n" in ENTRYPOINT.read_text()
    env = entrypoint_env({"CURVINE_CLUSTER_SECRET": placeholder}, toml_path)
    r = subprocess.run(["sh", str(ENTRYPOINT), "master"], env=dict(env, CURVINE_ENTRYPOINT_PRINT="1"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "placeholder" in r.stderr and r.stdout == ""
    assert entrypoint_argv(["master"], entrypoint_env({"CURVINE_CLUSTER_SECRET": TEST_SECRET}, toml_path)) == \
        ["curvine-master"]


def test_references_between_objects_exist() -> None:
    service_accounts = {o.name for o in find("ServiceAccount")}
    for w in workloads():
        spec = pod_spec(w)
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in service_accounts, w.name
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert find("ConfigMap", v["configMap"]["name"], w.path.parent), f"{w.name}: {v}"
            if "persistentVolumeClaim" in v:
                assert find("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"], w.path.parent)
        labels = w.body["spec"]["template"]["metadata"]["labels"]
        assert w.body["spec"]["selector"]["matchLabels"].items() <= labels.items(), w.name
    for binding in find("ClusterRoleBinding") + find("RoleBinding"):
        ref = binding.body["roleRef"]
        assert find(ref["kind"], ref["name"]), binding.name
        for s in binding.body["subjects"]:
            assert s["name"] in service_accounts


# ---------------------------------------------------------------- the entrypoint


def test_entrypoint_roles_run_the_package_commands(tmp_path: Path) -> None:
    env = entrypoint_env({}, os.devnull)
    assert entrypoint_argv(["worker", "--log-level", "DEBUG"], env) == ["curvine-worker", "--log-level", "DEBUG"]
    target = tmp_path / "m"
    assert entrypoint_argv(["mount", str(target), "--subdir", "/kv"], env) == \
        ["cv", "mount", str(target), "--subdir", "/kv", "--foreground"]
    assert not target.exists(), "print mode made the mount point"
    assert entrypoint_argv(["cv", "fs", "ls", "/"], env) == ["cv", "fs", "ls", "/"]
    assert entrypoint_argv(["csi-controller"], env) == ["cv", "csi", "controller"]
    for bad in (["mount"], ["mount", "--subdir", "/kv", str(target)]):
        r = subprocess.run(["sh", str(ENTRYPOINT), *bad], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "MOUNTPOINT" in r.stderr, bad
    r = subprocess.run(["sh", str(ENTRYPOINT), "help"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for role in ROLE_PORTS:
        assert f"  {role} " in r.stdout, role
    r = subprocess.run(["sh", str(ENTRYPOINT), "cv", "version"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"cv (curvine-py) {package_version()}" in r.stdout, r.stderr


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def _wait(what: str, check: typing.Callable[[], typing.Any], timeout: float = 30.0) -> typing.Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_entrypoint_starts_a_killed_csi_node_again_and_stops_on_sigterm(tmp_path: Path) -> None:
    """docs/csi.md: a crashed driver must not end the container, whose mount daemons
    would die with it; a SIGTERM (the pod's end) does stop it."""
    sock = tmp_path / "csi.sock"
    log = open(tmp_path / "log", "w+")
    ep = _csi_entrypoint(tmp_path, log)
    try:
        def serving(old: list[int]) -> list[int]:
            """The entrypoint's driver children not in old, once the socket answers."""
            new = [p for p in _children(ep.pid) if p not in old]
            return new if new and _answers(str(sock)) else []

        first = _wait("the driver", lambda: serving([]))
        os.kill(first[0], signal.SIGKILL)
        second = _wait("a new driver", lambda: serving(first))
        assert ep.poll() is None
        ep.send_signal(signal.SIGTERM)
        assert ep.wait(timeout=30) == 0
        assert not os.path.exists(f"/proc/{second[0]}") or _zombie(second[0])
        log.seek(0)
        text = log.read()
        assert "exited with status 137; starting it again" in text, text
    finally:
        _kill_entrypoint(ep)
        log.close()


def test_entrypoint_stopped_while_its_csi_node_starts_exits_0(tmp_path: Path) -> None:
    """A pod ended while its driver is still importing (no handlers yet): the TERM the
    entrypoint forwards kills the driver, and that is the asked-for stop, exit 0 (CI saw 143)."""
    ep = _csi_entrypoint(tmp_path, subprocess.DEVNULL)
    try:
        _wait("the driver", lambda: _children(ep.pid))
        ep.send_signal(signal.SIGTERM)
        assert ep.wait(timeout=30) == 0
    finally:
        _kill_entrypoint(ep)


def _csi_entrypoint(tmp_path: Path, out: typing.Any) -> subprocess.Popen[bytes]:
    """The image's entrypoint running a CSI node driver on a socket under tmp_path."""
    return subprocess.Popen(["sh", str(ENTRYPOINT), "csi-node", "--endpoint", f"unix://{tmp_path / 'csi.sock'}",
                             "--node-id", "n1", "--state-dir", str(tmp_path / "state")],
                            env=entrypoint_env({}, os.devnull), stdout=out, stderr=subprocess.STDOUT)


def _kill_entrypoint(ep: subprocess.Popen[bytes]) -> None:
    """A test's cleanup: an entrypoint still running is killed with its drivers."""
    if ep.poll() is None:
        for child in _children(ep.pid):
            os.kill(child, signal.SIGKILL)
        ep.kill()
        ep.wait()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# ---------------------------------------------------------------- the image


def containerfile_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY from the build context."""
    out = []
    for line in CONTAINERFILE.read_text().splitlines():
        words = line.split()
        if words and words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            out.append((words[1:-1], words[-1]))
    return out


def test_containerfile_copies_what_exists_and_is_not_ignored() -> None:
    ignored = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    copies = containerfile_copies()
    assert copies
    for sources, _ in copies:
        for src in sources:
            assert (ROOT / src).exists(), f"Containerfile copies {src}, which does not exist"
            assert not any(PurePosixPath(src).match(p) or src.split("/")[0] == p for p in ignored), src
    # every package directory setuptools installs is copied
    with open(ROOT / "pyproject.toml", "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    copied = {s.split("/")[0] for sources, _ in copies for s in sources}
    dirs = {tool["package-dir"].get(p, p.replace(".", "/")).split("/")[0] for p in tool["packages"]}
    assert dirs <= copied, dirs - copied
    entry = [dest for sources, dest in copies if sources == ["deploy/container/entrypoint.sh"]]
    assert entry and f'"{entry[0]}"' in CONTAINERFILE.read_text().split("ENTRYPOINT", 1)[1]


def built_image(tag: str) -> tuple[list[str], str]:
    """(how to run a command in the image tag, why not): the image `make image` (or a
    docker/podman build) left in this machine's buildah, podman or docker storage.  Building
    one takes 4-5 minutes on 2 cores (libfuse, pyfuse3 and the io_uring binding are compiled),
    too long for the suite: this test checks an image built before, and skips when there is none."""
    reasons = []
    for name in ("buildah", "podman", "docker"):
        exe = shutil.which(name)
        if exe is None:
            reasons.append(f"no {name}")
            continue
        look = [exe, "images", "-q", tag] if name == "buildah" else [exe, "image", "inspect", tag]
        r = subprocess.run(look, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 and r.stdout.strip():
            if name == "buildah":
                return [exe, "run", "--isolation", "chroot"], ""
            return [exe, "run", "--rm", tag], ""
        why = (r.stderr.strip().splitlines() or ["no such image"])[-1]
        reasons.append(f"{name}: {why}")
    return [], "; ".join(reasons)


@pytest.mark.timeout(300)
def test_image_runs_cv_version_and_loads_the_mount() -> None:
    tag = f"{IMAGE_NAME}:{package_version()}"
    run, why = built_image(tag)
    if not run:
        pytest.skip(f"no {tag} image built here (make image builds one): {why}")
    ctr = ""
    if "buildah" in Path(run[0]).name:
        # buildah runs commands in a working container of the image (no entrypoint)
        r = subprocess.run([run[0], "from", "--pull=false", tag], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        ctr = r.stdout.strip().splitlines()[-1]
        run = [*run, ctr, "--"]
    try:
        r = subprocess.run([*run, "cv", "version"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"cv (curvine-py) {package_version()}" in r.stdout, r.stdout + r.stderr
        # what the mount and csi-node roles import: pyfuse3 must load against the image's libfuse
        r = subprocess.run([*run, "python", "-c", "import pyfuse3, curvine_py.fuse.ops, curvine_py.fuse.passthrough"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        if ctr:
            subprocess.run([run[0], "rm", ctr], capture_output=True, timeout=120)


# ---------------------------------------------------------------- systemd


def unit_files() -> list[Path]:
    units = sorted(SYSTEMD.glob("*.service"))
    assert {u.name for u in units} == {"curvine-master.service", "curvine-worker.service", "curvine-mount@.service"}
    return units


UNIT_VENV = "/opt/curvine-py/.venv"   # where deploy/README.md installs the package
MOUNT_INSTANCE = "mnt-curvine"        # systemctl enable curvine-mount@mnt-curvine -> /mnt/curvine


def units_for_this_venv(dest: Path) -> list[Path]:
    """The units with ExecStart pointed at this venv (systemd-analyze verify needs the
    binaries to exist), the mount template as an instance."""
    out = []
    for unit in unit_files():
        text = unit.read_text()
        assert UNIT_VENV in text, unit
        name = unit.name.replace("@.", f"@{MOUNT_INSTANCE}.")
        path = dest / name
        path.write_text(text.replace(UNIT_VENV, str(Path(sys.prefix))))
        out.append(path)
    return out


def systemd_verify(paths: list[Path]) -> tuple[int, list[str]]:
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, paths)],
                       capture_output=True, text=True, timeout=120)
    # verify only warns about an unknown key or a bad value (exit 0): every line naming a
    # unit of ours is a finding
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "curvine" in ln]
    return r.returncode, lines


def test_systemd_units_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: the systemd package)")
    if not (BIN / "curvine-master").exists():
        pytest.skip(f"{BIN} has no curvine-master: the units' binaries must exist for systemd-analyze verify")
    units = units_for_this_venv(tmp_path)
    rc, findings = systemd_verify(units)
    assert rc == 0 and not findings, findings
    # and the check is a check: a typo'd key in one of them is reported
    bad = tmp_path / "bad"
    bad.mkdir()
    broken = bad / units[0].name
    broken.write_text(units[0].read_text().replace("Restart=on-failure", "Restart=on-failure\nRestrat=always"))
    rc, findings = systemd_verify([broken])
    assert any("Restrat" in ln for ln in findings), findings


def exec_lines(unit: Path) -> list[tuple[str, list[str]]]:
    out = []
    for line in unit.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name in ("ExecStart", "ExecStartPre", "ExecStop"):
            argv = shlex.split(value.replace("%I", MOUNT_INSTANCE.replace("-", "/")))
            out.append((name, argv))
    return out


def test_systemd_command_lines_parse_with_the_real_parsers(tmp_path: Path) -> None:
    """ExecStart: the daemon's parser and loader (the probe); ExecStop: cv's parser."""
    from curvine_py.cli.main import build_parser
    conf = tmp_path / "curvine.toml"   # the hosts' /etc/curvine/curvine.toml is not here
    conf.write_text("")
    env = entrypoint_env({}, conf)
    checked = 0
    for unit in unit_files():
        for directive, argv in exec_lines(unit):
            program = argv[0]
            if not program.startswith(UNIT_VENV):
                assert Path(program).is_absolute(), f"{unit.name}: {directive} {program}"
                continue
            argv[0] = Path(program).name
            if directive == "ExecStart":
                if argv[:2] == ["cv", "mount"] and not pyfuse3_available():
                    continue   # cv mount cannot load without pyfuse3; parsed below instead
                probe(argv, env)
            if argv[0] == "cv":
                build_parser().parse_args(argv[1:])
            checked += 1
    assert checked >= 4
    for unit in unit_files():
        assert "Environment=CURVINE_CONF=/etc/curvine/curvine.toml" in unit.read_text(), unit.name


def test_every_role_takes_its_own_tls_certificate_from_the_secret(toml_path: Path) -> None:
    """With [tls] enabled in the ConfigMap, each of our pods presents its role's
    certificate from the Secret curvine-tls, mounted read-only where the ConfigMap's CA is."""
    cfg = cfgmod.Config()
    cfgmod.load_file(cfg, toml_path)
    assert cfg.tls.enabled is False and cfg.tls.ca.startswith("/etc/curvine-tls/")
    want = {"master": "master", "worker": "worker", "csi-node": "client", "csi-controller": "client"}
    for c in our_containers():
        role = want[c.role]
        assert c.env["CURVINE_TLS_CERT"] == f"/etc/curvine-tls/{role}.pem", c.id
        assert c.env["CURVINE_TLS_KEY"] == f"/etc/curvine-tls/{role}.key", c.id
        (mount,) = [m for m in c.body["volumeMounts"] if m["mountPath"] == "/etc/curvine-tls"]
        (vol,) = [v for v in c.spec["volumes"] if v["name"] == mount["name"]]
        assert mount["readOnly"] and vol["secret"]["secretName"] == "curvine-tls", c.id
        assert vol["secret"]["defaultMode"] == 0o400 and vol["secret"]["optional"] is True, c.id
    assert one("Secret", "curvine-tls")
