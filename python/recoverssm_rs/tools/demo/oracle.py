"""The demo's ground truth: every request's state advanced by decoding only its accepted tokens,
one at a time, with the plain recurrence, compared with what the served path left in the cache.

Per layer a request keeps a reference recurrent state and conv history, fed with that layer's
inputs from the step (:func:`recurrence.sequential_decode` with one token, and a plain causal conv
over the history). Checked against the cache: every running block (recurrent state and conv
window, every layer), every boundary block written (at its boundary), every block a copy produced
(right after the copy), the verify and conv outputs at accepted positions (so, layer by layer,
the served forward equals token-by-token decoding) and the core's choice of boundary blocks.

Tolerance: recurrent states and outputs must agree to :data:`TOLERANCE` in *scaled* max-abs
error ``max|cache - ref| / max(1, max|ref|)`` (states and outputs are O(1) here: unit-norm keys,
beta < 1, decays < 1). The commit reproduces the same float32 operations in a different order, so
the measured error is around 1e-7. Conv windows and copies are pure data movement and must match
bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .engine import Request
    from .model import ToyLayer

__all__ = ["TOLERANCE", "Snapshot", "Stats", "Oracle"]

log = logging.getLogger("recoverssm_rs.tools.demo")

TOLERANCE = 1e-4
"""Scaled max-abs tolerance for recurrent states and outputs (see the module docstring)."""

Snapshot = tuple[list[Any], list[Any]]
"""A reference state of every layer: (recurrent states, conv histories)."""


class Stats:
    """Counts the checks and keeps the largest errors and the first mismatches."""

    def __init__(self) -> None:
        self.checks = 0
        self.mismatches = 0
        self.max_state_err = 0.0
        self.max_output_err = 0.0
        self.max_conv_err = 0.0
        self.max_state_abs = 0.0  # the magnitude the state errors are relative to
        self.first_mismatches: list[str] = []

    def fail(self, what: str) -> None:
        """Record a mismatch (the first 20 are kept: they tell the story)."""
        self.mismatches += 1
        if len(self.first_mismatches) < 20:
            self.first_mismatches.append(what)
            log.warning("mismatch: %s", what)

    def close(self, kind: str, got: Any, ref: Any, what: str) -> None:
        """Scaled max-abs comparison of states / outputs (``kind`` "state" or "output")."""
        import torch

        got = got.float()
        ref = ref.float()
        mag = float(ref.abs().max()) if ref.numel() else 0.0
        err = float((got - ref).abs().max()) / max(1.0, mag) if ref.numel() else 0.0
        self.checks += 1
        if kind == "state":
            self.max_state_err = max(self.max_state_err, err)
            self.max_state_abs = max(self.max_state_abs, mag)
        else:
            self.max_output_err = max(self.max_output_err, err)
        if not (err <= TOLERANCE) or not bool(torch.isfinite(got).all()):
            self.fail(f"{what}: scaled error {err:.3g} > {TOLERANCE:g}")

    def exact(self, got: Any, ref: Any, what: str) -> None:
        """Bit-for-bit comparison (conv windows: pure data movement)."""
        self.checks += 1
        err = float((got.float() - ref.float()).abs().max()) if ref.numel() else 0.0
        self.max_conv_err = max(self.max_conv_err, err)
        if not (got.dtype == ref.dtype and bool((got == ref).all())):
            self.fail(f"{what}: conv window differs (max abs diff {err:.3g})")

    def __repr__(self) -> str:
        return f"Stats(checks={self.checks}, mismatches={self.mismatches}, max_state_err={self.max_state_err:.3g})"


class Oracle:
    """The token-by-token reference of a layer stack, and the checks of the cache against it."""

    def __init__(self, stack: Sequence[ToyLayer], device: Any, block_size: int) -> None:
        self.stack = stack
        self.dev = device
        self.block_size = block_size
        self.stats = Stats()
        self.step = -1

    def zero(self) -> Snapshot:
        """The reference of a fresh request: zero states and histories, every layer."""
        import torch

        dev = self.dev
        st = [torch.zeros(ly.H, ly.V, ly.K, device=dev) for ly in self.stack]
        hi = [torch.zeros(ly.dim, ly.kc - 1, dtype=ly.conv_dtype, device=dev) for ly in self.stack]
        return st, hi

    def check_block(self, rid: int, block: int, states: list[Any], hists: list[Any], what: str) -> None:
        """Every layer's recurrent state and conv history of ``block`` against the reference."""
        import torch

        idx = torch.tensor([block], device=self.dev)
        for li, ly in enumerate(self.stack):
            tag = f"step {self.step} request {rid} layer {li} ({ly.kind}) block {block} {what}"
            self.stats.close("state", ly.rec_state(idx)[0], states[li], f"{tag} recurrent state")
            self.stats.exact(ly.conv_head(idx)[0], hists[li], f"{tag} conv window")

    def check_cached(self, entries: Iterable[tuple[tuple[int, ...], int]], snapshots: dict[int, Snapshot]) -> int:
        """Every cached prefix block (``(tokens, block)`` pairs) still holds its boundary state
        (nothing overwrote it). Returns how many were checked."""
        n = 0
        for key, b in entries:
            self.check_block(-1, b, *snapshots[b], f"cached prefix of {len(key)} tokens")
            n += 1
        return n

    def check_step(
        self,
        active: Sequence[Request],
        recs: list[dict[str, Any]],
        n_acc: np.ndarray,
        blocks: np.ndarray,
        plans: dict[str, np.ndarray],
    ) -> dict[int, tuple[int, Snapshot]]:
        """Advance every request's reference by its accepted tokens, one at a time, and compare:
        conv and verify outputs at accepted positions, running blocks, boundary blocks and the
        commit plans' boundaries. Returns ``{row: (boundary block, reference snapshot)}``."""
        import torch

        from ...speculative import recurrence

        dev, bs, stats = self.dev, self.block_size, self.stats
        L = len(self.stack)
        # Boundaries, as the engine expects them; the commit plans must agree.
        expect: dict[int, tuple[int, int]] = {}
        for i, r in enumerate(active):
            bnd = (r.seq_len + int(n_acc[i])) // bs * bs
            if bnd > r.seq_len:
                expect[i] = (r.table[bnd // bs - 1], bnd - r.seq_len)
        kinds = sorted(plans)
        rows = plans[kinds[0]]
        got = {
            int(x["request"]): (int(x["boundary_block"]), int(x["boundary_len"]))
            for x in rows
            if x["boundary_block"] >= 0
        }
        stats.checks += 1
        if got != expect or not all(np.array_equal(rows, plans[k]) for k in kinds[1:]):
            stats.fail(f"step {self.step}: commit plan boundaries {got} != expected {expect}")

        snaps: dict[int, Snapshot] = {i: ([None] * L, [None] * L) for i in expect}
        n_t = torch.as_tensor(n_acc, device=dev)
        idx = torch.as_tensor(blocks, device=dev)
        for li, ly in enumerate(self.stack):
            rec = recs[li]
            S = torch.stack([r.ref_state[li] for r in active])  # [B, H, V, K] float32
            hist = torch.stack([r.ref_hist[li] for r in active])  # [B, dim, K-1] conv dtype
            # The keys and gates the records hold (rounded through the record dtype).
            kg_dtype = ly.cache.workspace(ly.index)[1].dtype
            k_r = rec["k_hat"].to(kg_dtype).float()
            g_r = rec["gate"].to(kg_dtype).float()
            w = ly.conv_w.float()
            for j in range(int(n_acc.max())):
                live = n_t > j
                # Conv: a plain causal conv over the history, then push the input.
                xj = rec["x"][:, j]  # [B, dim]
                y_ref = (torch.cat([hist.float(), xj.float()[:, :, None]], dim=2) * w).sum(-1)
                hist = torch.where(live[:, None, None], torch.cat([hist[:, :, 1:], xj[:, :, None]], dim=2), hist)
                # Recurrence: one token of the plain recurrence.
                t = slice(j, j + 1)
                out, states = recurrence.sequential_decode(
                    S, rec["q_hat"][:, t], k_r[:, t], rec["v"][:, t], g_r[:, t], rec["beta"][:, t]
                )
                S = torch.where(live[:, None, None, None], states[:, 1], S)
                for i in live.nonzero().flatten().tolist():
                    tag = f"step {self.step} request {active[i].rid} layer {li} ({ly.kind}) token {j}"
                    stats.close("output", rec["conv_y"][i, j], y_ref[i], f"{tag} conv output")
                    stats.close("output", rec["out"][i, j], out[i, 0], f"{tag} verify output")
                    if i in expect and expect[i][1] == j + 1:
                        snaps[i][0][li] = S[i].clone()
                        snaps[i][1][li] = hist[i].clone()
            got_S, got_h = ly.rec_state(idx), ly.conv_head(idx)
            for i, r in enumerate(active):
                r.ref_state[li] = S[i].clone()
                r.ref_hist[li] = hist[i].clone()
                tag = f"step {self.step} request {r.rid} layer {li} ({ly.kind}) running block {r.running}"
                stats.close("state", got_S[i], S[i], f"{tag} recurrent state")
                stats.exact(got_h[i], hist[i], f"{tag} conv window")
        for i, (bb, m) in expect.items():
            self.check_block(active[i].rid, bb, *snaps[i], f"boundary after {m} window tokens")
        return {i: (bb, snaps[i]) for i, (bb, _m) in expect.items()}

    def __repr__(self) -> str:
        return f"Oracle(layers={len(self.stack)}, device={str(self.dev)!r}, {self.stats!r})"
