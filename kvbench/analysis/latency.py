"""The latency and throughput figures of one generation, from its clock readings (seconds): TTFT, ITL and its
percentiles, TPOT, e2e latency, and tokens/s. One definition, used by every engine and by the report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def latency_metrics(t_start: float, token_times: Sequence[float],
                    chunk_times: Sequence[float] | None = None) -> dict[str, Any]:
    """TTFT, ITL, TPOT, NTPOT and e2e latency from the clock readings of one generation (seconds).

    Args:
        t_start: clock before the prefill (a server request: before it was sent, or before the slot restore that
            preceded it).
        token_times: clock after each generated token (the first is the prefill's token).
        chunk_times: a streamed reply's clock reading per chunk that carried tokens (a chunk may carry several);
            None: every token came on its own (the in-process engine).

    Returns:
        ``ttft_s`` = first − start (prefill + first token); ``itl_s`` = the gaps between consecutive chunks (one
        per chunk, as vLLM's ``vllm bench serve`` takes them: a chunk of k tokens is one gap, not one gap and k − 1
        of 0 s; without ``chunk_times``, between consecutive tokens); ``e2e_s`` = last − start; ``tpot_s`` =
        (e2e − TTFT) / (n − 1), None when n = 1 (decode only); ``ntpot_s`` = e2e / n (inference-perf's normalised
        time per output token, TTFT included); with ``chunk_times``, ``tokens_per_chunk`` = n ÷ chunks.
    """
    if not token_times:
        raise ValueError("no token was generated")
    ttft = token_times[0] - t_start
    e2e = token_times[-1] - t_start
    marks = token_times if chunk_times is None else chunk_times
    itl = [b - a for a, b in zip(marks, marks[1:])]
    n = len(token_times)
    out = {"ttft_s": ttft, "itl_s": itl, "e2e_s": e2e, "tpot_s": (e2e - ttft) / (n - 1) if n > 1 else None,
           "ntpot_s": e2e / n}
    if chunk_times is not None:
        out["tokens_per_chunk"] = n / len(chunk_times) if chunk_times else None
    return out


#: ITL percentiles of each trial (and pooled per point in the report): stalls a TPOT median hides.
ITL_PERCENTILES = (50, 90, 99)


def itl_percentiles(itl_s: Sequence[float]) -> dict[str, float | None]:
    """``itl_p50_s``, ``itl_p90_s``, ``itl_p99_s`` and ``itl_max_s`` of one trial's inter-token latencies (seconds):
    the p-th percentile is the gap at 0-based rank ⌈(n − 1)·p/100⌉ of the n sorted gaps (numpy's and pandas'
    ``higher`` method: never below the linear-interpolation percentile, and always a gap that happened); None
    without gaps (one generated token)."""
    keys = [f"itl_p{p}_s" for p in ITL_PERCENTILES] + ["itl_max_s"]
    if not len(itl_s):
        return dict.fromkeys(keys)
    return dict(zip(keys, [float(v) for v in np.percentile(itl_s, [*ITL_PERCENTILES, 100], method="higher")]))


def is_max_rank(n: int, p: float) -> bool:
    """Whether the ``p``-th percentile of ``n`` values by :func:`higher_percentile`'s rank rule is their maximum
    (rank ⌈(n − 1)·p/100⌉ = n − 1): p99 of at most 100 values, p90 of at most 10."""
    return n > 0 and math.ceil((n - 1) * p / 100) == n - 1


def higher_percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0 ≤ p ≤ 100) of ``values`` by :func:`numpy.percentile`'s ``higher`` method: the
    value at 0-based rank ⌈(n − 1)·p/100⌉ of the n sorted values (always a value that happened); None without
    values.

    Raises:
        ValueError: ``p`` outside [0, 100] (numpy's).
    """
    return float(np.percentile(values, p, method="higher")) if len(values) else None


def throughputs(prompt_tokens: int, batch_size: int, lat: dict[str, Any], n_out: int) -> dict[str, float | None]:
    """Tokens/s: prefill (prompt tokens of the batch / TTFT), decode (tokens after the first / decode time) and
    overall (generated tokens of the batch / e2e)."""
    decode_s = lat["e2e_s"] - lat["ttft_s"]
    return {
        "prefill_tokens_per_s": prompt_tokens * batch_size / lat["ttft_s"] if lat["ttft_s"] > 0 else None,
        "decode_tokens_per_s": (n_out - 1) * batch_size / decode_s if n_out > 1 and decode_s > 0 else None,
        "throughput_tokens_per_s": n_out * batch_size / lat["e2e_s"] if lat["e2e_s"] > 0 else None,
    }


__all__ = ["ITL_PERCENTILES", "higher_percentile", "is_max_rank", "itl_percentiles", "latency_metrics", "throughputs"]
