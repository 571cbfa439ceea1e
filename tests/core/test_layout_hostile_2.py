"""Bad inputs an engine developer could hand the layout calculators and the layout fingerprint:
each is refused with the package's error naming the parameter and the value."""

from __future__ import annotations

import re

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


def _fingerprint_text() -> str:
    from recoverssm_rs.transfer import LayoutFingerprint

    return LayoutFingerprint(layouts.gdn(**GDN), tp_rank=0, block_size=16).encode()


def _conv_line_without_segments(text: str) -> str:
    return "\n".join(
        " ".join(line.split()[:5] + ["0", "4"]) if line.startswith("conv ") else line for line in text.splitlines()
    )


# A peer's fingerprint whose states hold no byte, or two states of one name: decode accepted both
# (a zero-byte state moves nothing, and two fingerprints of that kind passed check_compatible).
EMPTY_OR_AMBIGUOUS = {
    "zero heads": (
        lambda t: t.replace("heads temporal bfloat16 2 2x8x8", "heads temporal bfloat16 0 0x8x8"),
        r"state 'temporal': 0 heads .* every dimension must be > 0",
    ),
    "zero head dim": (
        lambda t: t.replace("heads temporal bfloat16 2 2x8x8", "heads temporal bfloat16 2 2x0x8"),
        r"state 'temporal': 2 heads of local shape \[2, 0, 8\]: every dimension must be > 0",
    ),
    "no conv channels": (_conv_line_without_segments, r"state 'conv': the conv window has 0 channels in 0 segments"),
    "zero-unit segment": (
        lambda t: t.replace("q:2:8", "q:0:8").replace("SD 3 48", "SD 3 32"),
        r"state 'conv': segment 'q' has 0 units of 8 channels",
    ),
    "duplicate state name": (
        lambda t: t.replace("heads temporal", "heads conv"),
        r"state 'conv': the name is used by an earlier state",
    ),
}


@pytest.mark.parametrize("case", list(EMPTY_OR_AMBIGUOUS))
def test_a_fingerprint_of_empty_or_ambiguous_states_is_refused(case):
    from recoverssm_rs.transfer import LayoutFingerprint

    edit, message = EMPTY_OR_AMBIGUOUS[case]
    text = edit(_fingerprint_text())
    assert text != _fingerprint_text()
    with pytest.raises(LayoutError, match=rf"^gdn: {message}"):
        LayoutFingerprint.decode(text)


# A fingerprint that gives an entry twice: decode kept the last family / tp / num_spec /
# block_size, and kept both values of a model dim, so a destination claiming head_k_dim 8 and 9
# passed check_compatible against a source of head_k_dim 8.
REPEATED = {
    "dim": ("dim head_k_dim 8", "dim head_k_dim 8\ndim head_k_dim 9", r"'dim head_k_dim' is given again"),
    "family": ("family gdn", "family gdn\nfamily gdn", r"'family' is given again"),
    "tp": ("tp 1 0", "tp 1 0\ntp 1 0", r"'tp' is given again"),
    "num_spec": ("num_spec 0", "num_spec 0\nnum_spec 0", r"'num_spec' is given again"),
    "block_size": ("block_size 16", "block_size 16\nblock_size 32", r"'block_size' is given again"),
}


@pytest.mark.parametrize("entry", list(REPEATED))
def test_a_fingerprint_that_repeats_an_entry_is_refused(entry):
    from recoverssm_rs.transfer import LayoutFingerprint

    old, new, message = REPEATED[entry]
    text = _fingerprint_text()
    assert old in text
    source = LayoutFingerprint.decode(text)
    with pytest.raises(LayoutError, match=rf"^fingerprint line \d+: {message} \(first on line \d+\)"):
        source.check_compatible(LayoutFingerprint.decode(text.replace(old, new)))


HOSTILE = {"None": None, "str": "abc", "float": 1.5, "bool": True, "negative": -1, "huge": 2**70, "dict": {"a": 1}}
FINGERPRINT_CALLS = {
    "decode": (lambda fp, v: type(fp).decode(v), "text", ("str",)),
    "with_rank": (lambda fp, v: fp.with_rank(v), "tp_rank", ()),
    "request_nbytes": (lambda fp, v: fp.request_nbytes(v), "num_layers", ()),
    "check_compatible": (lambda fp, v: fp.check_compatible(v), "destination", ()),
}
FP_CASES = [(m, h) for m in FINGERPRINT_CALLS for h in HOSTILE]


@pytest.mark.parametrize(("method", "hostile"), FP_CASES, ids=[f"{m}-{h}" for m, h in FP_CASES])
def test_fingerprint_methods_refuse_the_wrong_kind_naming_the_argument(method, hostile):
    # decode, with_rank, request_nbytes and check_compatible took their argument as PyO3 typed it:
    # a TypeError or OverflowError ("can't convert negative int to unsigned") naming nothing.
    from recoverssm_rs.transfer import LayoutFingerprint

    call, arg, parsed = FINGERPRINT_CALLS[method]
    fp = LayoutFingerprint.decode(_fingerprint_text())
    # A string reaches the parser (not a fingerprint: a LayoutError of its own words).
    match = r"not a transfer fingerprint" if hostile in parsed else rf"\b{arg}\b"
    with pytest.raises(LayoutError, match=match):
        call(fp, HOSTILE[hostile])


