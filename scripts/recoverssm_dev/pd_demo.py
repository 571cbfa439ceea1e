"""``pd-demo``: disaggregated prefill / decode of a toy GDN + KDA stack, states moved over NIXL.

Two OS processes: a **prefill** instance (``--prefill-tp`` ranks, ``--prefill-layout`` conv
windows, ``--prefill-spec`` draft columns) and a **decode** instance (its own TP size, layout and
``num_spec``). Each rank holds its shard of every layer (GDN and KDA heads split by rank, conv
channels split per q / k / v sub-projection) in a block pool per layer kind.

1. The prefill instance runs each request's prompt except its last token (the one-token backoff
   of P/D serving: the decode side recomputes it), writing each rank's conv window and recurrent
   state into the request's block.
2. Handshake: each decode rank gets every prefill rank's NIXL metadata and layout fingerprint;
   the compatibility check runs before any byte moves. The decode ranks pull the requests' states
   with the core's transfer plans (re-sharding, SD <-> DS, different conv widths).
3. The decode instance feeds the last prompt token and then generated tokens in speculative
   windows of ``num_spec + 1`` tokens (a seeded pattern accepts a prefix of the drafts).
4. Check: every state of every decode rank, right after the transfer and after decoding, against
   one TP = 1 instance decoding the whole accepted sequence token by token. Conv windows must match
   bit for bit, recurrent states to 1e-4 (scaled max-abs error).

The toy model feeds every layer from token embeddings (seeded random weights), so layers are
independent; the recurrences are :func:`recoverssm_rs.speculative.recurrence.prepare` and
:func:`~recoverssm_rs.speculative.recurrence.sequential_decode`. Exit status 1 on any mismatch.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recoverssm_rs.tools.cli_args import allowed_range

from .pd_processes import child_main, start_children, stop_children, wait_result

__all__ = [
    "Config",
    "PdOptionError",
    "MAX_GENERATE",
    "TOLERANCE",
    "format_summary",
    "passed",
    "run",
    "run_bytes",
    "validate",
]

HEADS = 8
HEAD_DIM = 8
KERNEL = 4
VOCAB = 97
TOLERANCE = 1e-4
MAX_GENERATE = 4096
"""The most tokens a request generates (``--generate``): the decode side runs them one window at a time."""
KINDS = ("gdn", "kda")


@dataclass
class Config:
    """The options of one run (see ``pd-demo --help``)."""

    requests: int = 16
    layers: int = 2
    prefill_tp: int = 2
    decode_tp: int = 1
    prefill_layout: str = "SD"
    decode_layout: str = "DS"
    prefill_spec: int = 0
    decode_spec: int = 3
    generate: int = 12
    seed: int = 0


def _layout(kind: str, tp: int, num_spec: int, conv_layout: str) -> Any:
    from recoverssm_rs import layouts

    common: dict[str, Any] = dict(
        conv_kernel_size=KERNEL,
        tp_size=tp,
        num_spec=num_spec,
        conv_layout=conv_layout,
        dtype="float32",
        ssm_dtype="float32",
    )
    if kind == "gdn":
        return layouts.gdn(num_k_heads=HEADS, num_v_heads=HEADS, head_k_dim=HEAD_DIM, head_v_dim=HEAD_DIM, **common)
    return layouts.kda(num_heads=HEADS, head_dim=HEAD_DIM, recover_ssm=True, **common)


class PdOptionError(ValueError):
    """An option of :class:`Config` the demo cannot run with.

    Attributes:
        option: the :class:`Config` field (``"prefill_tp"``, ...), or None for the two sides'
            layouts together.
        value: the value given.
        reason: what is wrong and what it must be (the core's message where the core decided).
    """

    def __init__(self, option: str | None, value: Any, reason: str) -> None:
        super().__init__(f"{option} = {value!r}: {reason}" if option else reason)
        self.option, self.value, self.reason = option, value, reason

    def __repr__(self) -> str:
        return f"PdOptionError({self.option!r}, {self.value!r}, {self.reason!r})"


def _at_least(cfg: Config, option: str, low: int, high: int | None = None) -> None:
    value = getattr(cfg, option)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PdOptionError(option, value, "expected an integer")
    if value < low or (high is not None and value > high):
        raise PdOptionError(option, value, f"must be {allowed_range(low, high)}")


def _kinds(layers: int) -> tuple[str, ...]:
    return KINDS[: min(layers, len(KINDS))]


def _side_layouts(cfg: Config, side: str) -> dict[str, Any]:
    """One side's layouts, built by the core; a refusal names the option to blame: the TP size
    (refused with the plainest window and layout), else ``num_spec``, else the conv layout."""
    from recoverssm_rs.errors import RecoverSSMError
    from recoverssm_rs.tools.cli_args import core_reason

    tp, spec, conv = (getattr(cfg, f"{side}_{k}") for k in ("tp", "spec", "layout"))
    out = {}
    for kind in _kinds(cfg.layers):
        for option, args in (
            (f"{side}_tp", (tp, 0, "SD")),
            (f"{side}_spec", (tp, spec, "SD")),
            (f"{side}_layout", (tp, spec, conv)),
        ):
            try:
                out[kind] = _layout(kind, *args)
            except (RecoverSSMError, OverflowError, TypeError) as e:
                value = getattr(cfg, option)
                raise PdOptionError(option, value, core_reason(e, value)) from e
    return out


def run_bytes(cfg: Config) -> int:
    """About the memory a run takes (both processes): each rank's pools (the core's bytes per
    block of its layouts), the model's weights in each process and the token sequences."""
    c = 3 * HEADS * HEAD_DIM
    total = 2 * cfg.layers * 4 * (VOCAB * c + c * KERNEL + VOCAB * HEADS * (HEAD_DIM + 1) + 2 * HEADS * HEAD_DIM)
    total += 2 * cfg.requests * (40 + cfg.generate) * 40
    for side, extra in (("prefill", 2), ("decode", 3)):
        tp = getattr(cfg, f"{side}_tp")
        for kind, lay in _side_layouts(cfg, side).items():
            n = len(range(KINDS.index(kind), cfg.layers, len(KINDS)))
            total += tp * lay.persistent_bytes_per_block * n * (cfg.requests + extra)
    return total


