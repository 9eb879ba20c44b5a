"""References in code and docs point at something real: a section of docs/design.md, a Makefile
target."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("operator", "tests", "hack", "images", "docs", "README.md", "Makefile")
DESIGN_REF = re.compile(r'docs/design\.md, "([^"]+)"')
MAKE_REF = re.compile(r"`make ([a-z][a-z0-9-]*)")


def files() -> list[Path]:
    out: list[Path] = []
    for name in SOURCES:
        path = REPO / name
        if path.is_file():
            out.append(path)
        else:
            out += [p for p in path.rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".sh"}]
    return out


def text(path: Path) -> str:
    # A reference may wrap across a docstring's lines; join them as a reader would.
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", path.read_text(errors="replace"))


def test_design_references_name_real_sections() -> None:
    headings = set(re.findall(r"^## (.+)$", (REPO / "docs" / "design.md").read_text(), re.M))
    refs = {(p.relative_to(REPO), ref) for p in files() for ref in DESIGN_REF.findall(text(p))}
    assert refs, "no references found: the pattern is wrong"
    broken = sorted(f"{p}: {ref}" for p, ref in refs if ref not in headings)
    assert broken == []


def test_make_targets_mentioned_exist() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.M))
    refs = {(p.relative_to(REPO), t) for p in files() for t in MAKE_REF.findall(text(p))}
    assert refs
    broken = sorted(f"{p}: make {t}" for p, t in refs if t not in targets)
    assert broken == []
