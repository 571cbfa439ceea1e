"""The transfer tiers under hostile inputs: a saved-states file whose tensor table holds numbers
no header has (negative, past 64 bits) is a LayoutError naming the file and the tensor; a pool's
layout, fingerprint and geometry cannot be reassigned after the pool was bound (a transfer then
still checks blocks against the tensors it holds, and writes nothing on a refusal)."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest
from recoverssm_rs.errors import LayoutError, PlanError
from recoverssm_rs.transfer import HostOffload, LocalTransfer, StatePool, load_states, save_states
from support.transfer_ref import FAMILIES, layout, paged_states


def _saved(tmp_path):
    lay = layout(FAMILIES["mamba2"], 1, 1, "SD")
    _, states = paged_states(lay, 2, 10, np.random.default_rng(0))
    path = tmp_path / "states.safetensors"
    save_states(HostOffload(StatePool(lay, states)).offload([1, 2]), path)
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return lay, path, json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path, header, data):
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + data)


@pytest.mark.parametrize(
    "field,index,value",
    [
        ("shape", 0, -1),
        ("shape", 1, 2**70),
        ("data_offsets", 0, -8),
        ("data_offsets", 1, 2**64),
    ],
    ids=["negative-dim", "dim-past-64-bits", "negative-offset", "offset-past-64-bits"],
)
def test_a_tensor_entry_with_a_number_out_of_range_is_a_layout_error_naming_it(tmp_path, field, index, value):
    lay, path, header, data = _saved(tmp_path)
    header["layer0.conv"][field][index] = value
    _write(path, header, data)
    with pytest.raises(
        LayoutError, match=rf"saved states file {re.escape(str(path))}: .*tensor .layer0.conv.: {field}\[{index}\]"
    ):
        load_states(path, lay)


def _pools():
    lay = layout(FAMILIES["mamba2"], 2, 1, "SD")
    _, a = paged_states(lay, 2, 10, np.random.default_rng(0))
    _, b = paged_states(lay, 2, 10, np.random.default_rng(1))
    return lay, b, StatePool(lay, a), StatePool(lay, b)


def _bytes(states):
    return [np.asarray(t).view(np.uint8).copy() for layer in states for t in layer]


@pytest.mark.parametrize("attr", ["num_blocks", "num_layers", "fingerprint", "layout", "device"])
def test_a_pools_binding_cannot_be_reassigned(attr):
    lay, states, src, dst = _pools()
    value = {"num_blocks": 100, "num_layers": 5, "fingerprint": src.fingerprint.with_rank(1)}.get(attr, None)
    with pytest.raises(AttributeError):
        setattr(dst, attr, value)
    assert dst.num_blocks == 10 and dst.num_layers == 2 and dst.fingerprint.tp_rank == 0


def test_a_block_past_the_bound_tensors_is_refused_with_nothing_written():
    lay, states, src, dst = _pools()
    try:
        dst.num_blocks = 100  # refused: the pool is bound to its tensors' 10 blocks
    except AttributeError:
        pass
    before = _bytes(states)
    with pytest.raises(PlanError, match="request 1: destination block 50 is out of range"):
        LocalTransfer([src], dst).run([(1, 2), (1, 50)])
    assert all((x == y).all() for x, y in zip(before, _bytes(states))), "request 0 was written"


_OPTIMIZED_PUT = """
import numpy as np
from recoverssm_rs.transfer import HostCache, StatePool
from support.transfer_ref import FAMILIES, layout, paged_states

lay = layout(FAMILIES["mamba2"], 1, 1, "SD")
_, states = paged_states(lay, 2, 10, np.random.default_rng(0))
cache = HostCache(StatePool(lay, states), 10**9)
cache.put("a", [1])
print(len(cache), cache.used_bytes == cache.bytes_per_request, cache.restore("a", [5]))
"""


def test_put_records_the_entry_when_python_runs_optimized():
    # `python -O` strips assert statements: the tier's put must not live in one.
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-O", "-c", _OPTIMIZED_PUT], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.split() == ["1", "True", "True"], out


def test_pinned_loading_without_a_device_is_backend_unavailable_before_the_file_is_read(tmp_path):
    import torch
    from recoverssm_rs.errors import BackendUnavailableError

    if torch.cuda.is_available():
        pytest.skip("this machine can pin host memory")
    lay = layout(FAMILIES["mamba2"], 1, 1, "SD")
    with pytest.raises(BackendUnavailableError, match="pin_memory=True needs"):
        load_states(tmp_path / "never-read.safetensors", lay, pin_memory=True)


@pytest.mark.parametrize(
    "wrap",
    [lambda s: (layer for layer in s), lambda s: [iter(layer) for layer in s], lambda s: iter([iter(x) for x in s])],
    ids=["generator-of-layers", "iterator-layers", "iterator-of-iterators"],
)
def test_a_pool_given_one_shot_iterators_binds_every_tensor(wrap):
    lay, states, src, _ = _pools()
    p = StatePool(lay, wrap(states))
    assert (p.num_layers, len(p.tensors)) == (2, 4)
    assert all(a is b for a, b in zip(p.tensors, [t for layer in states for t in layer]))
    LocalTransfer([src], p).run([(1, 2)])
    held = HostOffload(p).offload([2])  # the bytes just moved, read back through the pool
    assert all(
        (np.asarray(h)[1].view(np.uint8) == np.asarray(t)[1].view(np.uint8)).all()
        for h, t in zip(held.pool.tensors, src.tensors)
    )
