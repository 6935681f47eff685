"""The break-even map of other tools' shared-prefix runs (``kvbench map`` given GuideLLM, AIPerf or llm-d result
files): each file's cell is its tool, prompt length × shared share (its shared prefix as the tool's configuration
says, ÷ the prompt) × prefixes in rotation; within a cell the first file given is the recompute side (e.g. the
server's prompt cache off) and each later one is compared with it as :func:`kvbench.analysis.peer_cost.compare`
does. A cell pays when that comparison carries a verdict (≥ 5 pairs from ≥ 5 prefixes) and its interval lies above
0, loses when below, and is inconclusive otherwise, with the reason. Only measured cells: the fitted model of
:mod:`kvbench.analysis.break_even` needs kvbench's own rows (restored tokens per tier, the budget), which these
files do not hold."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvbench.analysis.cost import Prices
from kvbench.analysis.peer_cost import LOAD_CAVEAT, compare
from kvbench.results.peers import PeerRun


def cell_of(run: PeerRun) -> tuple[int, int, int] | str:
    """``(prompt tokens, shared %, prefixes)`` of a run (the median prompt length of its requests), or why it has
    no cell: no prefix in its configuration, aggregates only (an llm-d report), a prefix as long as the prompt or
    longer, no prefix count."""
    if run.shared_prefix_tokens is None:
        return f"{run.tool}'s file does not say its shared prefix"
    if not run.per_request:
        return "aggregates only: no requests to pair"
    prompt = pd.to_numeric(run.requests["prompt_tokens"], errors="coerce").median()
    if not prompt == prompt or prompt <= 0:
        return "no prompt lengths"
    if run.shared_prefix_tokens >= prompt:
        return f"its shared prefix ({run.shared_prefix_tokens} tokens) is not shorter than its prompts ({prompt:g})"
    if not run.prefixes:
        return "its file does not say how many prefixes it rotates over"
    return int(prompt), round(100 * run.shared_prefix_tokens / prompt), int(run.prefixes)


def peer_map(runs: list[PeerRun], prices: Prices, assume_quiet: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """The measured cells of ``runs``: one row per run after the first of its cell with ``prompt_tokens``,
    ``shared_pct``, ``prefixes``, ``concurrency`` (a cell's files share it), ``reference`` and ``label`` (the
    files), ``tool``,
    ``saving_pct`` with ``saving_ci_low``/``saving_ci_high``, ``usd_per_million`` of both sides
    (``recompute_usd_per_million``, ``restore_usd_per_million`` at the tools' throughputs), ``ttft_ratio``
    (Σ restore ÷ Σ recompute TTFT of the paired requests, as kvbench's own map; NaN unpaired), ``pairs``,
    ``prefixes_seen`` (the prefixes the paired prompts show; the interval is drawn by prefix; None where the files
    keep no prompts), ``comparison``, ``map_label`` (pays, loses, inconclusive) and ``why``; and one line per run that
    has no cell or no partner in its cell, or no TTFT ratio (NaN: no paired request of the recompute side with a TTFT
    above 0 s). ``assume_quiet``: the user's word that the machine was quiet
    (:func:`~kvbench.analysis.peer_cost.compare`)."""
    cells: dict[tuple[Any, ...], list[PeerRun]] = {}
    lines = []
    for run in runs:
        cell = cell_of(run)
        if isinstance(cell, str):
            lines.append(f"{run.label}: not mapped: {cell}")
        else:
            cells.setdefault((run.tool, run.concurrency, *cell), []).append(run)
    rows: list[dict[str, Any]] = []
    for (_, conc, prompt, pct, prefixes), members in cells.items():
        if len(members) < 2:
            lines.append(f"{members[0].label}: not mapped: the only file of its cell ({prompt} tokens, {pct}% "
                         "shared): give the same workload without and with the cache")
            continue
        ref = members[0]
        for run in members[1:]:
            c = compare(ref, run, assume_quiet)
            cached = pd.to_numeric(ref.requests["cached_prompt_tokens"], errors="coerce")
            if cached.sum() > 0:
                c["verdict"] = (f"inconclusive: the recompute side {ref.label} reused {int(cached.sum())} cached "
                                "prompt tokens: give the file without the cache first")
            ratio = c["ttft_ratio"]
            if ratio != ratio and not c["pairs"]:
                lines.append(f"{run.label}: TTFT ÷ n/a: no request of it pairs with one of {ref.label} (a pair needs "
                             "a request that generated tokens in each file), so no ratio can be taken")
            elif ratio != ratio:
                lines.append(f"{run.label}: TTFT ÷ n/a: the recompute side {ref.label} has no paired request with "
                             "a TTFT above 0 s, so no ratio can be taken")
            if c["verdict"]:
                label, why = "inconclusive", c["verdict"]
            elif c["saving_ci_low"] > 0:
                label, why = "pays", LOAD_CAVEAT
            else:
                label, why = "loses", LOAD_CAVEAT
            def per(r: PeerRun) -> float:
                """USD per 1M output tokens of ``r``; nan when it has no output rate."""
                return prices.per_million(r.output_tokens_per_s) if r.output_tokens_per_s else math.nan

            rows.append({"concurrency": conc, "prompt_tokens": prompt, "shared_pct": pct, "prefixes": prefixes,
                         "prefixes_seen": c["prefixes"], "reference": ref.label,
                         "label": run.label, "tool": run.tool, **{k: c[k] for k in (
                             "saving_pct", "saving_ci_low", "saving_ci_high", "pairs", "comparison")},
                         "recompute_usd_per_million": per(ref), "restore_usd_per_million": per(run),
                         "ttft_ratio": ratio, "map_label": label, "why": why})
    return pd.DataFrame(rows), lines


__all__ = ["cell_of", "peer_map"]
