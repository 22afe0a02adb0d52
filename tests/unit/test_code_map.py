"""docs/architecture.md's code map names every module of the product, so a newcomer
finds each one from the map (issue 38: the map must match the tree)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("curvine_py", "master", "worker", "fuse")
SKIP = ("/testing/", "/pb/", "__init__.py", "__main__.py")


def unmapped() -> list[str]:
    """Product modules whose path (as the map writes it) or file name the map never names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    found = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(s in "/" + rel for s in SKIP):
                continue
            short = rel.removeprefix("curvine_py/")
            if short not in text and path.name not in text:
                found.append(rel)
    return found


def test_the_code_map_names_every_module() -> None:
    assert unmapped() == []
