"""The break-even map (``kvbench map``): where restoring stored KV pays against recomputing it, cell by cell over
prompt length × shared share × KV working set ÷ the engine's KV budget, measured where a ``shared_prefix`` run
measured it and filled in by the fitted roofline (:mod:`kvbench.analysis.break_even_fit`) elsewhere.

A measured cell is its requests' :func:`kvbench.analysis.reuse_cost.reuse_cost` (the paired saving in USD per 1M
generated tokens, its interval over independent prefixes, pairs, the busy-machine check) with the paired TTFT and
TPOT ratios. Its label goes through :func:`kvbench.analysis.intervals.judge` (via the saving's verdict):

- ``pays``: a verdict, and the saving's interval lies above 0;
- ``loses``: a verdict, and the interval lies below 0;
- ``inconclusive``: no verdict: too few pairs or prefixes, a busy machine, the interval spans 0, nothing restored;
  or the interval does not clear the control: the saving the same mode shows at 0% shared, where nothing can be
  reused (a server mode runs on a server process of its own, after ``none``'s: a shift of a few percent between
  two processes is not reuse, and pairs within one process cannot see it);
- ``invalid``: restored ids differ from ``none``'s (a lossless restore that changes outputs is a bug).

The working-set ratio is the KV a cell's requests hold once all ran (``cell_kv_tokens``: every whole unit of a
shared prefix once, each visit's own rest and tail; :func:`~kvbench.scenario.workload.cell_kv_tokens`) ÷ the KV
the engine keeps for reuse (``kv_budget_tokens``: the store's host tier in-process; on a server its slots' context
and its host RAM tier, llama.cpp's ``--cache-ram``); rows of runs before kvbench recorded ``cell_kv_tokens`` count
prefixes × prompt tokens. Cells are grouped in panels by :data:`RATIO_EDGES`. The model fills a panel only with
cells whose own ratio falls in it: a prompt length and share the run's working set cannot bring into a panel is
left empty, and said so in the map's notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.break_even_fit import CellShape, Fit, beyond_range, fit_quiet, predict_saving, tier_tokens
from kvbench.analysis.cost import Prices
from kvbench.analysis.intervals import pair_load, pair_with_reference, quiet_pairs, ratio_interval
from kvbench.analysis.reuse import recompute_side, reuse_trials, sampling_units
from kvbench.analysis.reuse_cost import HOST_TIER_BASES, reuse_cost
from kvbench.errors import BadParameter, ResultsError
from kvbench.offload.modes import MAX_TOKENS
from kvbench.results.rows import MEASURED
from kvbench.scenario.workload import MAX_VISITS, MAX_WORKING_SET, cell_kv_tokens, prefix_tokens

#: Panel edges of the working-set ratio: ≤ 0.5, 0.5–1, 1–2, 2–4, > 4 (1: the working set just fits the budget).
RATIO_EDGES = (0.5, 1.0, 2.0, 4.0)
#: The shared shares (percent) a map shows by default, besides those measured.
DEFAULT_SHARES = (0, 25, 50, 75, 95)
LABELS = ("pays", "loses", "inconclusive", "invalid")
#: Largest number of values ``shares`` and ``contexts`` may each give (a prediction per value of one × of the other
#: × panels: 100 × 100 took 73 s and 2.1 GB).
MAX_MAP_VALUES = 16
#: The most a ``shared_prefix`` row's column may hold (what a scenario can ask for): the map sizes its predictions
#: from them (prefixes × visits requests per cell).
ROW_LIMITS = {"working_set_prompts": MAX_WORKING_SET, "turn_index": MAX_VISITS, "prompt_tokens": MAX_TOKENS}


def check_row_limits(rows: pd.DataFrame) -> None:
    """Refuse ``shared_prefix`` rows whose :data:`ROW_LIMITS` columns hold more than a scenario can ask for.

    Raises:
        ResultsError: ``<run>/trials.jsonl: <column> <value> is above <limit>, ...`` for the first such value.
    """
    for column, most in ROW_LIMITS.items():
        values = pd.to_numeric(rows[column], errors="coerce") if column in rows else None
        if values is None or not (values > most).any():
            continue
        at = values[values > most].index[0]
        run = rows.at[at, "run_path"] if "run_path" in rows else "?"
        raise ResultsError(f"{Path(str(run)) / 'trials.jsonl'}: {column} {int(values[at]):,} is above {most:,}, the "
                           "most a shared_prefix scenario asks for: not a row kvbench wrote")


def ratio_panel(ratio: float) -> str:
    """The panel of a working-set ratio: ``≤0.5×``, ``0.5–1×``, ``1–2×``, ``2–4×`` or ``>4×`` (upper edges
    included); ``?`` when unknown."""
    if ratio != ratio:
        return "?"
    lows = (0.0,) + RATIO_EDGES
    for lo, hi in zip(lows, RATIO_EDGES):
        if ratio <= hi:
            return f"≤{hi:g}×" if lo == 0 else f"{lo:g}–{hi:g}×"
    return f">{RATIO_EDGES[-1]:g}×"


def panel_rank(panel: str) -> int:
    """The order of a panel of :func:`ratio_panel` along the ratio: 0 for ``≤0.5×`` up to 4 for ``>4×``, 5 for
    ``?``."""
    names = [ratio_panel(e) for e in RATIO_EDGES] + [f">{RATIO_EDGES[-1]:g}×"]
    return names.index(panel) if panel in names else len(names)


def label(saving_verdict: str, saving_pct: float, tokens_match: Any) -> tuple[str, str]:
    """``(label, why)`` of a measured cell (module docstring): never ``pays`` without a verdict, so never when the
    saving's interval spans 0."""
    if tokens_match is False:
        return "invalid", "restored ids differ from none's"
    if saving_verdict:
        return "inconclusive", saving_verdict.removeprefix("inconclusive: ")
    if saving_pct != saving_pct:
        return "inconclusive", "no saving"
    return ("pays", "") if saving_pct > 0 else ("loses", "")


