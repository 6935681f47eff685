"""``kvbench report``: the per-point table, findings, a recommendation per scenario and diagnoses, computed from
measurements, written as ``summary.csv``, ``summary.md``, PNG charts, ``report.md`` and a self-contained
``report.html`` (images embedded as data URIs, no scripts, no network)."""

from __future__ import annotations

import base64
import contextlib
import html
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.report import charts, scratch_dir
from kvbench.analysis.points import KV_CHECK_TOLERANCE, point_table, qualifies
from kvbench.results.load import Results
from kvbench.report.chart_pool import chart_pool
from kvbench.analysis.intervals import pct_interval
from kvbench.report.md_text import md_escape, md_line
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.safe_read import open_regular
from kvbench.analysis.reuse import reuse_later_turns, reuse_table, reuse_trials

MIB, GIB = 2**20, 2**30
#: KV smaller than this fraction of the weights makes offload's savings invisible in device memory.
KV_SMALL_FRACTION = 0.10
#: Panels per memory-timeline figure.
TIMELINE_PANELS = 8
#: A decode step moving more than this fraction of the measured link bandwidth is link-bound.
LINK_BOUND_FRACTION = 0.8


# --------------------------------------------------------------------------- formatting


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def size_unit(values: pd.Series) -> tuple[str, int]:
    """("GiB", 2**30) when the largest value is at least 10 GiB, else ("MiB", 2**20)."""
    top = pd.to_numeric(values, errors="coerce").max()
    return ("GiB", GIB) if not _missing(top) and top >= 10 * GIB else ("MiB", MIB)


def _size(v: Any, unit: int) -> str:
    return "-" if _missing(v) else f"{v / unit:,.1f}"


def _ms(v: Any) -> str:
    if _missing(v):
        return "-"
    ms = v * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def _range_ms(med: Any, lo: Any, hi: Any) -> str:
    """Seconds as ``median [min–max]`` in milliseconds."""
    if _missing(med):
        return "-"
    return _ms(med) if lo == hi else f"{_ms(med)} [{_ms(lo)}–{_ms(hi)}]"


def _spread(row: Any, col: str) -> str:
    """A point's ``<col>_median`` ``[min–max]`` in milliseconds."""
    return _range_ms(row[f"{col}_median"], row[f"{col}_min"], row[f"{col}_max"])


def _ci(row: Any, col: str) -> str:
    lo, hi = row[f"{col}_ci_low"], row[f"{col}_ci_high"]
    return "-" if _missing(lo) else f"{_ms(lo)}–{_ms(hi)}"


def _pct(v: Any, signed: bool = False) -> str:
    return "n/a" if _missing(v) else (f"{v:+.1f}" if signed else f"{v:.1f}")


_STATUSES = ("ok", "over_budget", "skipped", "error", "oom", "other")


def _status(row: Any) -> str:
    """Trial counts per status, e.g. ``3 ok, 2 error`` (statuses kvbench does not know: ``other``)."""
    return ", ".join(f"{n} {s.replace('_', ' ')}" for s in _STATUSES if (n := int(row.get(f"n_{s}", 0))))


def _match(v: Any) -> str:
    return "-" if _missing(v) else ("yes" if v else "NO")


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The per-point table formatted for people: units in the headers, sizes in MiB (GiB for columns reaching
    10 GiB), times in ms as ``median [min–max]``, percentages against ``none`` (n/a without a baseline)."""
    kv_name, kv_unit = size_unit(table["kv_device_peak_bytes_median"])
    dev_name, dev_unit = size_unit(table["peak_device_allocated_bytes_median"])
    spread = [f"{m}_{x}" for m in ("ttft_s", "tpot_s", "e2e_s") for x in ("median", "min", "max")]
    used = ["group", "prompt_tokens", "batch_size", "mode", "mode_label", *(f"n_{s}" for s in _STATUSES), *spread,
            "tpot_s_ci_low", "tpot_s_ci_high", "throughput_tokens_per_s_median", "kv_device_peak_bytes_median",
            "peak_device_allocated_bytes_median", "memory_saving_pct", "time_overhead_pct", "time_overhead_ci_low",
            "time_overhead_ci_high", "throughput_ratio", "throughput_ratio_ci_low", "throughput_ratio_ci_high",
            "pairs", "tpot_verdict", "itl_p99_s", "n_busy", "measured", "tokens_match"]
    rows = []
    # plain dicts of the columns used: far faster than iterrows, or to_dict of all ~100 columns, on 1000s of points
    for r in table[[c for c in used if c in table]].to_dict("records"):
        rec = {"scenario": r["group"], "prompt (tokens)": int(r["prompt_tokens"]), "batch": int(r["batch_size"]),
               "mode": r["mode_label"], "trials": _status(r),
               "TTFT (ms)": _spread(r, "ttft_s"), "TPOT (ms)": _spread(r, "tpot_s"),
               "TPOT 95% CI (ms)": _ci(r, "tpot_s"), "e2e (ms)": _spread(r, "e2e_s"),
               "tokens/s (e2e)": "-" if _missing(r["throughput_tokens_per_s_median"])
               else f"{r['throughput_tokens_per_s_median']:,.1f}",
               f"KV device peak ({kv_name})": _size(r["kv_device_peak_bytes_median"], kv_unit),
               f"device peak ({dev_name})": _size(r["peak_device_allocated_bytes_median"], dev_unit),
               "ITL p99 (ms)": _ms(r["itl_p99_s"]),
               "memory saving (%)": _pct(r["memory_saving_pct"]),
               "time overhead (%)": pct_interval(r["time_overhead_pct"], r["time_overhead_ci_low"],
                                                 r["time_overhead_ci_high"], 1).replace("%", ""),
               "throughput (× none)": _ratio_interval(r["throughput_ratio"], r["throughput_ratio_ci_low"],
                                                      r["throughput_ratio_ci_high"]),
               "pairs": str(int(r["pairs"])),
               "verdict": "-" if not r["measured"] else (
                   r["tpot_verdict"] or f"decided: {'slower' if r['time_overhead_pct'] > 0 else 'faster'} than none"),
               **({"memory saving (%)": "ref", "time overhead (%)": "ref", "throughput (× none)": "ref", "pairs": "-",
                   "verdict": "-"} if r["mode"] == "none" and not _missing(r["tpot_s_median"]) else {}),
               "busy trials": f"{int(r['n_busy'])} of {int(r['measured'])}",
               "ids match none": _match(r["tokens_match"])}
        rows.append(rec)
    return pd.DataFrame(rows)


def _ratio_interval(v: Any, lo: Any, hi: Any) -> str:
    """A ratio with its 95% interval, e.g. ``0.91 [0.85, 0.97]``; the ratio alone without an interval (fewer than 5
    values); ``n/a`` without a ratio."""
    if _missing(v):
        return "n/a"
    return f"{v:.2f}" if _missing(lo) or _missing(hi) else f"{v:.2f} [{lo:.2f}, {hi:.2f}]"


def terminal_frame(shown: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The columns of :func:`display_frame`'s output that fit a terminal: TTFT median only; the overhead with its
    interval in whole percent; no scenario (one table per scenario), e2e, TPOT interval, ITL, allocator peak,
    throughput ratio, verdict text (the findings give it) or busy count; shorter headers."""
    frame = shown.drop(columns=["scenario", "e2e (ms)", "TPOT 95% CI (ms)", "throughput (× none)", "ITL p99 (ms)",
                                "verdict", "busy trials", *[c for c in shown.columns if c.startswith("device peak")]])
    frame["TTFT (ms)"] = [_ms(v) for v in table["ttft_s_median"]]
    frame["time overhead (%)"] = ["ref" if m == "none" and c == "ref" else
                                  pct_interval(v, lo, hi).replace("%", "")
                                  for m, c, v, lo, hi in zip(table["mode"], shown["time overhead (%)"],
                                                             table["time_overhead_pct"], table["time_overhead_ci_low"],
                                                             table["time_overhead_ci_high"])]
    kv = next(c for c in frame.columns if c.startswith("KV device peak"))
    return frame.rename(columns={"prompt (tokens)": "prompt", "TTFT (ms)": "TTFT ms", "TPOT (ms)": "TPOT ms",
                                 "tokens/s (e2e)": "tok/s e2e", kv: kv.replace("KV device peak (", "KV dev ").rstrip(")"),
                                 "memory saving (%)": "saved %", "time overhead (%)": "overhead %",
                                 "ids match none": "= none"})


