"""``recoverssm simulate``, :func:`recoverssm_rs.checkpoints.simulate` and :class:`CheckpointCache`:
the figures on traces whose outcome is known by hand, the JSON fields, and every kind of bad input
(named by line or flag, exit status 1 or 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recoverssm_rs.checkpoints import CheckpointCache, TraceRequest, read_trace, simulate, write_trace
from recoverssm_rs.errors import PlanError
from recoverssm_rs.tools.cli import main

FIELDS = {
    "policy",
    "requests",
    "prompt_tokens",
    "reused_tokens",
    "hit_requests",
    "checkpoint_writes",
    "peak_checkpoints",
}


def _three_sharing(shared: int = 1500, own: int = 800) -> list[TraceRequest]:
    system = list(range(shared))
    return [
        TraceRequest(f"r{i}", float(i), system + [10**6 * (i + 1) + t for t in range(own)], [5, 6]) for i in range(3)
    ]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(path, _three_sharing())
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(["simulate", *argv])
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("policy", "reused", "hits"),
    [
        # vLLM 0.33: the junction found by the second request, saved at its block, used by the third.
        ("vllm", 1056, 1),
        # At 64-token chunks the third request starts from 1,472 of the 1,500 shared tokens.
        ("recoverssm", 1472, 1),
        # Marconi saves the exact branch point.
        ("marconi", 1500, 1),
        # States only at request ends: nothing here is a prefix of a later prompt.
        ("sglang-lru", 0, 0),
    ],
)
def test_json_figures_on_a_shared_prefix(capsys, trace, policy, reused, hits):
    rc, out, _ = _run(capsys, str(trace), "--policy", policy, "--json")
    assert rc == 0
    doc = json.loads(out)
    assert FIELDS <= set(doc)
    assert doc["policy"] == policy
    assert (doc["requests"], doc["prompt_tokens"]) == (3, 3 * 2300)
    assert (doc["reused_tokens"], doc["hit_requests"]) == (reused, hits)
    assert doc["upper_bound_tokens"] == 2 * 1472


def test_text_report_and_all_policies(capsys, trace):
    rc, out, _ = _run(capsys, str(trace), "--policy", "all", "--budget-bytes", "4096", "--state-bytes", "1024")
    assert rc == 0
    rows = out.strip().splitlines()
    assert rows[0].split()[0] == "policy" and [r.split()[0] for r in rows[1:]] == [
        "vllm",
        "sglang-lru",
        "marconi",
        "recoverssm",
    ]
    for row in rows[1:]:
        assert int(row.split()[-1]) <= 4, "peak within the 4 checkpoints the bytes hold"


def test_a_budget_limits_the_checkpoints_held():
    reqs = _three_sharing()
    free = simulate(reqs, "recoverssm")
    tight = simulate(reqs, "recoverssm", budget_checkpoints=1)
    assert free["peak_checkpoints"] > 1 and tight["peak_checkpoints"] == 1
    assert tight["evictions"] > 0
    assert simulate(reqs, "recoverssm", budget_bytes=10, state_bytes=3)["budget_checkpoints"] == 3


def test_a_later_turn_starts_from_the_previous_turn_end():
    t1 = TraceRequest("a", 0.0, list(range(2612)), list(range(5000, 5100)))
    t2 = TraceRequest("b", 1.0, [*t1.prompt, *t1.output, *range(9000, 9050)], [1])
    assert simulate([t1, t2], "recoverssm")["reused"] == [0, 2711]
    assert simulate([t1, t2], "sglang-lru")["reused"] == [0, 2711]
    assert simulate([t1, t2], "vllm")["reused"] == [0, 2112]


def test_cache_class_request_by_request():
    c = CheckpointCache("recoverssm", block_size=16, granularity=4)
    p = list(range(10))
    plan = c.plan(p)
    assert (plan.hit_position, plan.hit_handle, plan.saves) == (0, None, [8])
    written, evicted = c.finish(p, [99, 98], plan)
    assert [pos for pos, _ in written] == [8, 11] and evicted == []
    again = c.plan([*p, 99, 7])
    assert again.hit_position == 11 and c.position(again.hit_handle) == 11
    assert len(c) == 2 and "recoverssm" in repr(c) and "hit_position=11" in repr(again)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "trace line 2: not valid JSON"),
        ("[1, 2]", "trace line 2: must be a JSON object"),
        ('{"id": "x", "arrival": 1, "output": []}', 'trace line 2: "prompt" is missing'),
        (
            '{"id": "x", "arrival": 1, "prompt": [1, -3], "output": []}',
            'trace line 2: "prompt" must be a list of token ids',
        ),
        ('{"id": "x", "arrival": 1, "prompt": [], "output": []}', "trace line 2 (request 'x'): \"prompt\" must hold"),
        ('{"id": "x", "arrival": "soon", "prompt": [1], "output": []}', 'trace line 2: "arrival" must be a number'),
        ('{"id": "r0", "arrival": 1, "prompt": [1], "output": []}', "trace line 2: request id 'r0' repeats line 1"),
        ('{"id": "x", "arrival": -1, "prompt": [1], "output": []}', "must be a finite number >= 0"),
    ],
)
def test_bad_trace_lines_are_named(capsys, tmp_path, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "r0", "arrival": 0.5, "prompt": [1, 2], "output": [3]}\n' + line + "\n")
    with pytest.raises(PlanError, match="trace line 2"):
        read_trace(path)
    rc, _, err = _run(capsys, str(path))
    assert rc == 1
    assert err.count("\n") == 1 and "PlanError" in err and needle in err, err


def test_arrivals_out_of_order_are_refused(tmp_path):
    reqs = [TraceRequest("a", 2.0, [1]), TraceRequest("b", 1.0, [1])]
    with pytest.raises(PlanError, match="line 2 .*before the previous request's 2"):
        simulate(reqs, "vllm")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--policy", "lru"], "argument --policy: invalid value 'lru'"),
        (["--block-size", "0"], "argument --block-size: invalid value 0"),
        (["--granularity", str(2**40)], "argument --granularity"),
        (["--granularity", "-1"], "argument --granularity"),
        (["--budget-checkpoints", "0"], "argument --budget-checkpoints: invalid value 0"),
        (["--budget-bytes", "100"], "argument --budget-bytes"),
        (["--state-bytes", "100"], "argument --state-bytes"),
        (["--budget-bytes", "10", "--state-bytes", "100"], "argument --budget-bytes: invalid value 10"),
        (["--budget-bytes", "10", "--state-bytes", "0"], "argument --state-bytes: invalid value 0"),
    ],
)
def test_bad_flags_are_named(capsys, trace, argv, flag):
    rc, out, err = _run(capsys, str(trace), *argv)
    assert rc == 2 and out == ""
    assert flag in err and err.count("\n") == 1, err


def test_missing_trace_file(capsys, tmp_path):
    rc, _, err = _run(capsys, str(tmp_path / "none.jsonl"))
    assert rc == 1 and "cannot read trace" in err


def test_several_traces_and_the_plot(capsys, tmp_path, trace):
    pytest.importorskip("matplotlib")
    other = tmp_path / "turns.jsonl"
    first = TraceRequest("a", 0.0, list(range(300)), list(range(900, 940)))
    write_trace(other, [first, TraceRequest("b", 1.0, [*first.prompt, *first.output, 7, 8, 9], [1])])
    png, doc = tmp_path / "out.png", tmp_path / "runs.json"
    rc, out, err = _run(
        capsys, str(trace), str(other), "--policy", "vllm,sglang-lru", "--plot", str(png), "--json", str(doc)
    )
    assert rc == 0, err
    runs = json.loads(doc.read_text())
    assert [(Path(r["trace"]).name, r["policy"]) for r in runs] == [
        ("t.jsonl", "vllm"),
        ("t.jsonl", "sglang-lru"),
        ("turns.jsonl", "vllm"),
        ("turns.jsonl", "sglang-lru"),
    ]
    assert runs[3]["reused_tokens"] == 339, "the second turn starts from the first turn's end"
    header = out.splitlines()[0]
    assert header.split()[:2] == ["trace", "policy"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    rc, _, err = _run(capsys, str(trace), "--plot", str(tmp_path / "no" / "such" / "dir.png"))
    assert rc == 2 and "argument --plot" in err and "does not exist" in err
    rc, _, err = _run(capsys, str(trace), "--plot", str(tmp_path / "plot.txt"))
    assert rc == 2 and "must end in .png, .svg or .pdf" in err
