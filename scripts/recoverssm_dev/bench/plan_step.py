"""The Python-visible align step: numpy inputs in, a validated, hazard-checked plan out.

Workload: Qwen3-Next GDN layers (``layouts.preset("qwen3-next-80b-a3b", num_spec=3)``: conv SD
``[6, 8192]`` bf16 = 96 KiB, temporal ``[32, 128, 128]`` bf16 = 1 MiB per block), ``layers``
layers x ``R`` requests x 2 persistent states; block table ``[R, 5]`` int32 with distinct blocks,
``src_col = 0``, ``dst_col = 4``, ``num_accepted`` random in ``1..4``: every request crosses, so
every (layer, state, request) is one copy (24,576 for 256 x 48).

State tensors: real torch tensors, strided views into one anonymous ``MAP_NORESERVE`` mapping
laid out as pages (per layer a ``[num_blocks, page]`` region, the conv state then the temporal
state in each page, like vLLM's per-layer views). Nothing ever touches that memory (planning only
computes addresses), so it costs no RAM; one pool, sized for the largest request count, serves
every request count, and the baselines index the very same tensors, so every method computes the
same addresses (checked before timing). The methods are timed interleaved (each method's calls
split into rounds, the methods in turn within a round), so that all of them see the same load.

Methods, each producing the same (src_ptr, dst_ptr, nbytes) per copy:
  plan       ``Planner.plan_align(...)`` (validation, hazards, segments; Rust, GIL released)
  plan+view  the same, plus the zero-copy numpy view of the segments (``plan.segments``)
  core       ``_core.Planner.plan_align(...)`` (the same without the thin Python wrapper)
  numpy      baseline: the best vectorised numpy version (broadcasting over layers and requests,
             no checks at all)
  loop       baseline: a per-copy Python loop like vLLM 0.33's ``collect_mamba_copy_meta``: per
             request the block-table row, per layer and state the copy-spec function with torch
             indexing on the state tensor (``state[blk, a-1:]``, ``state[blk]``) and
             ``.data_ptr()``
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from recoverssm_rs import layouts
from recoverssm_rs.planner import Planner

from .progress import Progress
from .timing import Budget, format_ratio, format_spread, measure_interleaved, ratio, round_range

__all__ = [
    "BASELINES",
    "LAYOUT",
    "METHODS",
    "count_units",
    "format_table",
    "make_step",
    "memory_bytes",
    "reserve_problem",
    "run",
]

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux value; Python < 3.12 lacks the name
LAYOUT = "qwen3-next-80b-a3b"
NUM_SPEC = 3
COLS = NUM_SPEC + 2
METHODS = ("plan", "plan+view", "core", "numpy", "loop")
BASELINES = ("numpy", "loop")
LOOP_BUDGET_FACTOR = 0.5  # the per-copy loop is ~1000x slower: fewer repetitions, same floor


def make_step(requests: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Block table ``[R, 5]`` int32 of distinct blocks ``1..5R``, src 0, dst 4, accepted 1..4."""
    rng = np.random.default_rng(seed)
    bt = (rng.permutation(requests * COLS) + 1).astype(np.int32).reshape(requests, COLS)
    sc = np.zeros(requests, np.int32)
    dc = np.full(requests, COLS - 1, np.int32)
    na = rng.integers(1, NUM_SPEC + 2, requests).astype(np.int32)
    return bt, sc, dc, na


