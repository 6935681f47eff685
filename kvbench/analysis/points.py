"""The per-point table of ``kvbench report``: per point the median, min–max and a 95% interval of the median of each
latency; the article's memory saving % and time overhead % against ``none`` at the same point. Pure functions over
the trials frame (:func:`kvbench.results.load.load_results`, :func:`kvbench.results.frame.trials_frame`).

A *point* is (group, prompt length, batch size, mode label); the group is the scenario's, as the loader pools runs
(:mod:`kvbench.results.load`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvbench.analysis.intervals import (MIN_INTERVAL_VALUES, add_comparisons, busy_flags, median_intervals,
                                        paired_point_stats)
from kvbench.analysis.latency import ITL_PERCENTILES
from kvbench.results.frame import numeric
from kvbench.results.rows import MEASURED, Status, agg

#: Latency/throughput columns summarised with median, min, max and a 95% interval of the median.
SPREAD_METRICS = ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s", "kl_mean", "token_agreement")
#: Memory/traffic columns summarised by their median.
MEDIAN_METRICS = ("decode_tokens_per_s", "kv_device_peak_bytes", "kv_host_peak_bytes", "kv_disk_peak_bytes",
                  "peak_device_allocated_bytes", "nvml_process_peak_bytes", "rss_peak_bytes", "kv_bytes_predicted",
                  "bytes_moved_per_token", "h2d_bytes_per_s", "h2d_bytes_per_step", "plan_kv_device_bytes",
                  "plan_link_bytes_per_step", "plan_tpot_s", "kl_max", "agreement_to_divergence", "h2d_logical_bytes",
                  "h2d_bytes")
POINT_KEYS = ["group", "prompt_tokens", "batch_size", "mode_label"]
#: A trial whose KV accounting differs from the analytic prediction by more than this fraction is flagged.
KV_CHECK_TOLERANCE = 0.25


def qualifies(table: pd.DataFrame) -> pd.Series:
    """Per point of :func:`point_table`: every trial ended ``ok`` (ran to the end within the budget), every measured
    trial's greedy ids were compared with ``none``'s and equal them (``tokens_match`` True: a point never compared
    does not qualify) or, for a lossy mode, its quality meets the scenario's thresholds (``quality_ok`` True), and
    it was measured as many times as its scenario's ``repeats`` (a capacity probe, run once, is not a cost point):
    the condition for recommending a mode or costing it."""
    planned = table["repeats_planned"] if "repeats_planned" in table else pd.Series(np.nan, index=table.index)
    quality = table["quality_ok"] if "quality_ok" in table else pd.Series(None, index=table.index, dtype=object)
    # a lossy mode stands or falls by its quality (its ids may differ by design); any other by its ids
    outputs = quality.map(lambda v: v is True) | (quality.isna() & table["tokens_match"].map(lambda v: v is True))
    return ((table["n_ok"] == table["trials"]) & outputs & (planned.isna() | (table["n_ok"] >= planned)))


def quality_crossed(kl: float, agreement: float, max_kl: float, min_agreement: float, bound: bool = False
                    ) -> list[str]:
    """The quality thresholds a lossy mode's median ``kl`` (nats) and ``agreement`` (the share of steps before the
    first differing id, 0 to 1) cross, as text (``"KL 0.0038 nats > max_kl 0.001"``); a threshold or figure that
    is NaN or None is not checked. ``bound``: ``kl`` is a server's lower bound from its top-k log-probabilities,
    and ``max_kl`` is the run's ``max_server_kl`` (the text says so: ``"KL ≥ 0.0038 nats > max_server_kl
    0.001"``)."""
    crossed = []
    if pd.notna(max_kl) and pd.notna(kl) and kl > max_kl:
        crossed.append(f"KL ≥ {kl:.3g} nats > max_server_kl {max_kl:g}" if bound else
                       f"KL {kl:.3g} nats > max_kl {max_kl:g}")
    if pd.notna(min_agreement) and pd.notna(agreement) and agreement < min_agreement:
        crossed.append(f"{agreement:.1%} of steps before the first differing id < min_agreement {min_agreement:.1%}")
    return crossed


