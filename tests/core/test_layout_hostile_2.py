"""Bad inputs an engine developer could hand the layout calculators and the layout fingerprint:
each is refused with the package's error naming the parameter and the value."""

from __future__ import annotations

import pytest
from recoverssm_rs import layouts
from recoverssm_rs.errors import LayoutError

GDN = dict(num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8, conv_kernel_size=4)

CALCULATORS = {
    "mamba1": lambda **k: layouts.mamba1(intermediate_size=8, state_size=4, conv_kernel=4, **k),
    "mamba2": lambda **k: layouts.mamba2(
        intermediate_size=8, n_groups=1, num_heads=2, head_dim=4, state_size=4, conv_kernel=4, **k
    ),
    "short_conv": lambda **k: layouts.short_conv(intermediate_size=8, conv_kernel=4, **k),
    "linear_attention": lambda **k: layouts.linear_attention(num_heads=2, head_dim=4, **k),
    "gdn": lambda **k: layouts.gdn(**GDN, **k),
    "kda": lambda **k: layouts.kda(num_heads=2, head_dim=4, **k),
}
SETTINGS = {
    "mamba1": ("dtype", "ssm_dtype", "conv_layout"),
    "mamba2": ("dtype", "ssm_dtype", "conv_layout"),
    "short_conv": ("dtype", "conv_layout"),
    "linear_attention": ("ssm_dtype",),
    "gdn": ("dtype", "ssm_dtype", "conv_layout"),
    "kda": ("dtype", "ssm_dtype", "conv_layout"),
}
CASES = [(f, p) for f, params in SETTINGS.items() for p in params]


@pytest.mark.parametrize(("family", "param"), CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_a_misspelled_dtype_or_conv_layout_names_the_family_and_the_parameter(family, param):
    # `dtype` and `ssm_dtype` took the same message ("unknown dtype 'bfloat'"), which did not say
    # which of the two settings (or which calculator) held the misspelling.
    with pytest.raises(LayoutError, match=rf"^{family}: {param}: unknown .*'bfloat'"):
        CALCULATORS[family](**{param: "bfloat"})
