"""An SGLang pool as the source and destination of the package's prefill -> decode transfers,
against SGLang 0.5.23's own description of its transfer entries: Kimi-Linear and GDN (Qwen3-Next) pools built by
SGLang's constructor at TP 1 (prefill) and TP 2 (decode); after the transfer each decode rank's
slot must hold exactly the slice SGLang's ``get_state_dim_per_tensor`` /
``get_state_conv_shard_groups`` / ``conv_slice_axis`` describe (each of the q, k, v conv
sub-blocks split on its own along the channel axis, the recurrent state split by heads). A decode
pool of another SSM dtype is refused before a byte moves (SGLang accepts it silently).

Skipped when the wheel cannot be fetched, unless RECOVERSSM_REQUIRE_ORACLE=1 (CI).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from recoverssm_rs import layouts  # noqa: E402
from recoverssm_rs.errors import RecoverSSMError  # noqa: E402
from recoverssm_rs.sglang import SglangMambaPool, layout_for  # noqa: E402
from recoverssm_rs.transfer import LocalTransfer  # noqa: E402
from support import sglang_oracle, vllm_oracle  # noqa: E402

HEADS, HEAD_DIM, K = 4, 8, 4


@pytest.fixture(scope="module")
def oracle():
    return vllm_oracle.load_or_skip(sglang_oracle.load, f"SGLang {sglang_oracle.VERSION}")


def _gdn(ns, tp, ssm_dtype=torch.float32):
    """Qwen3-Next's GDN as SGLang builds it: a Mamba2 pool whose conv is cat([q, k, v])."""
    C = ns.configs
    key_dim, value_dim = 2 * HEAD_DIM, HEADS * HEAD_DIM  # 2 key heads, HEADS value heads
    shape = C.Mamba2StateShape.create(
        tp_world_size=tp,
        intermediate_size=value_dim,
        n_groups=2,
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        state_size=HEAD_DIM,
        conv_kernel=K,
        conv_shard_groups=[key_dim, key_dim, value_dim],
    )
    params = C.Mamba2CacheParams(
        shape=shape, layers=[0, 1], dtype=C.Mamba2StateDType(conv=torch.bfloat16, temporal=ssm_dtype)
    )
    pool = ns.pool.MambaPool(size=6, spec_state_size=2, cache_params=params, mamba_layer_ids=[0, 1], device="cpu")
    pool.cache_params_for_test = params  # the parameters SGLang built it from (a model runner has them)
    return pool


def _gdn_layout(tp, ssm_dtype="float32"):
    return layouts.gdn(
        num_k_heads=2,
        head_k_dim=HEAD_DIM,
        num_v_heads=HEADS,
        head_v_dim=HEAD_DIM,
        conv_kernel_size=K,
        tp_size=tp,
        conv_layout="DS",
        dtype="bfloat16",
        ssm_dtype=ssm_dtype,
    )


def _kimi(ns, tp, ssm_dtype=torch.float32):
    C = ns.configs
    shape = C.KimiLinearStateShape.create(tp_world_size=tp, num_heads=HEADS, head_dim=HEAD_DIM, conv_kernel_size=K)
    params = C.KimiLinearCacheParams(
        shape=shape, layers=[0, 1], dtype=C.Mamba2StateDType(conv=torch.bfloat16, temporal=ssm_dtype)
    )
    pool = ns.pool.MambaPool(size=6, spec_state_size=2, cache_params=params, mamba_layer_ids=[0, 1], device="cpu")
    pool.cache_params_for_test = params  # the parameters SGLang built it from (a model runner has them)
    return pool


def _layout(tp, ssm_dtype="float32"):
    return layouts.kda(
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        num_k_heads=HEADS,
        head_k_dim=HEAD_DIM,
        conv_kernel_size=K,
        tp_size=tp,
        conv_layout="SD",
        dtype="bfloat16",
        ssm_dtype=ssm_dtype,
    )


