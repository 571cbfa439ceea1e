"""The end-to-end demo (``python -m recoverssm_rs demo``): a short run agrees with the
token-by-token ground truth, its counters show that every path ran, and its checks do catch a
broken copy or commit."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from recoverssm_rs.errors import LayoutError
from recoverssm_rs.speculative.state_cache import StateCache
from recoverssm_rs.tools import cli, demo

SMALL = dict(steps=16, requests=6, seed=0)


@pytest.fixture(scope="module")
def small_run():
    lines: list[str] = []
    summary = demo.run(**SMALL, progress=lines.append, progress_every=4)
    return summary, lines


def test_small_run_matches_the_ground_truth(small_run):
    s, _ = small_run
    assert s["mismatches"] == 0, s["first_mismatches"]
    assert s["first_mismatches"] == []
    assert s["checks"] > 1000
    assert s["max_state_err"] <= s["tolerance"] == demo.TOLERANCE
    assert s["max_output_err"] <= s["tolerance"]
    assert s["max_conv_err"] == 0.0  # conv windows and copies are bit-exact


def test_small_run_exercises_every_path(small_run):
    s, _ = small_run
    assert s["steps"] == SMALL["steps"]
    assert s["tokens_accepted"] > 0 and s["prefill_tokens"] > 0
    assert s["decode_windows"] > 0
    assert 1.0 <= s["mean_accepted_per_window"] <= s["config"]["window"]
    assert sum(s["accepted_histogram"]) == s["decode_windows"]
    assert s["accepted_histogram"][0] > 0 and s["accepted_histogram"][-1] > 0  # none / all
    assert s["cache_hits"] > 0 and s["hit_tokens"] > 0
    assert s["forks"] > 0
    assert s["plan_copy_copies"] > 0 and s["copy_blocks_calls"] > 0
    assert s["commits"] > 0
    assert s["boundary_states"] > 0 and s["prefix_cache_registered"] > 0
    assert s["boundary_layer_states"] == s["boundary_states"] * 2 * s["config"]["layers_per_kind"]
    assert s["requests_served"] >= SMALL["requests"] - 2
    assert s["step_ms_median"] > 0


def test_summary_reports_memory_and_is_json(small_run):
    s, lines = small_run
    doc = json.loads(json.dumps(s))
    pm = doc["memory"]["preset"]
    assert pm["preset"] == "kimi-k3-like-recoverssm" and pm["num_layers"] == 48
    records = 48 * 32 * 8 * (128 * 4 + 256 * 2)  # fp32 corrections + bf16 key+gate
    conv = 48 * 12288 * 10 * 2  # the verified conv window, bf16 [dim, K - 1 + num_spec]
    full = 48 * 8 * 32 * 128 * 128 * 4
    assert pm["record_bytes_per_request"] == records
    assert pm["conv_window_bytes_per_request"] == conv
    assert pm["workspace_bytes_per_request"] == records + conv
    assert pm["full_state_scratch_bytes_per_request"] == full
    assert pm["record_ratio"] == 64.0 and pm["ratio"] == full / (records + conv)
    assert pm["requests"] == 256
    # the per-layer, per-request figures are StateCache.memory_report's
    per = pm["per_layer_and_request"]
    assert per["record_bytes_per_request"] * 48 == records
    assert per["workspace_bytes_per_request"] * 48 == records + conv
    assert per["full_state_scratch_bytes"] * 48 == full
    for kind in ("gdn", "kda"):
        m = doc["memory"]["run"][kind]
        assert 0 < m["workspace_bytes"] < m["full_state_scratch_bytes"]
    # progress went through the callback (every 4 steps + the header), not to stdout
    assert len(lines) == 1 + SMALL["steps"] // 4
    assert lines[0].startswith("run: a toy hybrid model of 4 layers")
    assert lines[-1].startswith(f"step {SMALL['steps']:4d}/{SMALL['steps']}")
    text = demo.format_summary(s)
    assert "mismatches            0" in text and "plan_copy copies" in text
    assert "summary of the run (the toy model: 4 layers" in text
    assert "preset kimi-k3-like-recoverssm, 48 layers" in text and "not run" in text


def test_last_progress_line_counts_every_check(small_run):
    s, lines = small_run
    last = lines[-1]
    assert f" {s['checks']} checks, {s['mismatches']} mismatches" in last, (last, s["checks"])
    # the cached prefix blocks are re-checked after the last step; the line comes after them
    assert f"incl. {s['prefix_cache_entries_at_end']} cached prefix blocks re-checked" in last
    assert s["prefix_cache_entries_at_end"] > 0
    earlier = [int(x.split(" checks")[0].rsplit(" ", 1)[1]) for x in lines[1:]]
    assert earlier == sorted(earlier) and earlier[-1] == s["checks"]


def test_other_shapes_and_seeds():
    # block_size == Q (a boundary may fall at every window's end), 1 layer per kind, 2 drafts
    s = demo.run(steps=12, requests=3, layers=1, num_spec=2, block_size=3, seed=3)
    assert s["mismatches"] == 0, s["first_mismatches"]
    assert s["boundary_states"] > 0 and s["tokens_accepted"] > 0
    assert s["config"]["window"] == 3


def test_same_seed_same_run():
    a = demo.run(steps=6, requests=4, seed=11)
    b = demo.run(steps=6, requests=4, seed=11)
    keys = [
        "tokens_accepted",
        "prefill_tokens",
        "cache_hits",
        "forks",
        "boundary_states",
        "plan_copy_copies",
        "accepted_histogram",
        "checks",
    ]
    assert [a[k] for k in keys] == [b[k] for k in keys]


def test_bad_arguments():
    # the block size against the window is the core's rule: its message comes through
    with pytest.raises(demo.DemoOptionError, match="smaller than the speculative window") as e:
        demo.run(steps=1, block_size=2, num_spec=3)
    assert e.value.option == "block_size" and e.value.value == 2
    assert isinstance(e.value, ValueError)
    from recoverssm_rs.tools.demo.config import MAX_STEPS

    for steps in (0, MAX_STEPS + 1, 10**23):  # bounded: a run ends
        with pytest.raises(demo.DemoOptionError, match=f"must be from 1 to {MAX_STEPS} inclusive") as e:
            demo.run(steps=steps)
        assert e.value.option == "steps" and e.value.value == steps
    with pytest.raises(demo.DemoOptionError, match="not a RecoverSSM preset") as e:
        demo.run(steps=1, preset="nemotron-h-8b")
    assert e.value.option == "preset" and "kimi-k3-like-recoverssm" in str(e.value)
    with pytest.raises(demo.DemoOptionError) as e:
        demo.run(steps=1, seed=-1)
    assert e.value.option == "seed"


def test_recoverssm_presets_come_from_the_core():
    from recoverssm_rs import layouts

    names = demo.recoverssm_presets()
    assert names == ["kimi-k3-like-recoverssm"]
    for name in layouts.PRESETS:
        if name not in names:  # the core refuses it as a RecoverSSM layout
            with pytest.raises(LayoutError):
                layouts.PRESETS[name].layout().recover_geometry()


# ---- the checks have teeth -------------------------------------------------------------------


def test_a_copy_that_does_nothing_is_caught(monkeypatch):
    monkeypatch.setattr(StateCache, "copy_blocks", lambda self, src, dst: 0)
    s = demo.run(**SMALL)
    assert s["mismatches"] > 0
    assert any("copy from block" in m for m in s["first_mismatches"])


def test_a_commit_of_one_token_too_few_is_caught(monkeypatch):
    commit = StateCache.commit

    def short(self, n, *args, **kw):
        return commit(self, np.maximum(np.asarray(n) - 1, 1), *args, **kw)

    monkeypatch.setattr(StateCache, "commit", short)
    s = demo.run(steps=4, requests=4, seed=0)
    assert s["mismatches"] > 0


def test_a_commit_without_boundary_states_is_caught(monkeypatch):
    commit = StateCache.commit
    monkeypatch.setattr(StateCache, "commit", lambda self, n, sb, ql=None, **kw: commit(self, n, sb, ql))
    s = demo.run(**SMALL)
    assert s["mismatches"] > 0
    assert any("commit plan boundaries" in m for m in s["first_mismatches"])


def test_cli_exits_1_on_a_mismatch(monkeypatch, capsys):
    monkeypatch.setattr(StateCache, "copy_blocks", lambda self, src, dst: 0)
    assert cli.main(["demo", "--steps", "8", "--requests", "6", "--json", "--quiet"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["mismatches"] > 0


# ---- the command line ------------------------------------------------------------------------


def test_cli_json_subprocess():
    r = subprocess.run(
        [sys.executable, "-m", "recoverssm_rs", "demo", "--json", "--steps", "8"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout holds only the JSON summary
    assert doc["steps"] == 8 and doc["mismatches"] == 0
    assert doc["config"]["device"] == "cpu"
    assert doc["tokens_accepted"] > 0 and doc["boundary_states"] > 0
    assert "step    8/8" in r.stderr  # progress on stderr
    # the last progress line counts the same checks as the summary
    assert f" {doc['checks']} checks, 0 mismatches" in r.stderr.splitlines()[-1]


def test_the_demo_package_imports_neither_the_cli_nor_torch():
    # the command line imports the demo's parser; the demo never imports the command line (no
    # cycle), and parsing needs no torch
    code = (
        "import sys, recoverssm_rs.tools.demo, recoverssm_rs.tools.demo.cli; "
        "print('recoverssm_rs.tools.cli' in sys.modules, 'torch' in sys.modules); "
        "import recoverssm_rs.tools.cli; print('torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "False"]


def test_cli_text_summary(capsys):
    assert cli.main(["demo", "--steps", "6", "--requests", "4", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "kimi-k3-like-recoverssm" in out and "GDN_ATTN" in out  # the layout header
    # which table is the preset (not run) and which figures are the run (the toy model)
    assert out.startswith("preset kimi-k3-like-recoverssm (") and "not run" in out.splitlines()[0]
    assert "summary of the run (the toy model: 4 layers" in out
    assert "mismatches            0" in out and "OK:" in out


def test_cli_layout_only(capsys):
    assert cli.main(["demo", "--layout-only"]) == 0
    out = capsys.readouterr().out
    assert "verify_keygate" in out and "copyable prefix 2" in out


def test_cli_json_file_keeps_the_text_summary(capsys, tmp_path):
    path = tmp_path / "summary.json"
    assert cli.main(["demo", "--steps", "3", "--requests", "3", "--quiet", "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "OK: every state matched" in out and err == ""  # --quiet: no progress
    doc = json.loads(path.read_text())
    assert doc["steps"] == 3 and doc["mismatches"] == 0


def test_run_bytes_is_what_the_state_caches_allocate():
    from recoverssm_rs.tools.demo.config import run_bytes
    from recoverssm_rs.tools.demo.engine import Engine

    opts = dict(requests=3, layers=2, block_size=5, num_spec=2)
    engine = Engine(device="cpu", steps=1, seed=0, **opts)
    reports = [c.memory_report() for c in engine.caches.values()]
    # the pools twice (the oracle's reference copies), the workspace once
    assert run_bytes(**opts) == sum(2 * m.pool_bytes + m.workspace_bytes for m in reports)


def test_a_run_too_large_for_memory_is_refused_before_it_starts():
    with pytest.raises(demo.DemoOptionError, match="more than the .* of memory available") as e:
        demo.run(steps=1, layers=10**8)
    assert e.value.option == "layers" and e.value.value == 10**8
    with pytest.raises(demo.DemoOptionError, match="num_blocks must be in") as e:
        demo.run(steps=1, requests=10**12)
    assert e.value.option == "requests"
