"""The plain-language texts of a report, from measurements: per group, findings, a recommendation and diagnoses;
the same for reuse workloads (restore vs recompute) and capacity searches. Each function returns lines (or one
line) naming modes in backticks; none claims what the paired intervals do not decide."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kvbench.analysis.intervals import pct_interval
from kvbench.analysis.points import KV_CHECK_TOLERANCE, qualifies, quality_crossed
from kvbench.results.load import Results
from kvbench.report.format import MIB, missing, ms, ratio_interval

#: KV smaller than this fraction of the weights makes offload's savings invisible in device memory.
KV_SMALL_FRACTION = 0.10
#: A decode step moving more than this fraction of the measured link bandwidth is link-bound.
LINK_BOUND_FRACTION = 0.8


def point_text(r: Any) -> str:
    """A point as the report words it: ``4096 tokens × batch 8`` (``r`` has ``prompt_tokens``, ``batch_size``)."""
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
        if missing(r["memory_saving_pct"]) or missing(r["time_overhead_pct"]):
            continue
        out.append(f"at {point_text(r)}, `{r['mode_label']}` saved {r['memory_saving_pct']:.0f}% of device KV memory "
                   f"({r['kv_device_peak_bytes_median'] / MIB:,.1f} MiB left) for {_overhead(r)} TPOT "
                   f"({ms(r['tpot_s_median'])} ms per token; {_pairs(r)})" + _verdict_tail(r) + _quality_tail(r))
    return out


def _quality_tail(r: Any) -> str:
    """A lossy mode's quality cost beside its saving: ``"; quality: KL … nats […], agreement …%"`` or ``"; fails
    quality: …"``; empty for a lossless mode."""
    q = r.get("quality") if hasattr(r, "get") else None
    if not q:
        return ""
    return f"; {q}" if q.startswith("fails quality") else f"; quality vs none: {q}"


def _overhead(r: Any) -> str:
    """A point's paired TPOT overhead vs ``none`` with its interval, e.g. ``+9% [+5%, +14%]``."""
    return pct_interval(r["time_overhead_pct"], r["time_overhead_ci_low"], r["time_overhead_ci_high"])


def _pairs(r: Any) -> str:
    """``5 pairs with none``, and where busy pairs set no figure, how many quiet ones did: ``5 pairs with none, the
    figure from 1 quiet pair``."""
    n, used = int(r["pairs"]), r.get("pairs_figure") if hasattr(r, "get") else None
    said = f"{n} pair{'s' if n != 1 else ''} with none"
    if used is not None and not missing(used) and 0 < int(used) < n:
        said += f", the figure from {int(used)} quiet pair{'s' if int(used) != 1 else ''}"
    return said


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
        return f"no offload needed: `none` fits {where} at every measured point (up to {point_text(last)})"
    worst = misfits.sort_values(["prompt_tokens", "batch_size"]).iloc[-1]
    here = t[(t["prompt_tokens"] == worst["prompt_tokens"]) & (t["batch_size"] == worst["batch_size"])
             & (t["mode"] != "none")]
    cands = here[qualifies(here) & here["tpot_s_median"].notna()]
    first = misfits.sort_values(["prompt_tokens", "batch_size"]).iloc[0]
    why = "over budget" if first["n_over_budget"] else "out of memory"
    head = f"`none` does not fit {where} from {point_text(first)} ({why})"
    if cands.empty:
        return f"{head}; at {point_text(worst)} no measured mode fits: raise the budget or shorten the context"
    ranked = cands.sort_values("tpot_s_median")
    best = ranked.iloc[0]
    busy = int(cands["n_busy"].sum())
    if busy:  # which fits is exact (bytes); which is fastest was measured on a busy machine: no ranking
        fits = ", ".join(f"`{r['mode_label']}` ({r['kv_device_peak_bytes_median'] / MIB:,.1f} MiB)"
                         for _, r in cands.iterrows())
        return (f"{head}; at {point_text(worst)} these fit (device KV): {fits}; which has the least TPOT is "
                "inconclusive: "
                f"the machine was busy during {busy} of their {int(cands['measured'].sum())} trials")
    over = "" if missing(best["time_overhead_pct"]) else (f", {_overhead(best)} vs none, {int(best['pairs'])} "
                                                           f"pairs{_verdict_tail(best)}")
    text = (f"{head}; at {point_text(worst)} use `{best['mode_label']}`: it fits with the least TPOT "
            f"({ms(best['tpot_s_median'])} ms{over}, device KV {best['kv_device_peak_bytes_median'] / MIB:,.1f} MiB"
            f"{_quality_tail(best)})")
    failed = here[here["quality_ok"].map(lambda v: v is False)] if "quality_ok" in here else here.iloc[:0]
    if not failed.empty:
        text += "; not considered: " + ", ".join(f"`{r['mode_label']}` {r['quality']}" for _, r in failed.iterrows())
    close = [r["mode_label"] for _, r in ranked.iloc[1:].iterrows() if r["tpot_s_min"] <= best["tpot_s_max"]]
    if close:  # the TPOT ranges overlap: the measurements do not separate them
        text += (f"; {', '.join(f'`{m}`' for m in close)} overlap{'s' if len(close) == 1 else ''} its TPOT range "
                 f"[{ms(best['tpot_s_min'])}–{ms(best['tpot_s_max'])} ms]: more repeats would tell them apart")
    return text


