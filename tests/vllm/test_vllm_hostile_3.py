"""Hostile callers of the vLLM surfaces, third part: ``ModelStateV2``'s own buffers moved under it
between half-steps (the ``num_accepted`` / ``state_idx`` views it hands to vLLM resized, or their
storage freed), and malformed fields of vLLM's mamba specs and KV-cache groups read by
``from_runner``. Each is the package's own error, naming what is wrong, and nothing is written or
launched."""

from __future__ import annotations

import pytest
import torch
from recoverssm_rs.errors import BindingError
from support import vllm_trace

I32 = torch.int32


@pytest.fixture
def launch_args(monkeypatch):
    """The adapter's buffers are CPU tensors here; the launch sees them as CUDA tensors."""
    from recoverssm_rs.cuda.ops import CudaOps
    from support.device_fakes import FakeCuda

    monkeypatch.setattr(CudaOps, "launch_arg", staticmethod(FakeCuda))


def _v(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=I32)


def _adapter():
    """One GDN group (block_size 4, 4 slots); slots 1 and 2 hold requests with 4 cached tokens."""
    ms, states = vllm_trace.small_model_state(fake=True)
    table = torch.zeros(4, 6, dtype=I32)
    table[1, :4] = _v(1, 2, 3, 4)
    table[2, :4] = _v(5, 6, 7, 8)
    ms.add_request(1, 4)
    ms.add_request(2, 4)
    return ms, states, table


#: How a caller moves a buffer the adapter's kernel writes: the views ModelStateV2 hands to vLLM
#: (``num_accepted_tokens_gpu``, ``_mamba_state_idx_gpu``) share the buffers' storages, so a
#: ``resize_`` of one reallocates the buffer and a storage resize frees it.
MOVES = {
    "num_accepted resized": lambda ms: ms.num_accepted.resize_(1 << 16),
    "state_idx storage freed": lambda ms: ms.state_idx.untyped_storage().resize_(0),
}


@pytest.mark.parametrize("move", list(MOVES))
@pytest.mark.parametrize("half", ["pre", "post"])
def test_a_moved_adapter_buffer_is_refused_before_the_launch(fake_ops, recorder, launch_args, move, half):
    ms, _, table = _adapter()
    ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])  # the core step is made over the buffers
    launched = len(recorder.calls)
    MOVES[move](ms)
    name = move.split()[0]
    with pytest.raises(BindingError, match=rf"{name}.*(resized or freed|no longer points).*nothing was written"):
        if half == "pre":
            ms.preprocess_state(_v(1, 2), _v(0, 4, 4, 0), _v(0, 1, 2), [table])
        else:
            ms.postprocess_state(_v(1, 2), 1, _v(0, 5, 5, 0), [table])
    assert len(recorder.calls) == launched  # nothing launched over the old address
