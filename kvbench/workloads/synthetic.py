"""Synthetic prompts: seeded random token ids, for architecture-only models and for timing without text."""

from __future__ import annotations

import random


def prompt_ids(n_tokens: int, index: int, *, vocab_size: int, seed: int,
               exclude: frozenset[int] = frozenset()) -> list[int]:
    """``n_tokens`` ids drawn uniformly from ``[0, vocab_size)`` minus ``exclude`` (special tokens).

    Deterministic in ``(seed, n_tokens, index)``: prompt ``index`` of a length is the same in every run.
    """
    rng = random.Random(f"kvbench-synthetic-{seed}-{n_tokens}-{index}")
    out: list[int] = []
    while len(out) < n_tokens:
        t = rng.randrange(vocab_size)
        if t not in exclude:
            out.append(t)
    return out