def _sglang_slice(pool, tp, rank):
    """Per transfer entry of ``pool`` (SGLang's order: conv of every layer, then temporal), the
    index of the channels rank ``rank`` of ``tp`` holds along the entry's slice axis, from SGLang's
    own description of its entries."""
    dims = pool.get_state_dim_per_tensor()
    groups = pool.get_state_conv_shard_groups()
    out = []
    for dim, sub in zip(dims, groups, strict=True):
        if sub is None:
            part = dim // tp
            out.append(torch.arange(rank * part, (rank + 1) * part))
        else:
            assert sum(sub) == dim
            starts = [sum(sub[:i]) for i in range(len(sub))]
            out.append(
                torch.cat([torch.arange(s + rank * g // tp, s + (rank + 1) * g // tp) for s, g in zip(starts, sub)])
            )
    return out


FAMILIES = {"kimi": (_kimi, _layout), "gdn": (_gdn, _gdn_layout)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefill_tp1_to_decode_tp2_equals_sglang_slicing(oracle, family):
    make, layout = FAMILIES[family]
    prefill = make(oracle, 1)
    g = torch.Generator().manual_seed(0)
    for t in [*prefill.mamba_cache.conv, prefill.mamba_cache.temporal]:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    src = SglangMambaPool.from_pool(prefill).state_pool(layout(1), tp_rank=0)
    slices = _sglang_slice(prefill, 2, 0), _sglang_slice(prefill, 2, 1)
    layers = len(prefill.mamba_layer_ids)
    for rank in (0, 1):
        decode = make(oracle, 2)
        dst = SglangMambaPool.from_pool(decode).state_pool(layout(2), tp_rank=rank)
        LocalTransfer([src], dst).run([(3, 5), (1, 2)])
        for s_slot, d_slot in [(3, 5), (1, 2)]:
            for layer in range(layers):
                conv_idx, temporal_idx = slices[rank][layer], slices[rank][layers + layer]
                # SGLang slices the per-slot axis conv_slice_axis: Kimi's (K-1, channels) on 1,
                # the Mamba2 / GDN (channels, K-1) on 0
                want_conv = prefill.mamba_cache.conv[0][layer, s_slot].index_select(prefill.conv_slice_axis, conv_idx)
                want_temporal = prefill.mamba_cache.temporal[layer, s_slot][temporal_idx]
                assert torch.equal(decode.mamba_cache.conv[0][layer, d_slot], want_conv), (rank, layer)
                assert torch.equal(decode.mamba_cache.temporal[layer, d_slot], want_temporal), (rank, layer)
        assert not decode.mamba_cache.temporal[:, 1].any(), "other slots are untouched"


def test_mismatched_ssm_dtype_is_refused_before_anything_moves(oracle):
    prefill = _kimi(oracle, 1)
    prefill.mamba_cache.temporal.fill_(1.0)
    src = SglangMambaPool.from_pool(prefill).state_pool(_layout(1), tp_rank=0)
    decode = _kimi(oracle, 2, ssm_dtype=torch.bfloat16)
    dst = SglangMambaPool.from_pool(decode).state_pool(_layout(2, "bfloat16"), tp_rank=0)
    with pytest.raises(RecoverSSMError, match="recurrent.* dtype: source float32 vs destination bfloat16"):
        LocalTransfer([src], dst).run([(1, 1)])
    assert not decode.mamba_cache.temporal.any()


def test_a_layout_that_is_not_the_pool_is_refused(oracle):
    ops = SglangMambaPool.from_pool(_kimi(oracle, 1))
    with pytest.raises(RecoverSSMError):
        ops.state_pool(_layout(2), tp_rank=0)


def _mamba2(ns, tp, ssm_dtype=torch.float32):
    C = ns.configs
    shape = C.Mamba2StateShape.create(
        tp_world_size=tp,
        intermediate_size=HEADS * HEAD_DIM,
        n_groups=2,
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        state_size=HEAD_DIM,
        conv_kernel=K,
    )
    params = C.Mamba2CacheParams(
        shape=shape, layers=[0, 1], dtype=C.Mamba2StateDType(conv=torch.bfloat16, temporal=ssm_dtype)
    )
    pool = ns.pool.MambaPool(size=6, spec_state_size=2, cache_params=params, mamba_layer_ids=[0, 1], device="cpu")
    pool.cache_params_for_test = params  # the parameters SGLang built it from (a model runner has them)
    return pool


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("make", [_kimi, _gdn, _mamba2], ids=["kimi", "gdn", "mamba2"])
def test_layout_for_reads_sglang_cache_params(oracle, make, tp):
    pool = make(oracle, tp)
    lay = layout_for(pool.cache_params_for_test, tp_size=tp)
    assert [s.shape for s in lay.persistent] == [
        tuple(pool.mamba_cache.conv[0].shape[2:]),
        tuple(pool.mamba_cache.temporal.shape[2:]),
    ]
    sp = SglangMambaPool.from_pool(pool).state_pool(lay, tp_rank=tp - 1)  # the core binds the tensors
    assert sp.fingerprint.tp_size == tp and sp.num_blocks == 7
