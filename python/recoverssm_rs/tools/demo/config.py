"""The demo's options, their defaults, and the up-front check of a configuration.

Ranges of the demo's own options (``steps`` up to :data:`MAX_STEPS`, ``requests``, ``layers``, ``num_spec``, ``seed``,
``num_threads``, the largest block size) are checked here; everything the core decides (the layouts
for ``num_spec``, the block size against the speculative window, the state cache's sizes, whether a
preset is a RecoverSSM layout) is asked of the core, and its error is reported as an error of the
option that caused it. Last, the memory the run's state caches take (from the core's layout
figures) is checked against the memory available on the device.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import layouts
from ...errors import RecoverSSMError
from ..cli_args import allowed_range, core_reason, max_threads, memory_problem

__all__ = [
    "DEFAULTS",
    "MAX_BLOCK_SIZE",
    "MAX_STEPS",
    "PRESET",
    "DemoOptionError",
    "Sizes",
    "recoverssm_presets",
    "run_bytes",
    "sizes",
    "validate",
]

PRESET = "kimi-k3-like-recoverssm"
"""The RecoverSSM preset whose memory the demo reports by default."""

DEFAULTS: dict[str, Any] = dict(
    device="cpu",
    steps=384,
    requests=8,
    layers=2,
    seed=0,
    block_size=8,
    num_spec=3,
    preset=PRESET,
    num_threads=1,
)
"""Defaults of :func:`recoverssm_rs.tools.demo.run`'s options."""

_SEED_LIMIT = 2**64 - 1  # torch.Generator.manual_seed takes a 64-bit seed

MAX_STEPS = 100_000
"""The most serving steps a run takes (a few minutes on one CPU core; the default is 384)."""

MAX_BLOCK_SIZE = 1024
"""The largest block size the demo runs with: its prompts are up to 3 blocks long and prefill
``num_spec + 1`` tokens a step, so larger blocks would not be crossed within a run."""

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class Sizes:
    """The sizes of a demo run that follow from its options."""

    window: int
    """Tokens per speculative window, ``num_spec + 1``."""
    max_prompt: int
    """The longest prompt (tokens)."""
    max_new: int
    """The most tokens a request generates."""
    cols: int
    """Block-table columns per request."""
    num_blocks: int
    """Blocks in each state cache's pool (the null block 0 included)."""


def sizes(*, requests: int, block_size: int, num_spec: int) -> Sizes:
    """The run's sizes: prompts, generations, block-table columns and the pool, which holds the
    worst case of the active requests (a running block and a full block table each) plus room for
    the prefix cache (which evicts its least recently used unshared entry when the pool runs dry)."""
    window = num_spec + 1
    max_prompt = 3 * block_size + 6
    max_new = 6 * window + 8
    cols = (max_prompt + max_new + 2 * window) // block_size + 2
    return Sizes(
        window=window,
        max_prompt=max_prompt,
        max_new=max_new,
        cols=cols,
        num_blocks=1 + requests * (cols + 1) + 4 * requests,
    )


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
        raise DemoOptionError(option, value, f"must be {allowed_range(low, high)}")


def _core(option: str, value: Any, check: Callable[[], object]) -> None:
    """Run the core's ``check``; its refusal becomes an error of ``option``."""
    try:
        check()
    except (RecoverSSMError, OverflowError, TypeError) as e:
        raise DemoOptionError(option, value, core_reason(e, value)) from e


def _check_block_size(num_spec: int, block_size: int) -> None:
    """The core's commit planner decides whether ``block_size`` fits the speculative window:
    plan an empty align-mode commit for the toy layout (no torch needed)."""
    from ..._core import CommitPlanner
    from .model import toy_layouts

    none = np.zeros(0, dtype=np.int64)
    CommitPlanner(toy_layouts(num_spec)["gdn"], 2).plan(
        state_blocks=none,
        num_accepted=none,
        query_lens=none,
        seq_lens=none,
        block_table=np.zeros((0, 1), np.int64),
        block_size=block_size,
        max_requests=1,
    )


