"""The demo's figures and their text: the preset's memory, progress lines, the run's summary."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import layouts
from ..formatting import format_layout, human_bytes
from .model import CONV_KERNEL, HEAD_DIM, HEADS
from .oracle import TOLERANCE

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["PRESET_REQUESTS", "preset_header", "preset_memory", "progress_line", "summarize", "format_summary"]

PRESET_REQUESTS = 256
"""The batch the preset's memory is reported for."""


def preset_header(preset: str) -> str:
    """The preset's layout table, labelled as the preset (its memory is reported, it is not run)."""
    p = layouts.PRESETS[preset]
    return (
        f"preset {preset} ({p.model}, {p.num_layers} recurrent layers): reported for its "
        f"memory, not run\n{format_layout(p.layout(), p.num_layers)}"
    )


def preset_memory(preset: str, requests: int = PRESET_REQUESTS) -> dict[str, Any]:
    """Workspace vs full-state scratch of a RecoverSSM preset, per request and for ``requests``.

    The figures are :meth:`StateCache.memory_report`'s for one layer and one request (a cache of
    the preset's layout that small costs a few MiB), times the preset's layers and ``requests``:
    every figure of the report is per layer and per request times those counts.
    """
    from ...speculative.state_cache import StateCache

    p = layouts.PRESETS[preset]
    m = StateCache(p.layout(), num_layers=1, num_blocks=2, max_requests=1).memory_report()
    n = p.num_layers
    workspace = m.workspace_bytes_per_request * n
    full = m.full_state_scratch_bytes * n
    return {
        "preset": preset,
        "num_layers": n,
        "window": m.window,
        "per_layer_and_request": m.as_dict(),
        "record_bytes_per_request": m.record_bytes_per_request * n,
        "conv_window_bytes_per_request": workspace - m.record_bytes_per_request * n,
        "record_ratio": m.full_state_scratch_bytes / m.record_bytes_per_request,
        "workspace_bytes_per_request": workspace,
        "full_state_scratch_bytes_per_request": full,
        "ratio": m.scratch_ratio,
        "requests": requests,
        "workspace_bytes": workspace * requests,
        "full_state_scratch_bytes": full * requests,
    }


def progress_line(engine: Engine) -> str:
    """One line: where the run stands (counters and checks so far)."""
    c, s = engine.counters, engine.oracle.stats
    return (
        f"step {engine.step + 1:4d}/{engine.steps}: {len(engine.active)} active, "
        f"{c['requests_served']} served, {c['tokens_accepted']} tokens accepted, "
        f"{c['cache_hits']} hits, {c['forks']} forks, {c['boundary_states']} boundary "
        f"states, {s.checks} checks, {s.mismatches} mismatches, max state err "
        f"{s.max_state_err:.2e}, step {np.median(engine.step_ms):.1f} ms"
    )


