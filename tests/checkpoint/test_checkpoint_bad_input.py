"""What a serving engine may hand the checkpoint cache by mistake: token ids that are bools or a
bytes object (each byte read as a token), a policy that is not a string, a trace file that is not
UTF-8. Each is the package's error naming what is wrong, and changes nothing."""

from __future__ import annotations

import array
import re

import numpy as np
import pytest
from recoverssm_rs import PlanError
from recoverssm_rs.checkpoints import CheckpointCache, TraceRequest, read_trace, simulate

PROMPT = list(range(12))


def _cache() -> CheckpointCache:
    cache = CheckpointCache("recoverssm", block_size=8, granularity=4)
    cache.finish(PROMPT, [5, 6], cache.plan(PROMPT))
    return cache


@pytest.mark.parametrize(
    ("tokens", "needle"),
    [
        ([True, False, True], r"item 0 is True"),
        ([1, 2, True], r"item 2 is True"),
        ((1, False), r"item 1 is False"),
        (b"\x01\x02\x03", r"got bytes"),
        (bytearray(b"\x01\x02"), r"got bytearray"),
        (array.array("I", [1, 2]).tobytes(), r"got bytes"),
        (np.array([1, -1]), r"item 1 is (np\.int64\()?-1"),
        (np.array([1.5, 2.0]), r"item 0 is (np\.float64\()?1\.5"),
        ((1, 2**32), r"item 1 is 4294967296"),
    ],
    ids=[
        "bools",
        "trailing-bool",
        "bool-in-tuple",
        "bytes",
        "bytearray",
        "packed-u32",
        "np-negative",
        "np-float",
        "tuple-big",
    ],
)
def test_token_ids_that_are_not_ints_are_refused_naming_the_item(tokens, needle):
    cache = _cache()
    live = len(cache)
    for call in (cache.plan, cache.peek):
        with pytest.raises(PlanError, match=r"prompt must be a list of token ids.*" + needle):
            call(tokens)
    with pytest.raises(PlanError, match=r"output must be a list of token ids.*" + needle):
        cache.finish(PROMPT, tokens, cache.plan(PROMPT))
    with pytest.raises(PlanError, match=r"trace line 1: \"prompt\" must be a list of token ids.*" + needle):
        simulate([_Req(tokens)], "vllm")
    assert len(cache) == live


class _Req:
    """A request as :func:`simulate` reads it (not through ``TraceRequest``, which copies)."""

    def __init__(self, prompt):
        self.id, self.arrival, self.prompt, self.output = "r", 0.0, prompt, []


def test_int_sequences_of_every_kind_are_token_ids():
    cache = _cache()
    want = cache.peek(PROMPT + [5])
    assert want is not None
    for tokens in (PROMPT + [5], tuple(PROMPT + [5]), np.array(PROMPT + [5], dtype=np.uint32), range(13)):
        got = cache.peek(tokens if not isinstance(tokens, range) else list(PROMPT) + [5])
        assert got == want, tokens


@pytest.mark.parametrize("policy", [None, 3, b"vllm", ["vllm"]])
def test_a_policy_that_is_not_a_string_is_a_plan_error(policy):
    with pytest.raises(PlanError, match=r"policy must be one of vllm, sglang-lru, marconi, recoverssm; got "):
        CheckpointCache(policy)
    with pytest.raises(PlanError, match=r"policy must be one of"):
        simulate([_Req([1, 2])], policy)


def test_reprs_read_as_python():
    cache = CheckpointCache("vllm", budget=3)
    assert "budget=3," in repr(cache) and "Some" not in repr(cache)
    assert "budget=None," in repr(CheckpointCache("vllm"))
    plan = _cache().plan(PROMPT + [5, 9])
    assert "Some" not in repr(plan) and f"hit_handle={plan.hit_handle}," in repr(plan)
    assert "hit_handle=None," in repr(CheckpointCache("vllm").plan([1, 2]))


def test_a_trace_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        b'{"id":"a","arrival":0,"prompt":[1,2],"output":[]}\n{"id":"b\xff","arrival":1,"prompt":[1,2],"output":[]}\n'
    )
    for call in (read_trace, lambda p: simulate(p, "vllm")):
        with pytest.raises(PlanError, match=r"trace line 2: not valid UTF-8 \(byte 0xff at column 9\)"):
            call(path)


# ---- a request's end that does not match its plan ------------------------------------------------


def _snapshot(cache: CheckpointCache) -> tuple:
    """What a misused finish must leave as it was: the live checkpoints and the next hits."""
    return len(cache), repr(cache), [cache.peek(p) for p in (PROMPT + [5], PROMPT + [5, 6, 1], [9, 9, 9])]


