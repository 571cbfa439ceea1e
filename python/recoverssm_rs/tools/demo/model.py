"""The demo's toy hybrid model: GDN and KDA layers with random (seeded) weights whose recurrent
state lives in a :class:`~recoverssm_rs.StateCache`.

A layer's forward is the served path: RMS-norm -> conv input projection ->
:meth:`StateCache.conv_verify` -> SiLU -> q, k, v; gate and beta projections ->
:func:`recurrence.prepare` -> :meth:`StateCache.verify` -> output projection + residual. It returns
the step's per-layer inputs and outputs, which the oracle replays token by token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ... import layouts
from ..._core import Layout

if TYPE_CHECKING:
    from ...speculative import recurrence

__all__ = [
    "HEADS",
    "HEAD_DIM",
    "GDN_K_HEADS",
    "CONV_KERNEL",
    "HIDDEN",
    "VOCAB",
    "KINDS",
    "toy_layouts",
    "ToyLayer",
    "rms",
]

HEADS = 4
HEAD_DIM = 32
GDN_K_HEADS = 2
"""GQA-style key heads of the GDN layers (expanded to the ``HEADS`` value heads)."""
CONV_KERNEL = 4
HIDDEN = 64
VOCAB = 64
KINDS: tuple[recurrence.Kind, ...] = ("gdn", "kda")
"""The layer kinds, in stack order: GDN 0, KDA 0, GDN 1, KDA 1, ..."""


def toy_layouts(num_spec: int) -> dict[str, Layout]:
    """The two RecoverSSM layouts of the toy model (built and checked by the core): GDN with SD
    conv windows and float32 records, KDA with DS conv windows, bfloat16 conv and key/gate records
    and a float32 recurrent state (as the Kimi-K3-like preset)."""
    return {
        "gdn": layouts.gdn(
            num_k_heads=GDN_K_HEADS,
            num_v_heads=HEADS,
            head_k_dim=HEAD_DIM,
            head_v_dim=HEAD_DIM,
            conv_kernel_size=CONV_KERNEL,
            num_spec=num_spec,
            conv_layout="SD",
            dtype="float32",
            ssm_dtype="float32",
            recover_ssm=True,
        ),
        "kda": layouts.kda(
            num_heads=HEADS,
            head_dim=HEAD_DIM,
            conv_kernel_size=CONV_KERNEL,
            num_spec=num_spec,
            conv_layout="DS",
            dtype="bfloat16",
            ssm_dtype="float32",
            recover_ssm=True,
        ),
    }


def rms(h: Any) -> Any:
    """RMS-normalise the last dimension."""
    import torch

    return h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)


class ToyLayer:
    """One recurrent layer (``kind`` "gdn" or "kda") stored as layer ``index`` of ``cache``."""

    def __init__(self, kind: recurrence.Kind, index: int, cache: Any, gen: Any, device: Any) -> None:
        import torch

        self.kind: recurrence.Kind = kind
        self.index = index
        self.cache = cache
        g = cache.geometry
        self.H, self.K, self.V = int(g["heads"]), int(g["head_k_dim"]), int(g["head_v_dim"])
        self.dim = int(g["conv_dim"])
        self.kc = cache.conv_kernel_size
        self.layout = cache.conv_layout
        self.conv_dtype = cache.conv_state(index).dtype
        self.nk = GDN_K_HEADS if kind == "gdn" else self.H
        H, K, V, D = self.H, self.K, self.V, HIDDEN
        assert self.dim == 2 * self.nk * K + H * V

        def rnd(*shape: int, scale: float = 1.0) -> Any:
            return (torch.randn(*shape, generator=gen) * scale).to(device)

        self.w_in = rnd(D, self.dim, scale=D**-0.5)
        self.conv_w = rnd(self.dim, self.kc, scale=self.kc**-0.5)
        gate_cols = H * K if kind == "kda" else H
        self.w_g = rnd(D, gate_cols, scale=D**-0.5)
        self.w_b = rnd(D, H, scale=D**-0.5)
        self.A_log = torch.log(torch.rand(H, generator=gen) * 1.5 + 0.5).to(device)
        dt_shape = (H, K) if kind == "kda" else (H,)
        self.dt_bias = (torch.rand(*dt_shape, generator=gen) * 3.0 - 4.0).to(device)
        self.w_out = rnd(H * V, D, scale=0.5 * (H * V) ** -0.5)

    def forward(self, h: Any, blocks: np.ndarray, qlens: np.ndarray) -> tuple[Any, dict[str, Any]]:
        """One verify window ``h`` ``[B, Q, HIDDEN]`` from the running states of ``blocks``;
        returns the new hidden states and the layer's records for the oracle."""
        import torch
        import torch.nn.functional as F

        from ...speculative import recurrence

        B, Q, _ = h.shape
        H, K, V = self.H, self.K, self.V
        xn = rms(h)
        # Conv inputs in the cache's conv dtype (a bf16 model produces bf16 activations).
        x = (xn @ self.w_in).to(self.conv_dtype)
        conv_y = self.cache.conv_verify(self.index, blocks, x, self.conv_w)
        y = F.silu(conv_y)
        nkK = self.nk * K
        q = y[..., :nkK].reshape(B, Q, self.nk, K)
        k = y[..., nkK : 2 * nkK].reshape(B, Q, self.nk, K)
        v = y[..., 2 * nkK :].reshape(B, Q, H, V)
        if self.nk != H:
            q = q.repeat_interleave(H // self.nk, dim=2)
            k = k.repeat_interleave(H // self.nk, dim=2)
        raw_g = xn @ self.w_g
        raw_g = raw_g.reshape(B, Q, H, K) if self.kind == "kda" else raw_g
        raw_b = xn @ self.w_b
        p = recurrence.prepare(self.kind, q, k, raw_g, raw_b, self.A_log, self.dt_bias)
        o = self.cache.verify(
            self.index, blocks, p.q_hat, p.k_hat, v, p.gate, p.beta, query_lens=torch.as_tensor(qlens)
        )
        h = h + o.reshape(B, Q, H * V) @ self.w_out
        rec = dict(x=x, conv_y=conv_y, q_hat=p.q_hat, k_hat=p.k_hat, v=v, gate=p.gate, beta=p.beta, out=o)
        return h, rec

    def conv_head(self, blocks: Any) -> Any:
        """``[n, dim, K-1]`` conv history of ``blocks`` (the first K-1 window columns)."""
        win = self.cache.conv_state(self.index)[blocks]
        if self.layout == "SD":
            win = win.transpose(1, 2)
        return win[:, :, : self.kc - 1]

    def rec_state(self, blocks: Any) -> Any:
        """``[n, H, V, K]`` recurrent states of ``blocks``."""
        return self.cache.recurrent_state(self.index)[blocks]

    def __repr__(self) -> str:
        return (
            f"ToyLayer({self.kind!r}, index={self.index}, heads={self.H}, "
            f"conv_dim={self.dim}, conv_dtype={self.conv_dtype})"
        )