def summarize(engine: Engine, *, cached: int, preset: dict[str, Any], t_start: float) -> dict[str, Any]:
    """The run's JSON-serialisable summary."""
    d, c, s = engine, engine.counters, engine.oracle.stats
    return {
        "config": {
            "device": str(d.dev),
            "steps": d.steps,
            "requests": d.requests,
            "layers_per_kind": d.layers,
            "seed": d.seed,
            "block_size": d.block_size,
            "num_spec": d.num_spec,
            "window": d.Q,
            "heads": HEADS,
            "head_dim": HEAD_DIM,
            "conv_kernel_size": CONV_KERNEL,
            "num_blocks": d.num_blocks,
            "gdn": {"conv_layout": "SD", "conv_dtype": "float32", "record_dtype": "float32", "state_dtype": "float32"},
            "kda": {
                "conv_layout": "DS",
                "conv_dtype": "bfloat16",
                "record_dtype": "bfloat16",
                "state_dtype": "float32",
            },
        },
        "steps": d.steps,
        **c,
        "requests_active_at_end": len(d.active),
        "mean_accepted_per_window": c["tokens_accepted"] / max(c["decode_windows"], 1),
        "accepted_histogram": d.accepted_hist,
        "peak_blocks_used": d.pool.peak_used,
        "prefix_cache_entries_at_end": cached,
        "prefix_cache_evictions": d.pcache.evictions,
        "checks": s.checks,
        "mismatches": s.mismatches,
        "first_mismatches": s.first_mismatches,
        "tolerance": TOLERANCE,
        "max_state_err": s.max_state_err,
        "max_abs_state": s.max_state_abs,
        "max_output_err": s.max_output_err,
        "max_conv_err": s.max_conv_err,
        "memory": {"run": {k: cache.memory_report().as_dict() for k, cache in d.caches.items()}, "preset": preset},
        "step_ms_median": float(np.median(d.step_ms)),
        "check_ms_median": float(np.median(d.check_ms)),
        "wall_s": time.perf_counter() - t_start,
    }


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable summary of :func:`recoverssm_rs.tools.demo.run`'s result."""
    c = s["config"]
    pm = s["memory"]["preset"]
    h = human_bytes
    lines = [
        "",
        f"summary of the run (the toy model: {2 * c['layers_per_kind']} layers, {c['device']}, "
        f"seed {c['seed']}, Q = {c['window']}, block_size = {c['block_size']}):",
        f"  steps                 {s['steps']} (median {s['step_ms_median']:.2f} ms serving + "
        f"{s['check_ms_median']:.2f} ms ground-truth check per step; {s['wall_s']:.1f} s in all)",
        f"  requests              {s['requests_served']} served ({s['requests_finished']} "
        f"finished, "
        f"{s['requests_active_at_end']} active at the end), up to {c['requests']} per step",
        f"  tokens                {s['prefill_tokens']} prefilled, {s['tokens_accepted']} accepted "
        f"in {s['decode_windows']} decoding windows (mean {s['mean_accepted_per_window']:.2f} "
        f"per window of {c['window']}; drafts accepted {s['drafts_accepted']}/"
        f"{s['drafts_proposed']}; histogram of num_accepted {s['accepted_histogram']})",
        f"  copies                {s['cache_hits']} prefix-cache hits ({s['hit_tokens']} tokens "
        f"not prefilled, {s['cache_misses']} misses), {s['forks']} forks -> "
        f"{s['copy_blocks_calls']} copy_blocks calls, {s['plan_copy_copies']} plan_copy copies",
        f"  commits               {s['commits']} request commits, {s['boundary_states']} boundary "
        f"states written ({s['boundary_layer_states']} layer states), "
        f"{s['prefix_cache_registered']} prefix-cache entries registered "
        f"({s['prefix_cache_evictions']} evicted; peak {s['peak_blocks_used']} of "
        f"{c['num_blocks'] - 1} blocks in use)",
    ]
    for kind in ("gdn", "kda"):
        m = s["memory"]["run"][kind]
        lines.append(
            f"  {'memory (run, ' + kind + ')':22}workspace {h(m['workspace_bytes'])} vs "
            f"full-state scratch {h(m['full_state_scratch_bytes'])} ({m['scratch_ratio']:.1f}x)"
        )
    lines += [
        f"  memory (preset {pm['preset']}, {pm['num_layers']} layers, Q = {pm['window']}, not "
        f"run): verify records {h(pm['record_bytes_per_request'])} ({pm['record_ratio']:.0f}x "
        f"less than full-state scratch) + verified conv windows "
        f"{h(pm['conv_window_bytes_per_request'])} = workspace "
        f"{h(pm['workspace_bytes_per_request'])} vs full-state scratch "
        f"{h(pm['full_state_scratch_bytes_per_request'])} per request ({pm['ratio']:.1f}x); "
        f"x {pm['requests']} requests: {h(pm['workspace_bytes'])} vs "
        f"{h(pm['full_state_scratch_bytes'])}",
        f"  ground truth          {s['checks']} checks; max error |cache - ref| / max(1, "
        f"max|ref|): states {s['max_state_err']:.2e} (max|state| {s['max_abs_state']:.2f}), "
        f"outputs {s['max_output_err']:.2e}; tolerance {s['tolerance']:g}; conv windows max diff "
        f"{s['max_conv_err']:g} (bit-exact required)",
        f"  mismatches            {s['mismatches']}",
    ]
    for m in s["first_mismatches"]:
        lines.append(f"    {m}")
    return "\n".join(lines)