def reuse_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvbench.analysis.reuse.reuse_table` formatted for people: TTFT of recompute (cold) and restore (warm) in ms
    as ``median [min–max]``, their ratio, tokens restored (median), hit rate and bytes restored per tier (totals)."""
    if table.empty:
        return pd.DataFrame()
    by = "turn" if "turn_index" in table else "prompt (tokens)"
    unit_name, unit = size_unit(pd.concat([table["restore_host_bytes"], table["restore_disk_bytes"]]))
    rows = []
    for r in table.to_dict("records"):
        rows.append({
            "scenario": r["group"], "mode": r["mode_label"],
            by: int(r["turn_index"]) if by == "turn" else r["length_bin"],
            "prompt (tokens, median)": f"{r['prompt_tokens']:,.0f}",
            "recompute TTFT (ms)": _range_ms(r["cold_ttft_s"], r["cold_ttft_s_min"], r["cold_ttft_s_max"]),
            "restore TTFT (ms)": _range_ms(r["warm_ttft_s"], r["warm_ttft_s_min"], r["warm_ttft_s_max"]),
            "restore ÷ recompute": _ratio_interval(r["ttft_ratio"], r.get("ttft_ratio_ci_low"),
                                                   r.get("ttft_ratio_ci_high")),
            "pairs": str(int(r.get("pairs", 0))),
            "verdict": r.get("ttft_verdict") or (
                f"decided: restore {'faster' if r['ttft_ratio'] < 1 else 'slower'}" if r.get("pairs") else "-"),
            "tokens restored": "-" if _missing(r["tokens_restored"]) else f"{r['tokens_restored']:,.0f}",
            "hit rate (%)": "-" if _missing(r["hit_rate"]) else f"{100 * r['hit_rate']:.0f}",
            f"restored from host ({unit_name}, total)": _size(r["restore_host_bytes"], unit),
            f"restored from disk ({unit_name}, total)": _size(r["restore_disk_bytes"], unit),
            "prefill saved (%)": _pct(r["prefill_saved_pct"]),
            "ids match none": "near tie" if r["tokens_match"] == "near tie" else _match(r["tokens_match"]),
            "trials": f"{r['n']} warm" + (f", {r['failed']} failed" if r["failed"] else ""),
        })
    return pd.DataFrame(rows)


def reuse_terminal(shown: pd.DataFrame) -> pd.DataFrame:
    """The columns of :func:`reuse_display`'s output that fit a terminal, with shorter headers."""
    keep = {"mode": "mode", "turn": "turn", "prompt (tokens)": "prompt", "prompt (tokens, median)": "prompt",
            "recompute TTFT (ms)": "recompute TTFT ms", "restore TTFT (ms)": "restore TTFT ms",
            "restore ÷ recompute": "÷", "pairs": "pairs", "tokens restored": "restored", "hit rate (%)": "hit %",
            "ids match none": "= none"}
    frame = shown[[c for c in shown.columns if c in keep]]
    return frame.rename(columns=keep)


def reuse_findings(turns: pd.DataFrame, group: str, later: pd.DataFrame | None = None) -> list[str]:
    """Per mode: restore's TTFT against recompute's from the second turn on (pooled and paired by request, with its
    interval, pair count and verdict, from ``later`` = :func:`kvbench.analysis.reuse.reuse_later_turns`; and turn by turn),
    the prefill it saved and the store's hit rate; and whether restored runs generated ``none``'s ids."""
    t = turns[turns["group"] == group]
    pooled = {} if later is None or later.empty else {
        r["mode_label"]: r for r in later[later["group"] == group].to_dict("records")}
    out = []
    for mode, part in t.groupby("mode_label", sort=False):
        turns_on = part[part["turn_index"] >= 2].dropna(subset=["ttft_ratio"])
        if turns_on.empty:
            out.append(f"`{mode}`: no measured request after a first turn: nothing could be restored")
            continue
        ratios = ", ".join(f"{r:.2f}" for r in turns_on["ttft_ratio"])
        hit = turns_on["hit_rate"].mean()
        saved = 100 * turns_on["warm_tokens_restored"].sum() / turns_on["warm_prompt_tokens"].sum()
        p = pooled.get(mode)
        head = "" if p is None else (
            f"{_ratio_interval(p['ttft_ratio'], p['ttft_ratio_ci_low'], p['ttft_ratio_ci_high'])} over "
            f"{int(p['pairs'])} request pairs{': ' + p['ttft_verdict'] if p['ttft_verdict'] else ''}; ")
        out.append(f"`{mode}`: restore ÷ recompute TTFT from turn 2 on: {head}{ratios} (turn by turn); {saved:.0f}% "
                   f"of those turns' prompt tokens restored, not prefilled; chunk hit rate "
                   f"{'n/a' if _missing(hit) else f'{100 * hit:.0f}%'} (mean of the turns')")
    bad = t[t["tokens_match"].eq(False)]
    near = t[t["tokens_match"].eq("near tie")]
    if not bad.empty:
        out.append(f"ids DIFFER from recompute beyond a near tie in {', '.join(sorted(set(bad['mode_label'])))}: "
                   "a bug (restored KV must give the same tokens)")
    elif not near.empty:
        out.append("restored runs picked another token only at near ties (recompute's top-2 logits within 1e-3)")
    elif t["tokens_match"].eq(True).all():
        out.append("every restored run generated the same ids as recomputing the request with `none`")
    return out


def reuse_recommendation(turns: pd.DataFrame, group: str, later: pd.DataFrame | None = None) -> str:
    """The mode whose restore gives the lowest median TTFT from turn 2 on, among those whose ids match; restoring is
    recommended only where ``later`` (:func:`kvbench.analysis.reuse.reuse_later_turns`: restore ÷ recompute from turn 2,
    paired by request) decides that restore is faster; otherwise the line says why not."""
    t = turns[(turns["group"] == group) & (turns["turn_index"] >= 2)]
    t = t[t["tokens_match"].isin([True, "near tie"])]
    if t.empty or t["warm_ttft_s"].isna().all():
        return "no measured reuse after a first turn: nothing to recommend"
    best = t.groupby("mode_label")["warm_ttft_s"].median().sort_values()
    mode = best.index[0]
    cold = t[t["mode_label"] == mode]["cold_ttft_s"].median()
    figures = (f"with `{mode}`, TTFT from turn 2 on is {best.iloc[0] * 1e3:,.0f} ms against {cold * 1e3:,.0f} ms "
               "recomputing (median over turns)")
    p = None if later is None or later.empty else next(
        (r for r in later.to_dict("records") if r["group"] == group and r["mode_label"] == mode), None)
    if p is None:
        return f"no paired restore ÷ recompute from turn 2 on: no recommendation; {figures}"
    ratio = _ratio_interval(p["ttft_ratio"], p["ttft_ratio_ci_low"], p["ttft_ratio_ci_high"])
    if p["ttft_verdict"]:
        return f"restore or recompute: {p['ttft_verdict']} (restore ÷ recompute {ratio}); {figures}"
    if p["ttft_ratio"] >= 1:
        return (f"restoring does not pay here: restore ÷ recompute {ratio} over {int(p['pairs'])} request pairs; "
                f"{figures}")
    return (f"keep finished requests' KV and restore it: {figures}; restore ÷ recompute {ratio} over "
            f"{int(p['pairs'])} request pairs")


def _ratio(v: Any) -> str:
    return "-" if _missing(v) else f"{v:.2f}"


def plan_frame(table: pd.DataFrame) -> pd.DataFrame:
    """Measured next to ``kvbench plan``'s prediction, for the points whose trials carry one (``plan_*`` fields):
    device KV, host→device bytes per decode step and TPOT vs the roofline's step time, each with measured ÷
    predicted. Columns: ``scenario`` then text cells."""
    t = table[table["plan_kv_device_bytes_median"].notna()] if "plan_kv_device_bytes_median" in table else table[:0]
    rows = []
    used = ["group", "prompt_tokens", "batch_size", "mode_label", "plan_kv_device_bytes_median",
            "kv_device_peak_bytes_median", "kv_device_vs_plan", "plan_link_bytes_per_step_median",
            "h2d_bytes_per_step_median", "link_vs_plan", "plan_tpot_s_median", "tpot_s_median", "tpot_vs_plan"]
    for r in t[used].to_dict("records"):
        rows.append({"scenario": r["group"], "prompt (tokens)": int(r["prompt_tokens"]), "batch": int(r["batch_size"]),
                     "mode": r["mode_label"],
                     "device KV plan (MiB)": _size(r["plan_kv_device_bytes_median"], MIB),
                     "device KV measured (MiB)": _size(r["kv_device_peak_bytes_median"], MIB),
                     "device KV ×": _ratio(r["kv_device_vs_plan"]),
                     "H2D per step plan (MiB)": _size(r["plan_link_bytes_per_step_median"], MIB),
                     "H2D per step measured (MiB)": _size(r["h2d_bytes_per_step_median"], MIB),
                     "H2D ×": _ratio(r["link_vs_plan"]),
                     "TPOT roofline (ms)": _ms(r["plan_tpot_s_median"]),
                     "TPOT measured (ms)": _ms(r["tpot_s_median"]), "TPOT ×": _ratio(r["tpot_vs_plan"])})
    return pd.DataFrame(rows, columns=["scenario", "prompt (tokens)", "batch", "mode", "device KV plan (MiB)",
                                       "device KV measured (MiB)", "device KV ×", "H2D per step plan (MiB)",
                                       "H2D per step measured (MiB)", "H2D ×", "TPOT roofline (ms)",
                                       "TPOT measured (ms)", "TPOT ×"])


def capacity_display(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvbench.analysis.capacity.capacity_frame`'s table as text cells: the fixed value, mode, capacity, the probes
    (✗ = did not fit), tokens/s and device KV at the capacity, whether its ids matched ``none``, and why the
    search stopped there."""
    rows = []
    for r in frame.to_dict("records"):
        fixed = ("batch", "batch_size") if r["searched"] == "prompt_tokens" else ("prompt (tokens)", "prompt_tokens")
        cap = r["capacity"]
        rows.append({fixed[0]: int(r[fixed[1]]), "mode": r["mode_label"],
                     "capacity": "-" if _missing(cap) else str(int(cap)), "probes": r["probes"],
                     "tokens/s (e2e)": "-" if _missing(r["throughput_tokens_per_s_median"])
                     else f"{r['throughput_tokens_per_s_median']:,.1f}",
                     "KV device peak (MiB)": _size(r["kv_device_peak_bytes_median"], MIB),
                     "ids match none": _match(r["tokens_match"]), "why it stops there": r["stopped"]})
    return pd.DataFrame(rows)


def capacity_frames(results: Results, table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per group, the capacity search results of its runs (run.json ``capacity``) with the measured figures at
    each capacity (:func:`kvbench.analysis.capacity.capacity_frame`); groups without a search are left out."""
    out = {}
    for run in results.runs:
        if run.get("capacity"):
            from kvbench.analysis.capacity import capacity_frame

            g = run["group"]
            frame = capacity_frame(run["capacity"], table[table["group"] == g])
            out[g] = pd.concat([out[g], frame], ignore_index=True) if g in out else frame
    return out


