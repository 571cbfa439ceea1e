"""Conv windows of RecoverSSM: the verified window of a speculative step and its compaction by the
accepted count."""

from __future__ import annotations

import torch

from ...errors import PlanError
from .inputs import ConvLayout, Counts, check_device, check_shape, check_tensor, fmt_shape, window_counts


def compact_conv_window(
    window: torch.Tensor,
    num_accepted: Counts,
    conv_kernel_size: int,
    layout: ConvLayout = "DS",
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compact verified conv windows after accepting ``num_accepted[b]`` tokens.

    ``window`` is ``[B, dim, W]`` (``layout="DS"``) or ``[B, W, dim]`` (``"SD"``) with
    ``W = conv_kernel_size - 1 + Q - 1``. For ``n >= 1`` the first ``conv_kernel_size - 1`` columns
    become columns ``n - 1 .. n - 1 + conv_kernel_size - 2`` of the verified window and the other
    columns are unchanged; ``n = 0`` (and ``n = 1``) leave the window unchanged. ``num_accepted`` is
    clamped to ``[0, Q]``. Pure data movement (exact in any dtype). Written into ``out`` when given
    (it may be ``window`` itself, but must not partially overlap it), else into a copy; returned.
    """
    check_tensor("window", window, floating=False)
    if layout not in ("DS", "SD"):
        raise PlanError(f"layout: expected 'DS' or 'SD', got {layout!r}")
    if isinstance(conv_kernel_size, bool) or not isinstance(conv_kernel_size, int) or conv_kernel_size < 1:
        raise PlanError(f"conv_kernel_size: expected an int >= 1, got {conv_kernel_size!r}")
    names = ["B", "dim", "W"] if layout == "DS" else ["B", "W", "dim"]
    check_shape("window", window, names, [None, None, None])
    B = window.shape[0]
    width = window.shape[2] if layout == "DS" else window.shape[1]
    hist = conv_kernel_size - 1
    Q = width - hist + 1
    if Q < 1:
        raise PlanError(
            f"window: expected W = conv_kernel_size - 1 + Q - 1 >= {hist} columns (Q >= 1) in "
            f"{layout} layout {fmt_shape(names, [None, None, None])}, got {list(window.shape)}"
        )
    if out is not None:
        check_tensor("out", out, floating=False)
        check_shape("out", out, names, list(window.shape))
        check_device("out", out, window.device)
        if out.dtype != window.dtype:
            raise PlanError(f"out: expected dtype {window.dtype}, got {out.dtype}")
    n = window_counts("num_accepted", num_accepted, B, Q, window.device)
    # Gather the new head columns first: ``out`` may alias ``window``.
    shift = (n - 1).clamp(min=0)  # [B]; n = 0 and n = 1 both keep the head as it is
    idx = shift[:, None] + torch.arange(hist, device=window.device)[None, :]  # [B, hist]
    if layout == "DS":
        head = torch.gather(window, 2, idx[:, None, :].expand(B, window.shape[1], hist))
    else:
        head = torch.gather(window, 1, idx[:, :, None].expand(B, hist, window.shape[2]))
    if out is None:
        dst = window.clone()
    else:
        dst = out
        if not same_storage_view(out, window):
            out.copy_(window)
    if layout == "DS":
        dst[:, :, :hist] = head
    else:
        dst[:, :hist, :] = head
    return dst


def same_storage_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are the very same view (same storage, offset, shape and strides)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


# ----------------------------------------------------------------------------------------------
# memory accounting


def conv_verify(
    windows: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_kernel_size: int,
    conv_layout: ConvLayout,
    *,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over a speculative window, from each request's conv window.

    ``windows`` are the requests' persistent conv windows ``[B, dim, W]`` (DS) or ``[B, W, dim]``
    (SD) holding the last ``conv_kernel_size - 1`` inputs in their first columns; ``x``
    ``[B, Q, dim]`` the window's conv inputs; ``weight`` ``[dim, conv_kernel_size]`` (tap ``j``
    multiplies the input ``conv_kernel_size - 1 - j`` positions back). Returns ``(y, verified)``:
    the outputs ``[B, Q, dim]`` (float32) and the verified window ``[h_2 .. h_{K-1}, x_1 .. x_Q]`` in
    the windows' layout and dtype (what a commit compacts by the accepted count). With ``window``,
    ``x`` must hold exactly that many tokens (the verified window then fills the conv window).

    Raises:
        PlanError: ``x`` or ``weight`` has the wrong shape.
    """
    kc = int(conv_kernel_size)
    b = windows.shape[0]
    dim = windows.shape[1] if conv_layout == "DS" else windows.shape[2]
    check_tensor("x", x)
    check_shape("x", x, ("B", "Q", "dim"), (b, window, dim))
    check_tensor("weight", weight)
    check_shape("weight", weight, ("dim", "conv_kernel_size"), (dim, kc))
    check_device("x", x, windows.device)
    check_device("weight", weight, windows.device)
    win = windows.transpose(1, 2) if conv_layout == "SD" else windows
    hist = win[:, :, : kc - 1].float()  # [B, dim, K-1]
    seq = torch.cat([hist, x.float().transpose(1, 2)], dim=2)  # [B, dim, K-1+Q]
    taps = seq.unfold(2, kc, 1)  # [B, dim, Q, K]
    y = (taps * weight.float()[None, :, None, :]).sum(-1).transpose(1, 2)
    new = seq[:, :, 1:].to(windows.dtype)  # [B, dim, K-2+Q] == window width
    if conv_layout == "SD":
        new = new.transpose(1, 2)
    return y, new
