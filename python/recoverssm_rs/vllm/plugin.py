"""The vLLM plugin: vLLM's align-mode mamba state step served by :class:`~recoverssm_rs.vllm.VllmMambaStep`,
with no file of vLLM edited.

vLLM loads every entry point of the group ``vllm.general_plugins`` in each of its processes before it
builds a model runner; the package's wheel declares one, ``recoverssm_rs`` -> :func:`register`.
:func:`register` replaces three module-level functions of ``vllm.v1.worker.mamba_utils``, which the
model runner looks up at every call:

* ``preprocess_mamba`` (the pre-copy of every step in ``mamba_cache_mode="align"``),
* ``stage_postprocess_inputs_to_gpu`` and ``postprocess_mamba_align_gpu`` (the post-process with
  speculative decoding: the step's post half);

and, where vLLM runs its V2 runner, the class ``MambaHybridModelState`` of
``vllm.v1.worker.gpu.model_states.mamba_hybrid`` when vLLM imports that module (served by
:class:`~recoverssm_rs.vllm.ModelStateV2`; see :mod:`recoverssm_rs.vllm.plugin_v2`).

Each runner gets its own step, built from the objects vLLM passes (KV-cache config, forward context,
copy functions, the input batch's ``max_num_reqs``) at its first pre-copy, for every mamba group.
vLLM's ``mamba_state_idx`` dict is kept as vLLM's own code would keep it, and the accepted counts are
written where vLLM reads them, so vLLM's code can take over at any step.

Where the package cannot serve (an unknown vLLM version or signature, a layout or platform the step
refuses, a step it rejects), vLLM's own function runs instead: the reason is logged once (a
warning) and every half-step vLLM serves counts as a fallback in :func:`plugin_stats`. A runner whose
step was rejected once stays with vLLM's code (the package changed nothing for that step; vLLM's
bookkeeping was kept current). ``RECOVERSSM_VLLM_PLUGIN=0`` turns the plugin off (nothing replaced),
as does a value it does not know (a fallback, logged naming it).

vLLM itself is imported only by :func:`register` (from vLLM's plugin loader); everything else reads
vLLM's objects by attribute. The plugin's log lines go to the logger ``vllm.plugins.recoverssm_rs``.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import RecoverSSMError
from .step import VllmMambaStep, mamba_groups

__all__ = ["register", "plugin_stats", "SUPPORTED_VLLM", "ENV_SWITCH"]

log = logging.getLogger("vllm.plugins.recoverssm_rs")
"""The plugin's own lines go to vLLM's logger tree, so that they show in vLLM's log with vLLM's handler,
format and level, which vLLM sets up only after loading plugins; the package's other modules log to
``recoverssm_rs``."""

ENV_SWITCH = "RECOVERSSM_VLLM_PLUGIN"
"""Set to ``0`` to leave vLLM's own step in place."""

SUPPORTED_VLLM = ((0, 32), (0, 33))
"""The vLLM (major, minor) versions whose ``mamba_utils`` functions the plugin replaces."""

MODULE = "vllm.v1.worker.mamba_utils"

# The parameters of the replaced functions, as vLLM 0.32 and 0.33 declare them: a function with
# other parameters is left in place.
PARAMS: dict[str, tuple[str, ...]] = {
    "preprocess_mamba": (
        "scheduler_output",
        "kv_cache_config",
        "cache_config",
        "mamba_state_idx",
        "input_batch",
        "requests",
        "forward_context",
        "mamba_state_copy_funcs",
        "copy_bufs",
        "align_ctx",
    ),
    "stage_postprocess_inputs_to_gpu": (
        "ctx",
        "scheduler_output",
        "req_ids",
        "num_reqs",
        "requests",
        "mamba_state_idx",
    ),
    "postprocess_mamba_align_gpu": (
        "bufs",
        "num_reqs",
        "num_accepted_tokens_gpu",
        "num_accepted_tokens_cpu_tensor",
        "input_batch",
        "kv_cache_config",
        "forward_context",
        "mamba_state_copy_funcs",
    ),
}


