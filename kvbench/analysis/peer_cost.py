"""The cost of peer tools' runs (:mod:`kvbench.results.peers`): per run its medians in kvbench's definitions, USD
per 1M generated tokens at the throughput the tool measured, and each later run against the first (the reference,
e.g. the same workload without a cache) with an interval.

The saving is taken on request time per generated token, S = Σ e2e ÷ Σ output tokens over the requests compared:
at one concurrency a server's cost per token is proportional to it, so 100 × (1 − S_run ÷ S_reference) is the
cost saving. Requests that both files hold (the same prompt text, or the same index where the tool keeps no
prompt) give a paired comparison: its 95% interval is the jackknife over independent units (a declared
shared-prefix workload's prefixes, else the pairs), as for kvbench's own runs, with the same need for 5 units.
Files whose requests cannot be matched give an unpaired one (each file's jackknife on its own; the line says
"unpaired"). A file of aggregates only, or runs at different concurrencies, give the ratio of the tools'
throughputs without an interval: inconclusive. The files carry no record of the machine's load, so no verdict is
given from them unless the user says the machine was quiet (``--assume-quiet``), and the verdict then names it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from kvbench.analysis.cost import WHAT_IF_TOKENS_PER_S, Prices
from kvbench.analysis.intervals import jackknife_interval, jackknife_variance, judge, unit_sums
from kvbench.errors import ResultsError
from kvbench.results.peers import LATENCIES, PeerRun
from kvbench.results.peers.common import HEAD_CHARS

#: What a verdict from peer files adds: kvbench cannot tell whether their machine was quiet; the user said it was.
LOAD_CAVEAT = "the machine assumed quiet (--assume-quiet): their files do not record its load"
#: Why a shared-prefix comparison of files that keep no prompts gives no verdict.
NO_PROMPTS = "inconclusive: the files keep no prompts, so the interval cannot be drawn by prefix"
#: Why peer files give no verdict unless the user says the machine was quiet.
NO_LOAD = "inconclusive: the files record no machine load (--assume-quiet if it was quiet)"


def medians(run: PeerRun) -> dict[str, Any]:
    """Per metric of :data:`~kvbench.results.peers.common.LATENCIES` ``<metric>_p50`` (seconds): over the run's
    successful requests (numpy's default ``linear`` method, as ``vllm bench serve`` computes its medians: between
    the two middle values of an even count; ITL over every gap) where it has them, else the tool's own median;
    ``median_source``: ``requests`` or ``file``."""
    out: dict[str, Any] = {}
    ok = run.requests[run.requests["ok"]] if run.per_request else run.requests
    for m in LATENCIES:
        if run.per_request:
            if m == "itl_s":
                values = [g for v in ok["itl_s"] if isinstance(v, list) for g in v]
            else:
                values = [float(v) for v in ok[m] if v is not None and v == v]
            out[f"{m}_p50"] = float(np.median(values)) if values else math.nan
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


def _spt(t: np.ndarray) -> np.ndarray:
    """log(Σ e2e ÷ Σ tokens) of the sums ``[..., (e2e, tokens)]``."""
    return np.log(t[..., 0] / t[..., 1])


def _unpaired_interval(a: pd.DataFrame, b: pd.DataFrame, chars: int | None) -> tuple[float, float, int | None]:
    """95% interval of log(S_b ÷ S_a) from two independent samples of requests: each side's delete-one-unit
    jackknife variance (a unit: a prefix, its prompts' first ``chars`` characters, where the files declare one and
    keep the prompts; else a request), summed, with a t of min(units a, units b) − 1 degrees of freedom.
    Returns ``(low, high, prefixes)``: NaN ends with fewer than 2 units a side; ``prefixes`` the fewer of the two
    sides' (None without)."""
    sides, counts = [], []
    for frame in (a, b):
        heads = frame["prompt_head"] if "prompt_head" in frame else pd.Series(dtype=object)
        by_prefix = chars is not None and len(heads) and heads.notna().all()
        labels = heads.str[:chars] if by_prefix else pd.Series(np.arange(len(frame)))
        sides.append(unit_sums(labels, [frame["e2e_s"].to_numpy(float), frame["n_output_tokens"].to_numpy(float)]))
        counts.append(int(labels.nunique()) if by_prefix else None)
    prefixes = min(counts) if None not in counts else None
    k = min(len(x) for x in sides)
    var = sum(jackknife_variance(sums, _spt) for sums in sides)
    if k < 2 or not math.isfinite(var):
        return math.nan, math.nan, prefixes
    est = float(_spt(sides[1].sum(axis=0)) - _spt(sides[0].sum(axis=0)))
    half = float(student_t.ppf(0.975, k - 1)) * math.sqrt(var)
    return est - half, est + half, prefixes


def prefix_chars(run: PeerRun) -> int | None:
    """How many leading characters of a prompt name its shared prefix, for a run whose file declares a
    shared-prefix workload (``shared_prefix_tokens``): at most :data:`~kvbench.results.peers.common.HEAD_CHARS`
    (one character per token at least); None for a workload of no declared prefix."""
    return min(HEAD_CHARS, run.shared_prefix_tokens) if run.shared_prefix_tokens else None