@pytest.mark.parametrize("funcs", ["conv", "ct", b"conv"])
def test_a_string_as_a_backends_copy_functions_is_refused_naming_the_backend(funcs):
    # The string was read character by character: "conv" gave "unrecognised copy function 'c'".
    from recoverssm_rs.contract import validate_copy_funcs

    group = dict(mamba_type="GDN_ATTN", shapes=[(3, 4), (4, 4, 4)], block_size=16)
    with pytest.raises(
        LayoutError, match=r"^copy_funcs\['GDN_ATTN'\] must be a sequence of copy functions, got the string"
    ):
        validate_copy_funcs([group], {"GDN_ATTN": funcs})
    assert validate_copy_funcs([group], {"GDN_ATTN": ["conv"]}) == {"GDN_ATTN": 1}


@pytest.mark.parametrize("module", ["numpy", "not_a_module", "", None, "a.b"])
def test_require_refuses_a_module_that_is_not_an_optional_dependency(module):
    # An unknown module was a KeyError when it was missing ('not_a_module'), an AttributeError for
    # None, a ModuleNotFoundError for 'a.b', and passed silently when installed ('numpy').
    from recoverssm_rs.backend_check import require
    from recoverssm_rs.errors import BackendUnavailableError

    with pytest.raises(
        BackendUnavailableError, match=rf"^require: module = {re.escape(repr(module))} is not an optional"
    ):
        require(module)


@pytest.mark.parametrize(
    ("torch_cuda", "dists"),
    [("12.4", "cupy-cuda12x"), ("12.4", b"cupy-cuda12x"), (12.4, ["cupy-cuda12x"]), (12, [])],
)
def test_cuda_match_problem_refuses_arguments_of_the_wrong_kind(torch_cuda, dists):
    # A string of dists was read character by character ("several CuPy packages are installed
    # (-, 1, 2, a, c, ...)"); a float torch_cuda was an AttributeError.
    from recoverssm_rs.backend_check import cuda_match_problem
    from recoverssm_rs.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match=r"^cuda_match_problem: torch_cuda must be torch.version.cuda"):
        cuda_match_problem(torch_cuda, dists)


@pytest.mark.parametrize("torch_cuda", ["", "abc", "cu128"])
def test_cuda_match_problem_names_a_torch_cuda_that_is_no_version(torch_cuda):
    # It was read as CUDA major None: "keep only cupy-cudaNonex".
    from recoverssm_rs.backend_check import cuda_match_problem

    for dists in ([], ["cupy-cuda12x"], ["cupy-cuda12x", "cupy-cuda13x"]):
        assert cuda_match_problem(torch_cuda, dists) == (
            f"torch.version.cuda = {torch_cuda!r} is not a CUDA version (expected e.g. '12.8'): reinstall torch"
        )


@pytest.mark.parametrize("num_spec", [2, 3, 256])
@pytest.mark.parametrize("family", ["short_conv", "gdn"])
def test_a_conv_kernel_near_2_64_is_refused_naming_it_not_a_wrapped_width(family, num_spec):
    # conv_kernel - 1 + num_spec wrapped: num_spec 2 gave a conv "of shape (0, 8)", num_spec 3
    # "width 1", 256 "width 254", none of them naming the kernel.
    name = "conv_kernel" if family == "short_conv" else "conv_kernel_size"
    call = (
        (lambda **k: layouts.short_conv(intermediate_size=8, **k))
        if family == "short_conv"
        else (lambda **k: layouts.gdn(**{**GDN, **k}))
    )
    with pytest.raises(
        LayoutError, match=rf"^{family}: the conv window width {name} - 1 \+ num_spec = {2**64 - 1} - 1 \+ {num_spec}"
    ):
        call(**{name: 2**64 - 1, "num_spec": num_spec})


@pytest.mark.parametrize("dtype", [None, 3, 1.5, True, {"a": 1}, ["float32"], b"float32"])
def test_a_state_spec_dtype_of_the_wrong_kind_is_named_as_such(dtype):
    # StateSpec took str() of any object: None was "unknown dtype 'None'", a list
    # "unknown dtype '['float32']'", as if they were misspelled names.
    import recoverssm_rs as rs

    with pytest.raises(
        LayoutError,
        match=rf"^state 'x': dtype must be a dtype name or a torch / numpy dtype, got {type(dtype).__name__}$",
    ):
        rs.StateSpec("x", (3,), dtype, copy="temporal")
    assert rs.StateSpec("x", (3,), "fp32", copy="temporal").dtype == "float32"


def test_a_backend_registered_by_name_and_by_enum_member_is_refused():
    # Both registrations reached the core under one name and the first one was used silently.
    import enum

    from recoverssm_rs.contract import validate_copy_funcs

    group = dict(mamba_type="GDN_ATTN", shapes=[(3, 4), (4, 4, 4)], block_size=16)
    member = enum.Enum("MambaAttentionBackendEnum", ["GDN_ATTN"]).GDN_ATTN
    with pytest.raises(LayoutError, match=r"^copy_funcs registers backend GDN_ATTN twice"):
        validate_copy_funcs([group], {"GDN_ATTN": ["conv"], member: ["conv", "temporal"]})
    assert validate_copy_funcs([group], {member: ["conv", "temporal"]}) == {"GDN_ATTN": 2}