def validate(cfg: Config) -> None:
    """Check every option before any process starts: the demo's ranges, the layouts of both sides
    (the core builds them and checks that they fit together), the memory the run takes.

    Raises:
        PdOptionError: naming the option, its value and what it must be.
    """
    from recoverssm_rs._core import LayoutFingerprint
    from recoverssm_rs.errors import RecoverSSMError
    from recoverssm_rs.tools.cli_args import memory_problem

    _at_least(cfg, "requests", 1)
    _at_least(cfg, "layers", 1)
    _at_least(cfg, "generate", 1, MAX_GENERATE)
    _at_least(cfg, "seed", 0, 2**64 - 3)  # torch seeds take 64 bits; numpy gets seed + 2
    for side in ("prefill", "decode"):
        _at_least(cfg, f"{side}_tp", 1)
        _at_least(cfg, f"{side}_spec", 0)
    pre, dec = _side_layouts(cfg, "prefill"), _side_layouts(cfg, "decode")
    for kind in pre:
        try:
            LayoutFingerprint(pre[kind], block_size=16).check_compatible(LayoutFingerprint(dec[kind], block_size=16))
        except RecoverSSMError as e:
            raise PdOptionError(None, None, f"the prefill and decode layouts do not fit together: {e}") from e
    problem = memory_problem(run_bytes(cfg), "the run")
    if problem:
        defaults = Config()
        option = max(
            ("requests", "layers", "generate", "prefill_spec", "decode_spec"),
            key=lambda o: getattr(cfg, o) / max(1, getattr(defaults, o)),
        )
        raise PdOptionError(option, getattr(cfg, option), problem)