def compare(reference: PeerRun, run: PeerRun, assume_quiet: bool = False) -> dict[str, Any]:
    """``run`` against ``reference``: ``saving_pct`` (see the module docstring) with ``saving_ci_low`` and
    ``saving_ci_high`` (95%, NaN without requests), ``pairs`` (matched requests; unpaired: the smaller file's
    requests), ``comparison`` (how: ``paired by prompt text``, ``paired by request index``, ``unpaired``,
    ``throughputs only``: aggregates only, or a concurrency that differs or that a file does not say) and ``verdict``
    (why it is inconclusive, or ``""``: :func:`kvbench.analysis.intervals.judge`'s rule, as for kvbench's own
    runs). The interval is the jackknife over independent units
    (:func:`~kvbench.analysis.intervals.jackknife_interval`): for a file that declares a shared-prefix workload
    (:func:`prefix_chars`) requests are grouped by their prefix and the prefixes are the units (``prefixes``: how
    many, the fewer side's when unpaired; a verdict needs 5, as ``kvbench map``'s); otherwise each pair (unpaired:
    each request) is one. The files record no machine
    load, so without ``assume_quiet`` (the user's word that the machine was quiet) a comparison that would decide
    is "inconclusive: the files record no machine load"; ``assumed_quiet`` says which applied. ``ttft_ratio``: Σ
    TTFT of ``run``'s paired requests ÷ Σ of ``reference``'s, as kvbench's own map takes it (NaN unpaired)."""
    out: dict[str, Any] = {"saving_pct": math.nan, "saving_ci_low": math.nan, "saving_ci_high": math.nan,
                           "pairs": 0, "prefixes": None, "assumed_quiet": assume_quiet, "ttft_ratio": math.nan}
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
    paired = reference.pairing == run.pairing and reference.pairing in ("prompt text", "request index")
    pairs = (a[a["key"].notna()].merge(b[b["key"].notna()], on=["key", "occurrence"], suffixes=("_a", "_b"))
             if paired else pd.DataFrame())
    units = None
    if len(pairs):
        ea, ta = pairs["e2e_s_a"].to_numpy(float), pairs["n_output_tokens_a"].to_numpy(float)
        eb, tb = pairs["e2e_s_b"].to_numpy(float), pairs["n_output_tokens_b"].to_numpy(float)
        heads = pairs["prompt_head_a"] if "prompt_head_a" in pairs else pd.Series(dtype=object)
        chars = prefix_chars(run) or prefix_chars(reference)
        if chars is not None and len(heads) and heads.notna().all():
            labels = heads.str[:chars]
            out["prefixes"] = int(labels.nunique())
            units = (out["prefixes"], "prefixes")
        else:
            labels = pd.Series(np.arange(len(pairs)))
        sums = unit_sums(labels, [eb, tb, ea, ta])
        _, lo, hi = jackknife_interval(sums, lambda t: _spt(t[..., :2]) - _spt(t[..., 2:]))
        n, how = len(pairs), f"paired by {reference.pairing}"
        ttft = pd.to_numeric(pairs["ttft_s_b"], errors="coerce"), pd.to_numeric(pairs["ttft_s_a"], errors="coerce")
        both = ttft[0].notna() & ttft[1].notna()
        if both.any() and ttft[1][both].sum() > 0:
            out["ttft_ratio"] = float(ttft[0][both].sum() / ttft[1][both].sum())
    else:
        ea, ta = a["e2e_s"].to_numpy(float), a["n_output_tokens"].to_numpy(float)
        eb, tb = b["e2e_s"].to_numpy(float), b["n_output_tokens"].to_numpy(float)
        if not len(ea) or not len(eb):
            return dict(out, comparison="unpaired", verdict="inconclusive: no successful requests")
        lo, hi, out["prefixes"] = _unpaired_interval(a, b, prefix_chars(run) or prefix_chars(reference))
        units = (out["prefixes"], "prefixes") if out["prefixes"] is not None else None
        n, how = min(len(ea), len(eb)), "unpaired"
    point = 100 * (1 - _seconds_per_token(eb, tb) / _seconds_per_token(ea, ta))
    low, high = 100 * (1 - math.exp(hi)) if hi == hi else math.nan, 100 * (1 - math.exp(lo)) if lo == lo else math.nan
    declared = [r.prefixes for r in (reference, run) if r.shared_prefix_tokens and r.prefixes]
    no_prompts = units is None and bool(declared)  # a prefix workload whose prompts the files do not keep
    if no_prompts:
        units = (min(declared), "prefixes")
    counted = judge(n, 0, 0, 1.0, 1.0, no_change=0.0, units=units)  # too few pairs or units, or ""
    verdict = (counted or (NO_PROMPTS if no_prompts else "") or ("" if assume_quiet else NO_LOAD)
               or judge(n, 0, 0, low, high, no_change=0.0, units=units))
    return dict(out, saving_pct=point, saving_ci_low=low, saving_ci_high=high, pairs=n, comparison=how,
                verdict=verdict)


def peer_cost_table(runs: list[PeerRun], prices: Prices, assume_quiet: bool = False) -> pd.DataFrame:
    """One row per run: ``label``, ``tool``, ``tool_version``, ``requests`` (successful; NaN for aggregates only),
    ``cached_token_share`` (Σ cached ÷ Σ prompt tokens of the requests whose cached tokens the file holds; NaN
    without),
    ``failed``, ``concurrency``, :func:`medians`, ``output_tokens_per_s`` (the tool's), ``usd_per_million`` (at
    ``prices.gpu_per_hour``, no memory charged: a peer file says nothing of it), and for every run after the
    first, :func:`compare` against the first (``reference`` True on the first; ``assume_quiet``: the user's word
    that the machine was quiet, see :func:`compare`).

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
            rec.update(compare(runs[0], run, assume_quiet))
        rows.append(rec)
    return pd.DataFrame(rows)


__all__ = ["LOAD_CAVEAT", "NO_LOAD", "NO_PROMPTS", "compare", "medians", "peer_cost_table", "prefix_chars"]
