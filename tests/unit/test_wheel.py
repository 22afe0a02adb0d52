"""What `pip install` delivers: every product package, and no test tooling."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"master": "curvine_py/master", "worker": "curvine_py/worker", "fuse": "curvine_py/fuse"}


def product_packages() -> set[str]:
    """Every package of the tree, as the wheel names it, but curvine_py/testing."""
    out = set()
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT).as_posix()
        top = rel.split("/")[0]
        if top == "curvine_py" and not rel.startswith("curvine_py/testing"):
            out.add(rel)
        elif top in MAPPED:
            out.add(MAPPED[top] + rel[len(top):])
    return out


def checkout_copy(dest: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) without build/ or *.egg-info
    left by an earlier build, whose lists would bring old files back."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_the_wheel_holds_the_product_and_no_test_tooling(tmp_path: Path) -> None:
    src = checkout_copy(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    wheel, = (tmp_path / "dist").glob("curvine_py-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("curvine_py/testing/")]
    packaged = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    assert product_packages() - packaged == set(), "packages missing from pyproject's [tool.setuptools] list"