def diagnoses(results: Results, table: pd.DataFrame, group: str) -> list[str]:
    """Problems found in a group, in the spirit of the article's troubleshooting table: outputs that diverged,
    KV accounting off the analytic prediction by more than 25%, failed trials, savings invisible because KV is
    small next to the weights, and decode steps that are link-bound or slower than the link explains."""
    t = table[table["group"] == group]
    out = []
    for _, r in t[t["tokens_match"].map(lambda v: v is False)].iterrows():
        out.append(f"outputs diverged: `{r['mode_label']}` at {point_text(r)} generated other ids than `none` "
                   "(first at "
                   f"step {int(r['first_divergence_step']) if not missing(r['first_divergence_step']) else '?'}): "
                   "a bug in that mode, not a trade-off")
    for _, r in t[t["kv_check_flagged"] > 0].iterrows():
        out.append(f"KV accounting off the prediction: `{r['mode_label']}` at {point_text(r)} held "
                   f"{r['kv_check_worst']:+.0%} vs 2 × layers × kv_heads × head_dim × bytes × tokens × batch in "
                   f"{int(r['kv_check_flagged'])} trial(s) (tolerance ±{KV_CHECK_TOLERANCE:.0%})")
    for _, r in t[(t["n_error"] > 0) | (t["n_oom"] > 0)].iterrows():
        out.append(f"failed: `{r['mode_label']}` at {point_text(r)}: {int(r['n_error'] + r['n_oom'])} trial(s); "
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
            out.append(f"link-bound: `{r['mode_label']}` at {point_text(r)} copies {rate / 1e9:.1f} GB/s host→device, "
                       f"{rate / bw:.0%} of the measured {bw / 1e9:.1f} GB/s: a larger window moves fewer bytes per "
                       "step")
            continue
        none_tpot = ref.get((r["prompt_tokens"], r["batch_size"]))
        if bw and not missing(none_tpot) and not missing(r["tpot_s_median"]):
            extra = r["tpot_s_median"] - none_tpot
            link = rate * r["tpot_s_median"] / bw
            if extra > 2 * link and extra > 1e-3:
                out.append(f"slower than the link explains: `{r['mode_label']}` at {point_text(r)} adds {ms(extra)} ms "
                           f"per token but its copies take {ms(link)} ms at {bw / 1e9:.1f} GB/s: transfers are "
                           "not overlapped with compute, or the host side is slow")
    return out


def _busy_threshold(results: Results, group: str) -> str:
    """The busy threshold the group's trials were judged by (their ``busy_threshold_percent``)."""
    rows = results.trials[results.trials["group"] == group]
    if "busy_threshold_percent" in rows and rows["busy_threshold_percent"].notna().any():
        return f"{rows['busy_threshold_percent'].dropna().iloc[0]:.0f}% of a CPU"
    return "the busy threshold"


def reuse_findings(turns: pd.DataFrame, group: str, later: pd.DataFrame | None = None) -> list[str]:
    """Per mode: restore's TTFT against recompute's from the second turn on (pooled and paired by request, with its
    interval, pair count and verdict, from ``later`` = :func:`kvbench.analysis.reuse.reuse_later_turns`; and turn by
    turn), the prefill it saved and the store's hit rate; and whether restored runs generated ``none``'s ids."""
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
            f"{ratio_interval(p['ttft_ratio'], p['ttft_ratio_ci_low'], p['ttft_ratio_ci_high'])} over "
            f"{int(p['pairs'])} request pairs{': ' + p['ttft_verdict'] if p['ttft_verdict'] else ''}; ")
        out.append(f"`{mode}`: restore ÷ recompute TTFT from turn 2 on: {head}{ratios} (turn by turn); {saved:.0f}% "
                   f"of those turns' prompt tokens restored, not prefilled; chunk hit rate "
                   f"{'n/a' if missing(hit) else f'{100 * hit:.0f}%'} (mean of the turns')")
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


