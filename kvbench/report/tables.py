"""The tables of a report as text cells (frames of strings, one row per point or probe): the per-point table and
its terminal cut, the reuse tables, the capacity searches and measured-vs-plan. Columns carry their units."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.intervals import pct_interval
from kvbench.analysis.latency import is_max_rank
from kvbench.results.load import Results
from kvbench.report.format import (MIB, STATUSES, ci, kl_cell, match, missing, ms, ms_range, pct, ratio,
                                   ratio_interval, size, size_unit, spread, status_counts)


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """The per-point table formatted for people: units in the headers, sizes in MiB (GiB for columns reaching
    10 GiB), times in ms as ``median [min–max]``, percentages against ``none`` (n/a without a baseline)."""
    kv_name, kv_unit = size_unit(table["kv_device_peak_bytes_median"])
    dev_name, dev_unit = size_unit(table["peak_device_allocated_bytes_median"])
    spread_cols = [f"{m}_{x}" for m in ("ttft_s", "tpot_s", "e2e_s") for x in ("median", "min", "max")]
    used = ["group", "prompt_tokens", "batch_size", "mode", "mode_label", *(f"n_{s}" for s in STATUSES), *spread_cols,
            "tpot_s_ci_low", "tpot_s_ci_high", "throughput_tokens_per_s_median", "kv_device_peak_bytes_median",
            "peak_device_allocated_bytes_median", "memory_saving_pct", "time_overhead_pct", "time_overhead_ci_low",
            "time_overhead_ci_high", "throughput_ratio", "throughput_ratio_ci_low", "throughput_ratio_ci_high",
            "pairs", "tpot_verdict", "itl_p99_s", "itl_n", "n_busy", "measured", "tokens_match", "quality"]
    rows = []
    # plain dicts of the columns used: far faster than iterrows, or to_dict of all ~100 columns, on 1000s of points
    for r in table[[c for c in used if c in table]].to_dict("records"):
        rec = {"scenario": r["group"], "prompt (tokens)": int(r["prompt_tokens"]), "batch": int(r["batch_size"]),
               "mode": r["mode_label"], "trials": status_counts(r),
               "TTFT (ms)": spread(r, "ttft_s"), "TPOT (ms)": spread(r, "tpot_s"),
               "TPOT 95% CI (ms)": ci(r, "tpot_s"), "e2e (ms)": spread(r, "e2e_s"),
               "tokens/s (e2e)": "-" if missing(r["throughput_tokens_per_s_median"])
               else f"{r['throughput_tokens_per_s_median']:,.1f}",
               f"KV device peak ({kv_name})": size(r["kv_device_peak_bytes_median"], kv_unit),
               f"device peak ({dev_name})": size(r["peak_device_allocated_bytes_median"], dev_unit),
               "ITL p99 (ms)": itl_p99(r),
               "memory saving (%)": pct(r["memory_saving_pct"]),
               "time overhead (%)": pct_interval(r["time_overhead_pct"], r["time_overhead_ci_low"],
                                                 r["time_overhead_ci_high"], 1).replace("%", ""),
               "throughput (× none)": ratio_interval(r["throughput_ratio"], r["throughput_ratio_ci_low"],
                                                      r["throughput_ratio_ci_high"]),
               "pairs": str(int(r["pairs"])),
               "verdict": "-" if not r["measured"] else (
                   r["tpot_verdict"] or f"decided: {'slower' if r['time_overhead_pct'] > 0 else 'faster'} than none"),
               **({"memory saving (%)": "ref", "time overhead (%)": "ref", "throughput (× none)": "ref", "pairs": "-",
                   "verdict": "-"} if r["mode"] == "none" and not missing(r["tpot_s_median"]) else {}),
               "busy trials": f"{int(r['n_busy'])} of {int(r['measured'])}",
               "ids match none": match(r["tokens_match"]),
               "quality vs none": r.get("quality") or "-"}
        rows.append(rec)
    return pd.DataFrame(rows)


def itl_p99(r: dict) -> str:
    """A point's pooled ITL p99 in ms with the number of gaps, ``max`` where the rank rule makes it the largest
    (at most 100 gaps): ``max 41.2 (n 75)``; ``-`` without gaps."""
    n = r.get("itl_n")
    if missing(r["itl_p99_s"]) or missing(n):
        return "-"
    return f"{'max ' if is_max_rank(int(n), 99) else ''}{ms(r['itl_p99_s'])} (n {int(n)})"


def terminal_frame(shown: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The columns of :func:`display_frame`'s output that fit a terminal: TTFT median only; the overhead with its
    interval in whole percent; no scenario (one table per scenario), e2e, TPOT interval, ITL, allocator peak,
    throughput ratio, verdict or quality text (the findings give them) or busy count; shorter headers. A lossy
    mode's ``= none`` is its median KL against ``none`` ("fails" where it is beyond the run's thresholds)."""
    frame = shown.drop(columns=["scenario", "e2e (ms)", "TPOT 95% CI (ms)", "throughput (× none)", "ITL p99 (ms)",
                                "verdict", "busy trials", "quality vs none",
                                *[c for c in shown.columns if c.startswith("device peak")]])
    frame["TTFT (ms)"] = [ms(v) for v in table["ttft_s_median"]]
    frame["time overhead (%)"] = ["ref" if m == "none" and c == "ref" else
                                  pct_interval(v, lo, hi).replace("%", "")
                                  for m, c, v, lo, hi in zip(table["mode"], shown["time overhead (%)"],
                                                             table["time_overhead_pct"], table["time_overhead_ci_low"],
                                                             table["time_overhead_ci_high"])]
    if "kl_mean_median" in table:  # a lossy mode: its median KL against none (and whether it fails quality)
        quality = table["quality_ok"] if "quality_ok" in table else pd.Series(None, index=table.index)
        bound = table["kl_bound"] if "kl_bound" in table else pd.Series(False, index=table.index)
        frame["ids match none"] = [c if missing(kl) else kl_cell(kl, b) + (" fails" if ok is False else "")
                                   for c, kl, ok, b in zip(frame["ids match none"], table["kl_mean_median"], quality,
                                                           bound)]
    kv = next(c for c in frame.columns if c.startswith("KV device peak"))
    return frame.rename(columns={"prompt (tokens)": "prompt", "TTFT (ms)": "TTFT ms", "TPOT (ms)": "TPOT ms",
                                 "tokens/s (e2e)": "tok/s e2e",
                                 kv: kv.replace("KV device peak (", "KV dev ").rstrip(")"),
                                 "memory saving (%)": "saved %", "time overhead (%)": "overhead %",
                                 "ids match none": "= none"})