def _check_device(device: str) -> None:
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise DemoOptionError("device", device, "must be cpu, cuda or cuda:N")
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        raise DemoOptionError(
            "device", device, "CUDA is not available here (no GPU, or torch was built without CUDA); use --device cpu"
        )
    count = torch.cuda.device_count()
    index = torch.device(device).index
    if index is not None and index >= count:
        raise DemoOptionError("device", device, f"this machine has CUDA devices 0 to {count - 1} inclusive")


def _check_cache_sizes(layers: int, requests: int, block_size: int, num_spec: int) -> None:
    """The core's limits on a state cache's sizes, for the pool the run allocates."""
    from ... import _core

    blocks = sizes(requests=requests, block_size=block_size, num_spec=num_spec).num_blocks
    try:
        _core.check_cache_sizes(layers, blocks, requests)
    except RecoverSSMError as e:
        option, value = ("layers", layers) if "num_layers" in str(e) else ("requests", requests)
        raise DemoOptionError(option, value, f"{e} (the pool has {blocks} blocks for {requests} requests)") from e


def run_bytes(*, layers: int, requests: int, block_size: int, num_spec: int) -> int:
    """Bytes the run's state caches take (the core's per-block and per-request figures of the toy
    layouts), counting the persistent states twice: the oracle keeps a reference copy of them."""
    from .model import toy_layouts

    blocks = sizes(requests=requests, block_size=block_size, num_spec=num_spec).num_blocks
    total = 0
    for lay in toy_layouts(num_spec).values():
        conv = lay.states[lay.recover_geometry()["conv_state"]].nbytes or 0  # a row's verified window
        total += 2 * lay.persistent_bytes_per_block * layers * blocks
        total += (lay.workspace_bytes_per_request + conv) * layers * requests
    return total


def _device_memory(device: str) -> int | None:
    if device == "cpu":
        return None  # memory_problem reads the host's
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def _check_memory(device: str, layers: int, requests: int, block_size: int, num_spec: int) -> None:
    nbytes = run_bytes(layers=layers, requests=requests, block_size=block_size, num_spec=num_spec)
    problem = memory_problem(nbytes, "the run's state caches", _device_memory(device))
    if problem is None:
        return
    # Name the option furthest above its default: the one to lower.
    option = max(("layers", "requests"), key=lambda o: {"layers": layers, "requests": requests}[o] / DEFAULTS[o])
    value = layers if option == "layers" else requests
    raise DemoOptionError(option, value, f"{problem} on {device}")


def validate(
    *,
    device: str,
    steps: int,
    requests: int,
    layers: int,
    seed: int,
    block_size: int,
    num_spec: int,
    preset: str,
    num_threads: int | None,
) -> None:
    """Check every option before anything runs: ranges, the core's rules, the memory the run
    takes.

    Raises:
        DemoOptionError: naming the option, its value and what it must be.
    """
    _at_least("steps", steps, 1, MAX_STEPS)
    _at_least("requests", requests, 1)
    _at_least("layers", layers, 1)
    _at_least("num_spec", num_spec, 1)  # the demo verifies speculative drafts
    _at_least("seed", seed, 0, _SEED_LIMIT)
    if num_threads is not None:
        _at_least("num_threads", num_threads, 1, max_threads())
    recover = recoverssm_presets()
    if preset not in recover:
        what = "not a preset" if preset not in layouts.PRESETS else "not a RecoverSSM preset"
        raise DemoOptionError(
            "preset",
            preset,
            f"{what}; the demo reports the memory of a RecoverSSM preset: "
            f"{', '.join(recover)} (--layout-only shows any preset)",
        )
    from .model import toy_layouts

    _core("num_spec", num_spec, lambda: toy_layouts(num_spec))
    _at_least("block_size", block_size, 1, MAX_BLOCK_SIZE)  # a block holds tokens; the rest is the core's
    _core("block_size", block_size, lambda: _check_block_size(num_spec, block_size))
    _check_device(device)
    _check_cache_sizes(layers, requests, block_size, num_spec)
    _check_memory(device, layers, requests, block_size, num_spec)
