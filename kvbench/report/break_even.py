"""``kvbench map``'s text and files: the break-even map's cells as a table, the fitted constants with their
sources, and ``map.csv``, ``map.json`` and one heatmap PNG per scenario and mode
(:mod:`kvbench.report.break_even_chart`)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.break_even import DEFAULT_SHARES, BreakEvenMap, break_even_map, panel_rank
from kvbench.analysis.cost import Prices
from kvbench.analysis.intervals import pct_interval
from kvbench.arguments import path_arg
from kvbench.errors import BadParameter, ResultsError, UnwritableOutput, UserError
from kvbench.report.break_even_chart import break_even_heatmap
from kvbench.report.cost import replacing, replacing_chart
from kvbench.report.format import finite_json, number
from kvbench.results.load import Results
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.safe_text import unique_stems

#: Names, units and scales of the fitted constants, for their lines (a restore tier's: ``restore <tier>``).
UNITS = {"overhead_s": ("overhead", "ms", 1e3), "decode_s": ("decode step", "ms", 1e3),
         "prefill_s_per_token": ("prefill", "µs/token", 1e6),
         "attention_s_per_token_pair": ("attention", "ns/token pair", 1e9),
         "decode_s_per_context_token": ("decode per context token", "ns/token", 1e9)}


def _ratio(r: dict[str, Any], name: str) -> str:
    v, lo, hi = r.get(name), r.get(f"{name}_ci_low"), r.get(f"{name}_ci_high")
    if v is None or v != v:
        return "-"
    return f"{v:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo == lo and hi == hi and lo is not None else "")


def map_display(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells of one scenario and mode as text, one row each: KV working set ÷ budget panel, prompt, shared share,
    source (measured / model), saving with its interval, Δ USD per 1M, TTFT and TPOT ratios (restore ÷
    recompute, paired), pairs and units, the label and why, and the model's prediction (``!`` where it disagrees
    with the measurement beyond both intervals)."""
    rows = []
    for r in cells.to_dict("records"):
        measured = r["source"] == "measured"
        units = f"{int(r['pairs'])}/{int(r['units'])}" if measured and r.get("pairs") == r.get("pairs") else "-"
        predicted = pct_interval(r.get("predicted_saving_pct"), r.get("predicted_ci_low"), r.get("predicted_ci_high"))
        rows.append([r["panel"], str(int(r["prompt_tokens"])), f"{int(r['shared_pct'])}%",
                     r["source"],
                     pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"]) if measured else "-",
                     (number(r["delta_usd_per_million"], "+,.2f") + (
                         f" [{r['delta_usd_ci_low']:+,.2f}, {r['delta_usd_ci_high']:+,.2f}]"
                         if r["delta_usd_ci_low"] == r["delta_usd_ci_low"] else "")).replace("-", "−")
                     if measured else "-",
                     _ratio(r, "ttft_ratio") if measured else "-", _ratio(r, "tpot_ratio") if measured else "-",
                     units, r["label"] + (f": {r['why']}" if r.get("why") else ""),
                     predicted + (" !" if r.get("disagrees") is True else "")])
    return pd.DataFrame(rows, columns=["KV ÷ budget", "prompt", "shared", "source", "saving",
                                       "Δ USD/1M", "TTFT ÷", "TPOT ÷", "pairs/units", "label", "model"],
                        dtype=object)


#: The word a heatmap or grid cell shows for a label.
WORDS = {"pays": "pays", "loses": "loses", "inconclusive": "?", "invalid": "bad ids"}


