"""The cost of peer tools' runs (:mod:`kvbench.results.peers`): per run its medians in kvbench's definitions, USD
per 1M generated tokens at the throughput the tool measured, and each later run against the first (the reference,
e.g. the same workload without a cache) with an interval.

The saving is taken on request time per generated token, S = Σ e2e ÷ Σ output tokens over the requests compared:
at one concurrency a server's cost per token is proportional to it, so 100 × (1 − S_run ÷ S_reference) is the
cost saving. Requests that both files hold (the same prompt text, or the same index where the tool keeps no
prompt) give a paired comparison: its 95% interval resamples the pairs. Files whose requests cannot be matched
give an unpaired one: each file's requests are resampled on their own, and the line says "unpaired". A file of
aggregates only, or runs at different concurrencies, give the ratio of the tools' throughputs without an
interval: inconclusive. The files carry no record of the machine's load, so a verdict from them says so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.cost import WHAT_IF_TOKENS_PER_S, Prices
from kvbench.analysis.intervals import judge
from kvbench.analysis.latency import higher_percentile
from kvbench.errors import ResultsError
from kvbench.results.peers import LATENCIES, PeerRun

#: Resamples of each interval, and the seed that makes them repeatable.
N_BOOT, SEED = 2000, 0
#: What a verdict from peer files adds: kvbench cannot tell whether their machine was quiet.
LOAD_CAVEAT = "their files do not record the machine's load"


def medians(run: PeerRun) -> dict[str, Any]:
    """Per metric of :data:`~kvbench.results.peers.common.LATENCIES` ``<metric>_p50`` (seconds): over the run's
    successful requests (numpy's ``higher`` method, as kvbench's own tables; ITL over every gap) where it has
    them, else the tool's own median; ``median_source``: ``requests`` or ``file``."""
    out: dict[str, Any] = {}
    ok = run.requests[run.requests["ok"]] if run.per_request else run.requests
    for m in LATENCIES:
        if run.per_request:
            if m == "itl_s":
                values = [g for v in ok["itl_s"] if isinstance(v, list) for g in v]
            else:
                values = [float(v) for v in ok[m] if v is not None and v == v]
            out[f"{m}_p50"] = higher_percentile(values, 50) if values else math.nan
        else:
            out[f"{m}_p50"] = run.aggregates.get(m, {}).get("p50", math.nan)
    out["median_source"] = "requests" if run.per_request else "file"
    return out


def _seconds_per_token(e2e: np.ndarray, tokens: np.ndarray) -> float:
    total = tokens.sum()
    return float(e2e.sum() / total) if total > 0 else math.nan


def _usable(run: PeerRun) -> pd.DataFrame:
    """Successful requests with an e2e and an output count, each with its occurrence number among equal keys."""
    r = run.requests
    r = r[r["ok"] & r["e2e_s"].notna() & (pd.to_numeric(r["n_output_tokens"], errors="coerce") > 0)].copy()
    r["occurrence"] = r.groupby("key", dropna=False).cumcount()
    return r