def _fixed_at(fixed: str, value: Any) -> str:
    """The fixed value of a capacity search in words: ``512 tokens`` or ``batch 2``."""
    return f"{int(value)} tokens" if fixed == "prompt_tokens" else f"batch {int(value)}"


def capacity_recommendation(frame: pd.DataFrame) -> str:
    """The advice of a capacity search, among modes whose ids matched ``none`` at their capacity: per prompt length
    of a batch search, the mode with the most tokens/s at its capacity against ``none`` at its own; per batch size
    of a prompt-length search, the mode that fits the longest prompt."""
    lines = []
    searched = frame["searched"].iloc[0]
    fixed = "prompt_tokens" if searched == "batch_size" else "batch_size"
    what = "batch" if searched == "batch_size" else "prompt"
    for value, part in frame.groupby(fixed, sort=False):
        at = _fixed_at(fixed, value)
        ok = part[part["capacity"].notna() & part["throughput_tokens_per_s_median"].notna()
                  & part["tokens_match"].map(lambda v: v is not False)]
        if ok.empty:
            lines.append(f"at {at} no mode fits the budget: raise the budget or shorten the context")
            continue
        if searched == "prompt_tokens":  # tokens/s at different prompt lengths do not compare: the longest wins
            best = ok.loc[ok["capacity"].idxmax()]
            base = ok[ok["mode_label"] == "none"]
            if best["mode_label"] == "none" or (len(base) and base["capacity"].iloc[0] >= best["capacity"]):
                lines.append(f"at {at} no offload needed: `none` fits the longest prompt "
                             f"({int(best['capacity'])} tokens)")
            else:
                vs = (f", {best['capacity'] / base['capacity'].iloc[0]:.2f}× `none`'s {int(base['capacity'].iloc[0])}"
                      if len(base) else "")
                lines.append(f"at {at} use `{best['mode_label']}` for long contexts: it fits "
                             f"{int(best['capacity'])} prompt tokens{vs}")
            continue
        best = ok.loc[ok["throughput_tokens_per_s_median"].idxmax()]
        base = ok[ok["mode_label"] == "none"]
        if best["mode_label"] == "none":
            lines.append(f"at {at} no offload needed: `none` at its capacity ({what} {int(best['capacity'])}) gives "
                         f"the most tokens/s ({best['throughput_tokens_per_s_median']:,.1f})")
            continue
        line = (f"at {at} use `{best['mode_label']}`: {what} {int(best['capacity'])} fits, "
                f"{best['throughput_tokens_per_s_median']:,.1f} tokens/s")
        if len(base):
            b = base.iloc[0]
            line += (f", {best['throughput_tokens_per_s_median'] / b['throughput_tokens_per_s_median']:.2f}× `none` "
                     f"at its capacity ({what} {int(b['capacity'])})")
        lines.append(line)
    return "; ".join(lines)


