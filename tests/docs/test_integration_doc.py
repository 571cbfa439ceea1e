"""The CPU examples of docs/integration.md run as written: every fenced block that follows a
``<!-- doctest -->`` line is executed, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "integration.md"
BLOCK = re.compile(r"<!-- doctest -->\s*\n```python\n(.*?)\n```", re.S)


def test_the_guide_has_runnable_examples():
    assert len(BLOCK.findall(DOC.read_text(encoding="utf-8"))) >= 6


def test_the_guides_examples_run(capsys):
    ns: dict = {}
    for i, code in enumerate(BLOCK.findall(DOC.read_text(encoding="utf-8"))):
        try:
            exec(compile(code, f"{DOC.name}[block {i}]", "exec"), ns)
        except Exception as exc:  # name the failing block
            raise AssertionError(f"docs/integration.md block {i} failed: {type(exc).__name__}: {exc}\n{code}") from exc
    out = capsys.readouterr().out
    assert "num_accepted = 9 is outside" in out  # the PlanError the guide prints
    assert "GDN_ATTN" in out
    assert "request c (row 2): prefix-cache hit of 8 computed tokens" in out  # the vLLM section
