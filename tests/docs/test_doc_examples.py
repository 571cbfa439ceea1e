"""The documents' Python examples run as written: in each document, every fenced block that
follows a ``<!-- doctest -->`` line is executed, in order, in one fresh namespace per document
(README.md's Python API block, docs/integration.md's CPU examples). One runner for every document;
each case checks what its document's blocks print."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- doctest -->\s*\n```python\n(.*?)\n```", re.DOTALL)


def blocks(doc: str) -> list[str]:
    """The marked blocks of ``doc`` (a path relative to the repository root)."""
    return BLOCK.findall((ROOT / doc).read_text(encoding="utf-8"))


def run_blocks(doc: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Runs ``doc``'s marked blocks in one namespace; returns what they printed. A failing block is
    named with its index and code."""
    ns: dict[str, object] = {}
    for i, code in enumerate(blocks(doc)):
        try:
            exec(compile(code, f"{doc}[block {i}]", "exec"), ns)  # noqa: S102 (the point of the test)
        except Exception as exc:
            raise AssertionError(f"{doc} block {i} failed: {type(exc).__name__}: {exc}\n{code}") from exc
    return capsys.readouterr().out


def test_the_readme_api_block_is_marked_and_self_contained():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    api = text[text.index("## Python API") : text.index("## Command line")]
    (block,) = BLOCK.findall(api)
    assert block.startswith("import numpy as np\n")
    for name in (
        "Planner",
        "plan_align",
        "plan_copy",
        "StateCache",
        "conv_verify",
        "verify(",
        "commit(",
        "validate_copy_funcs",
    ):
        assert name in block, name


def test_the_guide_has_runnable_examples():
    assert len(blocks("docs/integration.md")) >= 6


def test_the_readme_blocks_run(capsys):
    out = run_blocks("README.md", capsys)
    assert "MemoryReport(" in out
    plan_line = out.splitlines()[1].split()
    assert plan_line[0] == "8" and plan_line[1] == "1"  # 2 layers x 2 requests x 2 states, one wave


def test_the_guides_examples_run(capsys):
    out = run_blocks("docs/integration.md", capsys)
    assert "num_accepted = 9 is outside" in out  # the PlanError the guide prints
    assert "GDN_ATTN" in out
    assert "request c (row 2): prefix-cache hit of 8 computed tokens" in out  # the vLLM section
    assert "SglangMambaPool(slots=7, layers=2" in out and "PlanError - " in out  # the SGLang section
    assert "[-1, 1] [1, 1]" in out  # the GPU-resident runner's slots
    assert "1 request moved" in out and "on_disk=1" in out and "hits=1" in out  # transfer and offload