def capacity_findings(frame: pd.DataFrame) -> list[str]:
    """Plain-language lines: per fixed value, each mode's capacity and throughput there against ``none``'s."""
    out = []
    for r in frame.to_dict("records"):
        searched = r["searched"]
        fixed = "prompt_tokens" if searched == "batch_size" else "batch_size"
        at = _fixed_at(fixed, r[fixed])
        what = "largest batch" if searched == "batch_size" else "longest prompt"
        if _missing(r["capacity"]):
            out.append(f"at {at}, `{r['mode_label']}` fit nothing within the budget ({r['stopped']})")
            continue
        base = frame[(frame[fixed] == r[fixed]) & (frame["mode_label"] == "none")]
        line = f"at {at}, `{r['mode_label']}`: {what} {int(r['capacity'])}"
        tps = r["throughput_tokens_per_s_median"]
        if not _missing(tps):
            line += f", {tps:,.1f} tokens/s there"
        if r["mode_label"] != "none" and len(base) and not _missing(base["capacity"].iloc[0]):
            b = base.iloc[0]
            line += f" ({r['capacity'] / b['capacity']:.2f}× none's {int(b['capacity'])}"
            if searched == "batch_size" and not _missing(tps) and not _missing(b["throughput_tokens_per_s_median"]):
                line += f", {tps / b['throughput_tokens_per_s_median']:.2f}× its tokens/s"
            line += ")"
        out.append(line)
    return out


# --------------------------------------------------------------------------- findings


def _pt(r: Any) -> str:
    return f"{int(r['prompt_tokens'])} tokens × batch {int(r['batch_size'])}"


def findings(table: pd.DataFrame, group: str) -> list[str]:
    """Plain-language findings at the group's longest prompt (every batch size): what each mode saved of device
    KV memory and what it cost in TPOT, against ``none`` there."""
    t = table[table["group"] == group]
    if not (t["mode"] == "none").any() or t["memory_saving_pct"].notna().sum() == 0:
        return [f"no measured `none` baseline in {group}: savings and overheads are n/a"]
    longest = t.loc[t["memory_saving_pct"].notna(), "prompt_tokens"].max()
    out = []
    for _, r in t[(t["prompt_tokens"] == longest) & (t["mode"] != "none")].iterrows():
        if _missing(r["memory_saving_pct"]) or _missing(r["time_overhead_pct"]):
            continue
        out.append(f"at {_pt(r)}, `{r['mode_label']}` saved {r['memory_saving_pct']:.0f}% of device KV memory "
                   f"({r['kv_device_peak_bytes_median'] / MIB:,.1f} MiB left) for {_overhead(r)} TPOT "
                   f"({_ms(r['tpot_s_median'])} ms per token; {_pairs(r)})" + _verdict_tail(r))
    return out


def _overhead(r: Any) -> str:
    """A point's paired TPOT overhead vs ``none`` with its interval, e.g. ``+9% [+5%, +14%]``."""
    return pct_interval(r["time_overhead_pct"], r["time_overhead_ci_low"], r["time_overhead_ci_high"])


def _pairs(r: Any) -> str:
    n = int(r["pairs"])
    return f"{n} pair{'s' if n != 1 else ''} with none"


def _verdict_tail(r: Any) -> str:
    """``": inconclusive: …"`` (or implausible) when the comparison may not claim anything; empty when it may."""
    return f": {r['tpot_verdict']}" if r["tpot_verdict"] else ""


def recommendation(table: pd.DataFrame, group: str) -> str:
    """The article's per-scenario advice, from measurements: "no offload needed" when ``none`` fits the budget
    at every measured point; otherwise, at the most demanding point where ``none`` does not fit, the mode (and
    window) that fits with the least TPOT."""
    t = table[table["group"] == group]
    base = t[(t["mode"] == "none") & ((t["measured"] > 0) | (t["n_oom"] > 0))]
    where = "the budget" if t["budget_bytes"].notna().any() else "device memory"
    if base.empty:
        return f"no measured `none` baseline in {group}: no recommendation"
    # `none` does not fit where a trial went over the budget or ran out of memory (errors say nothing about fit)
    misfits = base[(base["n_over_budget"] > 0) | (base["n_oom"] > 0)]
    if misfits.empty:
        last = base.sort_values(["prompt_tokens", "batch_size"]).iloc[-1]
        return f"no offload needed: `none` fits {where} at every measured point (up to {_pt(last)})"
    worst = misfits.sort_values(["prompt_tokens", "batch_size"]).iloc[-1]
    here = t[(t["prompt_tokens"] == worst["prompt_tokens"]) & (t["batch_size"] == worst["batch_size"])
             & (t["mode"] != "none")]
    cands = here[qualifies(here) & here["tpot_s_median"].notna()]
    first = misfits.sort_values(["prompt_tokens", "batch_size"]).iloc[0]
    why = "over budget" if first["n_over_budget"] else "out of memory"
    head = f"`none` does not fit {where} from {_pt(first)} ({why})"
    if cands.empty:
        return f"{head}; at {_pt(worst)} no measured mode fits: raise the budget or shorten the context"
    ranked = cands.sort_values("tpot_s_median")
    best = ranked.iloc[0]
    busy = int(cands["n_busy"].sum())
    if busy:  # which fits is exact (bytes); which is fastest was measured on a busy machine: no ranking
        fits = ", ".join(f"`{r['mode_label']}` ({r['kv_device_peak_bytes_median'] / MIB:,.1f} MiB)"
                         for _, r in cands.iterrows())
        return (f"{head}; at {_pt(worst)} these fit (device KV): {fits}; which has the least TPOT is inconclusive: "
                f"the machine was busy during {busy} of their {int(cands['measured'].sum())} trials")
    over = "" if _missing(best["time_overhead_pct"]) else (f", {_overhead(best)} vs none, {int(best['pairs'])} "
                                                           f"pairs{_verdict_tail(best)}")
    text = (f"{head}; at {_pt(worst)} use `{best['mode_label']}`: it fits with the least TPOT "
            f"({_ms(best['tpot_s_median'])} ms{over}, device KV {best['kv_device_peak_bytes_median'] / MIB:,.1f} MiB)")
    close = [r["mode_label"] for _, r in ranked.iloc[1:].iterrows() if r["tpot_s_min"] <= best["tpot_s_max"]]
    if close:  # the TPOT ranges overlap: the measurements do not separate them
        text += (f"; {', '.join(f'`{m}`' for m in close)} overlap{'s' if len(close) == 1 else ''} its TPOT range "
                 f"[{_ms(best['tpot_s_min'])}–{_ms(best['tpot_s_max'])} ms]: more repeats would tell them apart")
    return text


