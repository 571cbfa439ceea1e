"""Random request traces for the checkpoint-policy oracle tests: prompts drawn from a 3-token
alphabet that share prefixes with earlier prompts and extend earlier turns (prompt + output)."""

from __future__ import annotations

import random


def trace(rng: random.Random, n: int) -> list[dict[str, list[int]]]:
    """``n`` requests ``{"prompt": [...], "output": [...]}``: 40% extend an earlier request's prompt
    + output, 30% start with a prefix of an earlier prompt, the rest are new; 1-30 new prompt
    tokens and 0-6 output tokens each."""
    out: list[dict[str, list[int]]] = []
    for _ in range(n):
        prompt: list[int] = []
        if out and rng.random() < 0.4:
            prev = rng.choice(out)
            prompt = prev["prompt"] + prev["output"]
        elif out and rng.random() < 0.5:
            prev = rng.choice(out)["prompt"]
            prompt = prev[: rng.randint(0, len(prev))]
        prompt = prompt + [rng.randrange(3) for _ in range(rng.randint(1, 30))]
        out.append({"prompt": prompt, "output": [rng.randrange(3) for _ in range(rng.randint(0, 6))]})
    return out
