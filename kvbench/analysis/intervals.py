"""Intervals and verdicts: the interval of a median, the jackknife over independent units, paired ratios against
``none``, and the rule that decides whether a comparison may claim anything.

A comparison of mode A with ``none`` is made of **pairs**: repeat r of A next to repeat r of ``none`` in the same run
(the sweep runs the modes of one repeat back to back, so a pair shares the machine's conditions). Each pair gives a
ratio (A's figure ÷ ``none``'s); the comparison is the median of the pair ratios with the interpolated
order-statistic interval of a median (:func:`median_interval`: distribution-free, 93–96% measured for 5 to 30
pairs). With 5 pairs that interval is the range of the 5 ratios, which covers the median with probability
1 − 2 × 0.5⁵ = 93.75% (no interval from 5 values covers more), so a verdict then needs all 5 on one side of "no
change". Comparisons whose pairs come from a few independent units (the visits of a shared prefix, the turns of a
conversation) use :func:`jackknife_interval` over units instead. Every interval's coverage is measured by
simulation in ``tests/analysis/test_coverage.py``; a busy pair never sets a figure (:func:`quiet_pairs`).

:func:`judge` is the one rule every verdict (report findings, TPOT overhead, cost saving, reuse) goes through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from kvbench.analysis.engaged import offload_not_engaged
from kvbench.results.rows import agg

#: Intervals need this many values (repeats of a point, or pairs of a comparison).
MIN_INTERVAL_VALUES = 5
#: A comparison needs at least this many pairs to carry a verdict.
MIN_PAIRS = 5
#: Columns that identify a pair within a point: the run (repeats of two runs are not paired) and the repeat.
PAIR_KEYS = ["run_path", "repeat"]


def order_statistic_rank(n: int, level: float = 0.95) -> tuple[int, float]:
    """The order statistics of the median's interval from ``n`` values: ``(k, λ)``, the interval running from the
    k-th smallest value (1-based) moved a share λ of the way to the (k+1)-th, to the k-th largest moved as far
    toward the (k+1)-th largest (Hettmansperger & Sheather, "Confidence intervals based on interpolated order
    statistics", *Statistics & Probability Letters* 4, 1986, pp. 75–79). [X(k), X(n−k+1)] covers the median with
    probability γ_k = 1 − 2·P(B ≤ k − 1), B ~ Binomial(n, ½), whatever the distribution; k is the largest with
    γ_k ≥ ``level``, and λ interpolates between γ_k and γ_(k+1) to reach ``level``. Where even the smallest and
    largest value fall short (n ≤ 5 at 95%: γ_1 = 1 − 2⁻⁽ⁿ⁻¹⁾, 93.75% at n = 5), ``(1, 0.0)``: the range, which
    covers γ_1.

    Raises:
        ValueError: ``n`` < 2."""
    if n < 2:
        raise ValueError(f"an interval of the median needs 2 values or more, not {n}")
    cdf = np.cumsum([math.comb(n, i) for i in range(n + 1)]) / 2.0 ** n

    def gamma(k: int) -> float:
        return 1 - 2 * float(cdf[k - 1])

    k = 1
    while 2 * (k + 1) <= n and gamma(k + 1) >= level:
        k += 1
    if gamma(k) < level or 2 * k + 1 > n:
        return k, 0.0
    share = (gamma(k) - level) / (gamma(k) - gamma(k + 1))
    return k, (n - k) * share / (k + (n - 2 * k) * share)


def median_interval(sorted_values: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The interpolated order-statistic interval of the median (:func:`order_statistic_rank`) of many samples of
    the same size at once.

    Args:
        sorted_values: ``[points, n]``, each row sorted ascending, n ≥ 2.
        level: coverage (0.95).

    Returns:
        (low, high), each ``[points]``. Measured coverage (``tests/analysis/test_coverage.py``: 4,000 simulated
        samples per size, lognormal and t(3) noise): 93–96% for 5 to 30 values, where a percentile bootstrap of
        the median covered 88.5% at 7 and 92.4% at 15.
    """
    n = sorted_values.shape[1]
    k, lam = order_statistic_rank(n, level)
    if lam == 0.0:
        return sorted_values[:, k - 1], sorted_values[:, n - k]
    low = (1 - lam) * sorted_values[:, k - 1] + lam * sorted_values[:, k]
    high = (1 - lam) * sorted_values[:, n - k] + lam * sorted_values[:, n - k - 1]
    return low, high


def median_intervals(values: pd.Series, pid: pd.Series, level: float = 0.95) -> pd.DataFrame:
    """95% intervals of the median of ``values`` per group id ``pid`` (non-negative integers) with at least
    :data:`MIN_INTERVAL_VALUES` values (:func:`median_interval`), vectorised over groups with the same number of
    values. Returns columns ``low``, ``high`` indexed by group id."""
    ok = values.notna().to_numpy()
    v, ids = values.to_numpy(dtype=float)[ok], pid.to_numpy()[ok].astype(np.int64)
    sizes = np.bincount(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    keep = sizes[ids] >= MIN_INTERVAL_VALUES
    v, ids = v[keep], ids[keep]
    order = np.argsort(ids, kind="stable")
    v, ids = v[order], ids[order]
    n_of = sizes[ids]
    out_ids, out_lo, out_hi = [], [], []
    for n in dict.fromkeys(n_of.tolist()):
        sel = n_of == n
        lo, hi = median_interval(np.sort(v[sel].reshape(-1, n), axis=1), level)
        out_ids.append(ids[sel][::n])
        out_lo.append(lo)
        out_hi.append(hi)
    if not out_ids:
        return pd.DataFrame({"low": [], "high": []}, dtype=float)
    return pd.DataFrame({"low": np.concatenate(out_lo), "high": np.concatenate(out_hi)},
                        index=np.concatenate(out_ids))


def unit_sums(units: pd.Series, columns: Sequence[pd.Series | np.ndarray]) -> np.ndarray:
    """``[K, m]``: per independent unit (``units``: one label per value; K units in first-seen order) the sums of
    each of the m ``columns`` (aligned with ``units``)."""
    index = pd.factorize(units, sort=False)[0]
    k = int(index.max()) + 1 if len(index) else 0
    return np.stack([np.bincount(index, weights=np.asarray(c, dtype=float), minlength=k) for c in columns], axis=1)


def jackknife_interval(sums: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray],
                       level: float = 0.95) -> tuple[float, float, float]:
    """A statistic of per-unit sums with its delete-one-unit jackknife t interval (Efron & Tibshirani, *An
    Introduction to the Bootstrap*, 1993, ch. 11; Davison & Hinkley 1997, §3.8 for clustered data): units (the
    visits of one prefix, the turns of one conversation, a concurrent load) are the independent observations.

    Args:
        sums: ``[K, m]`` per-unit sums (:func:`unit_sums`).
        statistic: maps totals ``[..., m]`` to values ``[...]`` (e.g. a log ratio of two sums).
        level: coverage (0.95).

    Returns:
        ``(estimate, low, high)``: the statistic of all units, ± t(K − 1) × the jackknife standard error
        √((K − 1)/K · Σ (θ₍ᵢ₎ − θ̄)²) of the K leave-one-unit-out values; NaN ends with fewer than 2 units or a
        non-finite value. Measured coverage (``tests/analysis/test_coverage.py``, 5 units × 3 visits, lognormal
        and heavy-tailed noise): 94–96%, where the percentile cluster bootstrap covered about 80–84%.
    """
    estimate = float(statistic(sums.sum(axis=0)))
    var = jackknife_variance(sums, statistic)
    if not (math.isfinite(var) and math.isfinite(estimate)):
        return estimate, math.nan, math.nan
    half = float(student_t.ppf(0.5 + level / 2, len(sums) - 1)) * math.sqrt(var)
    return estimate, estimate - half, estimate + half


def jackknife_variance(sums: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray]) -> float:
    """The delete-one-unit jackknife variance (K − 1)/K · Σ (θ₍ᵢ₎ − θ̄)² of ``statistic`` over the K rows of
    ``sums`` (``[K, m]`` per-unit sums, :func:`unit_sums`): NaN with fewer than 2 units or a non-finite
    leave-one-out value. :func:`jackknife_interval` is its interval; two independent samples add theirs."""
    k = len(sums)
    if k < 2:
        return math.nan
    leave_out = statistic(sums.sum(axis=0)[None, :] - sums)
    if not np.all(np.isfinite(leave_out)):
        return math.nan
    return (k - 1) / k * float(((leave_out - leave_out.mean()) ** 2).sum())