def diagnoses(results: Results, table: pd.DataFrame, group: str) -> list[str]:
    """Problems found in a group, in the spirit of the article's troubleshooting table: outputs that diverged,
    KV accounting off the analytic prediction by more than 25%, failed trials, savings invisible because KV is
    small next to the weights, and decode steps that are link-bound or slower than the link explains."""
    t = table[table["group"] == group]
    out = []
    for _, r in t[t["tokens_match"].map(lambda v: v is False)].iterrows():
        out.append(f"outputs diverged: `{r['mode_label']}` at {_pt(r)} generated other ids than `none` (first at "
                   f"step {int(r['first_divergence_step']) if not _missing(r['first_divergence_step']) else '?'}): "
                   "a bug in that mode, not a trade-off")
    for _, r in t[t["kv_check_flagged"] > 0].iterrows():
        out.append(f"KV accounting off the prediction: `{r['mode_label']}` at {_pt(r)} held "
                   f"{r['kv_check_worst']:+.0%} vs 2 × layers × kv_heads × head_dim × bytes × tokens × batch in "
                   f"{int(r['kv_check_flagged'])} trial(s) (tolerance ±{KV_CHECK_TOLERANCE:.0%})")
    for _, r in t[(t["n_error"] > 0) | (t["n_oom"] > 0)].iterrows():
        out.append(f"failed: `{r['mode_label']}` at {_pt(r)}: {int(r['n_error'] + r['n_oom'])} trial(s); "
                   f"first: {r['message']}")
    measured = int(t["measured"].sum())
    busy = int(t["n_busy"].sum())
    if busy:
        out.append(f"busy machine: other processes used at least "
                   f"{_busy_threshold(results, group)} during {busy} of {measured} measured trials: comparisons "
                   "that include them are inconclusive; rerun on a quiet machine (a new run: `--resume` does not "
                   "rerun finished trials)")
    rows = results.trials[results.trials["group"] == group]
    if "disk_page_cache_dropped" in rows:
        kept = rows[rows["disk_page_cache_dropped"].map(lambda v: v is False)]
        for mode, part in kept.groupby("mode_label", sort=False):
            out.append(f"disk timings measure RAM: `{mode}` kept its disk tier in the page cache in {len(part)} "
                       "trial(s) (scenario disk: {page_cache: true}, or posix_fadvise missing): its disk reads "
                       "came from memory, not the device")
    runs = [r for r in results.runs if r.get("group") == group]
    weights = next((r["weights_bytes"] for r in runs if r.get("weights_bytes")), None)
    base = t[(t["mode"] == "none") & t["kv_bytes_predicted_median"].notna()]
    if weights and not base.empty:
        kv = base["kv_bytes_predicted_median"].max()
        if kv < KV_SMALL_FRACTION * weights:
            out.append(f"savings invisible: the largest KV here is {kv / MIB:,.1f} MiB next to {weights / MIB:,.0f} "
                       f"MiB of weights ({kv / weights:.0%}); offloading it cannot free more than "
                       f"{kv / (kv + weights):.0%} of device memory (activations not counted)")
    links = [r["environment"].get("link_bandwidth") for r in runs if r["environment"].get("link_bandwidth")]
    if not links:
        if (t["mode"] != "none").any():
            notes = {r["environment"].get("link_bandwidth_note") for r in runs} - {None}
            why = f" ({'; '.join(sorted(notes))})" if notes else ""
            out.append(f"no host↔device link bandwidth was measured{why}: the link diagnoses need a CUDA run")
        return out
    bw = links[0].get("h2d_pinned_gbps", 0) * 1e9
    ref = t[t["mode"] == "none"].set_index(["prompt_tokens", "batch_size"])["tpot_s_median"]
    for _, r in t[t["h2d_bytes_per_s_median"].notna() & (t["mode"] != "none")].iterrows():
        rate = r["h2d_bytes_per_s_median"]
        if bw and rate >= LINK_BOUND_FRACTION * bw:
            out.append(f"link-bound: `{r['mode_label']}` at {_pt(r)} copies {rate / 1e9:.1f} GB/s host→device, "
                       f"{rate / bw:.0%} of the measured {bw / 1e9:.1f} GB/s: a larger window moves fewer bytes per step")
            continue
        none_tpot = ref.get((r["prompt_tokens"], r["batch_size"]))
        if bw and not _missing(none_tpot) and not _missing(r["tpot_s_median"]):
            extra = r["tpot_s_median"] - none_tpot
            link = rate * r["tpot_s_median"] / bw
            if extra > 2 * link and extra > 1e-3:
                out.append(f"slower than the link explains: `{r['mode_label']}` at {_pt(r)} adds {_ms(extra)} ms "
                           f"per token but its copies take {_ms(link)} ms at {bw / 1e9:.1f} GB/s: transfers are "
                           "not overlapped with compute, or the host side is slow")
    return out


def _busy_threshold(results: Results, group: str) -> str:
    """The busy threshold the group's trials were judged by (their ``busy_threshold_percent``)."""
    rows = results.trials[results.trials["group"] == group]
    if "busy_threshold_percent" in rows and rows["busy_threshold_percent"].notna().any():
        return f"{rows['busy_threshold_percent'].dropna().iloc[0]:.0f}% of a CPU"
    return "the busy threshold"


# --------------------------------------------------------------------------- writing


