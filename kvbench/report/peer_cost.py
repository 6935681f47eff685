"""``kvbench cost`` on peer tools' result files (GuideLLM, AIPerf, ``vllm bench serve``, llm-d reports): the
table as text cells, the verdict lines, and the files (``peer_cost.csv``, ``peer_cost.json``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.analysis.cost import Prices
from kvbench.analysis.intervals import pct_interval
from kvbench.analysis.peer_cost import LOAD_CAVEAT, peer_cost_table
from kvbench.arguments import path_arg, paths_arg
from kvbench.errors import BadParameter, UnwritableOutput, UserError
from kvbench.report.cost import replacing
from kvbench.report.format import number
from kvbench.results.peers import PeerRun
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.safe_text import visible

CAPTION = ("cached = Σ cached ÷ Σ prompt tokens as the file reports them; medians (numpy's linear method, as vllm "
           "bench serve's) over each file's successful requests in kvbench's definitions (TPOT decode only; NTPOT in "
           "peer_cost.csv; * the tool's own median: "
           "the file has aggregates only); USD/1M at the tool's own output throughput (wall clock); saving = 1 − "
           "request seconds per generated token ÷ the first file's, with its 95% jackknife interval over units (a "
           "declared workload's prefixes, else the pairs; paired where the files hold the same requests; with "
           "aggregates only or another concurrency: 1 − the first file's tokens/s ÷ "
           "this one's, no interval)")


def _ms(v: float) -> str:
    return number(v * 1e3, ",.1f")


def peer_cost_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvbench.analysis.peer_cost.peer_cost_table` as text cells."""
    rows = []
    for r in table.to_dict("records"):
        star = "*" if r["median_source"] == "file" else ""
        rows.append({
            "file": r["label"], "tool": r["tool"],
            "requests": "-" if r["requests"] != r["requests"] else f"{int(r['requests'])}",
            "conc.": "-" if r["concurrency"] != r["concurrency"] else f"{int(r['concurrency'])}",
            "cached": "-" if r["cached_token_share"] != r["cached_token_share"] else f"{r['cached_token_share']:.0%}",
            "TTFT ms": _ms(r["ttft_s_p50"]) + star, "TPOT ms": _ms(r["tpot_s_p50"]) + star,
"ITL ms": _ms(r["itl_s_p50"]) + star,
            "tokens/s": "-" if r["output_tokens_per_s"] != r["output_tokens_per_s"] else
            f"{r['output_tokens_per_s']:,.2f}",
            "USD/1M": "-" if r["usd_per_million"] != r["usd_per_million"] else f"{r['usd_per_million']:,.2f}",
            "saving %": "ref" if r["reference"] else pct_interval(r["saving_pct"], r["saving_ci_low"],
                                                                  r["saving_ci_high"], 1).replace("%", ""),
            "pairs": "-" if r["reference"] else f"{int(r['pairs'])}"})
    return pd.DataFrame(rows)


def peer_verdicts(table: pd.DataFrame) -> list[str]:
    """One line per run after the first: its saving against the first, and whether it may carry a verdict."""
    if len(table) < 2:
        return []
    ref = table.iloc[0]
    lines = []
    for r in table.iloc[1:].to_dict("records"):
        saving = pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 0)
        what = f"{r['label']} against {ref['label']}: {saving} saving ({int(r['pairs'])} pairs, {r['comparison']})"
        if r["verdict"]:
            lines.append(f"{what}: {r['verdict']}")
        else:
            lines.append(f"{what}: {'cheaper' if r['saving_pct'] > 0 else 'dearer'} ({LOAD_CAVEAT})")
    return lines


def peer_notes(runs: list[PeerRun]) -> list[str]:
    """Each distinct note of ``runs`` (what was normalised or is missing), with the file it concerns."""
    seen: dict[str, None] = {}
    for run in runs:
        for note in run.notes:
            seen.setdefault(f"{run.tool}: {note}" if run.tool not in note else note)
    return list(seen)


