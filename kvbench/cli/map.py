"""``kvbench map``: the break-even map of ``shared_prefix`` runs: where restoring stored KV pays against
recomputing it, measured with intervals, and the fitted model's prediction where nothing was measured."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from kvbench.cli.common import (PRICE_FLAGS, fail, handle_errors, kvbench_runs_only, load_runs, out, render,
                                results_and_target, show, show_problems, stop_on_signals, write_or_stop)

#: Library argument → flag, for the messages of :class:`kvbench.errors.BadParameter`.
MAP_FLAGS = {**PRICE_FLAGS, "shares": "--shares", "contexts": "--contexts"}


def _whole_numbers(text: str | None, flag: str, low: int, high: int, example: str) -> tuple[int, ...]:
    """The distinct whole numbers of a comma-separated flag, each ``low`` to ``high`` and at most
    :data:`~kvbench.analysis.break_even.MAX_MAP_VALUES` of them; () when not given. Digits are ASCII 0-9 only
    (``str.isdigit`` also takes ² and other digits ``int`` refuses). Fails (exit 2) with one line otherwise."""
    from kvbench.analysis.break_even import MAX_MAP_VALUES

    if text is None:
        return ()
    parts = [v.strip() for v in text.split(",", MAX_MAP_VALUES)]
    if len(parts) > MAX_MAP_VALUES:
        fail(f"{flag}: give at most {MAX_MAP_VALUES} values (each adds a row or column of predictions)")
    if not all(re.fullmatch(r"[0-9]+", p, re.ASCII) for p in parts):
        fail(f"{flag} {text[:80]!r}: give whole numbers separated by commas (digits 0-9), e.g. {example}")
    values = tuple(dict.fromkeys(int(v) if len(v) <= 12 else high + 1 for v in parts))  # never int() of 10^6 digits
    if any(not low <= v <= high for v in values):
        fail(f"{flag} {text[:80]!r}: every value must be {low} to {high:,}")
    return values


def map_(
    results: list[Path] = typer.Argument(None, help="Run directories of shared_prefix scenarios, trials.jsonl "
                                         "files or folders of runs (default: the newest run under results/)."),
    gpu_price: float = typer.Option(2.0, "--gpu-price", help="USD per GPU-hour (with no memory charged, the "
                                    "saving in percent does not depend on it)."),
    host_price: float = typer.Option(0.0, "--host-price", help="USD per GiB-hour of host memory held by KV."),
    disk_price: float = typer.Option(0.0, "--disk-price", help="USD per GiB-hour of disk held by KV."),
    shares: str | None = typer.Option(None, "--shares", help="Shared shares (percent, 0-99) the model fills in "
                                         "besides those measured; default 0,25,50,75,95."),
    contexts: str | None = typer.Option(None, "--contexts", help="Prompt lengths (tokens) the model fills in "
                                           "besides those measured, e.g. 2048,4096."),
    host_tier: str = typer.Option("configured", "--host-tier", help="Servers: charge a host KV tier as its flags "
                                  "configure it (configured) or at the server's RSS growth (measured)."),
    assume_quiet: bool = typer.Option(False, "--assume-quiet", help="Other tools' files only: they record no "
                                      "machine load, so no verdict is given unless you say the machine was quiet "
                                      "(the verdict then names it)."),
    out_dir: str | None = typer.Option(None, "--out", help="Where map.csv, map.json and the heatmaps go "
                                          "(default: <first path>/report)."),
    details: bool = typer.Option(False, "--details", metavar="",
                                 help="One row per cell with every column, not the grids."),
) -> None:
    """The break-even map: per cell (prompt length × shared share × KV working set ÷ budget) the paired saving
    of restore against recompute with its interval, pays / loses / inconclusive, and the fitted model's
    prediction for the cells not measured."""
    from kvbench.analysis.break_even import DEFAULT_SHARES, break_even_map
    from kvbench.analysis.cost import Prices
    from kvbench.report.break_even import constant_lines, map_display, map_grids, write_map
    from kvbench.results.peers import peer_files

    stop_on_signals()
    with handle_errors(PRICE_FLAGS):
        prices = Prices(gpu_price, host_price, None, None, disk_price)
    share_values = _whole_numbers(shares, "--shares", 0, 99, "0,25,50") or DEFAULT_SHARES
    context_values = _whole_numbers(contexts, "--contexts", 1, 2**24, "2048,4096")
    from kvbench.analysis.break_even import check_map_arguments

    with handle_errors(MAP_FLAGS):
        check_map_arguments(prices, share_values, context_values, host_tier)
    results, target = results_and_target(results, out_dir, "mapping", "give the run directories of a "
                                         "shared_prefix scenario (e.g. scenarios/break_even.yaml)", "map's files")
    with handle_errors():
        peers = peer_files(results)
    if peers is not None:
        kvbench_runs_only({"--host-price": host_price, "--disk-price": disk_price, "--shares": shares,
                           "--contexts": contexts, "--details": details, "--host-tier": host_tier != "configured"},
                          "measured cells only, no memory figures")
        _peer_map(peers, target, prices, assume_quiet)
        return
    if assume_quiet:
        fail("--assume-quiet is for other tools' files: kvbench's runs record the machine's load")
    loaded = load_runs(results)
    with handle_errors(MAP_FLAGS):
        m = break_even_map(loaded.trials, prices, share_values, context_values, host_tier)
    if m.cells.empty:
        show_problems(loaded)
        fail("no shared_prefix trials in these results: the map needs a run of a scenario with "
             "workload.shared_prefix (e.g. scenarios/break_even.yaml)")
    for (group, mode), part in m.cells.groupby(["group", "mode_label"], sort=False):
        if details:
            show(render(map_display(part), f"{group}, {mode}: restore vs recompute", "", left=("source", "label"),
                        wrap=True, min_width={"label": 12}))
            continue
        for panel, grid in map_grids(part):
            show(render(grid, f"{group}, {mode}: saving of restore vs recompute, KV working set {panel} the "
                        "budget", "", left=1, wrap=True, min_width={}))
        for r in part[(part["source"] == "measured") & (part["label"] != "pays") & (part["label"] != "loses")
                      ].to_dict("records"):
            out.print(f"  {r['label']}: {int(r['prompt_tokens'])} tokens, {int(r['shared_pct'])}% shared, "
                      f"{r['panel']}: {r['why']}", highlight=False, markup=False)
        for r in part[part["disagrees"] == True].to_dict("records"):  # noqa: E712 (an object column)
            out.print(f"  measured and model disagree: {int(r['prompt_tokens'])} tokens, {int(r['shared_pct'])}% "
                      f"shared, {r['panel']}", highlight=False, markup=False)
    out.print(f"USD per 1M generated tokens at {gpu_price:g} USD per GPU-hour, host {host_price:g} and disk "
              f"{disk_price:g} USD per GiB-hour. KV working set: the prefixes in rotation × prompt tokens, against "
              "the KV the engine keeps for reuse (the store's host tier; a server's slots). A measured cell: the "
              "saving paired by request, with its 95% interval drawn by prefix; pays or loses only when that "
              "interval excludes 0 on a quiet machine with ≥ 5 pairs from ≥ 5 prefixes, else ? (why: below the "
              "grid). ≈: the fitted roofline's prediction with its 95% interval."
              + ("" if details else " --details: every column (TTFT and TPOT ratios, Δ USD, pairs)."),
              highlight=False, markup=False)
    out.print("[bold]fitted constants[/] (least squares, each ≥ 0, 95% bootstrap intervals over prefixes):",
              highlight=False)
    for line in constant_lines(m):
        out.print(f"  {escape(line)}", highlight=False)
    show_problems(loaded)
    write_or_stop("the map's files", target, lambda: write_map(m, target, prices), "map")


def _peer_map(runs: list[Any], target: Path, prices: Any, assume_quiet: bool) -> None:
    """``kvbench map`` of other tools' shared-prefix runs: the measured cells, what was not mapped."""
    from kvbench.analysis.peer_map import peer_map
    from kvbench.report.peer_cost import MAP_CAPTION, peer_map_display, peer_notes, write_peer_map

    with handle_errors():
        table, lines = peer_map(runs, prices, assume_quiet)
    if table.empty:
        fail("nothing to map: " + "; ".join(lines))
    show(render(peer_map_display(table), f"break-even map of other tools' results at {prices.gpu_per_hour:g} "
                "USD per GPU-hour (measured cells only)", MAP_CAPTION, left=("tool", "restore", "recompute"),
                wrap=("restore", "recompute"), min_width={"restore": 14, "recompute": 14}))
    for r in table.to_dict("records"):
        said = r["why"] if r["why"].startswith(r["map_label"]) else f"{r['map_label']} ({r['why']})"
        out.print(f"  {r['label']} ({r['tool']}, {r['prompt_tokens']} tokens, {r['shared_pct']}% shared): {said}",
                  highlight=False, markup=False)
    for line in lines + [f"note: {n}" for n in peer_notes(runs)]:
        out.print(line, highlight=False, markup=False)
    write_or_stop("the map's files", target, lambda: write_peer_map(table, lines, target, prices), "map")
