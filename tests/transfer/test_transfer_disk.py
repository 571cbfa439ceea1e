"""Saved states on disk: byte-exact round trips for every family (workspace never moved), the
safetensors framing, atomic writes, and truncated, extended, tampered, malformed or foreign files
refused with a LayoutError before anything is restored."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from recoverssm_rs.errors import BindingError, LayoutError
from recoverssm_rs.transfer import HostOffload, StatePool, load_states, save_states
from support.transfer_ref import FAMILIES, layout, paged_states

SRC, DST = [5, 2, 7], [3, 1, 6]


def _bytes(t):
    return t.view(torch.uint8).numpy() if isinstance(t, torch.Tensor) else np.asarray(t).view(np.uint8)


def _saved(name="gdn_recoverssm", tp=2, rank=1, seed=0):
    fam = FAMILIES[name]
    lay = layout(fam, tp, 3 if fam.spec else 0, "DS")
    rng = np.random.default_rng(seed)
    _, states = paged_states(lay, 3, 8, rng)
    work = [[rng.standard_normal((8, *w.shape)).astype(w.dtype) for w in lay.workspace] for _ in range(3)]
    p = StatePool(lay, [st + wk for st, wk in zip(states, work)], tp_rank=rank)
    return lay, states, work, p


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_round_trip_through_a_file_is_byte_exact_and_leaves_workspace(tmp_path, name):
    lay, states, work, p = _saved(name)
    want = [[_bytes(t)[SRC].copy() for t in layer] for layer in states]
    wsaved = [[w.copy() for w in layer] for layer in work]
    off = HostOffload(p)
    path = tmp_path / "states.safetensors"
    nbytes = save_states(off.offload(SRC), path)
    assert path.stat().st_size == nbytes and not list(tmp_path.glob(".*.tmp")), "a temporary file was left"
    back = load_states(path, lay)
    assert back.source_blocks == SRC and back.fingerprint == p.fingerprint
    off.restore(back, DST)
    for layer, ws in zip(range(3), wsaved):
        for t, w in zip(states[layer], want[layer]):
            assert (_bytes(t)[DST] == w).all(), f"layer {layer}: not byte-exact"
        assert all((a == b).all() for a, b in zip(work[layer], ws)), "workspace changed"


def test_bfloat16_states_round_trip_in_torch_and_the_file_is_safetensors(tmp_path):
    lay = layout(FAMILIES["gdn"], 1, 0, "SD", dtype="bfloat16")
    g = torch.Generator().manual_seed(0)
    layers = [
        [torch.randn((6, *s.shape), generator=g).to(getattr(torch, s.dtype)) for s in lay.persistent] for _ in range(2)
    ]
    p = StatePool(lay, layers)
    want = [[_bytes(t)[[1, 4]].copy() for t in layer] for layer in layers]
    path = tmp_path / "bf16.safetensors"
    save_states(HostOffload(p).offload([1, 4]), path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__")
    assert meta["format"] == "recoverssm-saved-states 2" and meta["source_blocks"] == "1,4"
    assert header["layer0.conv"]["dtype"] == "BF16" and header["layer0.conv"]["shape"][0] == 2
    assert max(v["data_offsets"][1] for v in header.values()) == len(raw) - 8 - n
    HostOffload(p).restore(load_states(path, lay), [2, 5])
    for layer, w in zip(layers, want):
        assert all((_bytes(t)[[2, 5]] == x).all() for t, x in zip(layer, w))


def _damaged(tmp_path, edit):
    lay, _, _, p = _saved("gdn", seed=3)
    path = tmp_path / "s.safetensors"
    save_states(HostOffload(p).offload(SRC), path)
    raw = bytearray(path.read_bytes())
    path.write_bytes(bytes(edit(raw)))
    return path, lay


def _flip_last(raw):
    raw[-1] ^= 0x01
    return raw


def _header_edit(fn):
    def edit(raw):
        (n,) = struct.unpack("<Q", raw[:8])
        h = json.loads(raw[8 : 8 + n])
        fn(h)
        hb = json.dumps(h).encode()
        return struct.pack("<Q", len(hb)) + hb + raw[8 + n :]

    return edit


@pytest.mark.parametrize(
    "edit,needle",
    [
        (_flip_last, r"request 2 \(saved from block 7\): checksum"),
        (lambda raw: raw[:-5], "truncated or extended"),
        (lambda raw: raw + b"\0" * 8, "truncated or extended"),
        (lambda raw: raw[:6], "too short"),
        (lambda raw: raw[:40], "runs past"),
        (lambda raw: b"not a safetensors file at all", "runs past"),
        (_header_edit(lambda h: h["__metadata__"].pop("fingerprint")), "no 'fingerprint' metadata entry"),
        (_header_edit(lambda h: h["layer0.conv"].update(dtype="F32")), 'tensor "layer0.conv" \\(F32'),
        (_header_edit(lambda h: h["layer0.conv"].update(shape="3x4")), "malformed header"),
        (_header_edit(lambda h: h.update(__metadata__=[1])), "malformed header"),
        (_header_edit(lambda h: h["__metadata__"].update(checksums="0,0,0")), "checksum"),
        (_header_edit(lambda h: h["__metadata__"].update(num_requests="4")), "source_blocks has 3 entries for 4"),
    ],
)
def test_damaged_files_are_refused(tmp_path, edit, needle):
    path, lay = _damaged(tmp_path, edit)
    with pytest.raises(LayoutError, match=needle):
        load_states(path, lay)


def test_a_file_from_another_layout_is_refused_and_a_freed_host_copy_is_not_saved(tmp_path):
    lay, _, _, p = _saved("gdn", seed=4)
    path = tmp_path / "s.safetensors"
    save_states(HostOffload(p).offload(SRC), path)
    other = layout(FAMILIES["gdn"], 2, 3, "SD")
    with pytest.raises(LayoutError, match="saved from a pool of another layout"):
        load_states(path, other)
    layers = [[torch.zeros((4, *s.shape), dtype=getattr(torch, s.dtype)) for s in lay.persistent] for _ in range(2)]
    host = HostOffload(StatePool(lay, layers, tp_rank=1)).offload([1])
    host.pool.tensors[1].untyped_storage().resize_(0)
    before = path.read_bytes()
    with pytest.raises(BindingError, match="its storage was resized or freed"):
        save_states(host, path)
    assert path.read_bytes() == before, "the old file was replaced"
