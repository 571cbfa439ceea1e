""":func:`run`: one demo run, from validated options to its summary."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .config import DEFAULTS, validate
from .report import preset_memory, progress_line, summarize

__all__ = ["run"]

log = logging.getLogger("recoverssm_rs.tools.demo")


def run(
    *,
    device: str = DEFAULTS["device"],
    steps: int = DEFAULTS["steps"],
    requests: int = DEFAULTS["requests"],
    layers: int = DEFAULTS["layers"],
    seed: int = DEFAULTS["seed"],
    block_size: int = DEFAULTS["block_size"],
    num_spec: int = DEFAULTS["num_spec"],
    preset: str = DEFAULTS["preset"],
    progress: Callable[[str], None] | None = None,
    progress_every: int | None = None,
    num_threads: int | None = DEFAULTS["num_threads"],
) -> dict[str, Any]:
    """Serve a toy hybrid GDN + KDA model for ``steps`` steps and check every state against the
    token-by-token ground truth after every step. Returns a JSON-serialisable summary
    (``summary["mismatches"] == 0`` when everything agreed).

    Args:
        device: torch device of every tensor ("cpu", "cuda", ...).
        steps: serving steps (each verifies and commits every active request).
        requests: the largest batch (workspace rows); requests arrive from the first step on.
        layers: layers per kind (the stack interleaves GDN and KDA layers).
        seed: seeds weights, prompts, drafts, acceptance and scheduling.
        block_size: prefix-cache block size in tokens (the core requires >= num_spec + 1).
        num_spec: draft tokens per decoding window (``Q = num_spec + 1``).
        preset: the RecoverSSM layout preset whose workspace-vs-scratch memory is reported (not
            run: the run serves the toy model).
        progress: called with a progress line every ``progress_every`` steps (default: 8 lines
            per run) and once at the end, after the last checks (its check count is the
            summary's); lines also go to the ``recoverssm_rs.tools.demo`` logger at INFO.
        num_threads: torch intra-op threads on the CPU during the run (restored afterwards;
            ``None`` keeps the process setting). The demo's tensors are tiny: extra threads do not
            help, and on a loaded machine they spin.

    Raises:
        DemoOptionError: (a ``ValueError``) before anything runs, naming the option that is out
            of range or that the core refused.
    """
    validate(
        device=device,
        steps=steps,
        requests=requests,
        layers=layers,
        seed=seed,
        block_size=block_size,
        num_spec=num_spec,
        preset=preset,
        num_threads=num_threads,
    )
    import torch

    saved = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _run(
            device=device,
            steps=steps,
            requests=requests,
            layers=layers,
            seed=seed,
            block_size=block_size,
            num_spec=num_spec,
            preset=preset,
            progress=progress,
            progress_every=progress_every,
        )
    finally:
        torch.set_num_threads(saved)


def _run(
    *,
    device: str,
    steps: int,
    requests: int,
    layers: int,
    seed: int,
    block_size: int,
    num_spec: int,
    preset: str,
    progress: Callable[[str], None] | None,
    progress_every: int | None,
) -> dict[str, Any]:
    from .engine import Engine

    t_start = time.perf_counter()
    every = progress_every or max(1, steps // 8)

    def say(msg: str) -> None:
        log.info("%s", msg)
        if progress is not None:
            progress(msg)

    memory = preset_memory(preset)
    engine = Engine(
        device=device,
        steps=steps,
        requests=requests,
        layers=layers,
        seed=seed,
        block_size=block_size,
        num_spec=num_spec,
    )
    say(engine.describe())
    for step in range(steps):
        engine.run_step(step)
        if step + 1 == steps:
            break
        if (step + 1) % every == 0:
            say(progress_line(engine))
    cached = engine.check_cached()
    say(progress_line(engine) + f" (incl. {cached} cached prefix blocks re-checked)")
    return summarize(engine, cached=cached, preset=memory, t_start=t_start)