def agreement_text(agreement: float, first_step: float) -> str:
    """Where a lossy mode's greedy ids first leave ``none``'s, in words: ``"ids as none's up to step 5 (31% of
    steps before the first differing id)"``, or ``"ids as none's at every step"`` (``first_step`` NaN, 0-based;
    ``agreement`` 0 to 1)."""
    if pd.isna(first_step) and (pd.isna(agreement) or agreement >= 1):
        return "ids as none's at every step"
    step = "" if pd.isna(first_step) else f"first differing id at step {int(first_step)}, "
    return f"{step}{agreement:.0%} of steps before the first differing id"


def quality_check(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per point: (``quality_ok``: None for a lossless mode (no quality columns), else whether the medians of
    ``kl_mean`` and ``agreement_to_divergence`` are within the run's thresholds (a threshold not set passes):
    ``max_kl`` for the in-process engine's KL, ``max_server_kl`` for a server's lower bound (``kl_bound``), and
    ``min_agreement``; ``quality``: the figures as text, with "fails quality" and the threshold crossed where one
    is)."""
    ok, text = [], []
    for _, r in table.iterrows():
        kl, agree = r.get(agg("kl_mean", "median")), r.get(agg("agreement_to_divergence", "median"))
        if kl is None or pd.isna(kl):
            ok.append(None)
            text.append("")
            continue
        bound = r.get("kl_bound") in (True,)
        crossed = quality_crossed(kl, agree, r.get("max_server_kl" if bound else "max_kl"), r.get("min_agreement"),
                                  bound)
        ok.append(not crossed)
        sign = "≥ " if bound else ""
        interval = (f" [{r[agg('kl_mean', 'ci_low')]:.3g}, {r[agg('kl_mean', 'ci_high')]:.3g}]"
                    if pd.notna(r.get(agg("kl_mean", "ci_low"))) else "")
        figures = f"KL {sign}{kl:.3g} nats{interval}, {agreement_text(agree, r.get('first_divergence_step'))}"
        text.append(f"fails quality: {'; '.join(crossed)} ({figures})" if crossed else figures)
    return pd.Series(ok, index=table.index, dtype=object), pd.Series(text, index=table.index, dtype=object)


def _itl_pooled(measured: pd.DataFrame, mpid: pd.Series) -> pd.DataFrame:
    """Per point: the p50/p90/p99 and max of every inter-token gap of its measured trials, pooled (seconds; the
    value at 0-based rank ⌈(n − 1)·p⌉ of the sorted gaps, as the trial rows' ``itl_p*_s``), and ``itl_n``, how
    many gaps they are (at most 100 make p99 the maximum)."""
    cols = [f"itl_p{p}_s" for p in ITL_PERCENTILES] + ["itl_max_s", "itl_n"]
    if "itl_s" not in measured or measured.empty:
        return pd.DataFrame(columns=cols, dtype=float)
    gaps = measured["itl_s"].map(lambda v: v if isinstance(v, list) else []).explode()
    gaps = pd.to_numeric(gaps, errors="coerce").dropna()
    by = gaps.groupby(mpid.reindex(gaps.index))
    out = by.quantile([p / 100 for p in ITL_PERCENTILES], interpolation="higher").unstack()
    out.columns = cols[:-2]
    out["itl_max_s"] = by.max()
    out["itl_n"] = by.size()
    return out


def point_table(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per point (group × prompt length × batch size × mode), in the order points first appear.

    Columns: the keys; ``mode`` (kind); ``trials``, ``measured`` (ok + over budget) and one count per status
    (``n_ok``, ``n_over_budget``, ``n_skipped``, ``n_error``, ``n_oom``, ``n_other`` for unknown ones: the
    :class:`~kvbench.results.rows.Status` order); ``status`` (``ok``, or the first other status) and its
    ``message``; ``tokens_match`` (False if any measured trial's ids differed from ``none``, None when never
    compared) and ``first_divergence_step``; for each of :data:`SPREAD_METRICS` its ``_median``/``_min``/``_max``
    over measured trials and ``_ci_low``/``_ci_high`` (95% interval of the median, with ≥ 5 measured repeats:
    :func:`~kvbench.analysis.intervals.median_interval`; names by :func:`kvbench.results.rows.agg`); the medians
    of :data:`MEDIAN_METRICS`; ``kv_check_flagged``
    (trials whose KV accounting is off the prediction by more than 25%) and ``kv_check_worst`` (that relative error);
    ``budget_bytes``; and against ``none`` at the same group, prompt length and batch size:
    ``memory_saving_pct`` = 100 × (1 − device KV peak / none's), ``measured_saving_pct`` (the same with the
    allocator's peak, CUDA only), ``time_overhead_pct`` = 100 × (TPOT / none's − 1), ``throughput_ratio`` =
    tokens/s ÷ none's — NaN where ``none`` has no measured trial there; measured ÷ ``kvbench plan``'s prediction
    (trial fields ``plan_*``): ``kv_device_vs_plan`` (device KV peak), ``link_vs_plan`` (host→device bytes per
    decode step, ``h2d_bytes_per_step``) and ``tpot_vs_plan`` (TPOT vs the roofline's step time) — NaN where the
    trials carry no prediction (older runs, modes plan does not model, bandwidths not measured).
    Reuse trials (:mod:`kvbench.bench.plans.reuse`: cold and warm runs of one request share a prompt length and batch)
    are left out; :func:`kvbench.analysis.reuse.reuse_table` is their table.
    """
    df = trials[trials["warm"].isna()] if "warm" in trials else trials
    keys = POINT_KEYS
    # one integer id per point (first-appearance order): every aggregate groups by it and aligns on it
    pid = df.groupby(keys, sort=False).ngroup()
    by_point = df.groupby(pid, sort=False)
    table = by_point[keys + ["mode"]].first()
    table.insert(len(keys), "trials", by_point.size())
    table = table[keys + ["trials", "mode"]]
    counts = pd.crosstab(pid, df["status"])
    known = [s.value for s in Status]
    for s in known:
        if s not in counts:
            counts[s] = 0
    counts["other"] = counts.drop(columns=known).sum(axis=1).astype(int)  # statuses this kvbench does not know
    for c in known + ["other"]:
        table[f"n_{c}"] = counts[c]
    table["measured"] = table["n_ok"] + table["n_over_budget"]
    bad = df["status"] != Status.OK
    first_bad = df[bad].groupby(pid[bad], sort=False)[["status", "message"]].first()
    table["status"] = first_bad["status"]
    table["message"] = first_bad["message"]
    table["status"] = table["status"].fillna(Status.OK.value)
    table["message"] = table["message"].fillna("")

    is_measured = df["status"].isin(MEASURED)
    measured = df[is_measured]
    mpid = pid[is_measured]
    if "tokens_match" in measured:
        tm = measured["tokens_match"].map({True: 1.0, False: 0.0}).groupby(mpid).min()
        table["tokens_match"] = tm.map({1.0: True, 0.0: False}).reindex(table.index).astype(object)
        table.loc[table["tokens_match"].isna(), "tokens_match"] = None
    else:
        table["tokens_match"] = None
    table["first_divergence_step"] = numeric(measured, "first_divergence_step").groupby(mpid).min()

    values = pd.DataFrame({col: numeric(measured, col) for col in SPREAD_METRICS + MEDIAN_METRICS})
    gm = values.groupby(mpid, sort=False)
    stats = gm[list(SPREAD_METRICS)].agg(["median", "min", "max"])
    stats.columns = [agg(col, stat) for col, stat in stats.columns]
    medians = gm[list(MEDIAN_METRICS)].median()
    medians.columns = [agg(col, "median") for col in medians.columns]
    table = table.join(stats).join(medians)
    for col in SPREAD_METRICS:
        ci = median_intervals(values[col], mpid)
        table[agg(col, "ci_low")] = ci["low"]
        table[agg(col, "ci_high")] = ci["high"]

    table = table.join(_itl_pooled(measured, mpid))
    busy = measured["machine_busy"] if "machine_busy" in measured else pd.Series(None, index=measured.index)
    table["n_busy"] = busy_flags(busy).groupby(mpid).sum()
    table["n_busy"] = table["n_busy"].fillna(0).astype(int)
    table[agg("others_cpu_percent", "median")] = numeric(measured, "others_cpu_percent").groupby(mpid).median()
    paired = paired_point_stats(measured, mpid)
    table = table.join(paired)
    for c in ("pairs", "pairs_busy_trials", "pairs_load_unknown"):
        table[c] = table[c].fillna(0).astype(int) if c in table else 0

    err = measured["kv_check_error"].abs()
    table["kv_check_flagged"] = (err > KV_CHECK_TOLERANCE).groupby(mpid).sum()
    worst = measured["kv_check_error"].where(err == err.groupby(mpid).transform("max"))
    table["kv_check_worst"] = worst.groupby(mpid, sort=False).first()
    table["kv_check_flagged"] = table["kv_check_flagged"].fillna(0).astype(int)
    table["budget_bytes"] = numeric(df, "budget_bytes").groupby(pid, sort=False).max()
    table["repeats_planned"] = numeric(df, "repeats_planned").groupby(pid, sort=False).max()
    for key in ("max_kl", "max_server_kl", "min_agreement"):
        table[key] = numeric(df, key).groupby(pid, sort=False).max()
    # a server's KL (kl_method set) is a lower bound from its top-k log-probabilities
    method = df["kl_method"] if "kl_method" in df else pd.Series(None, index=df.index, dtype=object)
    table["kl_bound"] = method.map(lambda m: isinstance(m, str) and bool(m)).groupby(pid, sort=False).any() \
        .astype(object)
    table["quality_ok"], table["quality"] = quality_check(table)
    table = table.reset_index(drop=True)

    kv, alloc = agg("kv_device_peak_bytes", "median"), agg("peak_device_allocated_bytes", "median")
    ref_cols = {kv: "ref_kv", alloc: "ref_alloc"}
    ref = table[table["mode"] == "none"].drop_duplicates(keys[:3])[keys[:3] + list(ref_cols)].rename(columns=ref_cols)
    table = table.merge(ref, on=keys[:3], how="left")
    # bytes are the same in every repeat: a ratio of medians; times are paired (kvbench.analysis.intervals)
    table["memory_saving_pct"] = 100 * (1 - table[kv] / table["ref_kv"])
    table["measured_saving_pct"] = 100 * (1 - table[alloc] / table["ref_alloc"])
    table = table.drop(columns=list(ref_cols.values()))
    add_comparisons(table)
    # measured ÷ kvbench plan's prediction (kvbench.analysis.plan: placement and decode-step roofline)
    def median(col: str) -> pd.Series:
        return table[agg(col, "median")]

    table["kv_device_vs_plan"] = median("kv_device_peak_bytes") / median("plan_kv_device_bytes")
    table["link_vs_plan"] = median("h2d_bytes_per_step") / median("plan_link_bytes_per_step")
    table["tpot_vs_plan"] = median("tpot_s") / median("plan_tpot_s")
    return table.replace([np.inf, -np.inf], np.nan)


__all__ = ["MIN_INTERVAL_VALUES", "KV_CHECK_TOLERANCE", "MEDIAN_METRICS", "POINT_KEYS", "SPREAD_METRICS",
           "agreement_text", "point_table", "quality_check", "quality_crossed", "qualifies"]
