"""docs/design.md is the project's design document: every citation of it in the repository names a
section that exists, and nothing points to a design document outside the repository."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SKIP_DIRS = {".git", ".venv", "target", "wheelhouse", "__pycache__", ".pytest_cache", ".mypy_cache"}
SUFFIXES = {".rs", ".py", ".pyi", ".cu", ".cuh", ".h", ".md", ".sh", ".toml", ".txt", ".cfg"}
CITATION = re.compile(r"docs/design\.md\)?\s+sections?\s+(\d+(?:\.\d+)?)")


def _text_files() -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            path = Path(dirpath, name)
            if path.suffix in SUFFIXES or name == "run":
                out.append(path)
    return out


def _sections() -> set[str]:
    heads = re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", DESIGN.read_text(), flags=re.MULTILINE)
    return set(heads)


def test_design_doc_sections_are_numbered():
    sections = _sections()
    top = sorted(int(s) for s in sections if "." not in s)
    assert top == list(range(1, len(top) + 1)) and len(top) >= 8, top


def test_every_citation_names_an_existing_section():
    sections = _sections()
    cited: dict[str, list[str]] = {}
    for path in _text_files():
        for m in CITATION.finditer(path.read_text(errors="replace")):
            cited.setdefault(m.group(1), []).append(str(path.relative_to(ROOT)))
    missing = {s: files for s, files in cited.items() if s not in sections}
    assert not missing, f"citations of sections docs/design.md does not have: {missing}"
    assert len(cited) >= 3, cited  # the citations exist (the pattern still matches them)


def test_nothing_points_outside_the_repository():
    outside = ("DESIGN" + ".md", "../" + "shared")
    me = Path(__file__).resolve()
    hits = [
        f"{path.relative_to(ROOT)}: {needle}"
        for path in _text_files()
        if path.resolve() != me
        for needle in outside
        if needle in path.read_text(errors="replace")
    ]
    assert not hits, hits
