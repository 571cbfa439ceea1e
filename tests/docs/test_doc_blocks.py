"""Every Python block of the documents says what it is: an example that runs (``<!-- doctest -->``,
run by test_doc_examples.py) or an excerpt of an engine's code that does not run alone
(``<!-- excerpt -->``, with a first line saying so); an excerpt is still valid Python."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(doc: str) -> list[tuple[str, str]]:
    """``(marker, code)`` per Python block of ``doc``: the marker is the line before the fence."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        out.append((before, m.group(1)))
    return out


def test_the_block_reader_finds_both_kinds():
    kinds = {marker for doc in DOCS for marker, _ in python_blocks(doc)}
    assert {"<!-- doctest -->", "<!-- excerpt -->"} <= kinds


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_block_is_an_example_or_a_marked_excerpt(doc):
    for i, (marker, code) in enumerate(python_blocks(doc)):
        assert marker in ("<!-- doctest -->", "<!-- excerpt -->"), (
            f"{doc} block {i} is neither marked <!-- doctest --> (run by the tests) nor "
            f"<!-- excerpt --> (not runnable alone):\n{code}"
        )
        if marker == "<!-- excerpt -->":
            assert code.startswith("# Excerpt, not runnable alone: "), f"{doc} block {i}: say why on its first line"
            compile(code, f"{doc}[block {i}]", "exec")  # valid Python, even if it does not run alone
