"""The workload generators: deterministic per seed, and each has the sharing shape it documents
(checked on the token ids, and through the simulator's bound)."""

from __future__ import annotations

import pytest
from recoverssm_rs.checkpoints import TraceRequest, simulate
from recoverssm_rs.checkpoints import workloads as w
from recoverssm_rs.errors import PlanError


def _by_prefix(reqs: list[TraceRequest], tag: str) -> dict[str, list[TraceRequest]]:
    out: dict[str, list[TraceRequest]] = {}
    for r in reqs:
        out.setdefault(r.id.split(tag)[0], []).append(r)
    return out


@pytest.mark.parametrize("name", list(w.WORKLOADS))
def test_deterministic_ordered_and_valid(name):
    a, b = w.generate(name), w.generate(name)
    assert a == b and a, "the same seed gives the same trace"
    assert w.generate(name, seed=1) != a
    assert [r.arrival for r in a] == sorted(r.arrival for r in a)
    assert len({r.id for r in a}) == len(a)
    # The core accepts it as a trace.
    assert simulate(a, "vllm")["requests"] == len(a)


def test_shared_prompt_shape():
    reqs = w.shared_prompt(requests=5, shared=300, suffix=70, output=9)
    head = reqs[0].prompt[:300]
    assert all(r.prompt[:300] == head and len(r.prompt) == 370 and len(r.output) == 9 for r in reqs)
    # Own suffixes differ: the bound of every later request is the shared part floored to 64.
    assert simulate(reqs, "recoverssm", granularity=64)["bound"] == [0, 256, 256, 256, 256]


def test_few_shot_shares_less_than_a_block():
    reqs = w.few_shot(requests=4)
    assert all(r.prompt[:400] == reqs[0].prompt[:400] for r in reqs)
    assert simulate(reqs, "vllm", block_size=1056)["reused_tokens"] == 0
    # The first request's tail save (two chunks before its end) lies within the shared 400 tokens:
    # every later request starts from 384, the bound.
    out = simulate(reqs, "recoverssm")
    assert out["bound"] == [0, 384, 384, 384] and out["reused"] == out["bound"]


@pytest.mark.parametrize(("gen", "tag"), [(w.multi_turn, "t"), (w.agent_loop, "s")])
def test_every_turn_resends_the_previous_one(gen, tag):
    reqs = gen()
    for turns in _by_prefix(reqs, tag).values():
        for prev, cur in zip(turns, turns[1:]):
            history = [*prev.prompt, *prev.output]
            assert cur.prompt[: len(history)] == history and len(cur.prompt) > len(history)


def test_rag_prompts_are_instruction_document_question():
    reqs = w.rag(requests=20, documents=3, instruction=50, document=200)
    docs = {tuple(r.prompt[50:250]) for r in reqs}
    assert len(docs) <= 3 and all(r.prompt[:50] == reqs[0].prompt[:50] for r in reqs)


def test_bad_parameters():
    with pytest.raises(PlanError, match="unknown workload 'x'"):
        w.generate("x")
    with pytest.raises(PlanError, match="rate = 0"):
        w.shared_prompt(rate=0)
