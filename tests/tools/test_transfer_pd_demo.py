"""``scripts/pd_demo.py``: prefill and decode in two processes with different TP sizes, conv layouts and
num_spec, states moved over NIXL, every decode-side state checked against one-instance decoding."""

from __future__ import annotations

import json

import pytest
from recoverssm_dev import pd_demo, pd_demo_cli
from support.transfer_ref import nixl_or_skip

nixl_or_skip()


def _check_summary(s: dict, requests: int) -> None:
    assert "error" not in s, s
    assert s["exit_codes"] == [0, 0]
    assert s["num_mismatches"] == 0 and not s["failed"], pd_demo.format_summary(s)
    assert s["bytes"] > 0 and s["descriptors"] > 0 and s["windows"] >= requests
    assert s["max_state_err"] <= pd_demo.TOLERANCE


def test_pd_demo_has_zero_mismatches():
    """TP2 prefill in SD without speculative columns to TP1 decode in DS with three."""
    cfg = pd_demo.Config(
        requests=4,
        layers=2,
        prefill_tp=2,
        decode_tp=1,
        prefill_layout="SD",
        decode_layout="DS",
        prefill_spec=0,
        decode_spec=3,
        generate=6,
    )
    _check_summary(pd_demo.run(cfg), cfg.requests)


def test_pd_demo_cli_exits_zero_and_prints_the_summary(capfd, tmp_path):
    """The command line, over the other direction: TP1 prefill in DS with two speculative columns to
    TP4 decode in SD with one."""
    path = tmp_path / "s.json"
    rc = pd_demo_cli.main(
        [
            *("--requests", "3", "--layers", "2", "--generate", "5", "--seed", "5"),
            *("--prefill-tp", "1", "--decode-tp", "4", "--prefill-layout", "DS", "--decode-layout", "SD"),
            *("--prefill-spec", "2", "--decode-spec", "1", "--json", str(path)),
        ]
    )
    out, err = capfd.readouterr()  # the child processes' output too
    assert rc == 0, out + err
    assert "mismatches: 0" in out and "descriptors" in out and "not a bandwidth" in out
    assert "GB/s" not in out and "gb_per_s" not in path.read_text()
    assert "NIXL INFO" not in out + err  # NIXL's logging only with --verbose
    assert err.splitlines()[0].startswith("pd-demo: prefill (TP1, pid ")  # progress on stderr
    _check_summary(json.loads(path.read_text()), 3)


def test_the_demo_check_catches_a_wrong_state():
    cfg = pd_demo.Config(requests=1, layers=2, generate=1)
    model = pd_demo._Model(cfg)
    rk = pd_demo._Rank(cfg, model, 2, 1, "DS", 2, 4)
    tokens = [3, 1, 4, 1, 5, 9, 2]
    for layer in range(2):
        rk.run(layer, 2, tokens)
        assert pd_demo._compare(model, rk, layer, 2, tokens) == (True, pytest.approx(0.0, abs=1e-6))
    conv, temporal = rk._tensors(1)
    conv[2, 5, 0] += 1.0
    assert pd_demo._compare(model, rk, 1, 2, tokens)[0] is False
    temporal[2, 0, 0, 0] += 1e-2
    assert pd_demo._compare(model, rk, 1, 2, tokens)[1] > pd_demo.TOLERANCE


def test_pd_demo_parser_follows_the_cli_conventions():
    parser = pd_demo_cli.build_parser()
    for action in parser._actions:
        if action.option_strings:
            assert action.help, action.option_strings
    text = parser.format_help()
    assert "``" not in text and "(default: 16)" in text
    assert "nixl-cu12" in text and "nixl-cu13" not in text  # what the nixl extra installs