@dataclass
class Report:
    """What :func:`write_report` made: the per-point table, per-group texts, the reuse tables per group
    (``{"turn": ..., "length": ...}``, see :func:`kvbench.analysis.reuse.reuse_table`), and the files written."""

    table: pd.DataFrame
    shown: pd.DataFrame
    findings: dict[str, list[str]]
    recommendations: dict[str, str]
    diagnoses: dict[str, list[str]]
    capacity: dict[str, pd.DataFrame] = field(default_factory=dict)
    plan: pd.DataFrame | None = None
    reuse: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    charts: list[tuple[str, Path]] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)


def _default_timelines(results: Results) -> dict[str, list[str]]:
    """Per group: the first measured trial of every mode at its longest prompt and largest batch."""
    picks = {}
    measured = results.trials[results.trials["status"].isin(["ok", "over_budget"])]
    for group, t in measured.groupby("group", sort=False):
        top = t[t["prompt_tokens"] == t["prompt_tokens"].max()]
        top = top[top["batch_size"] == top["batch_size"].max()]
        picks[group] = top.groupby("mode_label", sort=False)["trial_id"].first().tolist()
    return picks


#: The largest samples.csv a report reads (bytes): a sample is about 150 bytes, so hours of 10 ms samples.
MAX_SAMPLES_BYTES = 2 << 30


def _read_samples(path: Path) -> pd.DataFrame:
    """A run's ``samples.csv``: a regular file of at most :data:`MAX_SAMPLES_BYTES`, with ``trial_id``, ``phase``
    and ``t_s``; numeric columns that hold text become NaN (that sample draws nothing).

    Raises:
        ValueError: not a regular file, too large, or without those columns (the message says which).
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_SAMPLES_BYTES:
            raise ValueError(f"{size:,} bytes, over the {MAX_SAMPLES_BYTES:,} a report reads")
        samples = pd.read_csv(f, dtype={"trial_id": str, "phase": str}, low_memory=False)
    missing = [c for c in ("trial_id", "phase", "t_s") if c not in samples]
    if missing:
        raise ValueError(f"no {', '.join(missing)} column: not a kvbench samples file")
    for c in samples.columns.difference(["trial_id", "phase"]):
        samples[c] = pd.to_numeric(samples[c], errors="coerce")
    return samples.dropna(subset=["t_s"])


def _load_samples(results: Results, trial_ids: list[str]) -> dict[str, tuple[pd.DataFrame, str]]:
    """Samples of the selected trials, read from each run's ``samples.csv``: trial id → (samples, mode)."""
    out: dict[str, tuple[pd.DataFrame, str]] = {}
    wanted = set(trial_ids)
    for run in results.runs:
        path = Path(run["path"]) / "samples.csv"
        if not path.is_file() or not wanted - set(out):
            continue
        try:
            samples = _read_samples(path)
        except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            results.problems.append(f"{path}: unreadable ({str(exc).removeprefix(f'{path}: ')}); no timelines "
                                    "from it")
            continue
        rows = results.trials[results.trials["run_path"] == run["path"]].set_index("trial_id")["mode_label"]
        for tid, part in samples[samples["trial_id"].isin(wanted - set(out))].groupby("trial_id"):
            out[tid] = (part, rows.get(tid, ""))
    return out


def _md_table(frame: pd.DataFrame) -> str:
    """A Markdown (GFM) table of a frame of text cells, every cell through :func:`~kvbench.report.md_text.md_escape`."""
    if not len(frame):
        return "(no trials)"

    def line(cells: Any) -> str:
        return "| " + " | ".join(md_escape(c) for c in cells) + " |"

    rule = "|" + "|".join(":---" if i < 4 else "---:" for i in range(len(frame.columns))) + "|"
    return "\n".join([line(frame.columns), rule, *map(line, _cells(frame))])


def _cells(frame: pd.DataFrame) -> list[list[Any]]:
    """The rows of a frame as plain lists (iterating pandas' string arrays item by item is slow)."""
    return frame.to_numpy(dtype=object).tolist()


def _html_table(frame: pd.DataFrame) -> str:
    """An HTML table of a frame of text cells (pandas' ``to_html`` takes seconds on thousands of rows)."""
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in frame.columns)
    body = "\n".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in row) + "</tr>" for row in _cells(frame))
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def write_report(results: Results, out_dir: str | Path, timelines: list[str] | None = None,
                 pool: Any = None) -> Report:
    """Write the report of ``results`` into ``out_dir`` (created): ``summary.csv`` (the per-point table, raw
    numbers), ``summary.md``, ``reuse.csv`` (reuse workloads: :func:`kvbench.analysis.reuse.reuse_table` per turn and per
    prompt length), the charts (PNG), ``report.md`` and ``report.html``.

    Args:
        results: from :func:`kvbench.results.load.load_results`.
        out_dir: where to write.
        timelines: trial ids whose memory timeline is drawn; default: at each group's longest prompt and largest
            batch, the first measured trial of every mode.
        pool: from :func:`chart_pool` (default: one made here); stopped (its workers killed) when the report
            fails or is interrupted.

    Raises:
        ValueError: a trial id in ``timelines`` that is not in the results.
        kvbench.results.run_dir.SymlinkRefused: ``out_dir`` is a symbolic link.
    """
    if timelines:
        unknown = sorted(set(timelines) - set(results.trials["trial_id"]))
        if unknown:
            raise ValueError(f"no trial {', '.join(map(repr, unknown))} in these results")
    final = Path(out_dir)
    refuse_symlink_dir(final)  # e.g. a report/ link inside a run directory from someone's tarball
    created = not final.exists()
    # everything is written into a private folder inside, then moved into place: an interrupted or failed report
    # leaves no half of itself behind; one left by a killed report (its owner provably dead) is removed first
    try:
        final.mkdir(parents=True, exist_ok=True)
        scratch_dir.sweep(final)
        out = scratch_dir.make(final)
        rep = _write(results, out, timelines, pool)
        for f in out.iterdir():
            os.replace(f, final / f.name)
    except BaseException:
        try:
            if pool is not None:  # its workers may still be drawing into the folder
                pool.stop()
        finally:  # even when stopping them failed, or the interrupt came as the folder was made
            scratch_dir.remove_own(final)
            if created:
                shutil.rmtree(final, ignore_errors=True)
        raise
    out.rmdir()
    rep.charts = [(title, final / p.name) for title, p in rep.charts]
    rep.files = {k: final / p.name for k, p in rep.files.items()}
    return rep


def _write_csv(table: pd.DataFrame, path: Path) -> Path:
    table.to_csv(path, index=False)
    return path


