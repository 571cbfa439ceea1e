"""The README's Python API block runs as written: every fenced block after a ``<!-- doctest -->``
line, in order, in one fresh namespace (the same marker as docs/integration.md)."""

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"<!-- doctest -->\s*\n```python\n(.*?)\n```", re.DOTALL)


def _blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def test_the_api_block_is_marked_and_self_contained():
    text = README.read_text(encoding="utf-8")
    api = text[text.index("## Python API"):text.index("## Command line")]
    (block,) = BLOCK.findall(api)
    assert block.startswith("import numpy as np\n")
    for name in ("Planner", "plan_align", "plan_copy", "StateCache", "conv_verify", "verify(",
                 "commit(", "validate_copy_funcs"):
        assert name in block, name


def test_the_readme_blocks_run(capsys):
    ns: dict = {}
    for i, code in enumerate(_blocks()):
        try:
            exec(compile(code, f"{README.name}[block {i}]", "exec"), ns)  # noqa: S102 (the point of the test)
        except Exception as exc:  # name the failing block
            raise AssertionError(f"README.md block {i} failed: {type(exc).__name__}: {exc}\n{code}") from exc
    out = capsys.readouterr().out
    assert "MemoryReport(" in out
    plan_line = out.splitlines()[1].split()
    assert plan_line[0] == "8" and plan_line[1] == "1"  # 2 layers x 2 requests x 2 states, one wave
