"""The adapter for vLLM's model runner: its align-mode recurrent-state step (:class:`VllmMambaStep`,
:mod:`.step`), the step's device path (:class:`DeviceStep`, :mod:`.device_step`), the GPU-resident runner's
model state (:class:`ModelStateV2`, :mod:`.model_state`) and the step's
decisions (:mod:`.decide`); the vLLM plugin that serves vLLM's step with no source edit (:mod:`.plugin`,
:func:`plugin_stats`).

vLLM itself is never imported: every vLLM object is read by attribute.
"""

from .decide import PostProcessInputs, PreCopyInputs, align_post_process, align_pre_copy, plan
from .device_step import DeviceStep
from .model_state import ModelStateV2, RecoverSSMCommit
from .plugin import plugin_stats
from .step import VllmMambaStep, copy_kind, mamba_groups

__all__ = ["VllmMambaStep", "DeviceStep", "ModelStateV2", "RecoverSSMCommit", "mamba_groups", "copy_kind"]
__all__ += ["align_pre_copy", "align_post_process", "plan", "PreCopyInputs", "PostProcessInputs", "plugin_stats"]
