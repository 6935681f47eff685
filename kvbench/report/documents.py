"""What a report holds (:class:`Report`) and its two documents: ``report.md`` (GitHub-flavoured Markdown, every cell
and line from files escaped) and ``report.html`` (self-contained: images as data URIs, no scripts, no network)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.results.load import Results
from kvbench.report.format import GIB, MIB
from kvbench.report.machines import MachineSection
from kvbench.report.md_text import md_escape, md_line
from kvbench.report.tables import capacity_display, reuse_display
from kvbench.report.server_load import LOAD_CAPTION, server_load_display


@dataclass
class Report:
    """What :func:`~kvbench.report.write.write_report` made: the per-point table, per-group texts, the reuse tables per
    group (``{"turn": ..., "length": ...}``, see :func:`kvbench.analysis.reuse.reuse_table`), and the files written."""

    table: pd.DataFrame
    shown: pd.DataFrame
    findings: dict[str, list[str]]
    recommendations: dict[str, str]
    diagnoses: dict[str, list[str]]
    capacity: dict[str, pd.DataFrame] = field(default_factory=dict)
    plan: pd.DataFrame | None = None
    reuse: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    #: a server run's load per mode (:func:`kvbench.analysis.server_load.server_load_table`), per group
    server_load: dict[str, pd.DataFrame] = field(default_factory=dict)
    #: shared_prefix runs: the break-even map's cells as text (:func:`kvbench.report.break_even.map_display`),
    #: per group and mode
    break_even: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    #: per scenario run on two or more machines, its "Machines" section (:mod:`kvbench.report.machines`)
    machines: dict[str, MachineSection] = field(default_factory=dict)
    charts: list[tuple[str, Path]] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)


def md_table(frame: pd.DataFrame) -> str:
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


def env_lines(run: dict[str, Any]) -> list[str]:
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


def extra_tables(rep: Report, group: str) -> list[tuple[str, str, pd.DataFrame]]:
    """The reuse, server-load, capacity and plan-vs-measured tables of a group, where it has them: ``(heading,
    caption, frame)``; a heading may hold text from files (a mode label), a caption (``""`` or kvbench's own words,
    with `code` spans) never does."""
    out = []
    if group in rep.reuse:
        for key, title in (("turn", "Restore vs recompute per turn"),
                           ("length", "Restore vs recompute per prompt length")):
            out.append((title, "", reuse_display(rep.reuse[group][key]).drop(columns=["scenario"])))
    for mode, frame in rep.break_even.get(group, {}).items():
        out.append((f"Break-even map, {mode}", "restore vs recompute, USD per 1M tokens at 2 USD per GPU-hour, no "
                    "memory charged: `kvbench map --gpu-price --host-price` prices it", frame))
    if group in rep.server_load:
        out.append(("Load per mode", LOAD_CAPTION,
                    server_load_display(rep.server_load[group]).drop(columns=["scenario"])))
    if group in rep.capacity:
        out.append(("Capacity within the budget", "probes in order, ✗ = did not fit",
                    capacity_display(rep.capacity[group])))
    if rep.plan is not None and (rep.plan["scenario"] == group).any():
        out.append(("Measured vs kvbench plan's prediction", "× = measured ÷ predicted",
                    rep.plan[rep.plan["scenario"] == group].drop(columns=["scenario"])))
    return out


def of_group(shown: pd.DataFrame, group: str) -> pd.DataFrame | None:
    """The rows of the per-point table of one group, without the scenario column (None when it has none, e.g. a
    reuse workload's group)."""
    if "scenario" not in shown or not (shown["scenario"] == group).any():
        return None
    return shown[shown["scenario"] == group].drop(columns=["scenario"])


def markdown(results: Results, rep: Report, shown: pd.DataFrame) -> str:
    """``report.md``: per group its recommendation, findings, diagnoses, runs, tables and charts; per scenario run on
    several machines, its machines and how each mode compares there; the memory timelines; what was skipped; the
    glossary. ``shown`` is :func:`~kvbench.report.tables.display_frame`'s."""
    lines = ["# kvbench report", ""]
    for g in rep.recommendations:
        lines += [f"## {md_escape(g)}", "", f"**Recommendation:** {md_line(rep.recommendations[g])}", "",
                  "Findings:", ""]
        lines += [f"- {md_line(f)}" for f in rep.findings[g]] + [""]
        if rep.diagnoses[g]:
            lines += ["Diagnoses:", ""] + [f"- {md_line(d)}" for d in rep.diagnoses[g]] + [""]
        lines += ["Runs:", ""]
        for run in (r for r in results.runs if r.get("group") == g):
            lines += [f"- {md_line(x)}" for x in env_lines(run)] + [""]
        if (mine := of_group(shown, g)) is not None:
            lines += [md_table(mine), ""]
        for head, caption, frame in extra_tables(rep, g):
            lines += [f"### {md_escape(head)}" + (f" ({md_line(caption)})" if caption else ""), "", md_table(frame), ""]
        lines += [f"![{md_escape(title)}]({path.name})" for title, path in rep.charts
                  if title.startswith(f"{g}: ")] + [""]
    for base, sec in rep.machines.items():
        lines += [f"## Machines: {md_escape(base)}", "", md_table(sec.table), ""]
        lines += [f"- {md_line(f)}" for f in sec.findings] + [""]
    timelines = [(t, p) for t, p in rep.charts if t.startswith("memory timelines")]
    if timelines:
        lines += ["## Memory timelines", ""] + [f"![{md_escape(t)}]({p.name})" for t, p in timelines] + [""]
    if results.problems:
        lines += ["## Skipped or unknown", ""] + [f"- {md_escape(p)}" for p in results.problems] + [""]
    lines += [GLOSSARY]
    return "\n".join(lines)


GLOSSARY = """## Columns

- TTFT: time to first token (prefill + first token); TPOT: time per output token after the first; e2e: whole
  request. Medians over measured trials, [min–max]; 95% CI: the median's interpolated order statistics (≥ 5 repeats).
- KV device peak: the cache's own accounting of key/value bytes on the compute device at peak; device peak: the
  torch allocator's peak minus the weights (CUDA only).
- memory saving: 1 − KV device peak ÷ none's at the same point (exact bytes, the same in every repeat). time
  overhead and throughput (× none) are **paired**: repeat r of a mode next to repeat r of `none` at the same point
  (they ran back to back), the median of the quiet pairs' ratios (a busy pair is counted, never a figure) with a 95%
  interval over pairs (with exactly 5 pairs that interval is their range, min to max, which covers the median 93.75%
  of the time; docs/reports.md gives each interval's measured coverage); pairs: how many. verdict: \
`decided` only with at least 5 pairs, no trial measured while the
  machine was busy (other processes' CPU at or above the threshold, or another process on the GPU), and an
  interval that excludes no change (and never for a mode that held no KV off the device: "not engaged"); an
  offload mode faster than `none` at the same batch beyond its interval is implausible against the plan (the
  decode-step roofline puts it at or above `none`). n/a: no measured `none` trial there.
- ITL p99: the 99th percentile of every inter-token gap of the point's trials, pooled (stalls a median hides), with
  the number of gaps n; `max` where p99 is the largest gap (numpy's higher method over at most 100 gaps).
- busy trials: measured trials during which other processes used at least the busy threshold of CPU.
- ids match none: the greedy token ids equal those of `none` on the same prompts.
- capacity: the largest batch (or longest prompt) whose trial ended ok within the budget, found by doubling then
  bisection; each probe is a recorded trial.
- reuse (multi_turn, doc_qa, shared_prefix): each request runs twice per mode: recompute (cold, the whole prompt \
prefilled) and
  restore (warm: the longest stored prefix, in whole chunks, loaded from the mode's KV store, then the rest
  prefilled); TTFT of restore includes the lookup and the copy. hit rate: stored chunks found ÷ whole chunks of
  the prompt; prefill saved: tokens restored ÷ prompt tokens. Restore ÷ recompute and the cost saving resample
  whole conversations (or documents; a server's whole loads at a concurrency above 1) for their intervals, since
  the turns of one are not independent, and a verdict needs 5 of them. near tie: ids differ only where
  recompute's top-2 logits were within 1e-3.
- break-even map (shared_prefix): per cell (prompt length × shared share × KV working set ÷ the engine's reuse
  budget) the paired saving of restore against recompute with its interval over prefixes; pays or loses only with
  a verdict (≥ 5 pairs from ≥ 5 prefixes, a quiet machine, an interval that excludes 0); model: the roofline
  fitted to the run's trials, with its 95% prediction interval; ! marks a measured cell the model disagrees with.
- plan: `kvbench plan`'s prediction for the trial (device KV under the mode's placement, host KV copied per decode
  step, and the decode-step roofline max(t_mem, t_link) from the run's measured memory and link bandwidths); ×:
  measured ÷ predicted.
"""


__all__ = ["GLOSSARY", "Report", "env_lines", "extra_tables", "markdown", "md_table", "of_group"]
