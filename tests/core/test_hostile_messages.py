"""How the core's messages write ranges: inclusive, with the computed bound, as ``lo ..= hi``
(``0 ..= 9`` for a pool of 10 blocks), never ``0..10`` (read as exclusive by some and inclusive
by others). Checked on the core's sources -- every string literal of ``rust/`` -- and on a few
live refusals."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import recoverssm_rs as rs

RUST = Path(__file__).resolve().parents[2] / "rust"
#: A range written without ``=``: ``0..10``, ``1..{n}``, ``{a}..{b}``, ``x .. y`` (not ``...``).
EXCLUSIVE = re.compile(r"(?:\w|\}|\))\s?\.\.(?![.=])\s?(?:\w|\{)")


def _literals(src: str) -> Iterator[str]:
    """The string literals of Rust source ``src`` (comments and char literals skipped)."""
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i)
            i = n if j < 0 else j + 2
        elif (
            c == "r"
            and (m := re.match(r'r(#*)"', src[i:]))
            and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_"))
        ):
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            yield src[i + len(m.group(0)) : j]
            i = j + len(end)
        elif c == "'" and (m := re.match(r"'(\\.|[^\\'])'", src[i:])):
            i += len(m.group(0))
        elif c == '"':
            j = i + 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            yield src[i + 1 : j]
            i = j + 1
        else:
            i += 1


def test_the_scanner_finds_an_exclusive_range():
    src = 'let a = &v[0..n]; // 0..2\nformat!("id {id} is outside 0..{n}"); format!("1 ..= {n}"); f("...")'
    found = [s for s in _literals(src) if EXCLUSIVE.search(s)]
    assert found == ["id {id} is outside 0..{n}"]


def test_no_message_of_the_core_writes_an_exclusive_range():
    files = sorted(RUST.rglob("*.rs"))
    assert len(files) > 50, f"the core's sources are not at {RUST}"
    bad = [f"{p.relative_to(RUST)}: {s!r}" for p in files for s in _literals(p.read_text()) if EXCLUSIVE.search(s)]
    assert not bad, "ranges are written inclusive, lo ..= hi:\n" + "\n".join(bad)


def test_refusals_name_the_inclusive_range_with_the_computed_bound():
    layout = rs.Layout("X", [rs.StateSpec("t", (4,), "float32", copy="temporal")], num_spec=1)
    planner = rs.Planner(layout, [[np.zeros((10, 4), np.float32)]], block_size=4)
    with pytest.raises(rs.PlanError, match=r"source block id 10 is outside 0 \.\.= 9$"):
        planner.plan_copy([10], [2])
    table = np.array([[1, 12]], np.int64)
    with pytest.raises(rs.PlanError, match=r"block id 12 \(column 1\) is outside 0 \.\.= 9$"):
        planner.plan_align(table, np.array([0]), np.array([1]), np.array([1]))


def test_sglang_refusals_name_the_pool_s_slots_inclusive():
    torch = pytest.importorskip("torch")
    from recoverssm_rs.sglang import SglangMambaPool

    pool = SglangMambaPool([torch.zeros(1, 8, 4, 3)], torch.zeros(1, 8, 2, 3, 3))
    with pytest.raises(rs.PlanError, match=r"indices\[0\] = 8 is outside the pool's slots 1 \.\.= 7$"):
        pool.clear_slots([8])
    with pytest.raises(rs.PlanError, match=r"slots are 1 \.\.= 7$"):
        pool.clear_slots([-2])
