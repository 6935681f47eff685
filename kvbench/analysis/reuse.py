"""Reuse workloads' tables: per request of a multi-turn or document-QA stream, recompute (cold) against restore
(warm) per mode, paired, from the trials :mod:`kvbench.bench.plans.reuse` records; ``kvbench report`` and
``kvbench cost`` read them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.engaged import reuse_not_engaged
from kvbench.analysis.intervals import judge, pair_load, pair_with_reference, quiet_pairs, ratio_interval
from kvbench.results.rows import MEASURED, agg


#: Prompt-length bins of the per-length table (tokens): [lower, upper).
LENGTH_BINS = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def length_bin(tokens: pd.Series) -> pd.Series:
    """The bin label (``1024-2047``) of each prompt length, from :data:`LENGTH_BINS`."""
    edges = np.asarray(LENGTH_BINS)
    i = np.searchsorted(edges, tokens.to_numpy(dtype=float), side="right") - 1
    i = np.clip(i, 0, len(edges) - 2)
    return pd.Series([f"{edges[j]}-{edges[j + 1] - 1}" for j in i], index=tokens.index)


#: Columns of a measured reuse trial that the tables read: a frame of failed trials only lacks them.
MEASURED_COLUMNS = ("ttft_s", "e2e_s", "n_output_tokens", "tokens_restored", "store_hit_rate", "tokens_match",
                    "first_divergence_step", "divergence_acceptable", "machine_busy", "kl_mean")


def reuse_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The rows of reuse trials (those with a ``warm`` flag), measured or not, with every column of
    :data:`MEASURED_COLUMNS` (null where no trial has it, e.g. when none was measured)."""
    if "warm" not in trials:
        return trials.iloc[0:0]
    rows = trials[trials["warm"].notna()]
    missing = [c for c in MEASURED_COLUMNS if c not in rows]
    return rows.assign(**{c: pd.Series(None, index=rows.index, dtype=object) for c in missing}) if missing else rows