def compare(reference: PeerRun, run: PeerRun, prefix_chars: int | None = None) -> dict[str, Any]:
    """``run`` against ``reference``: ``saving_pct`` (see the module docstring) with ``saving_ci_low`` and
    ``saving_ci_high`` (95%, NaN without requests), ``pairs`` (matched requests; unpaired: the smaller file's
    requests), ``comparison`` (how: ``paired by prompt text``, ``paired by request index``, ``unpaired``,
    ``throughputs only``: aggregates only, or a concurrency that differs or that a file does not say) and ``verdict``
    (:func:`kvbench.analysis.intervals.judge`'s reason it is inconclusive, or ``""``). With ``prefix_chars`` (a
    shared-prefix workload) paired requests are grouped by the first so many characters of their prompt (their
    prefix) and the interval resamples whole prefixes, as ``kvbench map`` draws by prefix: ``prefixes`` is how many
    there were (None without)."""
    out: dict[str, Any] = {"saving_pct": math.nan, "saving_ci_low": math.nan, "saving_ci_high": math.nan,
                           "pairs": 0, "prefixes": None}
    unknown = [r.label for r in (reference, run) if r.concurrency is None]
    conc_differ = not unknown and reference.concurrency != run.concurrency
    if not (reference.per_request and run.per_request) or conc_differ or unknown:
        a, b = reference.output_tokens_per_s, run.output_tokens_per_s
        if a and b:
            out["saving_pct"] = 100 * (1 - a / b)
        why = ("aggregates only, no requests to compare" if not (reference.per_request and run.per_request)
               else f"concurrency {run.concurrency} vs {reference.concurrency}" if conc_differ
               else f"the concurrency of {unknown[0]} is not in its file (request time per token is a cost only at "
                    "one concurrency)")
        return dict(out, comparison="throughputs only", verdict=f"inconclusive: {why}")
    a, b = _usable(reference), _usable(run)
    rng = np.random.default_rng(SEED)
    paired = reference.pairing == run.pairing and reference.pairing in ("prompt text", "request index")
    pairs = (a[a["key"].notna()].merge(b[b["key"].notna()], on=["key", "occurrence"], suffixes=("_a", "_b"))
             if paired else pd.DataFrame())
    if len(pairs):
        ea, ta = pairs["e2e_s_a"].to_numpy(float), pairs["n_output_tokens_a"].to_numpy(float)
        eb, tb = pairs["e2e_s_b"].to_numpy(float), pairs["n_output_tokens_b"].to_numpy(float)
        heads = pairs["prompt_head_a"] if "prompt_head_a" in pairs else pd.Series(dtype=object)
        if prefix_chars is not None and len(heads) and heads.notna().all():
            groups = pd.factorize(heads.str[:prefix_chars])[0]
            members = [np.flatnonzero(groups == g) for g in range(groups.max() + 1)]
            out["prefixes"] = len(members)
            boot = np.empty(N_BOOT)
            for k, pick in enumerate(rng.integers(0, len(members), size=(N_BOOT, len(members)))):
                at = np.concatenate([members[g] for g in pick])
                boot[k] = 100 * (1 - (eb[at].sum() / tb[at].sum()) / (ea[at].sum() / ta[at].sum()))
        else:
            draws = rng.integers(0, len(pairs), size=(N_BOOT, len(pairs)))
            boot = 100 * (1 - (eb[draws].sum(1) / tb[draws].sum(1)) / (ea[draws].sum(1) / ta[draws].sum(1)))
        n, how = len(pairs), f"paired by {reference.pairing}"
        point = 100 * (1 - _seconds_per_token(eb, tb) / _seconds_per_token(ea, ta))
    else:
        ea, ta = a["e2e_s"].to_numpy(float), a["n_output_tokens"].to_numpy(float)
        eb, tb = b["e2e_s"].to_numpy(float), b["n_output_tokens"].to_numpy(float)
        if not len(ea) or not len(eb):
            return dict(out, comparison="unpaired", verdict="inconclusive: no successful requests")
        da = rng.integers(0, len(ea), size=(N_BOOT, len(ea)))
        db = rng.integers(0, len(eb), size=(N_BOOT, len(eb)))
        boot = 100 * (1 - (eb[db].sum(1) / tb[db].sum(1)) / (ea[da].sum(1) / ta[da].sum(1)))
        n, how = min(len(ea), len(eb)), "unpaired"
        point = 100 * (1 - _seconds_per_token(eb, tb) / _seconds_per_token(ea, ta))
    low, high = np.percentile(boot, [2.5, 97.5])
    units = (out["prefixes"], "prefixes") if out["prefixes"] is not None else None
    verdict = judge(n, 0, 0, float(low), float(high), no_change=0.0, units=units)
    if out["prefixes"] == 1:  # one prefix: no spread to draw an interval from
        low = high = math.nan
        verdict = "inconclusive: 1 prefix, need 5"
    return dict(out, saving_pct=point, saving_ci_low=float(low), saving_ci_high=float(high), pairs=n,
                comparison=how, verdict=verdict)


def peer_cost_table(runs: list[PeerRun], prices: Prices) -> pd.DataFrame:
    """One row per run: ``label``, ``tool``, ``tool_version``, ``requests`` (successful; NaN for aggregates only),
    ``cached_token_share`` (Σ cached ÷ Σ prompt tokens of the requests whose cached tokens the file holds; NaN
    without),
    ``failed``, ``concurrency``, :func:`medians`, ``output_tokens_per_s`` (the tool's), ``usd_per_million`` (at
    ``prices.gpu_per_hour``, no memory charged: a peer file says nothing of it), and for every run after the
    first, :func:`compare` against the first (``reference`` True on the first).

    Raises:
        kvbench.errors.ResultsError: a file's output rate outside
            :data:`~kvbench.analysis.cost.WHAT_IF_TOKENS_PER_S` (naming the file).
    """
    rows = []
    for run in runs:
        rate = run.output_tokens_per_s
        if rate is not None and rate != 0 and not WHAT_IF_TOKENS_PER_S[0] <= rate <= WHAT_IF_TOKENS_PER_S[1]:
            raise ResultsError(f"{run.path}: an output rate of {rate:g} tokens/s is outside "
                               f"{WHAT_IF_TOKENS_PER_S[0]:g} to {WHAT_IF_TOKENS_PER_S[1]:g}: not a measured rate")
    for k, run in enumerate(runs):
        ok = int(run.requests["ok"].sum()) if run.per_request else (
            math.nan if run.reported_requests is None else run.reported_requests)
        rate = run.output_tokens_per_s
        done = run.requests[run.requests["ok"]] if run.per_request else run.requests
        cached = pd.to_numeric(done["cached_prompt_tokens"], errors="coerce") if run.per_request \
            else pd.Series(dtype=float)
        known = done.loc[cached.notna()] if len(cached) else done.iloc[0:0]
        prompt = pd.to_numeric(known["prompt_tokens"], errors="coerce").sum() if len(known) else 0
        rec: dict[str, Any] = {
            "cached_token_share": float(cached.sum() / prompt) if prompt > 0 else (
                math.nan if run.per_request or run.reported_cached_share is None else run.reported_cached_share),
            "label": run.label, "tool": run.tool, "tool_version": run.tool_version or "",
            "requests": ok, "failed": int((~run.requests["ok"]).sum()) if run.per_request else math.nan,
            "concurrency": run.concurrency if run.concurrency is not None else math.nan, **medians(run),
            "output_tokens_per_s": rate if rate else math.nan,
            "usd_per_million": prices.per_million(rate) if rate else math.nan, "reference": k == 0}
        if k:
            rec.update(compare(runs[0], run))
        rows.append(rec)
    return pd.DataFrame(rows)


__all__ = ["LOAD_CAVEAT", "compare", "medians", "peer_cost_table"]
