"""The tree's architecture, enforced: who may import whom (as Curvine's check-deps does)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# folder -> module prefixes its code must never import
FORBIDDEN = {
    "master": ("curvine_py.worker", "curvine_py.client", "curvine_py.sdk", "curvine_py.fuse", "curvine_py.cli"),
    "worker": ("curvine_py.master", "curvine_py.client", "curvine_py.sdk", "curvine_py.fuse", "curvine_py.cli"),
    "fuse": ("curvine_py.master", "curvine_py.worker", "curvine_py.cli"),
    "curvine_py/common": ("curvine_py.master", "curvine_py.worker", "curvine_py.client", "curvine_py.sdk",
                          "curvine_py.fuse", "curvine_py.cli"),
    "curvine_py/client": ("curvine_py.master", "curvine_py.worker", "curvine_py.sdk", "curvine_py.fuse",
                          "curvine_py.cli"),
    "curvine_py/cli": ("curvine_py.master", "curvine_py.worker"),
    "curvine_py/sdk": ("curvine_py.master", "curvine_py.worker", "curvine_py.fuse", "curvine_py.cli",
                       "curvine_py.cluster"),
    # a local cluster runs the daemons as processes, never their code
    "curvine_py/cluster": ("curvine_py.master", "curvine_py.worker", "curvine_py.fuse", "curvine_py.cli",
                           "curvine_py.sdk"),
    # the driver runs mounts as processes (cv mount), never the mount code itself
    "curvine_py/csi": ("curvine_py.master", "curvine_py.worker", "curvine_py.fuse", "curvine_py.cli"),
}

# folder -> the only curvine_py modules its code may import (master/ and worker/ may
# import curvine_py.ufs: the UFS providers sit below both)
ONLY = {
    "curvine_py/ufs": ("curvine_py.common", "curvine_py.ufs"),
}

# what only a mount does at lookups and opens: the client core, the SDK, the CLI and the
# CSI driver never import it (the VFS takes it as an OpenPolicy from fuse/)
MOUNT_ONLY = "curvine_py.client.mount"
MOUNT_ONLY_DIR = ROOT / "curvine_py" / "client" / "mount"

# test tooling (moto, SeaweedFS launchers: dev-only packages) never reaches the product
# (curvine_py/ufs is held to ONLY, which leaves it out too)
TESTING = ("curvine_py.testing",)
for _folder in ("master", "worker", "fuse", "curvine_py/client", "curvine_py/cli", "curvine_py/csi"):
    FORBIDDEN[_folder] = tuple(dict.fromkeys(FORBIDDEN.get(_folder, ()) + TESTING))


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def banned(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def violations() -> list[str]:
    found = []
    for folder, banned_mods in FORBIDDEN.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, mod in imported_modules(path):
                if banned(mod, banned_mods) or mod.split(".")[0] in ("master", "worker", "fuse"):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    for folder, allowed in ONLY.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, mod in imported_modules(path):
                if banned(mod, ("curvine_py",)) and mod != "curvine_py" and not banned(mod, allowed):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    for folder in ("curvine_py/client", "curvine_py/sdk", "curvine_py/cli", "curvine_py/csi"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if MOUNT_ONLY_DIR in path.parents:
                continue
            for line, mod in imported_modules(path):
                if banned(mod, (MOUNT_ONLY,)):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {mod} (only the mount may)")
    return found


def test_no_module_sits_loose_in_the_package() -> None:
    """Every module has a home that says what it is (a package), but the package's own
    __init__.py."""
    assert sorted(p.name for p in (ROOT / "curvine_py").glob("*.py")) == ["__init__.py"]


def test_no_forbidden_imports() -> None:
    assert violations() == []


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("from curvine_py.worker import blockstore\nimport curvine_py.master.namespace\n")
    mods = [m for _, m in imported_modules(bad)]
    assert any(banned(m, FORBIDDEN["master"]) for m in mods)
    assert any(banned(m, FORBIDDEN["worker"]) for m in mods)
    assert not banned("curvine_py.client.core", FORBIDDEN["curvine_py/cli"])
    assert banned("curvine_py.testing.s3servers", FORBIDDEN["worker"])
    assert not banned("curvine_py.ufs.s3", FORBIDDEN["master"])
