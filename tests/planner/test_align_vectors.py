"""Conformance: every align-copy vector produced by vLLM 0.33's own kernels (tests/data/
align_copy.npz; both conv orientations, cross-block copies and in-block shifts) is reproduced
byte for byte by a plan executed with the host executor."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import Layout, StateSpec  # noqa: E402
from recoverssm_rs.planner import Planner  # noqa: E402

DATA = np.load(Path(__file__).parents[1] / "data" / "align_copy.npz")
CASES = range(int(DATA["num_cases"]))


def field(i, name):
    return DATA[f"case{i}_{name}"]


@pytest.mark.parametrize("i", CASES)
def test_vector(i):
    orientation = str(field(i, "orientation"))
    conv0 = field(i, "layer0_conv_before")
    temp0 = field(i, "layer0_temporal_before")
    width = conv0.shape[1] if orientation == "SD" else conv0.shape[2]
    layout = Layout(
        "GDN_ATTN",
        [
            StateSpec("conv", conv0.shape[1:], "bfloat16", "persistent", "conv", orientation),
            StateSpec("temporal", temp0.shape[1:], "float32", "persistent", "temporal"),
        ],
        num_spec=width - 1,
    )
    layers = [0, 1]
    states = [
        [
            torch.from_numpy(field(i, f"layer{l}_conv_before").copy()).to(torch.bfloat16),
            torch.from_numpy(field(i, f"layer{l}_temporal_before").copy()),
        ]
        for l in layers
    ]
    planner = Planner(layout, states)
    plan = planner.plan_align(
        field(i, "block_table"), field(i, "src_col"), field(i, "dst_col"), field(i, "num_accepted")
    )
    assert len(plan) > 0
    plan.execute()
    for l in layers:
        want_conv = torch.from_numpy(field(i, f"layer{l}_conv_after")).to(torch.bfloat16)
        want_temp = torch.from_numpy(field(i, f"layer{l}_temporal_after"))
        assert torch.equal(states[l][0].view(torch.int16), want_conv.view(torch.int16)), (
            f"case {i} ({orientation}, {field(i, 'producer')}): layer {l} conv differs"
        )
        assert torch.equal(states[l][1].view(torch.int32), want_temp.view(torch.int32)), (
            f"case {i}: layer {l} temporal differs"
        )


def test_vectors_cover_both_orientations_and_in_block_shifts():
    orientations = {str(field(i, "orientation")) for i in CASES}
    in_block = [
        i for i in CASES if np.any((field(i, "src_col") == field(i, "dst_col")) & (field(i, "num_accepted") > 1))
    ]
    assert orientations == {"SD", "DS"} and in_block