def ratio_interval(numerator: pd.Series, denominator: pd.Series, units: pd.Series,
                   level: float = 0.95) -> tuple[float, float, float]:
    """The ratio of two sums over pairs, Σ ``numerator`` ÷ Σ ``denominator`` (e.g. restore ÷ recompute TTFT of
    request pairs: the workload's TTFT ratio, each request weighted by its own seconds), with its
    :func:`jackknife_interval` over independent ``units`` on the log scale: ``(ratio, low, high)``; NaN ends with
    fewer than :data:`MIN_INTERVAL_VALUES` pairs or 2 units. Pairs without two positive numbers are left out
    (NaN throughout when none is left)."""
    num, den = (pd.to_numeric(x, errors="coerce").to_numpy(dtype=float) for x in (numerator, denominator))
    ok = np.isfinite(num) & np.isfinite(den) & (num > 0) & (den > 0)
    if not ok.any():
        return math.nan, math.nan, math.nan
    sums = unit_sums(pd.Series(units.to_numpy()[ok]), [num[ok], den[ok]])
    est, lo, hi = jackknife_interval(sums, lambda t: np.log(t[..., 0] / t[..., 1]), level)
    if ok.sum() < MIN_INTERVAL_VALUES:
        lo = hi = math.nan
    return math.exp(est), math.exp(lo) if lo == lo else math.nan, math.exp(hi) if hi == hi else math.nan