def map_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials of ``shared_prefix`` runs (measured or not) with their cell: ``shared_pct`` (the share the cell
    asked for; for rows that do not say, the prefix ÷ the prompt, percent, rounded), ``working_set``, ``kv_ratio``
    and ``panel`` (``?`` without a ``kv_budget_tokens`` above 0). Rows whose prefix is not 0 to prompt − 1 tokens or
    whose working set is not at least 1 (a hand-edited file) are left out. Empty without such trials.

    Raises:
        ResultsError: a row holds more than :data:`ROW_LIMITS` allow (:func:`check_row_limits`).
    """
    rows = reuse_trials(trials)
    if rows.empty or "shared_prefix_tokens" not in rows or rows["shared_prefix_tokens"].isna().all():
        return rows.iloc[0:0]
    rows = rows[rows["shared_prefix_tokens"].notna()].copy()
    check_row_limits(rows)
    prompt = pd.to_numeric(rows["prompt_tokens"], errors="coerce")
    shared = pd.to_numeric(rows["shared_prefix_tokens"], errors="coerce")
    rows["working_set"] = pd.to_numeric(rows.get("working_set_prompts"), errors="coerce") \
        if "working_set_prompts" in rows else np.nan
    ok = (shared >= 0) & (shared < prompt) & (rows["working_set"] >= 1)
    rows = rows[ok].copy()
    if rows.empty:
        return rows
    prompt, shared = prompt[ok], shared[ok]
    asked = pd.to_numeric(rows["shared_pct"], errors="coerce") if "shared_pct" in rows else \
        pd.Series(np.nan, index=rows.index)
    # the share the cell asked for (rows of a run before kvbench recorded it: the share its prefix has)
    rows["shared_pct"] = asked.where(asked.between(0, 99), (100 * shared / prompt).round()).astype(int)
    budget = pd.to_numeric(rows["kv_budget_tokens"], errors="coerce") if "kv_budget_tokens" in rows else np.nan
    budget = budget.where(budget > 0) if isinstance(budget, pd.Series) else budget
    held = pd.to_numeric(rows["cell_kv_tokens"], errors="coerce") if "cell_kv_tokens" in rows else \
        pd.Series(np.nan, index=rows.index)
    rows["kv_ratio"] = (held.fillna(rows["working_set"] * prompt) / budget).round(3)
    rows["panel"] = rows["kv_ratio"].map(ratio_panel)
    return rows


def fill_ratio(rows: pd.DataFrame, tokens: int, pct: int) -> float:
    """The working-set ratio a cell of ``tokens`` tokens at ``pct`` percent shared would have with the prefixes,
    visits, share unit and budget of the measured cells ``rows`` (medians; :func:`map_rows`' rule: prefixes ×
    ``tokens`` where they do not record their share unit); NaN without a budget."""
    budget = pd.to_numeric(rows["kv_budget_tokens"], errors="coerce").median() if "kv_budget_tokens" in rows \
        else math.nan
    w = int(rows["working_set"].median())
    unit = pd.to_numeric(rows["share_unit_tokens"], errors="coerce").median() if "share_unit_tokens" in rows \
        else math.nan
    held = w * tokens if unit != unit else cell_kv_tokens(tokens, prefix_tokens(tokens, pct), w, int(
        pd.to_numeric(rows["turn_index"]).max()), int(unit))
    return held / budget if budget > 0 else math.nan


def _paired_ratio(warm: pd.DataFrame, cold: pd.DataFrame, metric: str) -> tuple[float, float, float]:
    """Restore ÷ recompute ``metric`` over request pairs: Σ restore ÷ Σ recompute with its 95% interval, the
    jackknife over independent units (:func:`~kvbench.analysis.intervals.ratio_interval`); a busy pair is counted
    elsewhere, never a figure (:func:`~kvbench.analysis.intervals.quiet_pairs`)."""
    pairs = pair_with_reference(warm, cold, on=["request_id"])
    if pairs.empty:
        return math.nan, math.nan, math.nan
    units = sampling_units(pairs)[0]
    figure, interval = quiet_pairs(pair_load(pairs))
    est = ratio_interval(pairs.loc[figure, metric], pairs.loc[figure, f"{metric}_ref"], units[figure])[0]
    lo, hi = ratio_interval(pairs.loc[interval, metric], pairs.loc[interval, f"{metric}_ref"],
                            units[interval])[1:] if interval.any() else (math.nan, math.nan)
    return est, lo, hi


CELL_KEYS = ["group", "mode_label", "prompt_tokens", "shared_pct", "panel"]


def measured_cells(rows: pd.DataFrame, prices: Prices, host_tier: str = "configured") -> pd.DataFrame:
    """One row per measured cell (group × mode × prompt length × shared share × panel) of :func:`map_rows`:
    the :func:`~kvbench.analysis.reuse_cost.reuse_cost` columns of its reuse saving (restore against ``none``
    recomputing; a tier mode's tier saving against prefix caching is ``kvbench cost``'s), ``ttft_ratio`` /
    ``tpot_ratio`` with their ``_ci_low`` / ``_ci_high``, ``kv_ratio``, ``working_set``, ``label`` and ``why``,
    ``source`` = ``measured``."""
    out = []
    for key, part in rows.groupby(["prompt_tokens", "shared_pct", "panel"], sort=True):
        cost = reuse_cost(part, prices, host_tier=host_tier)
        cost = cost[cost["saving_kind"] == "reuse"] if len(cost) else cost
        ok = part[part["status"].isin(MEASURED)]
        for rec in cost.to_dict("records"):
            mine = ok[(ok["group"] == rec["group"]) & (ok["mode_label"] == rec["mode_label"])]
            warm, cold = mine[mine["warm"].astype(bool)], recompute_side(ok, mine, rec["group"])
            for metric, name in (("ttft_s", "ttft_ratio"), ("tpot_s", "tpot_ratio")):
                rec[name], rec[f"{name}_ci_low"], rec[f"{name}_ci_high"] = _paired_ratio(warm, cold, metric)
            rec.update(zip(["prompt_tokens", "shared_pct", "panel"], key))
            rec["kv_ratio"] = float(part["kv_ratio"].median())
            rec["working_set"] = int(part["working_set"].median())
            rec["label"], rec["why"] = label(rec["saving_verdict"], rec["saving_pct"], rec["tokens_match"])
            rec["source"] = "measured"
            out.append(rec)
    table = pd.DataFrame(out)
    if len(table):
        _apply_control(table)
    return table


def _apply_control(cells: pd.DataFrame) -> None:
    """The 0%-shared cells of a scenario and mode are its control: nothing can be reused there, so their saving is
    what the mode shifts without reuse (a server process of its own, a store's lookups). A cell that would pay or
    lose keeps its label only when its interval clears the control's band (the lowest low to the highest high of
    the 0% cells' intervals); else it is inconclusive, the band said. Adds ``control_low`` / ``control_high``
    (NaN without a control). In place."""
    cells["control_low"], cells["control_high"] = np.nan, np.nan
    for _, part in cells.groupby(["group", "mode_label"], sort=False):
        zero = part[(part["shared_pct"] == 0) & part["saving_ci_low"].notna()]
        if zero.empty:
            continue
        lo, hi = float(zero["saving_ci_low"].min()), float(zero["saving_ci_high"].max())
        cells.loc[part.index, "control_low"], cells.loc[part.index, "control_high"] = lo, hi
        for i in part.index[(part["shared_pct"] > 0) & part["label"].isin(["pays", "loses"])]:
            if cells.at[i, "saving_ci_low"] <= hi and cells.at[i, "saving_ci_high"] >= lo:
                cells.at[i, "label"] = "inconclusive"
                cells.at[i, "why"] = (f"within the shift measured with nothing to reuse (0% shared: "
                                      f"{lo:+.1f}% to {hi:+.1f}%)").replace("-", "−")


@dataclass
class BreakEvenMap:
    """``cells``: measured and model-filled cells (``source`` = ``measured`` or ``model``), with the model's
    ``predicted_saving_pct`` / ``_ci_low`` / ``_ci_high`` beside each and ``disagrees`` (a measured cell whose
    interval and the prediction's do not overlap); ``fits``: (group, mode label) → :class:`Fit` (None: too few
    trials to fit); ``notes``: what could not be filled, and why; ``files``: what
    :func:`kvbench.report.break_even.break_even_report` wrote."""

    cells: pd.DataFrame
    fits: dict[tuple[str, str], Fit | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    files: list[Any] = field(default_factory=list)


def _shape(rows: pd.DataFrame, cells: pd.DataFrame, tokens: int, pct: int) -> CellShape | None:
    """A cell's :class:`CellShape` at ``tokens`` and ``pct`` from the measured trials of its group, mode and panel
    (``rows``) and their cells: the share of a shared prefix its revisits restored, the tiers, visits, tokens
    generated and the memory charged (medians)."""
    warm = rows[rows["warm"].astype(bool) & (pd.to_numeric(rows["turn_index"]) >= 2)
                & (pd.to_numeric(rows["shared_prefix_tokens"]) > 0)]
    if warm.empty:
        return None
    k = pd.to_numeric(warm["tokens_restored"], errors="coerce").fillna(0)
    share = float((k / pd.to_numeric(warm["shared_prefix_tokens"])).mean())
    tiers = tier_tokens(warm).sum()
    total = float(tiers.sum())
    tier_share = {t: float(v) / total for t, v in tiers.items()} if total else {}
    return CellShape(int(tokens), prefix_tokens(int(tokens), int(pct)), int(pd.to_numeric(rows["turn_index"]).max()),
                     int(rows["working_set"].median()), share, tier_share, int(rows["n_output_tokens"].median()),
                     float(cells["store_host_bytes"].median()) if len(cells) else 0.0,
                     float(cells["store_disk_bytes"].median()) if len(cells) else 0.0)


def fit_notes(group: str, mode: str, fit: Fit, contexts: tuple[int, ...] = ()) -> list[str]:
    """What a map says of a fit's footing: the busy trials it left out, that it rests on busy trials only (its
    model cells are then inconclusive), and the ``contexts`` (tokens) it extrapolates to beyond 2x of its
    prompt lengths (:func:`~kvbench.analysis.break_even_fit.beyond_range`)."""
    out = []
    if fit.busy:
        out.append(f"{group} {mode}: fitted to trials measured on a busy machine only ({fit.trials}): its "
                   "constants are not a measurement of this machine, and its model cells are inconclusive")
    elif fit.busy_left_out:
        out.append(f"{group} {mode}: {fit.busy_left_out} trials measured on a busy machine left out of the fit")
    far = beyond_range(fit.prompt_tokens, contexts)
    if far:
        low, high = fit.prompt_tokens
        out.append(f"{group} {mode}: the model's cells at {', '.join(f'{n:,}' for n in far)} tokens extrapolate "
                   f"beyond 2x the prompt lengths it was fitted to ({low:,}–{high:,} tokens)")
    return out


def check_map_arguments(prices: Any, shares: Any, contexts: Any, host_tier: Any) -> None:
    """Refuse what :func:`break_even_map` cannot take (its Raises)."""
    if not isinstance(prices, Prices):
        raise BadParameter(f"{{prices}} must be kvbench.Prices(...), not {type(prices).__name__}", "prices")
    for name, values, low, high in (("shares", shares, 0, 99), ("contexts", contexts, 1, 2**24)):
        if not isinstance(values, (str, bytes)) and hasattr(values, "__len__") and len(values) > MAX_MAP_VALUES:
            raise BadParameter(f"{{{name}}} takes at most {MAX_MAP_VALUES} values, not {len(values):,}", name)
        if isinstance(values, (str, bytes)) or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                      and low <= v <= high for v in values):
            raise BadParameter(f"{{{name}}} must be whole numbers from {low} to {high:,}, not {values!r}", name)
    if host_tier not in HOST_TIER_BASES:
        raise BadParameter(f"{{host_tier}} must be one of {', '.join(HOST_TIER_BASES)}, not {host_tier!r}",
                           "host_tier")


def break_even_map(trials: pd.DataFrame, prices: Prices, shares: tuple[int, ...] = DEFAULT_SHARES,
                   contexts: tuple[int, ...] = (), host_tier: str = "configured") -> BreakEvenMap:
    """The map of the ``shared_prefix`` trials in ``trials``: its measured cells (:func:`measured_cells`), the
    constants fitted per group and mode to its quiet trials (:func:`~kvbench.analysis.break_even_fit.fit_quiet`;
    :func:`fit_notes` in ``notes``) and, for every cell of measured and ``shares`` × measured and ``contexts``
    prompt lengths × measured panels that was not measured, the model's prediction (``source`` = ``model``,
    ``label`` = ``model: pays`` / ``model: loses`` / ``model: inconclusive`` by the same rule on the prediction's
    interval; always ``model: inconclusive`` from a fit of busy trials). An empty map when no trial is of a
    ``shared_prefix`` run.

    Raises:
        kvbench.errors.BadParameter: ``prices`` not a :class:`~kvbench.analysis.cost.Prices`, a share not a whole
            number 0-99, a context not a whole number 1 to 2^24, more than :data:`MAX_MAP_VALUES` of either, or
            ``host_tier`` not one of :data:`~kvbench.analysis.reuse_cost.HOST_TIER_BASES` (naming the argument).
        kvbench.errors.ResultsError: a row holds more than a scenario can ask for (:func:`check_row_limits`).
    """
    check_map_arguments(prices, shares, contexts, host_tier)
    rows = map_rows(trials)
    if rows.empty:
        return BreakEvenMap(pd.DataFrame())
    cells = measured_cells(rows, prices, host_tier)
    ok = rows[rows["status"].isin(MEASURED)]
    fits: dict[tuple[str, str], Fit | None] = {}
    notes: list[str] = []
    filled = []
    for (group, mode), part in ok.groupby(["group", "mode_label"], sort=False):
        server = "engine" in part and part["engine"].notna().all()
        if server and part["mode"].eq("none").all():
            continue  # a server run's `none`: the recompute side of its other modes
        own = pd.concat([part, recompute_side(ok, part, group)]).drop_duplicates("trial_id")
        if "contaminated" in own:
            own = own[~own["contaminated"].fillna(False).astype(bool)]
        fit = fits[(group, mode)] = fit_quiet(own)
        if fit is None:
            notes.append(f"{group} {mode}: too few trials or prompt lengths to fit the model")
            continue
        notes.extend(fit_notes(group, mode, fit, contexts))
        mine = cells[(cells["group"] == group) & (cells["mode_label"] == mode)] if len(cells) else cells
        lengths = sorted(set(part["prompt_tokens"].astype(int)) | set(contexts))
        away: list[str] = []  # cells whose working set falls outside the panel they would fill
        for panel, in_panel in part.groupby("panel", sort=True):
            here = mine[mine["panel"] == panel] if len(mine) else mine
            measured = set(zip(in_panel["prompt_tokens"].astype(int), in_panel["shared_pct"].astype(int)))
            for tokens in lengths:
                for pct in sorted(set(in_panel["shared_pct"].astype(int)) | set(shares)):
                    shape = _shape(in_panel, here, tokens, pct)
                    if shape is None:
                        continue
                    ratio = fill_ratio(in_panel, tokens, pct)
                    if (tokens, pct) not in measured and panel != "?" and ratio_panel(ratio) != panel:
                        away.append(f"{tokens:,} tokens at {pct}% shared {ratio:.3g}×, not {panel}")
                        continue
                    value, lo, hi = predict_saving(fit, shape, prices.gpu_per_hour, prices.host_per_gib_hour,
                                                   prices.disk_per_gib_hour)
                    filled.append({"group": group, "mode_label": mode, "prompt_tokens": tokens, "shared_pct": pct,
                                   "panel": panel, "predicted_saving_pct": value, "predicted_ci_low": lo,
                                   "predicted_ci_high": hi})
        if away:
            notes.append(f"{group} {mode}: {len(away)} cells left empty, the run's prompts cannot reach their "
                         f"panel (KV working set ÷ budget: {'; '.join(away[:3])}{'; ...' if len(away) > 3 else ''})")
    model = pd.DataFrame(filled, columns=CELL_KEYS + ["predicted_saving_pct", "predicted_ci_low",
                                                      "predicted_ci_high"])
    table = cells.merge(model, on=CELL_KEYS, how="outer") if len(cells) else model.assign(source="model")
    table["source"] = table["source"].fillna("model")
    measured = table["source"] == "measured"
    table["disagrees"] = np.where(measured & table["predicted_ci_low"].notna() & table["saving_ci_low"].notna(),
                                  (table["predicted_ci_low"] > table["saving_ci_high"])
                                  | (table["predicted_ci_high"] < table["saving_ci_low"]), None)
    model_only = ~measured
    busy_fit = pd.Series([fits.get(k) is not None and fits[k].busy for k in zip(table["group"], table["mode_label"])],
                         index=table.index)
    table.loc[model_only, "label"] = [
        "model: inconclusive" if busy else "model: pays" if lo > 0 else "model: loses" if hi < 0
        else "model: inconclusive" for lo, hi, busy in zip(table.loc[model_only, "predicted_ci_low"],
                                                          table.loc[model_only, "predicted_ci_high"],
                                                          busy_fit[model_only])]
    table.loc[model_only, "why"] = np.where(busy_fit[model_only], "fitted to trials on a busy machine", "")
    order = {k: i for i, k in enumerate(dict.fromkeys(zip(ok["group"], ok["mode_label"])))}
    table["_rank"] = [order.get(k, len(order)) for k in zip(table["group"], table["mode_label"])]
    table["_panel"] = table["panel"].map(panel_rank)
    table = table.sort_values(["_rank", "_panel", "prompt_tokens", "shared_pct"], ignore_index=True)
    return BreakEvenMap(table.drop(columns=["_rank", "_panel"]), fits, notes)


__all__ = ["BreakEvenMap", "CELL_KEYS", "DEFAULT_SHARES", "LABELS", "MAX_MAP_VALUES", "RATIO_EDGES", "ROW_LIMITS",
           "break_even_map", "check_map_arguments", "check_row_limits", "fill_ratio", "fit_notes", "label",
           "map_rows", "measured_cells", "panel_rank", "ratio_panel"]