@pytest.mark.parametrize("policy", ["vllm", "sglang-lru", "marconi", "recoverssm"])
def test_a_request_finished_twice_is_refused_and_changes_nothing(policy):
    cache = CheckpointCache(policy, block_size=4, granularity=2, budget=3)
    plan = cache.plan(PROMPT)
    cache.finish(PROMPT, [5, 6], plan)
    before = _snapshot(cache)
    with pytest.raises(PlanError, match=r"this plan was already finished"):
        cache.finish(PROMPT, [5, 6], plan)
    assert _snapshot(cache) == before


def test_a_plan_of_another_cache_is_refused():
    ours, theirs = CheckpointCache("recoverssm", block_size=8, granularity=4), _cache()
    plan = theirs.plan(PROMPT + [5, 9])
    assert plan.hit_handle is not None
    before = _snapshot(ours)
    with pytest.raises(PlanError, match=r"the plan was made by another cache"):
        ours.finish(PROMPT + [5, 9], [1], plan)
    assert _snapshot(ours) == before
    theirs.finish(PROMPT + [5, 9], [1], plan)


@pytest.mark.parametrize("prompt", [PROMPT[:5], PROMPT + [5, 1]], ids=["shorter", "longer"])
def test_a_finish_with_another_prompt_than_planned_is_refused(prompt):
    cache = _cache()
    plan = cache.plan(PROMPT + [5])
    before = _snapshot(cache)
    with pytest.raises(PlanError, match=rf"the plan was made for a prompt of 13 tokens; this one has {len(prompt)}"):
        cache.finish(prompt, [1], plan)
    assert _snapshot(cache) == before
    cache.finish(PROMPT + [5], [1], plan)


def test_a_trace_line_nested_too_deeply_names_its_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text('{"id":"a","arrival":0,"prompt":[1],"output":[]}\n{"id":"b","arrival":0,"prompt":' + deep + "}\n")
    for call in (read_trace, lambda p: simulate(p, "vllm")):
        with pytest.raises(PlanError, match=r"trace line 2: not valid JSON \(nested too deeply\)"):
            call(path)


# A configuration parameter refused at 0 as well as below: a negative value is answered with the
# parameter's real rule (never "must be >= 0", which 0 does not meet either).
POSITIVE = [
    ("block_size", {}, r"block_size = {v} tokens must be in 1\.\.=1048576"),
    ("granularity", {}, r"granularity = {v} tokens must be in 1\.\.=1048576"),
    ("budget", {}, r"budget = {v} checkpoints must be in 1\.\.=4294967296"),
    ("state_bytes", {"budget_bytes": 10}, r"state_bytes = {v}: one checkpoint's size must be >= 1 byte"),
    ("budget_bytes", {"state_bytes": 2}, r"budget_bytes = {v} .*must be >= state_bytes"),
]


@pytest.mark.parametrize(("name", "others", "rule"), POSITIVE, ids=[p[0] for p in POSITIVE])
@pytest.mark.parametrize("value", [0, -5, np.int64(-5), -(2**70)], ids=["zero", "negative", "numpy", "huge"])
def test_a_positive_parameter_states_its_rule_for_zero_and_negative_values(name, others, rule, value):
    pattern = rule.format(v=re.escape(str(value)))
    with pytest.raises(PlanError, match=pattern) as cache_error:
        CheckpointCache("vllm", **{name: value}, **others)
    assert ">= 0" not in str(cache_error.value)
    kwargs = {"budget_checkpoints" if name == "budget" else name: value, **others}
    with pytest.raises(PlanError, match=pattern):
        simulate([TraceRequest("a", 0.0, [1, 2], [3])], "vllm", **kwargs)


def test_token_ids_as_a_tensor_or_a_generator_are_read_and_a_set_is_refused():
    """An ordered run of ints is token ids whatever holds it (a torch tensor, a numpy array, a
    generator); a set or a dict has no order, and is refused naming its type."""
    import numpy as np
    import torch
    from recoverssm_rs.checkpoints import TraceRequest, simulate

    rows = [
        TraceRequest("a", 0.0, torch.arange(1, 9), [4]),
        TraceRequest("b", 1.0, np.arange(1, 9), (t for t in [4])),
    ]
    result = simulate(rows, "recoverssm", block_size=8, granularity=4)
    again = simulate(
        [TraceRequest("a", 0.0, list(range(1, 9)), [4]), TraceRequest("b", 1.0, list(range(1, 9)), [4])],
        "recoverssm",
        block_size=8,
        granularity=4,
    )
    assert result == again and result["reused_tokens"] > 0
    for unordered in ({1, 2, 3}, {1: 0, 2: 0}):
        with pytest.raises(PlanError, match=rf"must be a list of token ids .*got {type(unordered).__name__}"):
            simulate([TraceRequest("a", 0.0, unordered, [4])], "recoverssm", block_size=8, granularity=4)
