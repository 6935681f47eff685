"""Intervals and verdicts: the percentile bootstrap of a median, paired ratios against ``none``, and the rule that
decides whether a comparison may claim anything.

A comparison of mode A with ``none`` is made of **pairs**: repeat r of A next to repeat r of ``none`` in the same run
(the sweep runs the modes of one repeat back to back, so a pair shares the machine's conditions). Each pair gives a
ratio (A's figure ÷ ``none``'s); the comparison is the median of the pair ratios with a 95% percentile-bootstrap
interval over pairs (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13). With 5 pairs that
interval is the range of the 5 ratios (a resample's median is the smallest ratio with probability 5.8% > 2.5%), so a
verdict then needs all 5 on one side of "no change": a sign test at 2 × 0.5⁵ = 6.25%.

:func:`judge` is the one rule every verdict (report findings, TPOT overhead, cost saving, reuse) goes through.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvbench.analysis.engaged import offload_not_engaged
from kvbench.results.rows import agg

#: Bootstrap intervals need this many values (repeats of a point, or pairs of a comparison).
BOOTSTRAP_MIN_REPEATS = 5
#: A comparison needs at least this many pairs to carry a verdict.
MIN_PAIRS = 5
#: Columns that identify a pair within a point: the run (repeats of two runs are not paired) and the repeat.
PAIR_KEYS = ["run_path", "repeat"]


def median_ci(sorted_values: np.ndarray, positions: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile-bootstrap interval of the median for many samples of the same size at once.

    Args:
        sorted_values: ``[points, n]``, each row sorted ascending.
        positions: ``[n_boot, n]`` resampled positions (integers in [0, n)), shared by every row.
        level: coverage (0.95: the 2.5th and 97.5th percentiles of the resampled medians).

    Returns:
        (low, high), each ``[points]``: exactly ``np.quantile(medians, [α, 1 − α], axis=1)`` (linear
        interpolation) of the resampled medians ``np.median(sorted_values[:, positions], axis=2)``, computed
        without sorting any resample: as each row is non-decreasing, a resample's sorted values are the row at its
        sorted positions, so its median is the row at the middle sorted position(s); for odd n the medians of a
        row are then already ordered by that middle position, and no partition is needed either.
    """
    idx = np.sort(positions, axis=1)
    n_boot, n = idx.shape
    alpha = (1 - level) / 2
    if n % 2:
        mid = np.sort(idx[:, n // 2])  # the resamples ordered by their median's position = by their median
        out = []
        for q in (alpha, 1 - alpha):
            h = q * (n_boot - 1)
            i = int(np.floor(h))
            j = min(i + 1, n_boot - 1)
            below, above = sorted_values[:, mid[i]], sorted_values[:, mid[j]]
            out.append(below + (h - i) * (above - below))
        return out[0], out[1]
    medians = (sorted_values[:, idx[:, n // 2 - 1]] + sorted_values[:, idx[:, n // 2]]) / 2  # [points, n_boot]
    lo, hi = np.quantile(medians, [alpha, 1 - alpha], axis=1)
    return lo, hi


def bootstrap_intervals(values: pd.Series, pid: pd.Series, n_boot: int, seed: int) -> pd.DataFrame:
    """95% percentile-bootstrap intervals of the median of ``values`` per group id ``pid`` (non-negative integers)
    with at least :data:`BOOTSTRAP_MIN_REPEATS` values; ``n_boot`` resamples, deterministic for a ``seed``,
    vectorised over groups with the same number of values (they share one resampling of positions). Returns
    columns ``low``, ``high`` indexed by group id (``n_boot=0``: empty)."""
    out_ids: list[np.ndarray] = []
    out_lo: list[np.ndarray] = []
    out_hi: list[np.ndarray] = []
    if n_boot > 0:
        ok = values.notna().to_numpy()
        v, ids = values.to_numpy(dtype=float)[ok], pid.to_numpy()[ok].astype(np.int64)
        sizes = np.bincount(ids) if len(ids) else np.zeros(0, dtype=np.int64)
        keep = sizes[ids] >= BOOTSTRAP_MIN_REPEATS
        v, ids = v[keep], ids[keep]
        rng = np.random.default_rng(seed)
        order = np.argsort(ids, kind="stable")
        v, ids = v[order], ids[order]
        n_of = sizes[ids]
        for n in dict.fromkeys(n_of.tolist()):  # in first-seen order: the random draws stay the same
            sel = n_of == n
            matrix = np.sort(v[sel].reshape(-1, n), axis=1)  # one row per group, each row sorted
            group_ids = ids[sel][::n]
            positions = rng.integers(0, n, size=(n_boot, n))
            for start in range(0, len(matrix), 1024):
                lo, hi = median_ci(matrix[start:start + 1024], positions)
                out_ids.append(group_ids[start:start + 1024])
                out_lo.append(lo)
                out_hi.append(hi)
    if not out_ids:
        return pd.DataFrame({"low": [], "high": []}, dtype=float)
    return pd.DataFrame({"low": np.concatenate(out_lo), "high": np.concatenate(out_hi)},
                        index=np.concatenate(out_ids))


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


def cluster_median_interval(values: pd.Series, clusters: pd.Series, n_boot: int, seed: int,
                            level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``values`` resampling whole ``clusters``
    (:func:`cluster_draws`): each resample's median is that of the values of the drawn clusters, each as often as
    its cluster was drawn. NaN with fewer than :data:`BOOTSTRAP_MIN_REPEATS` values (NaN values left out)."""
    ok = values.notna().to_numpy()
    v, c = values.to_numpy(dtype=float)[ok], clusters.to_numpy()[ok]
    if len(v) < BOOTSTRAP_MIN_REPEATS or n_boot <= 0:
        return math.nan, math.nan
    counts, index = cluster_draws(pd.Series(c), n_boot, seed)
    order = np.argsort(v, kind="stable")
    weights = counts[:, index[order]]  # [n_boot, n]: how often each value (ascending) is in the resample
    cum = weights.cumsum(axis=1)
    total = cum[:, -1]
    lo_i = (cum > ((total - 1) // 2)[:, None]).argmax(axis=1)
    hi_i = (cum > (total // 2)[:, None]).argmax(axis=1)
    medians = (v[order][lo_i] + v[order][hi_i]) / 2
    alpha = (1 - level) / 2
    lo, hi = np.quantile(medians, [alpha, 1 - alpha])
    return float(lo), float(hi)


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


def paired_point_stats(measured: pd.DataFrame, pid: pd.Series, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per point of the offload modes: its pairs with ``none`` at the same group, prompt length and batch size.

    Args:
        measured: measured trial rows (``group``, ``prompt_tokens``, ``batch_size``, ``mode``, ``run_path``,
            ``repeat``, the :data:`PAIRED_METRICS`, ``machine_busy`` where recorded).
        pid: each row's point id (integers).

    Returns:
        Indexed by point id (points with at least one pair): ``pairs``, ``pairs_busy_trials``,
        ``pairs_load_unknown`` (see :func:`pair_load`) and, per metric m of :data:`PAIRED_METRICS`, ``m_ratio``
        (median over pairs of the mode's figure ÷ ``none``'s) with ``m_ratio_ci_low``/``m_ratio_ci_high`` (95%
        bootstrap interval over pairs, with ≥ :data:`BOOTSTRAP_MIN_REPEATS` pairs and ``n_boot`` > 0).
    """
    rows = measured.assign(_pid=pid)
    is_none = rows["mode"] == "none"
    pairs = pair_with_reference(rows[~is_none], rows[is_none], on=["group", "prompt_tokens", "batch_size"])
    if pairs.empty:
        return pd.DataFrame()
    ids = pairs["_pid"]
    load = pair_load(pairs)
    out = pd.DataFrame({"pairs": ids.value_counts()})
    out["pairs_busy_trials"] = load["busy_trials"].groupby(ids).sum()
    out["pairs_load_unknown"] = load["load_unknown"].groupby(ids).sum()
    for m in PAIRED_METRICS:
        if m not in pairs or f"{m}_ref" not in pairs:
            continue
        ratio = (pd.to_numeric(pairs[m], errors="coerce") / pd.to_numeric(pairs[f"{m}_ref"], errors="coerce"))
        ratio = ratio.replace([np.inf, -np.inf], np.nan)
        out[f"{m}_ratio"] = ratio.groupby(ids).median()
        ci = bootstrap_intervals(ratio, ids, n_boot, seed)
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
    - a trial of its pairs ran while the machine was busy (:mod:`kvbench.bench.telemetry.machine_load`): ``"inconclusive: the
      machine was busy during 7 of 10 trials"``; or its load is unknown (older runs, a window too short to tell);
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


__all__ = ["BOOTSTRAP_MIN_REPEATS", "MIN_PAIRS", "PAIRED_METRICS", "PAIR_KEYS", "add_comparisons",
           "bootstrap_intervals", "busy_flags", "cluster_draws", "cluster_median_interval", "judge", "load_known",
           "median_ci", "pair_load", "pair_with_reference", "paired_point_stats", "pct_interval"]
