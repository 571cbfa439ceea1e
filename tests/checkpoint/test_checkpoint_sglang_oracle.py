"""The ``sglang-lru`` checkpoint policy against SGLang 0.5.23's own ``UnifiedRadixCache`` (Full and
Mamba components, no extra buffer, page size 1, LRU; see ``tests/support/sglang_checkpoint_oracle.py``),
driven request by request as its scheduler drives it, on random traces whose prompts share
prefixes and extend earlier turns: the model, replayed by ``simulate``, must reuse the same tokens
for every request, with a Mamba pool larger than any trace needs and with a pool of 2-5 slots (the
model's budget: SGLang takes a running request's slot from the same pool, evicting at admission).

Skipped when the wheel cannot be fetched, unless RECOVERSSM_REQUIRE_ORACLE=1 (CI).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recoverssm_rs.checkpoints import TraceRequest, simulate  # noqa: E402
from support import sglang_oracle, vllm_oracle  # noqa: E402
from support.checkpoint_traces import trace  # noqa: E402

ORACLE = Path(__file__).resolve().parents[1] / "support" / "sglang_checkpoint_oracle.py"


def _oracle_available() -> None:
    def check() -> Path:
        try:
            import msgspec  # noqa: F401  (SGLang's cache modules import it)
        except ImportError:
            raise sglang_oracle.OracleUnavailable("msgspec is not installed (the `test` extra has it)") from None
        return sglang_oracle.wheel()

    vllm_oracle.load_or_skip(check, f"SGLang {sglang_oracle.VERSION}")


def _model(case: dict, granularity: int, budget: int | None) -> list[int]:
    reqs = [TraceRequest(str(i), float(i), q["prompt"], q["output"]) for i, q in enumerate(case["requests"])]
    return simulate(reqs, "sglang-lru", granularity=granularity, budget_checkpoints=budget)["reused"]


# SGLang takes a request's slot (evicting the LRU state) before the request runs; when its end turns
# out to be cached already, the slot is freed and the evicted state stays gone: the fourth request
# finds no state for [5, 5, 5].
CACHED_END = {
    "slots": 2,
    "requests": [
        {"prompt": [5, 5, 5], "output": [9]},
        {"prompt": [1, 2, 3], "output": [4]},
        {"prompt": [1, 2, 3], "output": [4]},
        {"prompt": [5, 5, 5, 6], "output": [1]},
    ],
}


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """(cases, SGLang's reuse per case): 40 traces with a pool larger than any needs, 60 with 2-5
    Mamba slots, and :data:`CACHED_END`, replayed in one oracle process."""
    _oracle_available()
    rng = random.Random(20261207)
    cases = [{"slots": None, "requests": trace(rng, rng.randint(2, 14))} for _ in range(40)]
    cases += [{"slots": rng.randint(2, 5), "requests": trace(rng, rng.randint(6, 20))} for _ in range(60)]
    cases.append(CACHED_END)
    path = tmp_path_factory.mktemp("sglang") / "cases.json"
    path.write_text(json.dumps(cases))
    r = subprocess.run(
        [sys.executable, str(ORACLE), str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return cases, [w["reused"] for w in json.loads(r.stdout.strip().splitlines()[-1])]


def test_the_sglang_lru_model_matches_sglangs_radix_cache(replayed):
    cases, got = replayed
    rng = random.Random(7)
    compared = budget_matters = 0
    for case, want in zip(cases, got, strict=True):
        granularity = rng.choice([1, 2, 3, 4])  # the model's index only; hits are token-exact
        model = _model(case, granularity, case["slots"])
        assert model == want, f"{case['slots']} slots, granularity {granularity}, requests {case['requests']}"
        compared += len(model)
        if case["slots"] is not None:
            # One checkpoint more reuses differently somewhere: the budget is the pool's size.
            budget_matters += _model(case, granularity, case["slots"] + 1) != want
    assert sum(map(sum, got)) > 0, "the traces must produce hits to compare"
    assert compared > 1000
    assert budget_matters > 0


def test_a_cached_end_still_costs_an_admission_eviction(replayed):
    cases, got = replayed
    want = got[cases.index(CACHED_END)]
    assert want[3] == 0, "SGLang kept the state of [5, 5, 5]"
    assert _model(CACHED_END, 2, 2) == want