def with_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a ``cell`` column where they are a break-even map run's (``shared_prefix_tokens`` set): the
    cell a request belongs to, ``256 tokens, 80% shared, 5 prefixes`` (prompt tokens, the share the cell asked
    for, else its prefix ÷ prompt, and the prefixes in rotation), so that a summary never pools cells into a
    prompt length no trial had; ``""`` for rows of other runs. ``rows`` unchanged without such rows."""
    if "shared_prefix_tokens" not in rows or rows["shared_prefix_tokens"].isna().all():
        return rows
    prompt = pd.to_numeric(rows["prompt_tokens"], errors="coerce")
    shared = pd.to_numeric(rows["shared_prefix_tokens"], errors="coerce")
    asked = pd.to_numeric(rows["shared_pct"], errors="coerce") if "shared_pct" in rows else shared * np.nan
    pct = asked.where(asked.notna(), (100 * shared / prompt).round())
    sets = pd.to_numeric(rows.get("working_set_prompts"), errors="coerce") if "working_set_prompts" in rows \
        else shared * np.nan
    cell = [f"{n:,.0f} tokens, {c:.0f}% shared" + (f", {w:.0f} prefixes" if w == w else "") if s == s else ""
            for n, c, w, s in zip(prompt, pct, sets, shared)]
    return rows.assign(cell=cell)


def reuse_table(trials: pd.DataFrame, by: str = "turn_index") -> pd.DataFrame:
    """TTFT recompute (cold) vs restore (warm) per group × mode × ``by`` (``turn_index``, ``length_bin``, or
    ``cell``: a break-even map run's cells, :func:`with_cells`, in the order they ran).

    Returns:
        One row per (group, mode_label, by): ``n`` (warm trials), ``prompt_tokens`` (median), ``cold_ttft_s``
        and ``warm_ttft_s`` (median, with ``_min``/``_max``), ``ttft_ratio`` = warm ÷ cold medians,
        ``tokens_restored`` (median), ``hit_rate`` (mean ``store_hit_rate`` of warm trials that had a whole chunk
        to look up), ``restore_host_bytes`` / ``restore_disk_bytes`` (totals over the warm trials),
        ``warm_prompt_tokens`` and ``warm_tokens_restored`` (totals), ``prefill_saved_pct`` (Σ restored ÷ Σ prompt
        tokens of the warm trials), ``tokens_match`` (all warm and cold trials equal ``none``'s cold ids,
        or the only divergences acceptable: "near tie"), ``kl_mean``, ``token_agreement`` and
        ``agreement_to_divergence`` (medians over the warm trials of a lossy server preset's quality against
        ``none``, NaN for others), ``floor_kl_mean`` (the same KL of a lossless reuse preset), ``kl_bound`` (the
        KL is a server's lower bound, ``kl_method``) with the run's ``max_kl``, ``max_server_kl`` and
        ``min_agreement``, ``failed`` (trials not measured).
    """
    rows = with_cells(reuse_trials(trials)).copy()
    if rows.empty:
        return pd.DataFrame()
    rows["length_bin"] = length_bin(rows["prompt_tokens"])
    keys = ["group", "mode_label", by]
    out = []
    for key, part in rows.groupby(keys, sort=False):
        ok = part[part["status"].isin(MEASURED)]
        warm, cold = ok[ok["warm"].astype(bool)], recompute_side(rows, ok, key[0], {by: key[2]})
        rec: dict[str, Any] = dict(zip(keys, key))
        rec.update(mode=part["mode"].iloc[0], n=len(warm), failed=int((~part["status"].isin(MEASURED)).sum()),
                   prompt_tokens=float(part["prompt_tokens"].median()))
        for side, frame in (("cold", cold), ("warm", warm)):
            v = frame["ttft_s"].astype(float)
            rec[f"{side}_ttft_s"] = v.median() if len(v) else np.nan
            rec[agg(f"{side}_ttft_s", "min")] = v.min() if len(v) else np.nan
            rec[agg(f"{side}_ttft_s", "max")] = v.max() if len(v) else np.nan
        rec.update(paired_ttft(warm, cold))
        rec["tokens_restored"] = float(warm["tokens_restored"].median()) if len(warm) else np.nan
        hit = warm["store_hit_rate"].dropna().astype(float) if "store_hit_rate" in warm else pd.Series(dtype=float)
        rec["hit_rate"] = hit.mean() if len(hit) else np.nan
        for tier in ("host", "disk"):
            col = f"restore_{tier}_bytes"
            rec[col] = float(warm[col].sum()) if len(warm) and col in warm else np.nan
        rec["warm_prompt_tokens"] = prompt = int(warm["prompt_tokens"].sum())
        rec["warm_tokens_restored"] = int(warm["tokens_restored"].sum()) if len(warm) else 0
        rec["prefill_saved_pct"] = 100 * rec["warm_tokens_restored"] / prompt if prompt else np.nan
        rec["tokens_match"] = ids_verdict(ok)
        for col in ("kl_mean", "token_agreement", "agreement_to_divergence", "floor_kl_mean"):
            v = pd.to_numeric(warm[col], errors="coerce").dropna() if col in warm else pd.Series(dtype=float)
            rec[col] = float(v.median()) if len(v) else np.nan
        method = warm["kl_method"] if "kl_method" in warm else pd.Series(dtype=object)
        rec["kl_bound"] = bool(method.map(lambda m: isinstance(m, str) and bool(m)).any())
        for key in ("max_kl", "max_server_kl", "min_agreement"):  # the run's quality thresholds, NaN without
            rec[key] = float(pd.to_numeric(part[key], errors="coerce").max()) if key in part else np.nan
        out.append(rec)
    # groups and modes in the order they ran (`none` first), then by turn or length
    rank = {k: i for i, k in enumerate(dict.fromkeys(zip(rows["group"], rows["mode_label"])))}
    frame = pd.DataFrame(out)
    frame["tokens_match"] = frame["tokens_match"].astype(object)  # True/False/"near tie"/None as Python values
    if by == "turn_index":
        frame["turn_index"] = frame["turn_index"].astype("Int64")
    frame["_rank"] = [rank[k] for k in zip(frame["group"], frame["mode_label"])]
    order = ["_rank"] + ([] if by == "cell" else [by])  # cells as they ran, not as their labels sort
    return frame.sort_values(order, kind="stable", ignore_index=True).drop(columns="_rank")


def reuse_later_turns(trials: pd.DataFrame, from_turn: int = 2) -> pd.DataFrame:
    """Restore ÷ recompute TTFT of every request from turn ``from_turn`` on, pooled per group × mode (the turns
    that can restore a prefix), paired by request: the columns of :func:`paired_ttft` with ``group`` and
    ``mode_label``; empty without reuse trials."""
    rows = reuse_trials(trials)
    if rows.empty or "turn_index" not in rows:
        return pd.DataFrame()
    rows = rows[rows["status"].isin(MEASURED) & (pd.to_numeric(rows["turn_index"], errors="coerce") >= from_turn)]
    out = []
    for (group, mode), part in rows.groupby(["group", "mode_label"], sort=False):
        warm = part[part["warm"].astype(bool)]
        out.append({"group": group, "mode_label": mode, **paired_ttft(warm, recompute_side(rows, part, group))})
    return pd.DataFrame(out)


def recompute_side(rows: pd.DataFrame, part: pd.DataFrame, group: str, where: dict[str, Any] | None = None
                   ) -> pd.DataFrame:
    """The measured recompute (cold) trials a mode's restores are paired with: the mode's own cold trials (the
    in-process engine runs each request both ways), or, for a mode with none (a server configuration, which
    restores what it holds), the group's ``none`` requests (``where``: the same turn or length bin); uncontaminated
    ones only."""
    own = part[~part["warm"].astype(bool) & part["status"].isin(MEASURED)]
    if not own.empty or part["mode"].eq("none").all():
        return own
    ref = rows[(rows["group"] == group) & rows["mode"].eq("none") & ~rows["warm"].astype(bool)
               & rows["status"].isin(MEASURED)]
    if "concurrency" in part and part["concurrency"].notna().any():  # a server's `none` at the same level
        same = ref[ref["concurrency"].isin(part["concurrency"].dropna().unique())]
        ref = same if not same.empty else ref
    for col, value in (where or {}).items():
        ref = ref[ref[col] == value]
    if "contaminated" in ref:
        ref = ref[~ref["contaminated"].fillna(False).astype(bool)]
    return ref


def sampling_units(pairs: pd.DataFrame) -> tuple[pd.Series, str]:
    """The independent unit of each request pair, for the jackknife over units and the count a verdict needs, and its
    name: requests sent several at a time share the server, so at a concurrency above 1 a whole load (a run's
    repeat) is one unit (``"concurrent loads"``); one at a time, a conversation's turns (a document's questions)
    share their history, so the unit is the conversation (``"conversations"``; ``"documents"``; a shared prefix's
    visits, ``"prefixes"``); requests of no
    conversation are their own units (``"pairs"``)."""
    if "concurrency" in pairs and pd.to_numeric(pairs["concurrency"], errors="coerce").max() > 1:
        return pairs["run_path"].astype(str) + "#" + pairs["repeat"].astype(str), "concurrent loads"
    if "document" in pairs and pairs["document"].notna().all() and pairs["document"].duplicated().any():
        first = pairs["request_id"].astype(str).str[:1] if "request_id" in pairs else pd.Series("", index=pairs.index)
        name = {"d": "documents", "s": "prefixes"}.get(first.iloc[0], "conversations") if first.nunique() == 1 \
            else "conversations"
        return pairs["document"].astype(str), name
    return pd.Series(np.arange(len(pairs)), index=pairs.index), "pairs"


def paired_ttft(warm: pd.DataFrame, cold: pd.DataFrame, not_engaged: str | None = None) -> dict[str, Any]:
    """Restore ÷ recompute TTFT paired by request (the warm and cold run of one request in one repeat ran back to
    back): ``ttft_ratio`` (Σ restore TTFT ÷ Σ recompute TTFT of the quiet pairs: a busy pair is counted, never a figure)
    with ``ttft_ratio_ci_low``/``_high`` (95%, with ≥ 5 pairs: the jackknife over independent units,
    :func:`sampling_units`, of :func:`~kvbench.analysis.intervals.ratio_interval`), ``pairs``, ``units`` and ``unit``
    (how many independent units the pairs come from, and what they are), ``pairs_busy_trials`` and ``ttft_verdict``
    (:func:`kvbench.analysis.intervals.judge`, which also needs 5 units; "" when the pairs decide that restore is
    faster or slower; first ``not_engaged``, why the mode has no verdict, by default
    :func:`~kvbench.analysis.engaged.reuse_not_engaged`)."""
    pairs = pair_with_reference(warm, cold, on=["request_id"])
    clusters, unit = sampling_units(pairs)
    load = pair_load(pairs)
    figure, interval = quiet_pairs(load)
    est = ratio_interval(pairs.loc[figure, "ttft_s"], pairs.loc[figure, "ttft_s_ref"], clusters[figure])[0]
    lo, hi = ratio_interval(pairs.loc[interval, "ttft_s"], pairs.loc[interval, "ttft_s_ref"],
                            clusters[interval])[1:] if interval.any() else (np.nan, np.nan)
    n, busy, unknown = len(pairs), int(load["busy_trials"].sum()), int(load["load_unknown"].sum())
    return {"ttft_ratio": est if n else np.nan, "ttft_ratio_ci_low": lo, "ttft_ratio_ci_high": hi,
            "pairs": n, "units": int(clusters.nunique()), "unit": unit, "pairs_busy_trials": busy,
            "ttft_verdict": (reuse_not_engaged(warm) if not_engaged is None else not_engaged)
            or judge(n, busy, unknown, lo, hi, units=(int(clusters.nunique()), unit))}


def ids_verdict(ok: pd.DataFrame) -> Any:
    """Of measured reuse trials: True when every trial's ids equal the reference (``none`` recomputing the
    request); "near tie" when the only divergences are acceptable ones (see
    :data:`kvbench.bench.rows.reference.ACCEPTABLE_GAP`); False for any other divergence; None when nothing was
    compared."""
    m = ok["tokens_match"]
    if m.isna().all():
        return None
    if bool(m.fillna(True).astype(bool).all()):
        return True
    bad = ok[m.eq(False)]
    accepted = bad["divergence_acceptable"] if "divergence_acceptable" in bad else pd.Series(False, index=bad.index)
    return "near tie" if bool(accepted.fillna(False).astype(bool).all()) else False