def _write(results: Results, out: Path, timelines: list[str] | None, pool: Any) -> Report:
    table = point_table(results.trials)
    if any(r.get("capacity") for r in results.runs):  # a search's probes come in search order: show them by size
        rank = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
        table = (table.assign(_rank=table["group"].map(rank))
                 .sort_values(["_rank", "prompt_tokens", "batch_size"], kind="stable", ignore_index=True)
                 .drop(columns="_rank"))
    groups = list(dict.fromkeys(table["group"]))
    reuse_rows = reuse_trials(results.trials)
    reuse = {g: {"turn": reuse_table(part, "turn_index"), "length": reuse_table(part, "length_bin")}
             for g, part in reuse_rows.groupby("group", sort=False)}
    colours = charts.mode_colours(list(table["mode_label"]) + list(reuse_rows["mode_label"]))
    jobs: list[tuple[str, Any, tuple]] = []
    for g, frames in reuse.items():
        jobs.append((f"{g}: TTFT restore vs recompute", charts.reuse_ttft,
                     (frames["turn"], reuse_rows, g, colours, out / f"reuse_ttft_{charts.slug(g)}.png")))
    for g in groups:
        s = charts.slug(g)
        for title, fn, name in (("memory saving and time overhead vs prompt length", charts.saving_and_overhead,
                                 f"saving_overhead_{s}.png"),
                                ("throughput and device KV vs batch size", charts.throughput_vs_batch,
                                 f"throughput_batch_{s}.png"),
                                ("bytes moved per generated token", charts.bytes_per_token,
                                 f"bytes_per_token_{s}.png")):
            jobs.append((f"{g}: {title}", fn, (table[table["group"] == g], g, colours, out / name)))
    picks = {"selected trials": list(timelines)} if timelines else _default_timelines(results)
    samples = _load_samples(results, [t for ids in picks.values() for t in ids])
    for name, ids in picks.items():
        panels = []
        for tid in ids:
            if tid not in samples:
                results.problems.append(f"{tid}: no samples in samples.csv; no timeline")
                continue
            part, mode = samples[tid]
            panels.append((tid, part, colours.get(mode, "C0")))
        for k in range(0, len(panels), TIMELINE_PANELS):
            n = k // TIMELINE_PANELS + 1
            suffix = f"_{n}" if len(panels) > TIMELINE_PANELS else ""
            jobs.append((f"memory timelines: {name}{suffix.replace('_', ' part ')}", charts.memory_timelines,
                         (panels[k:k + TIMELINE_PANELS], f"{name}: memory over time",
                          out / f"timelines_{charts.slug(name)}{suffix}.png")))
    with contextlib.ExitStack() as stack:
        if pool is None:
            pool = stack.enter_context(chart_pool())
        # the timelines (several panels each) are the slowest to draw: they start first
        order = sorted(range(len(jobs)), key=lambda i: jobs[i][1] is not charts.memory_timelines)
        started = {i: pool.submit(jobs[i][1], *jobs[i][2]) for i in order}
        futures = [started[i] for i in range(len(jobs))]
        # the tables and texts are made while the charts render
        shown = display_frame(table)
        rep = Report(table, shown, {g: findings(table, g) for g in groups},
                     {g: recommendation(table, g) for g in groups},
                     {g: diagnoses(results, table, g) for g in groups},
                     capacity_frames(results, table), plan_frame(table))
        for g, frame in rep.capacity.items():  # a search's points are probes: its findings are the capacities
            rep.findings[g] = capacity_findings(frame)
            rep.recommendations[g] = capacity_recommendation(frame)
        rep.reuse = reuse
        for g, frames in reuse.items():
            if g not in rep.recommendations:
                rep.recommendations[g], rep.findings[g], rep.diagnoses[g] = "", [], []
            later = reuse_later_turns(results.trials)
            rep.findings[g] += reuse_findings(frames["turn"], g, later)
            rec = reuse_recommendation(frames["turn"], g, later)
            rep.recommendations[g] = f"{rep.recommendations[g]} {rec}".strip()
        if reuse:  # both tables of every reuse group, raw numbers: by turn_index, then by length_bin
            pd.concat([f for frames in reuse.values() for f in frames.values()], ignore_index=True).to_csv(
                out / "reuse.csv", index=False)
            rep.files["reuse.csv"] = out / "reuse.csv"
        csv_job = pool.submit(_write_csv, table, out / "summary.csv")  # 0.5 s for thousands of points
        (out / "summary.md").write_text(_md_table(shown) + "\n")
        rep.files.update({"summary.csv": out / "summary.csv", "summary.md": out / "summary.md"})
        rep.charts = [(title, path) for (title, _, _), f in zip(jobs, futures) if (path := f.result()) is not None]
        csv_job.result()
    (out / "report.md").write_text(_markdown(results, rep, shown))
    (out / "report.html").write_text(_html(results, rep, shown))
    rep.files.update({"report.md": out / "report.md", "report.html": out / "report.html"})
    return rep


def _env_lines(run: dict[str, Any]) -> list[str]:
    env = run["environment"]
    gpus = ", ".join(g.get("name", "?") for g in env.get("gpus") or []) or "none"
    link = env.get("link_bandwidth")
    link_s = (f"H2D {link.get('h2d_pinned_gbps', 0):.1f} GB/s pinned, {link.get('h2d_pageable_gbps', 0):.1f} pageable"
              if link else env.get("link_bandwidth_note", "not measured"))
    sc = run["scenario"]
    git = env.get("git") or {}
    return [f"run `{run['name']}` ({run['status'] or 'unknown status'}, started {run['started_at'] or '?'}, "
            f"{run['n_trials']} trials)",
            f"machine: {env.get('cpu', '?')}, {env.get('cpu_count', '?')} CPUs, "
            f"{(env.get('memory_total_bytes') or 0) / GIB:.0f} GiB RAM; GPU: {gpus}; link: {link_s}",
            f"versions: kvbench {env.get('kvbench', '?')}, torch {env.get('torch', '?')}, transformers "
            f"{env.get('transformers', '?')}, Python {env.get('python', '?')}; git "
            f"{(git.get('commit') or '?')[:12]}{' (dirty)' if git.get('dirty') else ''}",
            f"scenario: {sc.get('name', '?')} — {sc.get('description', '')}; model {_model(sc)}; budget "
            f"{_budget(sc)}"]


def _model(sc: dict[str, Any]) -> str:
    m = sc.get("model")
    if isinstance(m, dict):
        return str(m.get("name") or m.get("preset") or m.get("config") or "?")
    return str(m or "?")


def _budget(sc: dict[str, Any]) -> str:
    b = sc.get("budget")
    return "none" if b is None else f"{b / MIB:,.0f} MiB" if isinstance(b, (int, float)) else str(b)


def _extra_tables(rep: Report, group: str) -> list[tuple[str, pd.DataFrame]]:
    """The reuse, capacity and plan-vs-measured tables of a group, where it has them."""
    out = []
    if group in rep.reuse:
        for key, title in (("turn", "Restore vs recompute per turn"),
                           ("length", "Restore vs recompute per prompt length")):
            out.append((title, reuse_display(rep.reuse[group][key]).drop(columns=["scenario"])))
    if group in rep.capacity:
        out.append(("Capacity within the budget (probes in order, ✗ = did not fit)", capacity_display(rep.capacity[group])))
    if rep.plan is not None and (rep.plan["scenario"] == group).any():
        out.append(("Measured vs kvbench plan's prediction (× = measured ÷ predicted)",
                    rep.plan[rep.plan["scenario"] == group].drop(columns=["scenario"])))
    return out