def write_peer_costs(table: pd.DataFrame, out_dir: str | Path, prices: Prices, runs: list[PeerRun]) -> list[Path]:
    """``peer_cost.csv`` (the table) and ``peer_cost.json`` (prices, table, verdicts, notes) in ``out_dir``
    (created), each written beside its place and moved onto it; returns their paths.

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written.
    """
    doc: dict[str, Any] = {"prices": dataclasses.asdict(prices), "rows": json.loads(table.to_json(orient="records")),
                           "verdicts": peer_verdicts(table), "notes": peer_notes(runs),
                           "files": [visible(r.path) for r in runs]}
    return _table_and_doc(table, doc, Path(out_dir), "peer_cost")


def _table_and_doc(table: pd.DataFrame, doc: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """``<stem>.csv`` (``table``) and ``<stem>.json`` (``doc``) in ``out`` (created; a symbolic link refused), each
    written beside its place and moved onto it."""
    refuse_symlink_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return [replacing(out / f"{stem}.csv", lambda tmp: table.to_csv(tmp, index=False) or tmp),
                replacing(out / f"{stem}.json", lambda tmp: tmp.write_text(json.dumps(doc, indent=2) + "\n"))]
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(exc.filename or out, exc.strerror or str(exc)) from exc


MAP_CAPTION = ("per tool and cell (prompt tokens × shared share × prefixes in rotation, from the tool's own "
               "configuration), the first file given is recompute, a later one restore; TTFT ÷: Σ restore ÷ Σ "
               "recompute TTFT of the paired requests; saving = 1 − restore's request seconds per generated token "
               "÷ recompute's, with its 95% jackknife interval over the prefixes; pays or loses only with ≥ 5 "
               "pairs from ≥ 5 prefixes and an interval that excludes 0")


def peer_map_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvbench.analysis.peer_map.peer_map`'s cells as text cells (a TTFT ratio that cannot be taken:
    ``n/a``)."""
    return pd.DataFrame([{
        "tool": r["tool"], "prompt": f"{r['prompt_tokens']}", "shared %": f"{r['shared_pct']}",
        "prefixes": f"{r['prefixes']}", "restore": r["label"], "recompute": r["reference"],
        "TTFT ÷": number(r["ttft_ratio"], ".2f") if r["ttft_ratio"] == r["ttft_ratio"] else "n/a",
        "USD/1M": (f"{number(r['recompute_usd_per_million'], ',.2f')} → "
                   f"{number(r['restore_usd_per_million'], ',.2f')}"),
        "saving %": pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1).replace("%", ""),
        "pairs": f"{int(r['pairs'])}", "label": r["map_label"]} for r in table.to_dict("records")])


def write_peer_map(table: pd.DataFrame, lines: list[str], out_dir: str | Path, prices: Prices) -> list[Path]:
    """``map_peers.csv`` (the cells) and ``map_peers.json`` (prices, cells, what was not mapped) in ``out_dir``
    (created), each written beside its place and moved onto it; returns their paths.

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written.
    """
    doc = {"prices": dataclasses.asdict(prices), "cells": json.loads(table.to_json(orient="records")),
           "not_mapped": lines}
    return _table_and_doc(table, doc, Path(out_dir), "map_peers")


def peer_cost_report(paths: list[str | Path], out_dir: str | Path, prices: Prices) -> tuple[pd.DataFrame, list[Path]]:
    """``kvbench cost`` of peer result files as a library call: the table
    (:func:`kvbench.analysis.peer_cost.peer_cost_table`; the first file is the reference) and the files written.

    Raises:
        kvbench.errors.BadParameter: ``paths`` is no path nor a list of them, ``out_dir`` no path, ``prices`` no
            :class:`~kvbench.analysis.cost.Prices`.
        kvbench.errors.ResultsError: a path that is no peer result or cannot be read
            (:func:`kvbench.results.peers.load_peers`).
    """
    from kvbench.results.peers import load_peers

    paths, out_dir = paths_arg(paths, "paths"), path_arg(out_dir, "out_dir")
    if not isinstance(prices, Prices):
        raise BadParameter(f"{{prices}} must be a kvbench.Prices, not {type(prices).__name__}", "prices")
    runs = load_peers(list(paths))
    table = peer_cost_table(runs, prices)
    return table, write_peer_costs(table, out_dir, prices, runs)


__all__ = ["CAPTION", "MAP_CAPTION", "peer_cost_display", "peer_cost_report", "peer_map_display", "peer_notes",
           "peer_verdicts", "write_peer_costs", "write_peer_map"]
