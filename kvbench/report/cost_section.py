"""The cost section of ``kvbench report``: per scenario, each mode's paired saving against its baseline with the
95% interval, the pairs and the verdict, and one line for every decided saving first.

The saving is taken with the GPU price alone (no host or disk memory charged), so it does not depend on that
price: cost per 1M tokens is price ÷ tokens/s, and the price cancels in 1 − cost ÷ the baseline's. The absolute
figure is given as GPU-hours per 1M generated tokens (multiply by a price per GPU-hour for USD); ``kvbench cost``
prices it, memory included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvbench.analysis.cost import Prices, cost_table
from kvbench.analysis.intervals import pct_interval
from kvbench.analysis.reuse_cost import reuse_cost
from kvbench.report.cost_verdicts import (baseline_cell, mode_in_cell, quiet_note, verdict_cell, verdict_text,
                                          with_baselines)
from kvbench.report.documents import md_table
from kvbench.report.format import number
from kvbench.report.md_text import md_escape, md_line
from kvbench.results.load import Results

#: One GPU-hour costs 1: USD per 1M tokens at this price is GPU-hours per 1M tokens.
PER_GPU_HOUR = Prices(1.0)

CAPTION = ("saving = 1 − the mode's cost ÷ its baseline's, paired (an offload mode: repeat r against `none`'s "
           "repeat r at each one's best qualifying batch; a reuse mode: request by request, conversations as the "
           "units), "
           "with its 95% interval; the GPU price cancels in it (no host or disk memory charged here: `kvbench cost "
           "--gpu-price --host-price --disk-price` charges them); GPU-h/1M: GPU-hours per 1M generated tokens "
           "(× your price per GPU-hour = USD per 1M); verdict: lowers or raises cost only when the pairs decide "
           "(≥ 5 pairs, a quiet machine, an interval that excludes 0), else why not")


@dataclass
class CostSection:
    """What the report's cost section shows, per group: ``offload`` (text cells: prompt, mode, batch, tokens/s,
    GPU-h/1M, saving vs none, pairs, verdict), ``reuse`` (text cells: mode, vs, the baseline's and the mode's
    GPU-h/1M, saving, pairs, verdict) and ``lines`` (every decided saving first, then the cheapest undecided)."""

    offload: dict[str, pd.DataFrame] = field(default_factory=dict)
    reuse: dict[str, pd.DataFrame] = field(default_factory=dict)
    lines: dict[str, list[str]] = field(default_factory=dict)

    def groups(self) -> list[str]:
        """The groups with something to show, in order of appearance."""
        return list(dict.fromkeys([*self.offload, *self.reuse, *self.lines]))


def cost_section(results: Results, points: pd.DataFrame) -> CostSection:
    """The cost section of ``results`` (their per-point table ``points``, :func:`kvbench.analysis.points.point_table`):
    :func:`kvbench.analysis.cost.cost_table` and :func:`kvbench.analysis.reuse_cost.reuse_cost` at one unit per
    GPU-hour (:data:`PER_GPU_HOUR`), as text cells and lines (:func:`saving_lines`). Groups where no offload mode
    has a saving against ``none`` and no reuse mode was costed are left out."""
    sec = CostSection()
    costs = cost_table(points, PER_GPU_HOUR, results.trials) if len(points) else pd.DataFrame()
    for group, part in costs.groupby("group", sort=False) if len(costs) else ():
        if part["saving_pct"].notna().any():
            sec.offload[group] = offload_cells(part)
            sec.lines[group] = saving_lines(part)
    reuse = reuse_cost(results.trials, PER_GPU_HOUR, servers=results.servers)
    for group, part in with_baselines(reuse).groupby("group", sort=False) if len(reuse) else ():
        sec.reuse[group] = reuse_cells(part)
        sec.lines.setdefault(group, []).extend(reuse_lines(part))
    return sec


def offload_cells(costs: pd.DataFrame) -> pd.DataFrame:
    """Rows of :func:`kvbench.analysis.cost.cost_table` at :data:`PER_GPU_HOUR` as text cells (``ref`` for
    ``none``; why nothing qualified, in the saving's cell, where nothing did)."""
    rows = []
    for r in costs.to_dict("records"):
        none = r["mode"] == "none"
        qualified = r["usd_per_million"] == r["usd_per_million"]
        rows.append({"prompt (tokens)": str(int(r["prompt_tokens"])), "mode": r["mode_label"],
                     "batch": str(int(r["batch_size"])) if qualified else "-",
                     "tokens/s": number(r["throughput_tokens_per_s"], ",.2f"),
                     "GPU-h/1M": number(r["usd_per_million"], ",.2f"),
                     "saving vs none": "ref" if none and qualified else r["why"] if not qualified else
                     pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1),
                     "pairs": "-" if none or not qualified else str(int(r["pairs"])),
                     "verdict": "ref" if none and qualified else verdict_cell(r["cost_verdict"], r["saving_pct"])})
    return pd.DataFrame(rows)