class _Model:
    """Seeded weights: per layer, embeddings of the conv input, raw gate and raw beta per token,
    the depthwise conv weights, and the gate parameters."""

    def __init__(self, cfg: Config) -> None:
        import torch

        g = torch.Generator().manual_seed(cfg.seed)
        c = 3 * HEADS * HEAD_DIM
        self.layers: list[dict[str, Any]] = []
        for i in range(cfg.layers):
            kind = KINDS[i % 2]
            gshape = (VOCAB, HEADS, HEAD_DIM) if kind == "kda" else (VOCAB, HEADS)
            self.layers.append(
                dict(
                    kind=kind,
                    emb=torch.randn(VOCAB, c, generator=g),
                    conv=torch.randn(c, KERNEL, generator=g) / KERNEL,
                    raw_g=torch.randn(*gshape, generator=g),
                    raw_beta=torch.randn(VOCAB, HEADS, generator=g),
                    A_log=torch.rand(HEADS, generator=g) - 1.0,
                    dt_bias=torch.randn(*gshape[1:], generator=g) * 0.1,
                )
            )

    def rank_parts(self, tp: int, rank: int) -> tuple[Any, slice]:
        """Channels (q, k, v of the rank's heads) and heads of ``rank`` of ``tp``."""
        import torch

        per = HEADS // tp
        heads = slice(rank * per, (rank + 1) * per)
        span = HEADS * HEAD_DIM
        ch = torch.cat(
            [torch.arange(s * span + heads.start * HEAD_DIM, s * span + heads.stop * HEAD_DIM) for s in range(3)]
        )
        return ch, heads

    def step(self, layer: int, tp: int, rank: int, window: Any, state: Any, tokens: list[int]) -> tuple[Any, Any]:
        """Runs ``tokens`` through one layer on one rank from (conv window ``[K-1, C_r]``, state
        ``[H_r, V, K]``). Returns the conv history ``[K-1+Q, C_r]`` and the states after each
        token ``[Q+1, H_r, V, K]``."""
        import torch
        from recoverssm_rs.speculative import recurrence

        w = self.layers[layer]
        ch, heads = self.rank_parts(tp, rank)
        t = torch.tensor(tokens)
        hist = torch.cat([window, w["emb"][t][:, ch]])
        taps = hist.unfold(0, KERNEL, 1)  # [Q, C_r, K]
        y = torch.nn.functional.silu((taps * w["conv"][ch]).sum(-1))
        hr = heads.stop - heads.start
        q, k, v = (
            y[:, i * hr * HEAD_DIM : (i + 1) * hr * HEAD_DIM].reshape(len(tokens), hr, HEAD_DIM) for i in range(3)
        )
        p = recurrence.prepare(
            w["kind"], q, k, w["raw_g"][t][:, heads], w["raw_beta"][t][:, heads], w["A_log"][heads], w["dt_bias"][heads]
        )
        _, states = recurrence.sequential_decode(
            state[None], p.q_hat[None], p.k_hat[None], v[None], p.gate[None], p.beta[None]
        )
        return hist, states[0]


def _sequences(cfg: Config) -> tuple[list[list[int]], list[list[int]]]:
    """Per request: the prompt and the generated continuation (seeded)."""
    import numpy as np

    rng = np.random.default_rng(cfg.seed + 1)
    prompts = [rng.integers(0, VOCAB, size=int(rng.integers(6, 40))).tolist() for _ in range(cfg.requests)]
    gens = [rng.integers(0, VOCAB, size=cfg.generate).tolist() for _ in range(cfg.requests)]
    return prompts, gens


class _Rank:
    """One rank of an instance: a pool per layer kind, and the model shard."""

    def __init__(
        self, cfg: Config, model: _Model, tp: int, rank: int, conv_layout: str, num_spec: int, num_blocks: int
    ) -> None:
        import torch
        from recoverssm_rs.transfer.pool import StatePool

        self.tp, self.rank, self.model, self.conv_layout = tp, rank, model, conv_layout
        self.pools: dict[str, StatePool] = {}
        self.kind_layers = {k: [i for i, w in enumerate(model.layers) if w["kind"] == k] for k in KINDS}
        for kind, idx in self.kind_layers.items():
            if not idx:
                continue
            lay = _layout(kind, tp, num_spec, conv_layout)
            states = [[torch.zeros((num_blocks, *s.shape), dtype=torch.float32) for s in lay.persistent] for _ in idx]
            self.pools[kind] = StatePool(lay, states, tp_rank=rank, block_size=16)

    def _tensors(self, layer: int) -> tuple[Any, Any]:
        kind = self.model.layers[layer]["kind"]
        i = self.kind_layers[kind].index(layer)
        t = self.pools[kind].tensors
        return t[2 * i], t[2 * i + 1]

    def window(self, layer: int, block: int) -> Any:
        conv, _ = self._tensors(layer)
        w = conv[block] if self.conv_layout == "SD" else conv[block].T
        return w[: KERNEL - 1]

    def load(self, layer: int, block: int) -> tuple[Any, Any]:
        return self.window(layer, block).clone(), self._tensors(layer)[1][block].clone()

    def store(self, layer: int, block: int, window: Any, state: Any) -> None:
        conv, temporal = self._tensors(layer)
        if self.conv_layout == "SD":
            conv[block, : KERNEL - 1] = window
        else:
            conv[block, :, : KERNEL - 1] = window.T
        temporal[block] = state

    def run(self, layer: int, block: int, tokens: list[int], accept: int | None = None) -> None:
        """Feeds ``tokens``; keeps the state after ``accept`` of them (all by default)."""
        window, state = self.load(layer, block)
        hist, states = self.model.step(layer, self.tp, self.rank, window, state, tokens)
        a = len(tokens) if accept is None else accept
        self.store(layer, block, hist[a : a + KERNEL - 1], states[a])


