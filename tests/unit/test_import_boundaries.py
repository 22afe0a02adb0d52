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


def module_graph(folders: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of the same folders it imports (TYPE_CHECKING imports too:
    a cycle hidden behind one is still two modules that cannot be read apart)."""
    mods: dict[str, Path] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {m: {n for _, n in imported_modules(p) if n in mods and n != m} for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The client side reads apart: no two of its modules import each other, even through a
# chain (issue 38 removed cli/fs <-> cli/policy and sdk <-> ufsadmin).
CLIENT_SIDE = ("curvine_py/client", "curvine_py/sdk", "curvine_py/cli", "curvine_py/cluster",
               "curvine_py/common", "curvine_py/csi", "curvine_py/ufs", "curvine_py/kv")


def test_the_client_side_has_no_import_circles() -> None:
    assert cycles(module_graph(tuple(f for f in CLIENT_SIDE if (ROOT / f).is_dir()))) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("from curvine_py.worker import blockstore\nimport curvine_py.master.namespace\n")
    mods = [m for _, m in imported_modules(bad)]
    assert any(banned(m, FORBIDDEN["master"]) for m in mods)
    assert any(banned(m, FORBIDDEN["worker"]) for m in mods)
    assert not banned("curvine_py.client.core", FORBIDDEN["curvine_py/cli"])
    assert banned("curvine_py.testing.s3servers", FORBIDDEN["worker"])
    assert not banned("curvine_py.ufs.s3", FORBIDDEN["master"])