def reuse_cells(reuse: pd.DataFrame) -> pd.DataFrame:
    """Rows of :func:`kvbench.analysis.reuse_cost.reuse_cost` at :data:`PER_GPU_HOUR` (with their baselines,
    :func:`~kvbench.report.cost_verdicts.with_baselines`) as text cells."""
    return pd.DataFrame([{"mode": mode_in_cell(r), "vs": baseline_cell(r["baseline"], r["saving_kind"]),
                          "baseline GPU-h/1M": number(r["recompute_usd_per_million"], ",.2f"),
                          "mode GPU-h/1M": number(r["restore_usd_per_million"], ",.2f"),
                          "saving": pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1),
                          "pairs": _pairs(r), "verdict": verdict_cell(r["saving_verdict"], r["saving_pct"])}
                         for r in reuse.to_dict("records")])


def _pairs(r: dict, noun: str = "") -> str:
    """``15 pairs from 5 conversations`` (``noun`` = `` pairs``), ``15 from 5 conversations`` (no noun); ``15 pairs
    (3 quiet) from 5 conversations`` where busy pairs set no figure."""
    units, unit = r.get("units"), str(r.get("unit") or "")
    more = "" if units is None or units != units or unit in ("", "pairs") else f" from {int(units)} {unit}"
    return f"{int(r['pairs'])}{noun}{quiet_note(r)}{more}"


def _decided_first(rows: list[dict], verdict: str) -> list[dict]:
    """Decided savings first (the largest first), then the rest in order: an undecided cheaper median never comes
    before a decided saving."""
    decided = sorted((r for r in rows if r[verdict] == "" and r["saving_pct"] == r["saving_pct"]),
                     key=lambda r: -r["saving_pct"])
    chosen = {id(r) for r in decided}
    return decided + [r for r in rows if id(r) not in chosen]


def saving_lines(costs: pd.DataFrame) -> list[str]:
    """Per prompt length, one line per offload mode with a saving against ``none``: ``at 96 tokens `full` vs none:
    +12.0% [+4.1%, +19.8%], 5 pairs (batch 4 vs none's 1): lowers cost``; decided savings first, the largest
    first, then the undecided ones with why not."""
    lines = []
    by_prompt: dict[Any, list[dict]] = {}
    for r in costs.to_dict("records"):  # one pass: a large run has hundreds of prompt lengths
        by_prompt.setdefault(r["prompt_tokens"], []).append(r)
    for prompt, part in by_prompt.items():
        none = [r for r in part if r["mode"] == "none"]
        nb = int(none[0]["batch_size"]) if none and none[0]["batch_size"] == none[0]["batch_size"] else None
        rows = [r for r in part if r["mode"] != "none" and r["saving_pct"] == r["saving_pct"]]
        for r in _decided_first(rows, "cost_verdict"):
            lines.append(f"at {prompt} tokens `{r['mode_label']}` vs none: "
                         f"{pct_interval(r['saving_pct'], r['saving_ci_low'], r['saving_ci_high'], 1)}, "
                         f"{int(r['pairs'])} pairs (batch {int(r['batch_size'])} vs none's {nb}): "
                         f"{verdict_text(r['cost_verdict'], r['saving_pct'])}")
    return lines


def reuse_lines(reuse: pd.DataFrame) -> list[str]:
    """One line per reuse row (with its baseline): ``host-cache vs prefix-cache (tier saving): +12.0% [+4.1%,
    +19.8%], 15 pairs from 5 conversations: lowers cost``; decided savings first, the largest first."""
    lines = []
    for r in _decided_first(reuse.to_dict("records"), "saving_verdict"):
        lines.append(f"`{r['mode_label']}` vs `{r['baseline']}` ({r['saving_kind']} saving): "
                     f"{pct_interval(r['saving_pct'], r['saving_ci_low'], r['saving_ci_high'], 1)}, "
                     f"{_pairs(r, ' pairs')}: {verdict_text(r['saving_verdict'], r['saving_pct'])}")
    return lines


def cost_markdown(sec: CostSection) -> str:
    """The cost section as Markdown for ``report.md`` (every cell and line from files escaped): per group its
    lines and tables; ``""`` when no group has one."""
    if not sec.groups():
        return ""
    lines = ["## Cost: saving against the baseline", "", md_line(CAPTION), ""]
    for g in sec.groups():
        lines += [f"### {md_escape(g)}", ""] + [f"- {md_line(x)}" for x in sec.lines.get(g, [])] + [""]
        for frame in (sec.offload.get(g), sec.reuse.get(g)):
            if frame is not None:
                lines += [md_table(frame), ""]
    return "\n".join(lines)


__all__ = ["CAPTION", "cost_markdown", "PER_GPU_HOUR", "CostSection", "cost_section", "offload_cells", "reuse_cells",
           "reuse_lines", "saving_lines"]
