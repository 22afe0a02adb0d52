"""deploy/build-pyfuse3.sh run as the container image runs it, and its fallbacks.

The venv is a fresh one of Debian's python3 (the image's interpreter) at the image's path,
under a scratch root: tmp/opt/curvine-py/.venv.  Debian's python3 is a shared-library build
whose LIBDIR (/usr/lib/x86_64-linux-gnu) setuptools puts on the extension's link line; with
libfuse3-dev installed there, that is where -lfuse3 once found the system's libfuse 3.14
while the module was compiled against 3.17's headers: a module that cannot load
("undefined symbol: fuse_session_new_versioned"), kept by the script as if it worked
(issue 42, item 6).  Here the module the script builds must load against the prefix's
libfuse, in a python of its own, and a module that does not load must never be kept.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "build-pyfuse3.sh"
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"
IMAGE_PYTHON = "/usr/bin/python3"   # the build stage's python3 (Debian's)
NO_MIRROR = "file:///nonexistent"   # a FUSE_MIRROR the script cannot fetch from: its build stops at once
pytestmark = pytest.mark.timeout(600)

# Loads VENV's pyfuse3 (RTLD_NOW: every symbol resolved), imports it when trio is there, and
# says which libfuse the process mapped.  Independent of the script's own check.
LOAD = r"""
import ctypes, importlib.util, json, os
spec = importlib.util.find_spec("pyfuse3")
out = {"installed": spec is not None}
if spec is not None:
    try:
        ctypes.CDLL(spec.origin, mode=os.RTLD_NOW)
        if importlib.util.find_spec("trio") is not None:
            import pyfuse3
            out["patched"] = hasattr(pyfuse3, "session_fd_number")
        out["loaded"] = True
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    with open("/proc/self/maps") as maps:
        out["libfuse"] = sorted({ln.split()[-1] for ln in maps if "/libfuse3.so" in ln})
print(json.dumps(out))
"""


def image_venv() -> str:
    """The Containerfile's VENV (ENV VENV=...)."""
    m = re.search(r"^ENV VENV=(\S+)$", CONTAINERFILE.read_text(), re.M)
    assert m, "the Containerfile sets no ENV VENV="
    return m.group(1)


def script_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILD_PYFUSE3_")}
    env.pop("FUSE_MIRROR", None)
    env.update(extra)
    return env


def build(venv: Path, env: dict[str, str], timeout: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), str(venv)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def check(venv: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "--check", str(venv)], capture_output=True, text=True,
                          timeout=60)


def load(venv: Path) -> dict[str, Any]:
    r = subprocess.run([str(venv / "bin" / "python"), "-c", LOAD], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def log_of(venv: Path) -> str:
    log = venv / "pyfuse3-build.log"
    return log.read_text()[-4000:] if log.exists() else "(no log)"


def test_build_pyfuse3_in_an_image_like_venv(tmp_path: Path) -> None:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler (gcc): build-pyfuse3.sh cannot build here")
    if not os.access(IMAGE_PYTHON, os.X_OK):
        pytest.skip(f"no Debian python3 ({IMAGE_PYTHON}) to make a venv like the image's")
    venv = tmp_path / image_venv().lstrip("/")
    venv.parent.mkdir(parents=True)
    r = subprocess.run([IMAGE_PYTHON, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"{IMAGE_PYTHON} cannot make a venv (python3-venv): {r.stderr.strip()[-300:]}")
    prefix = venv / "opt" / "libfuse"
    stock_mark = venv / "opt" / "pyfuse3-stock"

    # 1. a fresh build: the patched module, loading against the prefix's libfuse 3.17
    r = build(venv, script_env())
    assert r.returncode == 0, r.stderr + log_of(venv)
    offline = re.search(r"cannot (install meson and ninja|download libfuse \S+ with|download pyfuse3)", r.stderr)
    if offline:
        pytest.skip(f"no package mirror reachable ({offline.group(0)}): {r.stderr.strip()}")
    assert "warning" not in r.stderr, r.stderr + log_of(venv)
    assert not stock_mark.exists()
    # trio, so that the module is imported as the mount imports it, not only loaded
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "trio"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    got = load(venv)
    assert got.get("loaded") and got.get("patched"), got
    assert got["libfuse"] == [str(prefix / "lib" / "libfuse3.so.3.17.2")], got
    r = check(venv)
    assert r.returncode == 0 and f"pyfuse3 imports (patched, libfuse {prefix}/lib/" in r.stdout, r.stdout + r.stderr

    # 2. run again where nothing can be built: the installed module loads, so it is kept
    for stamp in prefix.glob(".max-pages-*"):
        stamp.unlink()            # libfuse is to be fetched again: the build stops there
    r = build(venv, script_env(FUSE_MIRROR=NO_MIRROR))
    assert r.returncode == 0, r.stderr + log_of(venv)
    assert "FUSE_MIRROR" in r.stderr and "keeping the one already installed" in r.stderr, r.stderr
    assert load(venv).get("patched") and not stock_mark.exists()

    # 3. the prefix's libfuse broken (a libfuse3.so.4 without its symbols), no index to
    # fetch the stock pyfuse3 from: the module that does not load is not kept, and the
    # warning says why
    lib = prefix / "lib" / "libfuse3.so.4"
    lib.unlink()
    stub = tmp_path / "stub.c"
    stub.write_text("int curvine_stub;\n")
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-Wl,-soname,libfuse3.so.4",
                    "-o", str(lib), str(stub)], check=True, timeout=60)
    assert "undefined symbol: fuse_" in str(load(venv).get("error")), "the stub does not break the module"
    offline_pip = {k: v for k, v in script_env(FUSE_MIRROR=NO_MIRROR).items()
                   if k not in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")}
    offline_pip.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1")
    r = build(venv, offline_pip, timeout=120)
    assert r.returncode == 0, r.stderr + log_of(venv)
    warning = r.stderr.strip()
    assert re.search(r"the installed pyfuse3 does not load: undefined symbol: fuse_\w+", warning), warning
    assert "stock pyfuse3 3.5.0 failed too" in warning and "no FUSE mount" in warning, warning
    assert load(venv) == {"installed": False}
    r = check(venv)
    assert r.returncode == 1 and "no pyfuse3 is installed" in r.stderr, r.stdout + r.stderr
    assert stock_mark.exists()

    # 4. with the index back: PyPI's pyfuse3, built against the system's libfuse3, loads
    # and is what stays (when the system has libfuse3-dev, as `make install` installs)
    if not shutil.which("pkg-config") or subprocess.run(["pkg-config", "--exists", "fuse3"], timeout=30).returncode:
        return
    r = build(venv, script_env(FUSE_MIRROR=NO_MIRROR))
    assert r.returncode == 0, r.stderr + log_of(venv)
    assert "stock pyfuse3 3.5.0 with the system's libfuse3" in r.stderr, r.stderr + log_of(venv)
    got = load(venv)
    assert got.get("loaded") and got.get("patched") is False, got
    assert got["libfuse"] and not got["libfuse"][0].startswith(str(prefix)), got
    assert stock_mark.exists()