def reuse_recommendation(turns: pd.DataFrame, group: str, later: pd.DataFrame | None = None,
                         need_match: bool = True) -> str:
    """The mode whose restore gives the lowest median TTFT from turn 2 on, among those whose ids match (unless not
    ``need_match``: a server's cache, whose divergences are the engine's finding); restoring is recommended only
    where ``later`` (:func:`kvbench.analysis.reuse.reuse_later_turns`: restore ÷ recompute from turn 2, paired by
    request) decides that restore is faster; otherwise the line says why not."""
    t = turns[(turns["group"] == group) & (turns["turn_index"] >= 2)]
    if need_match:
        t = t[t["tokens_match"].isin([True, "near tie"])]
    else:
        t = t[t["mode"] != "none"]
    failing = {m: why for m, part in t.groupby("mode_label", sort=False) if (why := _reuse_quality_fails(part))}
    t = t[~t["mode_label"].isin(list(failing))]
    dropped = "".join(f"; not considered: `{m}` {why}" for m, why in failing.items())
    if t.empty or t["warm_ttft_s"].isna().all():
        return f"no measured reuse after a first turn: nothing to recommend{dropped}"
    best = t.groupby("mode_label")["warm_ttft_s"].median().sort_values()
    mode = best.index[0]
    cold = t[t["mode_label"] == mode]["cold_ttft_s"].median()
    kl = t[t["mode_label"] == mode]["kl_mean"].median() if "kl_mean" in t else float("nan")
    figures = (f"with `{mode}`, TTFT from turn 2 on is {best.iloc[0] * 1e3:,.0f} ms against {cold * 1e3:,.0f} ms "
               "recomputing every prompt (median over turns; the baseline is `none`)"
               + (f"; quality vs none: KL ≥ {kl:.3g} nats (a lower bound from the server's top-k "
                  "log-probabilities)" if not missing(kl) else "") + dropped)
    p = None if later is None or later.empty else next(
        (r for r in later.to_dict("records") if r["group"] == group and r["mode_label"] == mode), None)
    if p is None:
        return f"no paired restore ÷ recompute from turn 2 on: no recommendation; {figures}"
    ratio = ratio_interval(p["ttft_ratio"], p["ttft_ratio_ci_low"], p["ttft_ratio_ci_high"])
    if p["ttft_verdict"]:
        return f"restore or recompute: {p['ttft_verdict']} (restore ÷ recompute {ratio}); {figures}"
    if p["ttft_ratio"] >= 1:
        return (f"restoring does not pay here: restore ÷ recompute {ratio} over {int(p['pairs'])} request pairs; "
                f"{figures}")
    return (f"keep finished requests' KV and restore it: {figures}; restore ÷ recompute {ratio} over "
            f"{int(p['pairs'])} request pairs")


def _reuse_quality_fails(part: pd.DataFrame) -> str:
    """"fails quality: …" where a lossy server preset's median KL lower bound or agreement (the share of steps
    before the first differing id, over its turns) is beyond the run's ``max_server_kl`` (``max_kl`` for a KL
    that is not a server's bound) or ``min_agreement``; "" otherwise."""
    def median(col: str) -> float:
        return part[col].median() if col in part else float("nan")

    def limit(col: str) -> float:
        return part[col].max() if col in part else float("nan")

    bound = bool(part["kl_bound"].any()) if "kl_bound" in part else False
    crossed = quality_crossed(median("kl_mean"), median("agreement_to_divergence"),
                              limit("max_server_kl" if bound else "max_kl"), limit("min_agreement"), bound)
    return f"fails quality: {'; '.join(crossed)}" if crossed else ""


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
        if missing(r["capacity"]):
            out.append(f"at {at}, `{r['mode_label']}` fit nothing within the budget ({r['stopped']})")
            continue
        base = frame[(frame[fixed] == r[fixed]) & (frame["mode_label"] == "none")]
        line = f"at {at}, `{r['mode_label']}`: {what} {int(r['capacity'])}"
        tps = r["throughput_tokens_per_s_median"]
        if not missing(tps):
            line += f", {tps:,.1f} tokens/s there"
        if r["mode_label"] != "none" and len(base) and not missing(base["capacity"].iloc[0]):
            b = base.iloc[0]
            line += f" ({r['capacity'] / b['capacity']:.2f}× none's {int(b['capacity'])}"
            if searched == "batch_size" and not missing(tps) and not missing(b["throughput_tokens_per_s_median"]):
                line += f", {tps / b['throughput_tokens_per_s_median']:.2f}× its tokens/s"
            line += ")"
        out.append(line)
    return out


__all__ = ["KV_SMALL_FRACTION", "LINK_BOUND_FRACTION", "capacity_findings", "capacity_recommendation", "diagnoses",
           "findings", "recommendation", "reuse_findings", "reuse_recommendation"]
