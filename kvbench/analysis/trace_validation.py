"""The simulator checked against a measured replay: per request of a replayed trace slice (``workload.trace``),
the cached prompt tokens the engine reported beside those the simulator predicts at the engine's cache capacity,
their difference per request and overall, and the requests whose gap block granularity does not explain.

Prediction, in replayed tokens: the slice simulated under ``policy`` (one pass, kvbench.traces.simulate, or
directly, kvbench.traces.direct: ``prompt-lru`` is llama.cpp's slot and RAM cache) at ``capacity`` whole
replayed blocks (the capacity in tokens ÷ ``block_tokens``); a request's predicted hit is its hit blocks ×
``block_tokens``, at most its prompt. A measured count can miss a prediction by a block or so for
reasons that are the engine's, not the policy's: vLLM recomputes at least the prompt's last token (a prompt wholly
cached reports one block less) and reports whole blocks of its own size; so a request is flagged only when the
gap exceeds one engine block (``engine_block_tokens``, default ``block_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvbench.errors import BadParameter
from kvbench.traces.direct import DIRECT_POLICIES, direct_hits
from kvbench.traces.simulate import POLICIES, simulate
from kvbench.traces.trace import Trace


@dataclass(frozen=True)
class ReplayCheck:
    """Measured against simulated cached tokens of one mode's replay.

    Attributes:
        table: per request (and repeat): ``repeat``, ``trace_index``, ``prompt_tokens``, ``reusable_tokens`` (an
            unlimited cache's hit), ``predicted_tokens``, ``measured_tokens``, ``difference_tokens`` (measured −
            predicted) and ``flagged`` (a gap beyond one engine block).
        capacity_blocks: the capacity simulated (replayed blocks); policy: the policy simulated.
        predicted, measured: Σ over the requests compared (tokens); ``unlimited``: Σ an unlimited cache's.
        flagged: requests whose gap exceeds one engine block; ``missing``: slice requests with no measured row.
    """

    table: pd.DataFrame
    capacity_blocks: int
    policy: str
    predicted: int
    measured: int
    unlimited: int
    flagged: int
    missing: int


def check_replay(rows: pd.DataFrame, trace: Trace, block_tokens: int, capacity_tokens: int, policy: str = "lru",
                 engine_block_tokens: int | None = None) -> ReplayCheck:
    """Compare ``rows`` (one mode's measured rows: ``trace_index``, ``repeat``, ``prompt_tokens``,
    ``cached_prompt_tokens``; rows without a cached count are left out) with the simulation of ``trace`` (the slice
    replayed) at ``capacity_tokens`` of KV (``prompt-lru``: of the RAM cache beside the slot), replayed at
    ``block_tokens`` per block.

    Raises:
        kvbench.errors.BadParameter: an unknown ``policy``.
    """
    if policy not in POLICIES + DIRECT_POLICIES:
        raise BadParameter(f"{{policy}} {policy!r} is not one of: {', '.join(POLICIES + DIRECT_POLICIES)}",
                           "policy")
    capacity = max(0, capacity_tokens // block_tokens)
    curve = simulate(trace, policy if policy in POLICIES else "lru")
    hit_blocks = curve.per_request(capacity)[0] if policy in POLICIES else direct_hits(trace, policy, capacity)
    ever, _ = curve.per_request(curve.distinct_blocks)
    position = {int(ix): i for i, ix in enumerate(trace.index)}
    unit = engine_block_tokens or block_tokens
    out = []
    for r in rows.to_dict("records"):
        ix, cached = r.get("trace_index"), r.get("cached_prompt_tokens")
        if ix is None or ix != ix or cached is None or cached != cached or int(ix) not in position:
            continue
        i, prompt = position[int(ix)], int(r["prompt_tokens"])
        predicted = min(int(hit_blocks[i]) * block_tokens, prompt)
        out.append({"repeat": int(r.get("repeat") or 0), "trace_index": int(ix), "prompt_tokens": prompt,
                    "reusable_tokens": min(int(ever[i]) * block_tokens, prompt), "predicted_tokens": predicted,
                    "measured_tokens": int(cached), "difference_tokens": int(cached) - predicted,
                    "flagged": abs(int(cached) - predicted) > unit})
    table = pd.DataFrame(out, columns=["repeat", "trace_index", "prompt_tokens", "reusable_tokens",
                                       "predicted_tokens", "measured_tokens", "difference_tokens", "flagged"])
    if len(table):
        table = table.sort_values(["repeat", "trace_index"], kind="stable").reset_index(drop=True)
    seen = set(table["trace_index"].astype(int)) if len(table) else set()
    return ReplayCheck(table, capacity, policy, int(table["predicted_tokens"].sum()),
                       int(table["measured_tokens"].sum()), int(table["reusable_tokens"].sum()),
                       int(np.asarray(table["flagged"], dtype=bool).sum()),
                       sum(1 for ix in trace.index if int(ix) not in seen))