def map_grids(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The cells of one scenario and mode as grids, one per working-set panel (in ratio order): a row per prompt
    length, a column per shared share; a measured cell reads its saving with its interval and ``pays``, ``loses``
    or ``?`` (inconclusive), a cell the model filled in ``≈`` and the prediction with its interval."""
    out = []
    shares = sorted(cells["shared_pct"].astype(int).unique())
    for panel in sorted(dict.fromkeys(cells["panel"]), key=panel_rank):
        part = cells[cells["panel"] == panel]
        rows = []
        for n, line in part.groupby("prompt_tokens", sort=True):
            by = {int(r["shared_pct"]): r for r in line.to_dict("records")}
            row = [f"{int(n):,}"]
            for pct in shares:
                r = by.get(pct)
                if r is None:
                    row.append("")
                elif r["source"] == "measured":
                    row.append(f"{pct_interval(r['saving_pct'], r['saving_ci_low'], r['saving_ci_high'])} "
                               f"{WORDS.get(r['label'], r['label'])}")
                else:
                    row.append("≈" + pct_interval(r["predicted_saving_pct"], r["predicted_ci_low"],
                                                  r["predicted_ci_high"]))
            rows.append(row)
        out.append((panel, pd.DataFrame(rows, columns=["prompt"] + [f"{p}% shared" for p in shares], dtype=object)))
    return out


def map_finding(cells: pd.DataFrame, mode: str) -> str:
    """One line on a mode's map: how many measured cells pay, lose, stay inconclusive or are invalid, the largest
    measured saving that pays (its cell), and how many cells the model filled in."""
    measured = cells[cells["source"] == "measured"]
    counts = measured["label"].value_counts()
    told = ", ".join(f"{int(counts[k])} {k}" for k in ("pays", "loses", "inconclusive", "invalid") if k in counts)
    pays = measured[measured["label"] == "pays"]
    best = ""
    if len(pays):
        r = pays.loc[pays["saving_pct"].idxmax()]
        saving = pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"])
        best = (f"; the largest saving that pays: {saving} at {int(r['prompt_tokens'])} tokens, "
                f"{int(r['shared_pct'])}% shared, working set {r['panel']} the budget")
    return (f"break-even map, `{mode}`: of {len(measured)} measured cells {told or 'none'}{best}; "
            f"{len(cells) - len(measured)} more cells filled in by the fitted model")


def constant_lines(m: BreakEvenMap) -> list[str]:
    """Per fitted scenario and mode: each constant with its 95% interval and unit, the restore bandwidths where
    the trials give bytes, and what it was fitted to: trials, units, prompt lengths (tokens), machine load, runs;
    then the map's notes."""
    lines = []
    for (group, mode), fit in m.fits.items():
        if fit is None:
            continue
        parts = []
        for name, v in fit.values.items():
            if v != v:
                continue
            label, unit, scale = UNITS.get(name, (name.removesuffix("_s_per_token").replace("_", " "), "µs/token",
                                                  1e6))
            parts.append(f"{label} {v * scale:,.3g} [{fit.low[name] * scale:,.3g}, {fit.high[name] * scale:,.3g}] "
                         f"{unit}")
        for tier, (bw, lo, hi) in fit.bandwidth.items():
            parts.append(f"{tier} restore bandwidth " + (
                f"{bw / 1e9:,.3g} GB/s [{lo / 1e9:,.3g}, {hi / 1e9:,.3g}]" if math.isfinite(bw) else
                "too fast to tell from these trials (its time is below their noise)"))
        low, high = fit.prompt_tokens
        load = ("BUSY: trials measured on a busy machine, not a measurement of it" if fit.busy else
                f"{fit.busy_left_out} busy trials left out" if fit.busy_left_out else "no busy trial")
        lines.append(f"{group} {mode}: " + "; ".join(parts) + f" (fitted to {fit.trials} trials from {fit.units} "
                     f"independent units, prompts of {low:,}–{high:,} tokens, {load}, TTFT residual "
                     f"{fit.residual_s * 1e3:.1f} ms; runs: {', '.join(fit.runs)})")
    return lines + m.notes


def break_even_report(results: Results, out_dir: str | Path, prices: Prices,
                      shares: tuple[int, ...] = DEFAULT_SHARES, contexts: tuple[int, ...] = (),
                      host_tier: str = "configured") -> BreakEvenMap:
    """What ``kvbench map`` computes and writes: :func:`kvbench.analysis.break_even.break_even_map` of
    ``results`` (from :func:`kvbench.results.load.load_results`), then :func:`write_map` into ``out_dir`` when it
    has cells; the map's ``files`` are those written.

    Raises:
        kvbench.errors.BadParameter: ``results`` is not a :class:`~kvbench.results.load.Results`, or an argument
            :func:`~kvbench.analysis.break_even.break_even_map` refuses.
        kvbench.errors.ResultsError: ``results`` holds no trial of a ``shared_prefix`` run.
        kvbench.errors.SymlinkRefused, kvbench.errors.UnwritableOutput: as :func:`write_map`.
    """
    if not isinstance(results, Results):
        raise BadParameter(f"{{results}} must be kvbench.load_results(...), not {type(results).__name__}", "results")
    m = break_even_map(results.trials, prices, shares, contexts, host_tier)
    if m.cells.empty:
        raise ResultsError("no shared_prefix trials in these results: the map needs a run of a scenario with "
                           "workload.shared_prefix (e.g. scenarios/break_even.yaml)")
    m.files = write_map(m, path_arg(out_dir, "out_dir"), prices)
    return m


def write_map(m: BreakEvenMap, out_dir: str | Path, prices: Prices) -> list[Path]:
    """``map.csv`` (the cells, raw numbers), ``map.json`` (the prices, the cells and the fitted constants with their
    intervals, sources and footing: ``prompt_tokens`` [shortest, longest], ``busy`` (fitted to busy trials only),
    ``busy_trials_left_out``, ``load_unknown_trials``, and ``draws``: each constant's bootstrap values, 6
    significant digits, from which ``kvbench simulate`` draws its intervals) and ``map_<scenario>_<mode>.png``
    (:func:`break_even_heatmap`; names as :func:`~kvbench.safe_text.unique_stems` makes them) in ``out_dir``
    (created); returns their paths. Each file is written beside its place and moved onto it. A heatmap that
    cannot be drawn is left out with a :class:`~kvbench.report.charts.ChartWarning` that says why; the other files
    are written.

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written (an ``OSError``).
    """
    out = Path(out_dir)
    refuse_symlink_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        cells = m.cells
        paths = [replacing(out / "map.csv", lambda tmp: cells.to_csv(tmp, index=False) or tmp)]
        fits = [{"group": g, "mode_label": mode, "values": f.values, "ci_low": f.low, "ci_high": f.high,
                 "bandwidth_bytes_per_s": {t: list(b) for t, b in f.bandwidth.items()}, "trials": f.trials,
                 "units": f.units, "runs": f.runs, "ttft_residual_s": f.residual_s,
                 "prompt_tokens": list(f.prompt_tokens), "busy": f.busy, "busy_trials_left_out": f.busy_left_out,
                 "load_unknown_trials": f.load_unknown,
                 "draws": {k: [float(f"{x:.6g}") for x in v] for k, v in f.draws.items() if np.isfinite(v).all()}}
                for (g, mode), f in m.fits.items() if f is not None]
        doc = {"prices": dataclasses.asdict(prices), "cells": json.loads(cells.to_json(orient="records")),
               "constants": fits, "notes": m.notes}
        paths.append(replacing(out / "map.json", lambda tmp: tmp.write_text(
            json.dumps(finite_json(doc), indent=2, allow_nan=False) + "\n")))
        maps = list(cells.groupby(["group", "mode_label"], sort=False))
        for ((group, mode), part), stem in zip(maps, unique_stems([key for key, _ in maps])):
            png = replacing_chart(out / f"map_{stem}.png", lambda tmp, p=part, g=group, md=mode: break_even_heatmap(
                p, f"{g}, {md}: saving of restore against recompute", tmp), f"map of {group}, {mode}")
            if png is not None:
                paths.append(png)
        return [p for p in paths if p is not None]
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(exc.filename or out, exc.strerror or str(exc)) from exc


__all__ = ["WORDS", "break_even_report", "constant_lines", "map_display", "map_finding", "map_grids", "write_map"]
