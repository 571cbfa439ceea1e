"""Text formatting shared by the command-line tools: byte counts and layout tables."""

from __future__ import annotations

from .._core import Layout

__all__ = ["human_bytes", "format_layout"]


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps the number >= 1 (``"1.50 MiB"``)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{int(n)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def format_layout(layout: Layout, num_layers: int | None = None) -> str:
    """A readable table of ``layout``: state, role, copy kind, shape, dtype and bytes; with
    ``num_layers``, also the totals for that many layers."""
    rows = [("#", "state", "role", "copy", "shape", "dtype", "bytes")]
    for i, s in enumerate(layout.states):
        copy: str = s.copy or "-"
        if s.conv_layout:
            copy = f"conv/{s.conv_layout}"
        per = "block" if s.role == "persistent" else "request"
        rows.append(
            (
                str(i),
                s.name,
                s.role,
                copy,
                "(" + ", ".join(str(d) for d in s.shape) + ")",
                s.dtype,
                f"{s.nbytes:,} per {per}",
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        f"{layout.backend}: num_spec={layout.num_spec}, copyable prefix = "
        f"{layout.copyable_prefix_len} of {len(layout)} states"
    ]
    for j, r in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(r)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(
        f"persistent: {human_bytes(layout.persistent_bytes_per_block)} per block and layer; "
        f"workspace: {human_bytes(layout.workspace_bytes_per_request)} per request and layer"
    )
    if num_layers:
        lines.append(
            f"x {num_layers} layers: {human_bytes(layout.persistent_bytes_per_block * num_layers)} "
            f"per block, {human_bytes(layout.workspace_bytes_per_request * num_layers)} workspace "
            f"per request"
        )
    return "\n".join(lines)