def quiet_pairs(load: pd.DataFrame, groups: pd.Series | None = None) -> tuple[pd.Series, pd.Series]:
    """Which pairs (rows of :func:`pair_load`) may set a figure, and which may set an interval: a busy pair (one of
    its trials ran on a busy machine) is counted (``busy_trials``) and makes its comparison "inconclusive: busy",
    but never sets a median or an interval's end. Per comparison (``groups``: one id per pair; None: all pairs
    are one), the figure comes from its quiet pairs; where every pair is busy, from the busy ones, with no
    interval. Returns ``(figure, interval)``, boolean masks over the pairs."""
    quiet = load["busy_trials"].eq(0)
    groups = pd.Series(0, index=load.index) if groups is None else groups
    any_quiet = quiet.groupby(groups).transform("any")
    return quiet | ~any_quiet, quiet


def cluster_draws(clusters: pd.Series, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A cluster bootstrap's resamples (Davison & Hinkley, *Bootstrap Methods and their Application*, 1997, §3.8):
    turns of one conversation are not independent, so a resample draws whole clusters (``clusters``: one label
    per value, e.g. the conversation) with replacement, as many as there are. Returns ``(counts, index)``:
    ``counts`` ``[n_boot, K]`` how many times each of the K clusters was drawn, ``index`` ``[n]`` each value's
    cluster (0..K−1, in first-seen order). With one value per cluster the draws are those of a plain bootstrap
    over the values (``rng.integers(0, n, (n_boot, n))``)."""
    index = pd.factorize(clusters, sort=False)[0]
    k = int(index.max()) + 1 if len(index) else 0
    pos = np.random.default_rng(seed).integers(0, k, size=(n_boot, k))
    counts = np.zeros((n_boot, k), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(n_boot), k), pos.ravel()), 1)
    return counts, index


def pair_with_reference(trials: pd.DataFrame, reference: pd.DataFrame, on: Sequence[str]) -> pd.DataFrame:
    """Each row of ``trials`` next to the ``reference`` trial with the same ``on`` columns and the same
    :data:`PAIR_KEYS` (run and repeat); the reference's columns get the suffix ``_ref``. Rows without a reference
    are dropped; ``trials``' index is kept (column ``row``)."""
    keys = list(on) + PAIR_KEYS
    if any(k not in trials or k not in reference for k in keys):  # rows that cannot be paired (no repeat index)
        return trials.iloc[:0].reset_index(names="row")
    # a null key (a row without a repeat index, pooled with newer rows) pairs with nothing: pandas would match
    # null with null
    trials, reference = trials[trials[keys].notna().all(axis=1)], reference[reference[keys].notna().all(axis=1)]
    ref = reference.drop_duplicates(keys)
    return trials.reset_index(names="row").merge(ref, on=keys, how="inner", suffixes=("", "_ref"))


def pair_load(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per pair (rows of :func:`pair_with_reference` with the trials' ``machine_busy``): ``busy_trials`` (0–2
    trials of the pair measured while the machine was busy) and ``load_unknown`` (0–2 trials whose load was not
    recorded: rows of a kvbench before it recorded load)."""
    def col(name: str) -> pd.Series:
        return pairs[name] if name in pairs else pd.Series(None, index=pairs.index, dtype=object)

    a, b = col("machine_busy"), col("machine_busy_ref")
    busy = busy_flags(a).astype(int) + busy_flags(b).astype(int)
    unknown = (~load_known(a)).astype(int) + (~load_known(b)).astype(int)
    return pd.DataFrame({"busy_trials": busy, "load_unknown": unknown}, index=pairs.index)


def load_known(machine_busy: pd.Series) -> pd.Series:
    """Per trial, whether its ``machine_busy`` says anything: a real boolean (True or False). None, NaN, a string or
    a number (a hand-edited or foreign row) is unknown, never a quiet machine."""
    return machine_busy.map(lambda v: isinstance(v, (bool, np.bool_)))


def busy_flags(machine_busy: pd.Series) -> pd.Series:
    """Per trial, whether it was measured on a busy machine: ``machine_busy`` is the boolean True."""
    return machine_busy.map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v))


#: Trial columns compared in pairs against ``none`` by :func:`paired_point_stats`.
PAIRED_METRICS = ("tpot_s", "throughput_tokens_per_s", "ttft_s")


def paired_point_stats(measured: pd.DataFrame, pid: pd.Series) -> pd.DataFrame:
    """Per point of the offload modes: its pairs with ``none`` at the same group, prompt length and batch size.

    Args:
        measured: measured trial rows (``group``, ``prompt_tokens``, ``batch_size``, ``mode``, ``run_path``,
            ``repeat``, the :data:`PAIRED_METRICS`, ``machine_busy`` where recorded).
        pid: each row's point id (integers).

    Returns:
        Indexed by point id (points with at least one pair): ``pairs``, ``pairs_busy_trials``,
        ``pairs_load_unknown`` (see :func:`pair_load`), ``pairs_figure`` (the pairs the figures come from: the
        quiet ones, or all where none is quiet) and, per metric m of :data:`PAIRED_METRICS`, ``m_ratio``
        (median over the quiet pairs of the mode's figure ÷ ``none``'s: :func:`quiet_pairs`) with
        ``m_ratio_ci_low``/``m_ratio_ci_high`` (:func:`median_intervals` over the quiet pairs, with ≥
        :data:`MIN_INTERVAL_VALUES` of them).
    """
    rows = measured.assign(_pid=pid)
    is_none = rows["mode"] == "none"
    pairs = pair_with_reference(rows[~is_none], rows[is_none], on=["group", "prompt_tokens", "batch_size"])
    if pairs.empty:
        return pd.DataFrame()
    ids = pairs["_pid"]
    load = pair_load(pairs)
    figure, interval = quiet_pairs(load, ids)
    out = pd.DataFrame({"pairs": ids.value_counts()})
    out["pairs_busy_trials"] = load["busy_trials"].groupby(ids).sum()
    out["pairs_load_unknown"] = load["load_unknown"].groupby(ids).sum()
    out["pairs_figure"] = figure.groupby(ids).sum()
    for m in PAIRED_METRICS:
        if m not in pairs or f"{m}_ref" not in pairs:
            continue
        ratio = (pd.to_numeric(pairs[m], errors="coerce") / pd.to_numeric(pairs[f"{m}_ref"], errors="coerce"))
        ratio = ratio.replace([np.inf, -np.inf], np.nan)
        out[f"{m}_ratio"] = ratio[figure].groupby(ids[figure]).median()
        ci = median_intervals(ratio[interval], ids[interval])
        out[agg(f"{m}_ratio", "ci_low")] = ci["low"]
        out[agg(f"{m}_ratio", "ci_high")] = ci["high"]
    return out


def judge(pairs: int, busy_trials: int, load_unknown: int, low: float, high: float, no_change: float = 1.0,
          implausible: bool = False, units: tuple[int, str] | None = None) -> str:
    """Whether a paired comparison may carry a verdict: ``""`` when it may, else why not, the first that applies:

    - fewer than :data:`MIN_PAIRS` pairs: ``"inconclusive: 2 pairs, need 5"``;
    - ``units`` (how many independent units the pairs come from, and their name: conversations, documents,
      concurrent loads) fewer than :data:`MIN_PAIRS`: ``"inconclusive: 3 conversations, need 5"`` (pairs drawn
      from 3 conversations are 3 observations, not 12);
    - a trial of its pairs ran while the machine was busy (:mod:`kvbench.bench.telemetry.machine_load`):
      ``"inconclusive: the machine was busy during 7 of 10 trials"``; or its load is unknown (older runs, a window too
      short to tell);
    - no interval (not computed): ``"inconclusive: no interval"``;
    - the interval ``[low, high]`` contains ``no_change`` (1 for a ratio, 0 for a percentage):
      ``"inconclusive: the interval includes no change"``;
    - ``implausible`` (the caller's check against the plan, e.g. an offload mode faster than ``none`` at the same
      batch beyond its interval): ``"implausible against the plan: check for noise"``.
    """
    trials = 2 * pairs
    if pairs < MIN_PAIRS:
        return f"inconclusive: {pairs} pair{'s' if pairs != 1 else ''}, need {MIN_PAIRS}"
    if units is not None and units[0] < MIN_PAIRS:
        name = units[1] if units[0] != 1 else (units[1].removesuffix("es") if units[1].endswith("xes")
                                                else units[1].removesuffix("s"))
        return f"inconclusive: {units[0]} {name}, need {MIN_PAIRS}"
    if busy_trials:
        return f"inconclusive: the machine was busy during {busy_trials} of {trials} trials"
    if load_unknown:
        return (f"inconclusive: the machine's load is unknown for {load_unknown} of {trials} trials (not recorded, "
                "or a window too short to tell)")
    if not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive: no interval"
    if low <= no_change <= high:
        return "inconclusive: the interval includes no change"
    if implausible:
        return "implausible against the plan: check for noise"
    return ""


def add_comparisons(table: pd.DataFrame) -> None:
    """The paired comparisons of a point table (:func:`kvbench.analysis.points.point_table`, with the columns of
    :func:`paired_point_stats` joined) as percentages and ratios, and their verdicts (in place):
    ``time_overhead_pct`` = 100 × (paired TPOT ratio − 1) with ``time_overhead_ci_low``/``_high``;
    ``throughput_ratio`` (paired) with its ``_ci_low``/``_high``; ``ttft_ratio``; ``tpot_verdict`` (see
    :func:`judge`; an offload mode faster than ``none`` at the same batch beyond its interval is implausible: the
    decode-step roofline puts it at or above ``none``; a mode that held no KV off the device is "not engaged":
    :func:`~kvbench.analysis.engaged.offload_not_engaged`); None for ``none`` itself."""
    for c in ("tpot_s_ratio", "tpot_s_ratio_ci_low", "tpot_s_ratio_ci_high", "throughput_tokens_per_s_ratio",
              "throughput_tokens_per_s_ratio_ci_low", "throughput_tokens_per_s_ratio_ci_high", "ttft_s_ratio"):
        if c not in table:
            table[c] = np.nan
    table["time_overhead_pct"] = 100 * (table["tpot_s_ratio"] - 1)
    table["time_overhead_ci_low"] = 100 * (table["tpot_s_ratio_ci_low"] - 1)
    table["time_overhead_ci_high"] = 100 * (table["tpot_s_ratio_ci_high"] - 1)
    table["throughput_ratio"] = table["throughput_tokens_per_s_ratio"]
    table["throughput_ratio_ci_low"] = table["throughput_tokens_per_s_ratio_ci_low"]
    table["throughput_ratio_ci_high"] = table["throughput_tokens_per_s_ratio_ci_high"]
    table["ttft_ratio"] = table["ttft_s_ratio"]
    verdicts = []
    held = [c for c in ("kv_host_peak_bytes_median", "kv_disk_peak_bytes_median") if c in table]
    for r in table[["mode", "pairs", "pairs_busy_trials", "pairs_load_unknown", "tpot_s_ratio_ci_low",
                    "tpot_s_ratio_ci_high", *held]].to_dict("records"):
        if r["mode"] == "none":
            verdicts.append(None)
            continue
        lo, hi = float(r["tpot_s_ratio_ci_low"]), float(r["tpot_s_ratio_ci_high"])
        verdicts.append(offload_not_engaged(r) or judge(int(r["pairs"]), int(r["pairs_busy_trials"]),
                                                        int(r["pairs_load_unknown"]), lo, hi, implausible=hi < 1))
    table["tpot_verdict"] = verdicts


def pct_interval(median: float, low: float, high: float, digits: int = 0) -> str:
    """A signed percentage with its interval, e.g. ``+12% [−3%, +25%]``; ``n/a`` without a median; the median alone
    when there is no interval (fewer than 5 values). A value that rounds to zero prints as ``+0%``."""
    def one(v: float) -> str:
        text = f"{v:+.{digits}f}"
        if float(text) == 0:  # no "−0%" for a value that rounds to zero
            text = f"{0:+.{digits}f}"
        return text.replace("-", "−") + "%"

    if median is None or median != median:
        return "n/a"
    if low is None or high is None or low != low or high != high:
        return one(median)
    return f"{one(median)} [{one(low)}, {one(high)}]"


__all__ = ["MIN_INTERVAL_VALUES", "MIN_PAIRS", "PAIRED_METRICS", "PAIR_KEYS", "add_comparisons", "busy_flags",
           "cluster_draws", "jackknife_interval", "jackknife_variance", "judge", "load_known", "median_interval",
           "median_intervals",
           "order_statistic_rank", "pair_load", "pair_with_reference", "paired_point_stats", "pct_interval",
           "quiet_pairs", "ratio_interval", "unit_sums"]