class _Stats:
    """The calling process's counters (:func:`plugin_stats`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pre_copies = 0
        self.post_processes = 0
        self.fallbacks = 0
        self.replaced: list[str] = []
        self.vllm_version: str | None = None
        self.reasons: list[str] = []
        self.registered = False

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


_stats = _Stats()


def plugin_stats() -> dict[str, Any]:
    """The plugin's counters in the calling process.

    Returns:
        ``steps``: half-steps the package served (``pre_copies + post_processes``);
        ``pre_copies``, ``post_processes``: each half's share; ``fallbacks``: half-steps (or a
        declined installation) left to vLLM's own code; ``replaced``: the names of the
        ``vllm.v1.worker.mamba_utils`` functions replaced (and the V2 runner's model-state class,
        once installed); ``vllm_version``; ``active``: whether
        anything was replaced; ``reasons``: why vLLM's code served, one entry per distinct reason.
    """
    s = _stats
    with s.lock:
        return {
            "steps": s.pre_copies + s.post_processes,
            "pre_copies": s.pre_copies,
            "post_processes": s.post_processes,
            "fallbacks": s.fallbacks,
            "replaced": list(s.replaced),
            "vllm_version": s.vllm_version,
            "active": bool(s.replaced),
            "reasons": list(s.reasons),
        }


def _fallback(reason: str) -> None:
    """Counts one fallback; logs ``reason`` (a warning) the first time it is given."""
    with _stats.lock:
        _stats.fallbacks += 1
        new = reason not in _stats.reasons
        if new:
            _stats.reasons.append(reason)
    if new:
        log.warning("recoverssm_rs vLLM plugin: vLLM's own code serves: %s", reason)


def record_fallback(reason: str) -> None:
    """Counts one half-step (or declined installation) left to vLLM, logging ``reason`` once (the
    plugin's other parts report through it)."""
    _fallback(reason)


def record_served(half: str) -> None:
    """Counts one half-step the package served: ``half`` is ``"pre_copies"`` or ``"post_processes"``."""
    if half not in ("pre_copies", "post_processes"):
        raise ValueError(f"half: expected 'pre_copies' or 'post_processes', got {half!r}")
    _stats.count(half)


def record_replaced(name: str) -> None:
    """Adds ``name`` to what :func:`plugin_stats` reports replaced (once)."""
    with _stats.lock:
        if name not in _stats.replaced:
            _stats.replaced.append(name)


def conv_layout_of(copy_funcs: Mapping[Any, Any]) -> str | None:
    """vLLM's conv-state layout as its copy functions read it (see :func:`_conv_layout`)."""
    return _conv_layout(copy_funcs)


def version_supported(version: str) -> bool:
    """Whether a vLLM version string (``"0.32.0"``, ``"0.33.0+cpu"``, ...) is one the plugin serves."""
    m = re.match(r"^(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) in SUPPORTED_VLLM


def signature_matches(func: Any, name: str) -> bool:
    """Whether ``func`` declares the parameters of vLLM's ``name`` (:data:`PARAMS`), in order."""
    try:
        params = tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return False
    return params == PARAMS[name]


def _conv_layout(copy_funcs: Mapping[Any, Any]) -> str | None:
    """vLLM's conv-state layout as vLLM's own code reads it: ``get_conv_state_layout()`` of the
    module that defines its copy functions (``None`` when not found: the step's default,
    ``$VLLM_SSM_CONV_STATE_LAYOUT`` or ``"SD"``)."""
    for funcs in copy_funcs.values():
        for f in funcs:
            get = getattr(f, "__globals__", {}).get("get_conv_state_layout")
            if callable(get):
                return str(get())
    return None


def _max_num_reqs(input_batch: Any) -> Any:
    """The input batch's request capacity (its ``max_num_reqs``, else the length of its per-row
    ``num_accepted_tokens_cpu``), as given: the core checks it (an integer in ``1 ..= 2**24``)."""
    n = getattr(input_batch, "max_num_reqs", None)
    return n if n is not None else len(input_batch.num_accepted_tokens_cpu)


class _Runner:
    """One model runner's step, or why vLLM's code serves it."""

    def __init__(self, step: VllmMambaStep | None, reason: str | None, block_size: int = 0) -> None:
        self.step = step
        self.reason = reason
        self.block_size = block_size  # the mamba groups' (vLLM's running columns in its dict)
        self.staged: Callable[[], None] | None = None  # vLLM's staging, for a post-process fallback

    def give_up(self, reason: str) -> None:
        self.step = None
        self.reason = reason


class _Plugin:
    """The replacements, bound to vLLM's originals."""

    def __init__(self, module: ModuleType, originals: Mapping[str, Any]) -> None:
        self.module = module
        self.originals = dict(originals)
        self._signatures = {n: inspect.signature(f) for n, f in self.originals.items()}
        self.pending_line: str | None = None  # the INFO line, when vLLM's logging was not set up yet
        # id -> (object, runner) for a buffer object that takes no attribute (held: its id is not reused)
        self._runners: dict[int, tuple[Any, _Runner]] = {}

    def _announce(self) -> None:
        line, self.pending_line = self.pending_line, None
        if line is not None:
            log.info("%s", line)

    def _runner_of(self, key: Any) -> _Runner | None:
        runner: _Runner | None = getattr(key, "_recoverssm_runner", None)
        entry = self._runners.get(id(key)) if runner is None else None
        return entry[1] if entry is not None and entry[0] is key else runner

    def _bind(self, key: Any, runner: _Runner) -> None:
        """The runner lives on vLLM's buffer object (copy buffers, align context), freed with it when
        vLLM re-initialises or frees its KV cache: its step binds the states."""
        try:
            object.__setattr__(key, "_recoverssm_runner", runner)
        except (AttributeError, TypeError):
            self._runners[id(key)] = (key, runner)

    def _build(self, a: dict[str, Any]) -> _Runner:
        if not getattr(a["cache_config"], "enable_prefix_caching", False):
            return _Runner(None, "prefix caching is off (vLLM's align mode requires it)")
        try:
            step = VllmMambaStep.from_runner(
                a["kv_cache_config"],
                a["forward_context"],
                a["mamba_state_copy_funcs"],
                max_num_reqs=_max_num_reqs(a["input_batch"]),
                conv_layout=_conv_layout(a["mamba_state_copy_funcs"]),
            )
        except (RecoverSSMError, AttributeError, TypeError, ValueError) as exc:
            return _Runner(None, f"the step cannot serve this runner: {type(exc).__name__}: {exc}")
        log.debug("recoverssm_rs vLLM plugin: %r", step)
        return _Runner(step, None, int(mamba_groups(a["kv_cache_config"])[0][1].block_size))

    # --------------------------------------------------------------------------------------------
    # The replacements
    # --------------------------------------------------------------------------------------------

    def preprocess_mamba(self, *args: Any, **kwargs: Any) -> None:
        self._announce()
        a = self._signatures["preprocess_mamba"].bind(*args, **kwargs).arguments
        copy_bufs = a["copy_bufs"]
        runner = self._runner_of(copy_bufs)
        if runner is None:
            runner = self._build(a)
            self._bind(copy_bufs, runner)
        if a.get("align_ctx") is not None:
            self._bind(a["align_ctx"], runner)
        step = runner.step
        if step is not None:
            try:
                self._pre_copy(step, runner.block_size, a)
                _stats.count("pre_copies")
                return
            except RecoverSSMError as exc:
                runner.give_up(f"the step rejected a pre-copy (nothing changed): {exc}")
        _fallback(str(runner.reason))
        self.originals["preprocess_mamba"](*args, **kwargs)

    @staticmethod
    def _pre_copy(step: VllmMambaStep, block_size: int, a: dict[str, Any]) -> None:
        input_batch, sched, requests = a["input_batch"], a["scheduler_output"], a["requests"]
        out = step.preprocess(sched, input_batch, requests)
        if getattr(step, "device_step", None) is not None:  # device counts: vLLM reads the host copy next
            input_batch.num_accepted_tokens_cpu[: len(out)] = out.cpu().numpy()
        # vLLM's mamba_state_idx as vLLM's preprocess_mamba leaves it (released ids dropped, each
        # request's running column), for vLLM's own code should it serve a later step.
        idx: dict[str, int] = a["mamba_state_idx"]
        cached = sched.scheduled_cached_reqs
        for ids in (sched.finished_req_ids, sched.preempted_req_ids or (), cached.resumed_req_ids or ()):
            for r in ids:
                idx.pop(r, None)
        ns = sched.num_scheduled_tokens
        for r in input_batch.req_ids:
            idx[r] = (requests[r].num_computed_tokens + ns[r] - 1) // block_size

    def stage_postprocess_inputs_to_gpu(self, *args: Any, **kwargs: Any) -> None:
        original = self.originals["stage_postprocess_inputs_to_gpu"]
        a = self._signatures["stage_postprocess_inputs_to_gpu"].bind(*args, **kwargs).arguments
        runner = self._runner_of(a["ctx"])
        if runner is not None and runner.step is not None:
            # The pre-copy prepared the post-process's inputs; vLLM's staging is kept for a fallback.
            runner.staged = lambda: original(*args, **kwargs)
            return
        original(*args, **kwargs)

    def postprocess_mamba_align_gpu(self, *args: Any, **kwargs: Any) -> None:
        self._announce()
        a = self._signatures["postprocess_mamba_align_gpu"].bind(*args, **kwargs).arguments
        runner = self._runner_of(getattr(a["bufs"], "preprocess", None))
        if runner is not None and runner.step is not None:
            staged, runner.staged = runner.staged, None
            try:
                self._post_process(runner.step, a)
                _stats.count("post_processes")
                return
            except RecoverSSMError as exc:
                runner.give_up(f"the step rejected a post-process (nothing changed): {exc}")
                if staged is not None:
                    staged()
        _fallback(str(runner.reason) if runner is not None else "a post-process for a runner never pre-copied")
        self.originals["postprocess_mamba_align_gpu"](*args, **kwargs)

    @staticmethod
    def _post_process(step: VllmMambaStep, kw: dict[str, Any]) -> None:
        n = int(kw["num_reqs"])
        acc = kw["num_accepted_tokens_gpu"][:n]
        if getattr(step, "device_step", None) is None:
            acc = acc.cpu().numpy() if hasattr(acc, "cpu") else np.asarray(acc)
            if acc.dtype.kind in "iu":
                acc = acc.astype(np.int64, copy=False)
        out = step.postprocess(acc)
        dest = kw["num_accepted_tokens_cpu_tensor"][:n]
        if isinstance(out, np.ndarray):
            import torch

            dest.copy_(torch.from_numpy(np.array(out)))
        else:
            dest.copy_(out, non_blocking=True)


def _switch() -> bool | None:
    """``$RECOVERSSM_VLLM_PLUGIN``: on (unset, empty, 1/true/yes/on), off (0/false/no/off), else ``None``."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    return True if value in ("", "1", "true", "yes", "on") else False if value in ("0", "false", "no", "off") else None


def register() -> None:
    """vLLM's plugin entry point (``vllm.general_plugins``: ``recoverssm_rs``): replaces vLLM's mamba
    state step in this process; once per process (later calls do nothing). Never raises: what it
    cannot replace stays vLLM's (see the module docstring)."""
    with _stats.lock:
        if _stats.registered:
            return
        _stats.registered = True
    on = _switch()
    if on is None:  # the user set it, most likely to turn the plugin off: vLLM's code is kept
        _fallback(
            f"{ENV_SWITCH}={os.environ[ENV_SWITCH]!r} is not 0/1, false/true, no/yes or off/on: the plugin stays off"
        )
        return
    if not on:
        log.info("recoverssm_rs vLLM plugin: off (%s); vLLM's own mamba state step serves", ENV_SWITCH)
        return
    try:
        import vllm

        version = str(getattr(vllm, "__version__", "unknown"))
    except Exception as exc:  # vLLM's own import failing is not the plugin's to raise
        _fallback(f"vLLM cannot be imported: {type(exc).__name__}: {exc}")
        return
    _stats.vllm_version = version
    if not version_supported(version):
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_VLLM)
        _fallback(f"vLLM {version} is not a version the plugin serves ({supported})")
        return
    try:
        import importlib

        module = importlib.import_module(MODULE)
    except Exception as exc:
        _fallback(f"{MODULE} cannot be imported: {type(exc).__name__}: {exc}")
        return
    install(module, version)
    from .plugin_v2 import watch_v2

    watch_v2(version)  # the V2 runner's model state, when vLLM loads it


def install(module: ModuleType, version: str) -> list[str]:
    """Replaces the step functions of ``module`` (vLLM's ``mamba_utils``, or a module with its
    functions) whose signatures are vLLM's; returns the names replaced (logged on one INFO line).
    The pre-copy is required; the post-process is replaced with its signature, the staging only
    with the post-process's."""
    originals = {n: getattr(module, n, None) for n in PARAMS}
    ok = {n: f is not None and signature_matches(f, n) for n, f in originals.items()}
    if not ok["preprocess_mamba"]:
        _fallback(f"{module.__name__}.preprocess_mamba is missing or has another signature (vLLM {version})")
        return []
    names = ["preprocess_mamba"]
    if ok["postprocess_mamba_align_gpu"]:
        names.append("postprocess_mamba_align_gpu")
        if ok["stage_postprocess_inputs_to_gpu"]:
            names.append("stage_postprocess_inputs_to_gpu")
    skipped = [n for n in PARAMS if n not in names]
    plugin = _Plugin(module, {n: originals[n] for n in names})  # the others may not be inspectable
    for n in names:
        setattr(module, n, getattr(plugin, n))
    with _stats.lock:
        _stats.replaced = names
        _stats.vllm_version = version
    from .. import __version__

    line = (
        f"recoverssm_rs {__version__} serves vLLM {version}'s mamba state step: replaced {module.__name__}."
        + ", ".join(names)
        + (f" (left vLLM's: {', '.join(skipped)})" if skipped else "")
    )
    if logging.getLogger("vllm").handlers:
        log.info("%s", line)
    else:  # vLLM configures its logging after loading plugins: the line waits for the first call
        plugin.pending_line = line
    return names
