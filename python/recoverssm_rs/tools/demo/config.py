"""The demo's options, their defaults, and the up-front check of a configuration.

Ranges of the demo's own options (``steps``, ``requests``, ``layers``, ``num_spec``, ``seed``,
``num_threads``) are checked here; everything the core decides (the layouts for ``num_spec``, the
block size against the speculative window, whether a preset is a RecoverSSM layout) is asked of the
core, and its error is reported as an error of the option that caused it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ... import layouts
from ...errors import RecoverSSMError

__all__ = ["DEFAULTS", "PRESET", "DemoOptionError", "recoverssm_presets", "validate"]

PRESET = "kimi-k3-like-recoverssm"
"""The RecoverSSM preset whose memory the demo reports by default."""

DEFAULTS: dict[str, Any] = dict(
    device="cpu", steps=384, requests=8, layers=2, seed=0, block_size=8, num_spec=3,
    preset=PRESET, num_threads=1,
)
"""Defaults of :func:`recoverssm_rs.tools.demo.run`'s options."""

_SEED_LIMIT = 2**64 - 1  # torch.Generator.manual_seed takes a 64-bit seed


class DemoOptionError(ValueError):
    """A demo option has a value the demo cannot run with.

    Attributes:
        option: the keyword of :func:`recoverssm_rs.tools.demo.run` (``"block_size"``, ...).
        value: the value given.
        reason: what is wrong, with the allowed range (the core's message where the core decided).
    """

    def __init__(self, option: str, value: Any, reason: str) -> None:
        super().__init__(f"{option} = {value!r}: {reason}")
        self.option = option
        self.value = value
        self.reason = reason

    def __repr__(self) -> str:
        return f"DemoOptionError({self.option!r}, {self.value!r}, {self.reason!r})"


def recoverssm_presets() -> list[str]:
    """The presets whose layout the core accepts as a RecoverSSM layout (the ones the demo's
    memory comparison can use)."""
    names = []
    for name, p in layouts.PRESETS.items():
        try:
            p.layout().recover_geometry()
        except RecoverSSMError:
            continue
        names.append(name)
    return names


def _at_least(option: str, value: int, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DemoOptionError(option, value, "expected an integer")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in {low}..{high}"
        raise DemoOptionError(option, value, f"must be {allowed}")


def _core(option: str, value: Any, check: Callable[[], object]) -> None:
    """Run the core's ``check``; its refusal becomes an error of ``option``."""
    try:
        check()
    except (RecoverSSMError, OverflowError, TypeError) as e:
        raise DemoOptionError(option, value, str(e)) from e


def _check_block_size(num_spec: int, block_size: int) -> None:
    """The core's commit planner decides whether ``block_size`` fits the speculative window:
    plan an empty align-mode commit on a minimal cache of the toy layout."""
    from ...recoverssm.state_cache import StateCache
    from .model import toy_layouts

    cache = StateCache(toy_layouts(num_spec)["gdn"], num_layers=1, num_blocks=2, max_requests=1)
    none = np.zeros(0, dtype=np.int64)
    cache.plan_commit(none, none, none, seq_lens=none, block_table=np.zeros((0, 1), np.int64),
                      block_size=block_size)


def _check_device(device: str) -> None:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as e:
        raise DemoOptionError("device", device, f"not a torch device ({e})") from None
    if dev.type == "cpu":
        return
    if dev.type != "cuda":
        raise DemoOptionError("device", device, "the demo runs on 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise DemoOptionError("device", device, "CUDA is not available here (no GPU, or torch "
                                                "was built without CUDA); use --device cpu")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise DemoOptionError("device", device, f"this machine has CUDA devices 0..{count - 1}")


def validate(*, device: str, steps: int, requests: int, layers: int, seed: int,
             block_size: int, num_spec: int, preset: str, num_threads: int | None) -> None:
    """Check every option before anything runs.

    Raises:
        DemoOptionError: naming the option, its value and what it must be.
    """
    _at_least("steps", steps, 1)
    _at_least("requests", requests, 1)
    _at_least("layers", layers, 1)
    _at_least("num_spec", num_spec, 1)  # the demo verifies speculative drafts
    _at_least("seed", seed, 0, _SEED_LIMIT)
    if num_threads is not None:
        _at_least("num_threads", num_threads, 1)
    recover = recoverssm_presets()
    if preset not in recover:
        what = "not a preset" if preset not in layouts.PRESETS else "not a RecoverSSM preset"
        raise DemoOptionError(
            "preset", preset, f"{what}; the demo reports the memory of a RecoverSSM preset: "
                              f"{', '.join(recover)} (--layout-only shows any preset)")
    from .model import toy_layouts

    _core("num_spec", num_spec, lambda: toy_layouts(num_spec))
    _at_least("block_size", block_size, 1)  # a block holds tokens; the rest is the core's
    _core("block_size", block_size, lambda: _check_block_size(num_spec, block_size))
    _check_device(device)