def reuse_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvbench.analysis.reuse.reuse_table` formatted for people, a row per turn, prompt-length bin or map cell:
    TTFT of recompute (cold) and restore (warm) in ms as ``median [min–max]``, their ratio, tokens restored
    (median), hit rate and bytes restored per tier (totals)."""
    if table.empty:
        return pd.DataFrame()
    by = "turn" if "turn_index" in table else "cell" if "cell" in table else "prompt (tokens)"
    unit_name, unit = size_unit(pd.concat([table["restore_host_bytes"], table["restore_disk_bytes"]]))
    rows = []
    for r in table.to_dict("records"):
        rows.append({
            "scenario": r["group"], "mode": r["mode_label"],
            by: int(r["turn_index"]) if by == "turn" else r["cell"] if by == "cell" else r["length_bin"],
            "prompt (tokens, median)": f"{r['prompt_tokens']:,.0f}",
            "recompute TTFT (ms)": ms_range(r["cold_ttft_s"], r["cold_ttft_s_min"], r["cold_ttft_s_max"]),
            "restore TTFT (ms)": ms_range(r["warm_ttft_s"], r["warm_ttft_s_min"], r["warm_ttft_s_max"]),
            "restore ÷ recompute": ratio_interval(r["ttft_ratio"], r.get("ttft_ratio_ci_low"),
                                                   r.get("ttft_ratio_ci_high")),
            "pairs": str(int(r.get("pairs", 0))),
            "verdict": r.get("ttft_verdict") or (
                f"decided: restore {'faster' if r['ttft_ratio'] < 1 else 'slower'}" if r.get("pairs") else "-"),
            "tokens restored": "-" if missing(r["tokens_restored"]) else f"{r['tokens_restored']:,.0f}",
            "hit rate (%)": "-" if missing(r["hit_rate"]) else f"{100 * r['hit_rate']:.0f}",
            f"restored from host ({unit_name}, total)": size(r["restore_host_bytes"], unit),
            f"restored from disk ({unit_name}, total)": size(r["restore_disk_bytes"], unit),
            "prefill saved (%)": pct(r["prefill_saved_pct"]),
            "ids match none": (kl_cell(r["kl_mean"], r.get("kl_bound")) if not missing(r.get("kl_mean")) else
                               "near tie" if r["tokens_match"] == "near tie" else match(r["tokens_match"])),
            "trials": f"{r['n']} warm" + (f", {r['failed']} failed" if r["failed"] else ""),
        })
    return pd.DataFrame(rows)


def reuse_terminal(shown: pd.DataFrame) -> pd.DataFrame:
    """The columns of :func:`reuse_display`'s output that fit a terminal, with shorter headers."""
    keep = {"mode": "mode", "turn": "turn", "cell": "cell", "prompt (tokens)": "prompt",
            "prompt (tokens, median)": "prompt", "recompute TTFT (ms)": "recompute TTFT ms",
            "restore TTFT (ms)": "restore TTFT ms",
            "restore ÷ recompute": "÷", "pairs": "pairs", "tokens restored": "restored", "hit rate (%)": "hit %",
            "ids match none": "= none"}
    frame = shown[[c for c in shown.columns if c in keep]]
    return frame.rename(columns=keep)


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
                     "device KV plan (MiB)": size(r["plan_kv_device_bytes_median"], MIB),
                     "device KV measured (MiB)": size(r["kv_device_peak_bytes_median"], MIB),
                     "device KV ×": ratio(r["kv_device_vs_plan"]),
                     "H2D per step plan (MiB)": size(r["plan_link_bytes_per_step_median"], MIB),
                     "H2D per step measured (MiB)": size(r["h2d_bytes_per_step_median"], MIB),
                     "H2D ×": ratio(r["link_vs_plan"]),
                     "TPOT roofline (ms)": ms(r["plan_tpot_s_median"]),
                     "TPOT measured (ms)": ms(r["tpot_s_median"]), "TPOT ×": ratio(r["tpot_vs_plan"])})
    return pd.DataFrame(rows, columns=["scenario", "prompt (tokens)", "batch", "mode", "device KV plan (MiB)",
                                       "device KV measured (MiB)", "device KV ×", "H2D per step plan (MiB)",
                                       "H2D per step measured (MiB)", "H2D ×", "TPOT roofline (ms)",
                                       "TPOT measured (ms)", "TPOT ×"])


def capacity_display(frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvbench.analysis.capacity.capacity_frame`'s table as text cells: the fixed value, mode, capacity, the
    probes (✗ = did not fit), tokens/s and device KV at the capacity, whether its ids matched ``none``, and why the
    search stopped there."""
    rows = []
    for r in frame.to_dict("records"):
        fixed = ("batch", "batch_size") if r["searched"] == "prompt_tokens" else ("prompt (tokens)", "prompt_tokens")
        cap = r["capacity"]
        rows.append({fixed[0]: int(r[fixed[1]]), "mode": r["mode_label"],
                     "capacity": "-" if missing(cap) else str(int(cap)), "probes": r["probes"],
                     "tokens/s (e2e)": "-" if missing(r["throughput_tokens_per_s_median"])
                     else f"{r['throughput_tokens_per_s_median']:,.1f}",
                     "KV device peak (MiB)": size(r["kv_device_peak_bytes_median"], MIB),
                     "ids match none": match(r["tokens_match"]), "why it stops there": r["stopped"]})
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


__all__ = ["capacity_display", "capacity_frames", "display_frame", "plan_frame", "reuse_display", "reuse_terminal",
           "terminal_frame"]