class Pool:
    """Per layer a ``[num_blocks, page]`` byte region of one lazily committed mapping; the conv and
    temporal states are views into it (never touched)."""

    def __init__(self, torch: Any, layout: Any, num_layers: int, num_blocks: int) -> None:
        conv_spec, temp_spec = layout.persistent
        self.page = conv_spec.nbytes + temp_spec.nbytes
        self.num_blocks = num_blocks
        size = num_layers * num_blocks * self.page
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
        raw = torch.frombuffer(self.map, dtype=torch.uint8)
        self.states: list[list[Any]] = []
        for layer in range(num_layers):
            lo = layer * num_blocks * self.page
            region = raw[lo : lo + num_blocks * self.page].view(num_blocks, self.page)
            views = []
            for off, spec in ((0, conv_spec), (conv_spec.nbytes, temp_spec)):
                v = region[:, off : off + spec.nbytes].view(getattr(torch, spec.dtype))
                inner = np.cumprod((1, *reversed(spec.shape[1:])))[::-1].tolist()
                views.append(
                    v.as_strided((num_blocks, *spec.shape), (self.page // spec.itemsize, *inner), v.storage_offset())
                )
            self.states.append(views)

    def __repr__(self) -> str:
        return f"Pool(layers={len(self.states)}, num_blocks={self.num_blocks}, page={self.page})"


def _conv_copy_spec(state: Any, block_ids: list[int], cur: int, accepted: int) -> tuple[int, int]:
    """vLLM's conv copy spec: the window of the source block shifted by the accepted tokens."""
    src = state[block_ids[cur], accepted - 1 :]
    return src.data_ptr(), src.numel()


def _temporal_copy_spec(state: Any, block_ids: list[int], cur: int, accepted: int) -> tuple[int, int]:
    """vLLM's temporal copy spec: the accepted token's spec-block state."""
    src = state[block_ids[cur + accepted - 1]]
    return src.data_ptr(), src.numel()


_COPY_FUNCS = (_conv_copy_spec, _temporal_copy_spec)


def loop_baseline(
    states: list[list[Any]],
    block_table_t: Any,
    src_col: np.ndarray,
    dst_col: np.ndarray,
    num_accepted: np.ndarray,
    out: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> int:
    """Per-copy Python loop (vLLM 0.33 ``collect_mamba_copy_meta`` per request); returns the count."""
    src_ptrs, dst_ptrs, sizes = out
    offset = 0
    for r in range(block_table_t.shape[0]):
        src_idx, dst_idx, a = int(src_col[r]), int(dst_col[r]), int(num_accepted[r])
        if src_idx == dst_idx and a == 1:
            continue
        block_ids = block_table_t[r].tolist()
        dest_block_id = block_ids[dst_idx]
        for layer in states:
            for state, copy_func in zip(layer, _COPY_FUNCS, strict=True):
                start, numel = copy_func(state, block_ids, src_idx, a)
                src_ptrs[offset] = start
                dst_ptrs[offset] = state[dest_block_id].data_ptr()
                sizes[offset] = numel * state.element_size()
                offset += 1
    return offset


class Vectorised:
    """The best numpy version: per-(layer, state) bases broadcast against per-request blocks."""

    def __init__(self, states: list[list[Any]]) -> None:
        conv, temp = zip(*states, strict=True)
        self.conv_base = np.array([t.data_ptr() for t in conv], np.int64)[:, None]
        self.temp_base = np.array([t.data_ptr() for t in temp], np.int64)[:, None]
        self.conv_stride = conv[0].stride(0) * conv[0].element_size()
        self.temp_stride = temp[0].stride(0) * temp[0].element_size()
        self.width = conv[0].shape[1]
        self.row = conv[0].shape[2] * conv[0].element_size()
        self.temp_bytes = temp[0][0].numel() * temp[0].element_size()
        self.layers = len(states)

    def __repr__(self) -> str:
        return f"Vectorised(layers={self.layers})"

    def __call__(
        self, bt: np.ndarray, sc: np.ndarray, dc: np.ndarray, na: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = np.arange(bt.shape[0])
        k = na.astype(np.int64) - 1
        src = bt[r, sc].astype(np.int64)
        dst = bt[r, dc].astype(np.int64)
        tsrc = bt[r, sc + k].astype(np.int64)
        shape = (self.layers, 2, len(r))
        out_src, out_dst, out_n = np.empty(shape, np.int64), np.empty(shape, np.int64), np.empty(shape, np.int64)
        np.add(self.conv_base, src * self.conv_stride + k * self.row, out=out_src[:, 0])
        np.add(self.temp_base, tsrc * self.temp_stride, out=out_src[:, 1])
        np.add(self.conv_base, dst * self.conv_stride, out=out_dst[:, 0])
        np.add(self.temp_base, dst * self.temp_stride, out=out_dst[:, 1])
        out_n[:, 0] = (self.width - k) * self.row
        out_n[:, 1] = self.temp_bytes
        return out_src.ravel(), out_dst.ravel(), out_n.ravel()


def _triples(src: Any, dst: Any, n: Any) -> set[tuple[int, int, int]]:
    return set(zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), np.asarray(n).tolist(), strict=True))


def _methods(
    planner: Planner,
    vec: Vectorised,
    pool: Pool,
    step: tuple[np.ndarray, ...],
    bt_t: Any,
    out: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> dict[str, Callable[[], object]]:
    """The timed calls of one step, by method name."""
    bt, sc, dc, na = step
    # The compiled planner alone (what the Python wrapper adds is the rest).
    core = planner.core
    return {
        "plan": lambda: planner.plan_align(bt, sc, dc, na),
        "plan+view": lambda: planner.plan_align(bt, sc, dc, na).segments,
        "core": lambda: core.plan(tables=bt, src_col=sc, dst_col=dc, num_accepted=na),
        "numpy": lambda: vec(bt, sc, dc, na),
        "loop": lambda: loop_baseline(pool.states, bt_t, sc, dc, na, out),
    }


def _pool_size(requests: Sequence[int], layers: int) -> tuple[int, int]:
    """``(num_blocks, bytes)`` of the never-touched mapping :func:`run` lays its pool out in."""
    conv, temp = layouts.preset(LAYOUT, num_spec=NUM_SPEC).persistent
    num_blocks = max(requests) * COLS + 1
    return num_blocks, layers * num_blocks * ((conv.nbytes or 0) + (temp.nbytes or 0))


def reserve_problem(requests: Sequence[int], layers: int) -> str | None:
    """Why the pool mapping for ``requests`` and ``layers`` cannot be made here, or None: asks the
    operating system for the mapping (reserved, never touched) and gives it back at once."""
    _, size = _pool_size(requests, layers)
    try:
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    except (OSError, OverflowError, ValueError) as e:
        from recoverssm_rs.tools.formatting import human_bytes

        why = getattr(e, "strerror", None) or "more than the address space"
        return (
            f"the plan step's pool ({human_bytes(size)} of address space, never touched) cannot be mapped here ({why})"
        )
    mapping.close()
    return None


def memory_bytes(requests: Sequence[int], layers: int) -> int:
    """About the memory :func:`run` touches at the largest request count: per copy the address
    arrays of the methods and the sets that check them against each other (about 600 bytes), and
    per layer the state views."""
    return max(requests) * layers * 2 * 600 + layers * 4096


def count_units(requests: Sequence[int]) -> int:
    """Progress units :func:`run` reports: one per (request count, method)."""
    return len(requests) * len(METHODS)


def run(
    requests: Sequence[int], layers: int, budget: Budget, progress: Progress | None = None, seed: int = 0
) -> dict[str, Any]:
    """Time every method at every request count; returns the results as a JSON-ready dict.

    Each request count's methods are first checked to produce the same copies (``check``).
    ``results[i]["methods"][name]`` holds ``median_s``, ``p10_s``, ``p90_s``, ``reps``,
    ``rounds_s``, ``ns_per_copy``, ``copies_per_s`` and ``copies_per_s_range`` (min-max over the
    rounds); each ratio (``loop_over_plan``, ...) is the median of the ratios taken round by round,
    with their min-max as its ``_range``.
    """
    import torch

    progress = progress or Progress(count_units(requests), enabled=False)
    layout = layouts.preset(LAYOUT, num_spec=NUM_SPEC)
    conv, temp = layout.persistent
    num_blocks = max(requests) * COLS + 1
    progress.start("plan step", f"binding {layers} layers x {num_blocks} blocks")
    pool = Pool(torch, layout, layers, num_blocks)
    planner = Planner(layout, pool.states)
    vec = Vectorised(pool.states)
    results = []
    for R in requests:
        case = f"plan step, {R} requests x {layers} layers"
        bt, sc, dc, na = make_step(R, seed=seed + R)
        copies = R * layers * 2
        plan = planner.plan_align(bt, sc, dc, na)
        assert len(plan) == copies and plan.num_waves == 1, plan
        segs = plan.segments
        seg_set = _triples(
            segs["src"].astype(np.int64),
            segs["dst"].astype(np.int64),
            segs["rows"].astype(np.int64) * segs["row_bytes"],
        )
        vec_set = _triples(*vec(bt, sc, dc, na))
        bt_t = torch.from_numpy(bt)
        out = (np.zeros(copies, np.int64), np.zeros(copies, np.int64), np.zeros(copies, np.int64))
        assert loop_baseline(pool.states, bt_t, sc, dc, na, out) == copies
        loop_set = _triples(*out)
        if plan.num_segments == copies:
            if not seg_set == vec_set == loop_set:
                raise AssertionError(f"R={R}: plan, numpy and loop disagree on the copies")
            check = "identical (src, dst, bytes) from plan, numpy and loop"
        else:  # coalesced neighbours (not expected with distinct random blocks): compare byte totals
            if not (vec_set == loop_set and plan.nbytes == sum(n for _, _, n in vec_set)):
                raise AssertionError(f"R={R}: plan bytes differ from numpy and loop")
            check = f"numpy == loop; plan coalesced to {plan.num_segments} segments, same bytes"
        nbytes = plan.nbytes
        del plan, segs
        fns = _methods(planner, vec, pool, (bt, sc, dc, na), bt_t, out)
        loop_budget = Budget(budget.seconds * LOOP_BUDGET_FACTOR, 2, budget.max_reps, 1)
        progress.start(case, "timing the methods interleaved")

        def done(name: str, case: str = case) -> None:
            progress.advance(case, f"{name} done")

        methods: dict[str, dict[str, Any]] = measure_interleaved(
            {name: (fns[name], loop_budget if name == "loop" else budget) for name in METHODS}, done
        )

        def rate(s: float, c: int = copies) -> float:
            return c / s

        for t in methods.values():
            t["ns_per_copy"] = t["median_s"] * 1e9 / copies
            t["copies_per_s"] = copies / t["median_s"]
            t["copies_per_s_range"] = round_range(t, rate)
        ratios = {
            key: ratio(methods[a], methods[b])
            for key, a, b in (
                ("loop_over_plan", "loop", "plan"),
                ("numpy_over_plan", "numpy", "plan"),
                ("plan_over_core", "plan", "core"),
            )
        }
        results.append(
            {
                "requests": R,
                "copies": copies,
                "bytes_per_step": nbytes,
                "check": check,
                "methods": methods,
                **{k: v for k, (v, _) in ratios.items()},
                **{f"{k}_range": rng for k, (_, rng) in ratios.items()},
            }
        )
    return {
        "layout": LAYOUT,
        "num_spec": NUM_SPEC,
        "layers": layers,
        "num_blocks": num_blocks,
        "states": {"conv": [list(conv.shape), conv.dtype], "temporal": [list(temp.shape), temp.dtype]},
        "tensors": "views into one MAP_NORESERVE mapping (never touched)",
        "methods": list(METHODS),
        "baselines": list(BASELINES),
        "budget_s": budget.seconds,
        "results": results,
    }


def format_table(doc: dict[str, Any]) -> str:
    """The plan-step results as a text table: per method the median microseconds per step with the
    min-max of the rounds' medians, and the ratios to ``plan`` with their spread (min-max of the
    per-round ratios)."""
    lines = [
        (
            f"plan step: {doc['layout']} GDN, {doc['layers']} layers x R requests x 2 states "
            f"(align mode, every request crosses); us per step, median (min-max of the timing rounds); "
            f"baselines: {', '.join(doc['baselines'])}"
        )
    ]
    cells = {
        id(r): [format_spread(r["methods"][m]["median_s"], round_range(r["methods"][m]), scale=1e6) for m in METHODS]
        for r in doc["results"]
    }
    width = max([18, *(len(c) for cs in cells.values() for c in cs)])
    head = (
        f"{'requests':>8} {'copies':>8} "
        + " ".join(f"{m:>{width}}" for m in METHODS)
        + f" {'loop/plan':>21} {'numpy/plan':>17}"
    )
    lines += [head, "-" * len(head)]
    for r in doc["results"]:
        lines.append(
            f"{r['requests']:>8} {r['copies']:>8} "
            + " ".join(f"{c:>{width}}" for c in cells[id(r)])
            + f" {format_ratio(r, 'loop_over_plan'):>21} {format_ratio(r, 'numpy_over_plan'):>17}"
        )
    return "\n".join(lines)
