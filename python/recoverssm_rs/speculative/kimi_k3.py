"""The RecoverSSM commit as vLLM's Kimi-K3 model drives it, over the model's own tensors.

vLLM 0.33's Kimi-K3 keeps, per KDA layer, its conv state and recurrent state in the layer's KV
cache (``kv_cache[0]``, ``kv_cache[1]``), the verify records beside them (``correction [max_num_reqs,
H, Q, V]`` float32 and the raw ``key_gate [max_num_reqs, H, Q, 2K]``: row ``b`` for row ``b`` of the
step's speculative batch) and the gate parameters (``A_log``, ``dt_bias``, ``gate_lower_bound``).
After sampling, ``KimiK3KDAMetadata.commit_recoverssm_state`` folds each row's accepted tokens into
the state (the key normalised and the gate computed from the raw records at commit time) and
compacts the conv window, in align mode also writing the state at a crossed block boundary.

:class:`KimiK3Commit` does the same commit through the package: the layers' tensors are checked
once by the core (:class:`~recoverssm_rs._core.KimiK3CommitPlanner`) and bound
(:class:`~recoverssm_rs._core.BoundTensors`); each step's metadata is planned by the core (a bad
index, count or block is a :class:`~recoverssm_rs.PlanError` naming the row, its request and the
value, and nothing is written), then one guarded write folds the records on the states' device.
The index vectors are read on the host (a device-to-host copy when they live on a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .._core import BoundTensors, KimiK3CommitPlanner
from ..errors import BindingError

__all__ = ["KimiK3Commit", "KimiK3Plan"]

#: The plan's columns, in the core's order (one entry per row that writes).
KimiK3Plan = tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int]]


def _host(x: Any) -> Any:
    """An index tensor on the host (the core reads host integers), anything else as is (a meta
    tensor, which holds no values, too: the core refuses it)."""
    if isinstance(x, torch.Tensor) and x.device.type not in ("cpu", "meta"):
        return x.cpu()
    return x


def _once(x: Any) -> Any:
    """An iterator read into a list (it can be read only once), anything else as is."""
    return list(x) if isinstance(x, Iterator) else x


class KimiK3Commit:
    """The KDA layers of one Kimi-K3 model and their RecoverSSM commit (see the module docstring).

    Args:
        conv_states: per layer, the conv state viewed dim-first ``[num_blocks, conv_dim, conv_len]``
            (``conv_len = history + Q - 1``).
        states: per layer, the recurrent state ``[num_blocks, H, V, K]``.
        corrections / key_gates: per layer, the verify records ``[max_num_reqs, H, Q, V]`` (float32)
            and ``[max_num_reqs, H, Q, 2K]`` (raw key, then raw gate).
        A_log / dt_bias: per layer, ``H`` and ``H * K`` values.
        gate_lower_bound: per layer (one value for all, or ``None`` for the softplus gate).
        spec_query_len: the speculative window ``Q``.

    Raises:
        BindingError: the tensors do not make one commit (shapes, dtypes, devices, read-only or
            autograd-tracked destinations, differing gate bounds), naming the layer.
    """

    def __init__(
        self,
        conv_states: Sequence[torch.Tensor],
        states: Sequence[torch.Tensor],
        corrections: Sequence[torch.Tensor],
        key_gates: Sequence[torch.Tensor],
        A_log: Sequence[torch.Tensor],
        dt_bias: Sequence[torch.Tensor],
        gate_lower_bound: Sequence[float | None],
        spec_query_len: int,
    ) -> None:
        # An iterator is read once, here; anything else goes to the core as given (it refuses what
        # is not a list with a BindingError naming the argument).
        conv_states, states, corrections, key_gates = map(_once, (conv_states, states, corrections, key_gates))
        A_log, dt_bias, gate_lower_bound = map(_once, (A_log, dt_bias, gate_lower_bound))
        self.planner = KimiK3CommitPlanner(
            conv=conv_states,
            state=states,
            correction=corrections,
            key_gate=key_gates,
            a_log=A_log,
            dt_bias=dt_bias,
            gate_lower_bound=gate_lower_bound,
            spec_query_len=spec_query_len,
        )
        self.conv_states = tuple(conv_states)
        self.states = tuple(states)
        self.corrections = tuple(corrections)
        self.key_gates = tuple(key_gates)
        self.A_log = tuple(A_log)
        self.dt_bias = tuple(dt_bias)
        labelled = []
        for name, ts in (
            ("conv state", self.conv_states),
            ("state", self.states),
            ("correction", self.corrections),
            ("key_gate", self.key_gates),
            ("A_log", self.A_log),
            ("dt_bias", self.dt_bias),
        ):
            for i, t in enumerate(ts):
                # The core takes any array; the fold below indexes torch tensors.
                if not isinstance(t, torch.Tensor):
                    raise BindingError(f"layer {i}: {name}: the commit folds torch tensors, got {type(t).__name__}")
                labelled.append((t, f"Kimi-K3 layer {i} {name}"))
        self._bound = BoundTensors(labelled)

    @classmethod
    def from_layers(cls, layers: Sequence[Any], *, spec_query_len: int, conv_dim_first: bool) -> KimiK3Commit:
        """The commit of vLLM's KDA layers as ``KDARecoverSSMCommitContext.create`` reads them:
        ``kv_cache[0]`` (transposed when the conv layout is token-first: ``conv_dim_first=False``),
        ``kv_cache[1]``, ``recoverssm_records``, ``A_log``, ``dt_bias`` viewed ``[local_num_heads,
        head_dim]`` and ``gate_lower_bound``."""
        conv = [layer.kv_cache[0] if conv_dim_first else layer.kv_cache[0].transpose(-1, -2) for layer in layers]
        return cls(
            conv,
            [layer.kv_cache[1] for layer in layers],
            [layer.recoverssm_records.correction for layer in layers],
            [layer.recoverssm_records.key_gate for layer in layers],
            [layer.A_log for layer in layers],
            [layer.dt_bias.view(layer.local_num_heads, layer.head_dim) for layer in layers],
            [layer.gate_lower_bound for layer in layers],
            spec_query_len,
        )

    @classmethod
    def from_context(cls, context: Any) -> KimiK3Commit:
        """The commit of the tensors a vLLM ``KDARecoverSSMCommitContext`` holds (its conv states
        are dim-first views already; ``A_log`` / ``dt_bias`` are stacked per layer)."""
        n = len(context.checkpoints)
        return cls(
            context.conv_states,
            context.checkpoints,
            context.correction_caches,
            context.kg_caches,
            [context.A_log[i] for i in range(n)],
            [context.dt_bias[i] for i in range(n)],
            [context.lower_bound] * n,
            context.spec_query_len,
        )

    def plan(
        self,
        num_accepted_tokens: Any,
        state_indices: Any,
        query_start_loc: Any,
        request_indices: Any = None,
        block_table: Any = None,
        num_computed_tokens: Any = None,
        mamba_block_size: int | None = None,
    ) -> KimiK3Plan:
        """The core's plan of one step (the rows that write); see :meth:`commit`."""
        return self.planner.plan(
            _host(num_accepted_tokens),
            _host(state_indices),
            _host(query_start_loc),
            _host(request_indices),
            _host(block_table),
            _host(num_computed_tokens),
            mamba_block_size,
        )

    def commit(
        self,
        num_accepted_tokens: Any,
        state_indices: Any,
        query_start_loc: Any,
        request_indices: Any = None,
        block_table: Any = None,
        num_computed_tokens: Any = None,
        mamba_block_size: int | None = None,
    ) -> KimiK3Plan:
        """Fold the accepted tokens into every layer, as ``KDARecoverSSMCommitContext.commit``.

        Row ``b`` of the step (its state index ``state_indices[b]``, ``<= 0``: padding, its tokens
        ``query_start_loc[b:b + 2]``) belongs to request ``request_indices[b]`` (default ``b``),
        whose ``num_accepted_tokens`` (clamped to ``[0, min(query_len, Q)]``) are folded. Align mode
        (``block_table``, ``num_computed_tokens``, ``mamba_block_size`` together): the result goes
        to the request's block at its last token and, when the window crosses a block boundary,
        the state after the boundary's tokens to that boundary's block.

        Returns:
            the plan that was executed.

        Raises:
            PlanError: before anything is written (an index out of range, a block written twice or
                written by one row and read by another, a boundary beyond the block table, ...).
            BindingError: a bound tensor was re-pointed or resized since construction.
        """
        p = self.plan(
            num_accepted_tokens,
            state_indices,
            query_start_loc,
            request_indices,
            block_table,
            num_computed_tokens,
            mamba_block_size,
        )
        if p[0]:
            self._bound.guarded(lambda: self._write(p))
        return p

    def commit_metadata(self, metadata: Any, num_accepted_tokens: Any) -> Any:
        """The commit ``KimiK3KDAMetadata.commit_recoverssm_state`` makes, from its
        ``recoverssm_commit`` (``KDARecoverSSMCommitMetadata``) and ``num_spec_decodes``; returns
        that metadata's ``align`` (vLLM's align metadata, from which its post-process metadata is
        made), or ``None``."""
        c = metadata.recoverssm_commit
        if c is None:
            return None
        n = int(metadata.num_spec_decodes)
        a = c.align
        self.commit(
            num_accepted_tokens,
            c.state_indices[:n, 0],
            c.query_start_loc[: n + 1],
            request_indices=c.request_indices,
            block_table=None if a is None else a.block_table,
            num_computed_tokens=None if a is None else a.num_computed_tokens,
            mamba_block_size=None if a is None else a.block_size,
        )
        return a

    # ---- the fold ------------------------------------------------------------------------
    def _gate(self, raw_g: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        """Kimi-K3's per-channel log-decay from the raw gate (float32): ``lower_bound * sigmoid(A
        (g + dt_bias))``, or ``-A softplus(g + dt_bias)`` (linear above 20) without a bound."""
        x = raw_g + dt_bias
        lb = self.planner.gate_lower_bound
        if lb is not None:
            return lb * (1.0 / (1.0 + torch.exp(-(A * x))))
        return -A * torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x)))

    def _write(self, p: KimiK3Plan) -> None:
        rows_l, _, src_l, cnt_l, dst_l, bnd_l, blen_l = p
        dev = self.states[0].device
        rows, src, cnt, dst, bnd, blen = (
            torch.tensor(v, dtype=torch.int64, device=dev) for v in (rows_l, src_l, cnt_l, dst_l, bnd_l, blen_l)
        )
        has_b = bnd > 0
        any_b = bool(has_b.any())
        q = self.planner.spec_query_len
        hist = self.planner.conv_history_len
        offs = torch.arange(hist, device=dev)
        for layer in range(self.planner.num_layers):
            state = self.states[layer]
            _, H, V, K = state.shape
            s0 = state[src].to(torch.float32)  # [n, H, V, K]
            corr = self.corrections[layer][rows].to(torch.float32)  # [n, H, Q, V]
            kg = self.key_gates[layer][rows].to(torch.float32)  # [n, H, Q, 2K]
            A = torch.exp(self.A_log[layer].reshape(H).to(torch.float32))[None, :, None]  # [1, H, 1]
            dtb = self.dt_bias[layer].reshape(H, K).to(torch.float32)[None]  # [1, H, K]
            decay_f = torch.ones(len(rows_l), H, 1, K, dtype=torch.float32, device=dev)
            corr_f = torch.zeros_like(s0)
            decay_b, corr_b = decay_f.clone(), corr_f.clone()
            # vLLM's order: the newest accepted token first, each update scaled by the later decays.
            for j in range(q):
                t = cnt - 1 - j  # [n]
                live = (t >= 0)[:, None, None, None]
                tt = t.clamp(min=0)
                k = kg[torch.arange(len(rows_l), device=dev), :, tt, :K]  # [n, H, K]
                g = kg[torch.arange(len(rows_l), device=dev), :, tt, K:]
                u = corr[torch.arange(len(rows_l), device=dev), :, tt]  # [n, H, V]
                nk = k * (1.0 / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6))
                decay = torch.exp(self._gate(g, dtb, A))[:, :, None, :]  # [n, H, 1, K]
                update = u[..., None] * nk[:, :, None, :]  # [n, H, V, K]
                corr_f = torch.where(live, corr_f + update * decay_f, corr_f)
                decay_f = torch.where(live, decay_f * decay, decay_f)
                if any_b:
                    before = live & (t < blen)[:, None, None, None]
                    corr_b = corr_b + torch.where(before, update * decay_b, 0.0)
                    decay_b = decay_b * torch.where(before, decay, 1.0)
            final = s0 * decay_f + corr_f
            conv = self.conv_states[layer]
            window = conv[src]  # [n, D, L], read before any write
            D = window.shape[1]
            take = ((cnt - 1)[:, None] + offs[None, :])[:, None, :].expand(-1, D, -1)
            conv_final = torch.gather(window, 2, take)
            if any_b:
                boundary = (s0 * decay_b + corr_b)[has_b]
                take_b = ((blen - 1)[:, None] + offs[None, :])[:, None, :].expand(-1, D, -1)
                conv_b = torch.gather(window, 2, take_b.clamp(min=0))[has_b]
                state[bnd[has_b]] = boundary.to(state.dtype)
                conv[bnd[has_b], :, :hist] = conv_b
            state[dst] = final.to(state.dtype)
            conv[dst, :, :hist] = conv_final

    def __repr__(self) -> str:
        return f"KimiK3Commit({self.planner!r})"