def _of_group(shown: pd.DataFrame, group: str) -> pd.DataFrame | None:
    """The rows of the per-point table of one group, without the scenario column (None when it has none, e.g. a
    reuse workload's group)."""
    if "scenario" not in shown or not (shown["scenario"] == group).any():
        return None
    return shown[shown["scenario"] == group].drop(columns=["scenario"])


def _markdown(results: Results, rep: Report, shown: pd.DataFrame) -> str:
    lines = ["# kvbench report", ""]
    for g in rep.recommendations:
        lines += [f"## {md_escape(g)}", "", f"**Recommendation:** {md_line(rep.recommendations[g])}", "",
                  "Findings:", ""]
        lines += [f"- {md_line(f)}" for f in rep.findings[g]] + [""]
        if rep.diagnoses[g]:
            lines += ["Diagnoses:", ""] + [f"- {md_line(d)}" for d in rep.diagnoses[g]] + [""]
        lines += ["Runs:", ""]
        for run in (r for r in results.runs if r.get("group") == g):
            lines += [f"- {md_line(x)}" for x in _env_lines(run)] + [""]
        if (mine := _of_group(shown, g)) is not None:
            lines += [_md_table(mine), ""]
        for title, frame in _extra_tables(rep, g):
            lines += [f"### {title}", "", _md_table(frame), ""]
        lines += [f"![{md_escape(title)}]({path.name})" for title, path in rep.charts
                  if title.startswith(f"{g}: ")] + [""]
    timelines = [(t, p) for t, p in rep.charts if t.startswith("memory timelines")]
    if timelines:
        lines += ["## Memory timelines", ""] + [f"![{md_escape(t)}]({p.name})" for t, p in timelines] + [""]
    if results.problems:
        lines += ["## Skipped or unknown", ""] + [f"- {md_escape(p)}" for p in results.problems] + [""]
    lines += [_GLOSSARY]
    return "\n".join(lines)


_GLOSSARY = """## Columns

- TTFT: time to first token (prefill + first token); TPOT: time per output token after the first; e2e: whole
  request. Medians over measured trials, [min–max]; 95% CI: percentile bootstrap of the median (≥ 5 repeats).
- KV device peak: the cache's own accounting of key/value bytes on the compute device at peak; device peak: the
  torch allocator's peak minus the weights (CUDA only).
- memory saving: 1 − KV device peak ÷ none's at the same point (exact bytes, the same in every repeat). time
  overhead and throughput (× none) are **paired**: repeat r of a mode next to repeat r of `none` at the same point
  (they ran back to back), the median of the pair ratios with a 95% bootstrap interval over pairs; pairs: how
  many. verdict: `decided` only with at least 5 pairs, no trial measured while the machine was busy (other
  processes' CPU at or above the threshold, or another process on the GPU), and an interval that excludes no
  change; an offload mode faster than `none` at the same batch beyond its interval is implausible against the
  plan (the decode-step roofline puts it at or above `none`). n/a: no measured `none` trial there.
- ITL p99: the 99th percentile of every inter-token gap of the point's trials, pooled (stalls a median hides).
- busy trials: measured trials during which other processes used at least the busy threshold of CPU.
- ids match none: the greedy token ids equal those of `none` on the same prompts.
- capacity: the largest batch (or longest prompt) whose trial ended ok within the budget, found by doubling then
  bisection; each probe is a recorded trial.
- reuse (multi_turn, doc_qa): each request runs twice per mode: recompute (cold, the whole prompt prefilled) and
  restore (warm: the longest stored prefix, in whole chunks, loaded from the mode's KV store, then the rest
  prefilled); TTFT of restore includes the lookup and the copy. hit rate: stored chunks found ÷ whole chunks of
  the prompt; prefill saved: tokens restored ÷ prompt tokens. near tie: ids differ only where recompute's top-2
  logits were within 1e-3.
- plan: `kvbench plan`'s prediction for the trial (device KV under the mode's placement, host KV copied per decode
  step, and the decode-step roofline max(t_mem, t_link) from the run's measured memory and link bandwidths); ×:
  measured ÷ predicted.
"""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
.table{overflow-x:auto}table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}th{background:#f3f3f3}
th:nth-child(-n+4),td:nth-child(-n+4){text-align:left}img{max-width:100%;display:block;margin:1em 0}
.rec{background:#eef6ee;padding:.6em;border-left:4px solid #4a4}.diag li{color:#8a3b00}
.meta{color:#555;font-size:13px}code{background:#f3f3f3;padding:0 .2em}"""


def _text(text: str) -> str:
    """HTML of a plain-language line: escaped, with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _html(results: Results, rep: Report, shown: pd.DataFrame) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', "<title>kvbench report</title>",
             f"<style>{_CSS}</style></head><body>", "<h1>kvbench report</h1>"]
    for g in rep.recommendations:
        parts += [f"<h2>{e(g)}</h2>", f'<p class="rec"><b>Recommendation:</b> {_text(rep.recommendations[g])}</p>',
                  "<h3>Findings</h3><ul>"] + [f"<li>{_text(f)}</li>" for f in rep.findings[g]] + ["</ul>"]
        if rep.diagnoses[g]:
            parts += ['<h3>Diagnoses</h3><ul class="diag">'] + [f"<li>{_text(d)}</li>" for d in rep.diagnoses[g]]
            parts += ["</ul>"]
        parts += ['<div class="meta"><ul>']
        for run in (r for r in results.runs if r.get("group") == g):
            parts += [f"<li>{_text(x)}</li>" for x in _env_lines(run)]
        parts += ["</ul></div>"]
        if (mine := _of_group(shown, g)) is not None:
            parts += ['<div class="table">', _html_table(mine), "</div>"]
        for title, frame in _extra_tables(rep, g):
            parts += [f"<h3>{e(title)}</h3>", '<div class="table">', _html_table(frame), "</div>"]
        parts += [_img(p) for t, p in rep.charts if t.startswith(f"{g}: ")]
    timelines = [p for t, p in rep.charts if t.startswith("memory timelines")]
    if timelines:
        parts += ["<h2>Memory timelines</h2>"] + [_img(p) for p in timelines]
    if results.problems:
        parts += ["<h2>Skipped or unknown</h2><ul>"] + [f"<li>{e(p)}</li>" for p in results.problems] + ["</ul>"]
    parts += ["<h2>Columns</h2><ul>"]
    parts += [f"<li>{e(x.strip('- ').replace(chr(10) + '  ', ' '))}</li>" for x in _GLOSSARY.split("\n- ")[1:]]
    parts += ["</ul></body></html>"]
    return "\n".join(parts) + "\n"


__all__ = ["Report", "capacity_display", "capacity_findings", "capacity_frames", "capacity_recommendation", "chart_pool", "diagnoses",
           "display_frame", "findings", "plan_frame", "recommendation", "reuse_display", "reuse_findings",
           "reuse_terminal",
           "reuse_recommendation", "size_unit", "terminal_frame", "write_report"]
