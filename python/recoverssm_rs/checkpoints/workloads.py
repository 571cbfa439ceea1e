"""Trace generators for the request shapes the field reports on hybrid prefix caching.

Every generator is deterministic for a ``seed``, draws token ids uniformly from ``vocab`` (distinct
texts never share a prefix by chance beyond a token or two), spaces arrivals by exponential gaps of
mean ``1 / rate`` seconds, and returns :class:`~recoverssm_rs.checkpoints.TraceRequest` objects in
arrival order. :data:`WORKLOADS` names them for the command line and the benchmarks.

- :func:`shared_prompt`: one long system prompt (default 1,500 tokens) shared by every request,
  then a suffix of its own (700 tokens: the 1,500/700 split of the public reports; ``suffix=60`` for
  short questions).
- :func:`few_shot`: a shared block of examples shorter than one engine block (400 tokens), then a
  query.
- :func:`multi_turn`: conversations whose every turn re-sends the previous turn's prompt and
  answer, plus a new user message; conversations interleave.
- :func:`agent_loop`: agents sharing a tool preamble, each step re-sending the growing history
  plus a tool result.
- :func:`rag`: a shared instruction, one of a few documents (popularity skewed), a question.
- :func:`mix`: all of the above, interleaved by arrival.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
import random
from collections.abc import Callable
from typing import Any

from ..errors import PlanError
from . import TraceRequest

__all__ = ["shared_prompt", "few_shot", "multi_turn", "agent_loop", "rag", "mix", "WORKLOADS", "generate"]

VOCAB = 150_000


def _count(name: str, v: Any, least: int | None = 1) -> int:
    """``v`` as an int ``>= least`` (any int when None; a bool or a float is refused, a numpy
    int accepted)."""
    try:
        n = None if isinstance(v, bool) else operator.index(v)
    except TypeError:
        n = None
    if n is None or (least is not None and n < least):
        raise PlanError(f"{name} = {v!r} must be an int" + ("" if least is None else f" >= {least}"))
    return n


def _span(name: str, v: Any) -> tuple[int, int]:
    """``v`` as a range ``(lo, hi)`` of token counts, ``0 <= lo <= hi``."""
    try:
        lo, hi = (_count(name, x, 0) for x in v)
    except (TypeError, ValueError, PlanError):
        lo, hi = 1, 0
    if lo > hi:
        raise PlanError(f"{name} = {v!r} must be a range (lo, hi) of token counts with 0 <= lo <= hi")
    return lo, hi


def _number(name: str, v: Any, least: float, strict: bool) -> float:
    """``v`` as a finite number ``> least`` (``strict``) or ``>= least``."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < least or (strict and v == least):
        raise PlanError(f"{name} = {v!r} must be a finite number {'>' if strict else '>='} {least:g}")
    return float(v)


def _prompt(what: str, tokens: int) -> None:
    if tokens < 1:
        raise PlanError(f"{what} is 0 tokens: every prompt needs at least one token")