def _prefill(cfg: Config, conn: Any) -> dict[str, Any] | None:
    """The prefill process: prompts minus their last token, then serve the pulls."""
    from recoverssm_rs.transfer.nixl import NixlEndpoint

    model = _Model(cfg)
    prompts, _ = _sequences(cfg)
    ranks = [
        _Rank(cfg, model, cfg.prefill_tp, r, cfg.prefill_layout, cfg.prefill_spec, cfg.requests + 2)
        for r in range(cfg.prefill_tp)
    ]
    for rk in ranks:
        for i, prompt in enumerate(prompts):
            for layer in range(cfg.layers):
                rk.run(layer, i + 1, prompt[:-1])
    # The endpoints (agents and registrations) must stay alive while the decode side reads.
    eps = {kind: [NixlEndpoint(f"prefill-{kind}-{rk.rank}", rk.pools[kind]) for rk in ranks] for kind in ranks[0].pools}
    conn.send(({k: [e.info().to_bytes() for e in v] for k, v in eps.items()}, [i + 1 for i in range(cfg.requests)]))
    try:  # serve until the decode side has pulled (or is gone)
        conn.recv()
    except EOFError:
        pass
    return None


def _reference(model: _Model, layer: int, tokens: list[int]) -> tuple[Any, Any]:
    import torch

    c = 3 * HEADS * HEAD_DIM
    hist, states = model.step(layer, 1, 0, torch.zeros(KERNEL - 1, c), torch.zeros(HEADS, HEAD_DIM, HEAD_DIM), tokens)
    return hist[-(KERNEL - 1) :], states[-1]


def _compare(model: _Model, rk: _Rank, layer: int, block: int, tokens: list[int]) -> tuple[bool, float]:
    window, state = rk.load(layer, block)
    ref_w, ref_s = _reference(model, layer, tokens)
    ch, heads = model.rank_parts(rk.tp, rk.rank)
    conv_ok = bool((window == ref_w[:, ch]).all())
    err = float((state - ref_s[heads]).abs().max() / max(1.0, float(ref_s[heads].abs().max())))
    return conv_ok, err


def _decode(cfg: Config, conn: Any) -> dict[str, Any]:
    """The decode process: pull, check, decode in speculative windows, check again."""
    import numpy as np
    from recoverssm_rs.transfer.nixl import NixlEndpoint

    model = _Model(cfg)
    prompts, gens = _sequences(cfg)
    infos, src_blocks = conn.recv()
    nb = cfg.requests + 3
    dst_blocks = [nb - 1 - i for i in range(cfg.requests)]  # a different block order than prefill's
    ranks = [_Rank(cfg, model, cfg.decode_tp, r, cfg.decode_layout, cfg.decode_spec, nb) for r in range(cfg.decode_tp)]
    moved = descriptors = 0
    seconds = 0.0
    failed: list[str] = []
    for rk in ranks:
        for kind, pool in rk.pools.items():
            # The pull's polling progresses the reads: no busy-polling progress thread here.
            ep = NixlEndpoint(f"decode-{kind}-{rk.rank}", pool, progress_thread=False)
            for info in infos[kind]:
                ep.connect(info)
            res = ep.pull(list(zip(src_blocks, dst_blocks)))
            moved += res.nbytes
            descriptors += res.descriptors
            seconds += res.seconds
            failed += [f"rank {rk.rank} {kind} request {r}: {m}" for r, m in res.failed.items()]
    conn.send("done")
    mismatches: list[str] = []
    max_err = 0.0
    for rk in ranks:
        for i, prompt in enumerate(prompts):
            for layer in range(cfg.layers):
                ok, err = _compare(model, rk, layer, dst_blocks[i], prompt[:-1])
                max_err = max(max_err, err)
                if not ok or err > TOLERANCE:
                    mismatches.append(
                        f"after transfer: rank {rk.rank} request {i} layer {layer} conv_ok={ok} err={err:.2e}"
                    )
    rng = np.random.default_rng(cfg.seed + 2)
    q = cfg.decode_spec + 1
    windows = 0
    for i, prompt in enumerate(prompts):
        accepted = [prompt[-1]]
        todo = list(gens[i])
        seq = list(prompt[:-1])
        while True:
            # Window: the pending token plus drafts; a seeded number of drafts are right.
            right = int(rng.integers(0, q))
            drafts = todo[:right] + [int(x) for x in rng.integers(0, VOCAB, size=q - 1 - len(todo[:right]))]
            tokens = accepted[-1:] + drafts
            a = 1 + len(todo[:right])
            for rk in ranks:
                for layer in range(cfg.layers):
                    rk.run(layer, dst_blocks[i], tokens, accept=a)
            seq += tokens[:a]
            windows += 1
            todo = todo[right:]
            if not todo:
                break
            accepted = [todo.pop(0)]
        for rk in ranks:
            for layer in range(cfg.layers):
                ok, err = _compare(model, rk, layer, dst_blocks[i], seq)
                max_err = max(max_err, err)
                if not ok or err > TOLERANCE:
                    mismatches.append(
                        f"after decode: rank {rk.rank} request {i} layer {layer} conv_ok={ok} err={err:.2e}"
                    )
    return dict(
        requests=cfg.requests,
        layers=cfg.layers,
        prefill=f"TP{cfg.prefill_tp} {cfg.prefill_layout} num_spec={cfg.prefill_spec}",
        decode=f"TP{cfg.decode_tp} {cfg.decode_layout} num_spec={cfg.decode_spec}",
        bytes=moved,
        descriptors=descriptors,
        transfer_seconds=seconds,
        windows=windows,
        max_state_err=max_err,
        failed=failed,
        mismatches=mismatches[:20],
        num_mismatches=len(mismatches),
    )


