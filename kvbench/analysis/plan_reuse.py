"""``kvbench plan``, the reuse tier: the offload vLLM (``--kv-offloading-backend native``), LMCache and SGLang's
hierarchical cache do. A finished prompt's KV goes to a tier (host memory, then disk); when a later prompt starts
with the same prefix, the tier restores that prefix's KV to the device instead of the GPU recomputing it. Only
the reused prefix crosses the link, once per request, not the whole history at every decode step (kvbench's own
streaming offload, :mod:`kvbench.analysis.plan`).

The model (seconds, tokens), per prompt of n tokens whose first k = share × n tokens the tier holds, with the
constants of :mod:`kvbench.analysis.plan_break_even` (p = prefill per token, a = attention per token pair,
r = restore per token = KV bytes per token ÷ the tier's bandwidth), the TTFT roofline of the break-even map
(:mod:`kvbench.analysis.break_even_fit`, no per-request overhead):

- recompute: TTFT = p × n + a × n²/2 (every token through the weights; each attends to those before it);
- restore: TTFT = r × k + p × (n − k) + a × (n − k) × (k + (n − k)/2) (the suffix attends to the restored
  prefix and to itself); the restore is taken as not overlapped with compute (vLLM and LMCache load layer by
  layer and hide part of it: the figure is an upper bound);
- saving = recompute − restore = k × (p − r) + a × k²/2. Restoring pays for any share when r ≤ p; otherwise from
  the break-even prefix k* = 2 (r − p) ÷ a, the share k* ÷ n (none at this length when above 100%).
"""

from __future__ import annotations

import math

import pandas as pd

from kvbench.analysis.plan_break_even import Constants
from kvbench.errors import BadValue
from kvbench.scenario.workload import prefix_tokens

#: The reused shares (percent of the prompt) the reuse table shows.
REUSE_SHARES = (25, 50, 75, 95)


def _rates(constants: Constants) -> tuple[float, float, float]:
    """``(p, a, r)`` of the module docstring. Raises BadValue for a missing or negative constant."""
    values = []
    for key in ("prefill_s_per_token", "attention_s_per_token_pair", "restore_host_s_per_token"):
        v = constants.values.get(key)
        if v is None or not (v >= 0 and math.isfinite(v)):
            raise BadValue(f"the constant {key} must be a finite number of seconds, at least 0, not {v!r}")
        values.append(v)
    return values[0], values[1], values[2]


def ttft_recompute(constants: Constants, prompt_tokens: int) -> float:
    """TTFT (seconds) of a prompt of ``prompt_tokens`` computed whole: p × n + a × n²/2."""
    p, a, _ = _rates(constants)
    return p * prompt_tokens + a * prompt_tokens**2 / 2


def ttft_restore(constants: Constants, prompt_tokens: int, restored_tokens: int) -> float:
    """TTFT (seconds) of a prompt of ``prompt_tokens`` whose first ``restored_tokens`` the tier restores:
    r × k + p × (n − k) + a × (n − k) × (k + (n − k)/2).

    Raises:
        BadValue: ``restored_tokens`` not from 0 to ``prompt_tokens``.
    """
    if not 0 <= restored_tokens <= prompt_tokens:
        raise BadValue(f"restored tokens must be 0 to {prompt_tokens:,}, not {restored_tokens:,}")
    p, a, r = _rates(constants)
    rest = prompt_tokens - restored_tokens
    return r * restored_tokens + p * rest + a * rest * (restored_tokens + rest / 2)


def break_even_share(constants: Constants, prompt_tokens: int) -> float | None:
    """The reused share (0 to 1) of a ``prompt_tokens`` prompt above which restoring it beats recomputing it: 0 when
    restoring a token costs no more than prefilling it (r ≤ p), else 2 (r − p) ÷ (a × n); None when that is above
    1 (restoring never pays at this length) or a = 0 with r > p."""
    p, a, r = _rates(constants)
    if r <= p:
        return 0.0
    if a == 0:
        return None
    share = 2 * (r - p) / (a * prompt_tokens)
    return share if share <= 1 else None


def reuse_table(constants: Constants, contexts: list[int], shares: tuple[int, ...] = REUSE_SHARES) -> pd.DataFrame:
    """Per prompt length × reused share (percent; the prefix rounded as a ``shared_prefix`` workload rounds it,
    :func:`kvbench.scenario.workload.prefix_tokens`): columns ``prompt_tokens``, ``shared_pct``,
    ``restored_tokens``, ``recompute_s``, ``restore_s`` (TTFTs, seconds), ``speedup`` (recompute ÷ restore) and
    ``break_even_share`` (0 to 1, nan where restoring never pays at that length)."""
    rows = []
    for n in contexts:
        cold, even = ttft_recompute(constants, n), break_even_share(constants, n)
        for pct in shares:
            k = prefix_tokens(n, pct)
            warm = ttft_restore(constants, n, k)
            rows.append({"prompt_tokens": n, "shared_pct": pct, "restored_tokens": k, "recompute_s": cold,
                         "restore_s": warm, "speedup": cold / warm if warm > 0 else math.inf,
                         "break_even_share": math.nan if even is None else even})
    return pd.DataFrame(rows)


__all__ = ["REUSE_SHARES", "break_even_share", "reuse_table", "ttft_recompute", "ttft_restore"]