class _Gen:
    def __init__(self, seed: int, vocab: int, rate: float) -> None:
        vocab = _count("vocab", vocab, 2)
        rate = _number("rate", rate, 0, strict=True)
        self.rng = random.Random(_count("seed", seed, None))
        self.vocab = vocab
        self.rate = rate
        self.t = 0.0

    def text(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def span(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def arrival(self) -> float:
        self.t += self.rng.expovariate(self.rate)
        return round(self.t, 6)


def shared_prompt(
    requests: int = 64,
    shared: int = 1500,
    suffix: int = 700,
    output: int = 64,
    seed: int = 0,
    vocab: int = VOCAB,
    rate: float = 4.0,
) -> list[TraceRequest]:
    """``requests`` prompts of a ``shared``-token system prompt plus a ``suffix``-token text of
    their own, each answered with ``output`` tokens."""
    g = _Gen(seed, vocab, rate)
    requests, shared, suffix, output = (
        _count("requests", requests),
        *(_count(n, v, 0) for n, v in (("shared", shared), ("suffix", suffix), ("output", output))),
    )
    _prompt("the prompt (shared + suffix)", shared + suffix)
    system = g.text(shared)
    return [TraceRequest(f"s{i}", g.arrival(), system + g.text(suffix), g.text(output)) for i in range(requests)]


def few_shot(
    requests: int = 64,
    shared: int = 400,
    query: int = 120,
    output: int = 32,
    seed: int = 0,
    vocab: int = VOCAB,
    rate: float = 4.0,
) -> list[TraceRequest]:
    """A ``shared``-token block of examples (less than one engine block by default) and a
    ``query``-token question per request."""
    g = _Gen(seed, vocab, rate)
    requests, shared, query, output = (
        _count("requests", requests),
        *(_count(n, v, 0) for n, v in (("shared", shared), ("query", query), ("output", output))),
    )
    _prompt("the prompt (shared + query)", shared + query)
    shots = g.text(shared)
    return [TraceRequest(f"f{i}", g.arrival(), shots + g.text(query), g.text(output)) for i in range(requests)]


def multi_turn(
    conversations: int = 12,
    turns: int = 5,
    system: int = 300,
    user: tuple[int, int] = (40, 250),
    output: tuple[int, int] = (60, 400),
    seed: int = 0,
    vocab: int = VOCAB,
    rate: float = 4.0,
) -> list[TraceRequest]:
    """``conversations`` chats of ``turns`` turns, all opening with the same ``system`` prompt;
    turn ``k + 1``'s prompt is turn ``k``'s prompt + answer + a user message of ``user`` tokens
    (uniform range); answers have ``output`` tokens. Turns of different chats interleave at
    random."""
    g = _Gen(seed, vocab, rate)
    conversations, turns, system = (
        _count("conversations", conversations),
        _count("turns", turns),
        _count("system", system, 0),
    )
    user, output = _span("user", user), _span("output", output)
    _prompt("the first turn's prompt (system + user)", system + user[0])
    sys_prompt = g.text(system)
    history = [sys_prompt + g.text(g.span(*user)) for _ in range(conversations)]
    left = [turns] * conversations
    out: list[TraceRequest] = []
    while any(left):
        c = g.rng.choice([i for i, k in enumerate(left) if k])
        answer = g.text(g.span(*output))
        out.append(TraceRequest(f"c{c}t{turns - left[c]}", g.arrival(), list(history[c]), answer))
        history[c] = history[c] + answer + g.text(g.span(*user))
        left[c] -= 1
    return out


def agent_loop(
    agents: int = 6,
    steps: int = 8,
    preamble: int = 1200,
    task: int = 150,
    tool: tuple[int, int] = (80, 500),
    output: tuple[int, int] = (20, 120),
    seed: int = 0,
    vocab: int = VOCAB,
    rate: float = 4.0,
) -> list[TraceRequest]:
    """``agents`` loops of ``steps`` calls sharing a ``preamble`` (tool definitions); each starts
    from a ``task`` of its own and each step re-sends the whole history: previous prompt, the
    model's call (``output`` tokens) and the tool's result (``tool`` tokens). Agents interleave."""
    g = _Gen(seed, vocab, rate)
    agents, steps = _count("agents", agents), _count("steps", steps)
    preamble, task = _count("preamble", preamble, 0), _count("task", task, 0)
    tool, output = _span("tool", tool), _span("output", output)
    _prompt("the first step's prompt (preamble + task)", preamble + task)
    pre = g.text(preamble)
    history = [pre + g.text(task) for _ in range(agents)]
    left = [steps] * agents
    out: list[TraceRequest] = []
    while any(left):
        a = g.rng.choice([i for i, k in enumerate(left) if k])
        call = g.text(g.span(*output))
        out.append(TraceRequest(f"a{a}s{steps - left[a]}", g.arrival(), list(history[a]), call))
        history[a] = history[a] + call + g.text(g.span(*tool))
        left[a] -= 1
    return out


def rag(
    requests: int = 64,
    documents: int = 8,
    instruction: int = 200,
    document: int = 1500,
    question: tuple[int, int] = (20, 80),
    output: int = 48,
    zipf: float = 1.2,
    seed: int = 0,
    vocab: int = VOCAB,
    rate: float = 4.0,
) -> list[TraceRequest]:
    """``requests`` prompts of a shared ``instruction``, one of ``documents`` retrieved documents
    (``document`` tokens each; document ``k`` drawn with weight ``1 / (k + 1) ** zipf``) and a
    ``question``."""
    g = _Gen(seed, vocab, rate)
    requests, documents = _count("requests", requests), _count("documents", documents)
    instruction, document, output = (
        _count(n, v, 0) for n, v in (("instruction", instruction), ("document", document), ("output", output))
    )
    question = _span("question", question)
    zipf = _number("zipf", zipf, 0, strict=False)
    _prompt("the prompt (instruction + document + question)", instruction + document + question[0])
    inst = g.text(instruction)
    docs = [g.text(document) for _ in range(documents)]
    weights = [1.0 / (k + 1) ** zipf for k in range(documents)]
    out = []
    for i in range(requests):
        d = g.rng.choices(range(documents), weights)[0]
        out.append(TraceRequest(f"r{i}", g.arrival(), inst + docs[d] + g.text(g.span(*question)), g.text(output)))
    return out


def mix(seed: int = 0, vocab: int = VOCAB) -> list[TraceRequest]:
    """Every other workload at its defaults (a quarter of the requests each, different seeds),
    merged by arrival time."""
    seed = _count("seed", seed, None)
    parts = [
        shared_prompt(requests=16, seed=seed + 1, vocab=vocab, rate=1.0),
        few_shot(requests=16, seed=seed + 2, vocab=vocab, rate=1.0),
        multi_turn(conversations=4, seed=seed + 3, vocab=vocab, rate=1.0),
        agent_loop(agents=2, seed=seed + 4, vocab=vocab, rate=1.0),
        rag(requests=16, seed=seed + 5, vocab=vocab, rate=1.0),
    ]
    merged = sorted(
        (TraceRequest(f"m{k}-{r.id}", r.arrival, r.prompt, r.output) for k, p in enumerate(parts) for r in p),
        key=lambda r: r.arrival,
    )
    return merged


WORKLOADS: dict[str, Callable[..., list[TraceRequest]]] = {
    "shared-long": shared_prompt,
    "shared-short": functools.partial(shared_prompt, suffix=60),
    "few-shot": few_shot,
    "multi-turn": multi_turn,
    "agent-loop": agent_loop,
    "rag": rag,
    "mix": mix,
}
"""Name -> generator (keyword arguments as documented on each; ``shared-short`` is
:func:`shared_prompt` with 60-token suffixes)."""


def generate(name: str, **params: Any) -> list[TraceRequest]:
    """The workload ``name`` (a key of :data:`WORKLOADS`) with ``params``."""
    try:
        gen = WORKLOADS[name]
    except KeyError:
        raise PlanError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
    try:
        inspect.signature(gen).bind(**params)
    except TypeError as e:
        raise PlanError(f"workload {name!r}: {e}") from None
    return gen(**params)