def run(cfg: Config, *, progress: Callable[[str], None] | None = None, verbose: bool = False) -> dict[str, Any]:
    """Runs the two processes and returns the decode side's summary, or ``{"error": ...}`` naming
    the process that failed. The configuration is checked first (:func:`validate`). However it
    ends (an error, Ctrl-C), no child outlives the call."""
    validate(cfg)
    ctx = mp.get_context("spawn")
    p_conn, d_conn = ctx.Pipe()
    (pre_here, pre_there), (dec_here, dec_there) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
    pre = ctx.Process(target=child_main, args=("prefill", _prefill, (cfg, p_conn), pre_there, verbose), name="prefill")
    dec = ctx.Process(target=child_main, args=("decode", _decode, (cfg, d_conn), dec_there, verbose), name="decode")
    t0 = time.perf_counter()
    start_children([pre, dec])
    grace = 0.0  # Ctrl-C: end them now
    try:
        for c in (p_conn, d_conn, pre_there, dec_there):  # the children hold these ends now
            c.close()
        if progress is not None:
            progress(
                f"pd-demo: prefill (TP{cfg.prefill_tp}, pid {pre.pid}) and decode (TP{cfg.decode_tp}, "
                f"pid {dec.pid}) processes started"
            )
        summary = wait_result({"decode": (dec_here, dec), "prefill": (pre_here, pre)}, "decode")
        grace = 2.0 if "error" in summary else 30.0  # done: let them exit
    finally:  # however it ends, no child outlives the call
        stop_children([dec, pre], grace)
        for c in (pre_here, dec_here):
            c.close()
    summary["wall_seconds"] = time.perf_counter() - t0
    summary["exit_codes"] = [pre.exitcode, dec.exitcode]
    return summary


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable summary."""
    if "error" in s:
        return f"pd-demo: {s['error']}"
    lines = [
        f"pd-demo: prefill {s['prefill']} -> decode {s['decode']}, {s['requests']} requests x {s['layers']} layers",
        f"  transfer: {s['bytes']} bytes in {s['descriptors']} descriptors, pulled in {s['transfer_seconds'] * 1e3:.1f} ms "
        f"(connection set-up included: not a bandwidth; benches/transfer.py measures that)",
        f"  decode: {s['windows']} speculative windows; max recurrent-state error {s['max_state_err']:.2e}",
        f"  mismatches: {s['num_mismatches']}, failed transfers: {len(s['failed'])}",
    ]
    lines += [f"    {m}" for m in s["mismatches"] + s["failed"]]
    return "\n".join(lines)


def passed(s: dict[str, Any]) -> bool:
    """Whether the run of summary ``s`` found no mismatch, no failed transfer and no failed process."""
    return "error" not in s and not s["num_mismatches"] and not s["failed"] and s["exit_codes"] == [0, 0]
