"""``kvbench cost``: USD per million generated tokens, the saving against ``none`` and its worth."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from kvbench.cli.common import (err, fail, handle_errors, load_runs, out, render, results_and_target, show,
                                show_problems, stop_on_signals, warnings_shown, write_or_stop)

#: Library argument → flag, for the messages of :class:`kvbench.errors.BadParameter`.
FLAGS = {"gpu_per_hour": "--gpu-price", "host_per_gib_hour": "--host-price", "disk_per_gib_hour": "--disk-price",
         "tokens_per_month": "--tokens-per-month", "engineering_cost": "--engineering-cost", "host_tier": "--host-tier"}


def cost(
    results: list[Path] = typer.Argument(None, help="Run directories, trials.jsonl files or folders of runs "
                                         "(default: the newest run under results/)."),
    gpu_price: float = typer.Option(..., "--gpu-price", help="USD per GPU-hour."),
    host_price: float = typer.Option(0.0, "--host-price", help="USD per GiB-hour of host memory held by KV."),
    disk_price: float = typer.Option(0.0, "--disk-price", help="USD per GiB-hour of disk held by KV."),
    tokens_per_month: Optional[float] = typer.Option(None, "--tokens-per-month", help="For the saving per month."),
    engineering_cost: Optional[float] = typer.Option(None, "--engineering-cost", help="USD, for the payback time."),
    max_ttft_ms: Optional[float] = typer.Option(None, "--max-ttft-ms", help="SLO: TTFT at most this many ms (a "
                                                "point's median; a server request's own, for goodput)."),
    max_tpot_ms: Optional[float] = typer.Option(None, "--max-tpot-ms", help="SLO: TPOT at most this many ms (a "
                                                "point's median; a server request's own, for goodput)."),
    host_tier: str = typer.Option("configured", "--host-tier", help="Servers: charge a host KV tier at the size "
                                  "its flags configure (configured: --cache-ram, --kv-offloading-size, "
                                  "--hicache-size) or at the server's RSS growth beyond none's (measured)."),
    base_throughput: Optional[float] = typer.Option(None, "--base-throughput", help="What-if: tokens/s without "
                                                    "offload (with --offload-throughput; no results needed)."),
    offload_throughput: Optional[float] = typer.Option(None, "--offload-throughput", help="What-if: with offload."),
    assume_quiet: bool = typer.Option(False, "--assume-quiet", help="Other tools' files only: they record no "
                                      "machine load, so no verdict is given unless you say the machine was quiet "
                                      "(the verdict then names it)."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Where cost.csv, cost.json and cost.png go "
                                           "(default: <first path>/report)."),
) -> None:
    """Cost per 1M generated tokens per mode from measured throughput (or what-if figures), saving vs none.
    Ctrl-C or SIGTERM while it writes its files stops it with exit 130, leaving none half-written."""
    from kvbench.analysis.cost import Prices, what_if
    from kvbench.report import cost as rc

    stop_on_signals()

    with handle_errors(FLAGS):
        prices = Prices(gpu_price, host_price, tokens_per_month, engineering_cost, disk_price)
    for name, v in (("--max-ttft-ms", max_ttft_ms), ("--max-tpot-ms", max_tpot_ms)):
        if v is not None and not (v > 0 and v != float("inf")):
            fail(f"{name} must be a finite number of milliseconds above 0, not {v}")
    if (base_throughput is None) != (offload_throughput is None):
        fail("--base-throughput and --offload-throughput go together")
    if base_throughput is not None and results:
        fail("give result directories or a what-if (--base-throughput, --offload-throughput), not both")
    if base_throughput is not None:
        with handle_errors(FLAGS):
            w = what_if(prices, base_throughput, offload_throughput)
        for line in rc.what_if_lines(prices, w, base_throughput, offload_throughput):
            out.print(line, highlight=False, markup=False)
        return
    results, target = results_and_target(results, out_dir, "costing", "give result directories, or "
                                         "--base-throughput and --offload-throughput for a what-if", "cost files")
    peers = _peer_files(results)
    if peers is not None:
        _kvbench_only({"--max-ttft-ms": max_ttft_ms, "--max-tpot-ms": max_tpot_ms, "--tokens-per-month":
                       tokens_per_month, "--engineering-cost": engineering_cost, "--host-price": host_price,
                       "--disk-price": disk_price, "--host-tier": host_tier != "configured"},
                      "they hold no memory figures or per-request SLO checks")
        _peer_cost(peers, target, prices, assume_quiet)
        return
    if assume_quiet:
        fail("--assume-quiet is for other tools' files: kvbench's runs record the machine's load")
    loaded = load_runs(results)
    failed = rc.failed_groups(loaded.trials)
    if failed and len(failed) == loaded.trials["group"].nunique():  # nothing to cost: said, and nothing written
        show_problems(loaded)
        fail(f"nothing to cost: {'; '.join(failed.values())}")
    with handle_errors(FLAGS):
        rep = rc.compute_costs(loaded, prices, None if max_ttft_ms is None else max_ttft_ms / 1e3,
                               None if max_tpot_ms is None else max_tpot_ms / 1e3, host_tier)
    if len(rep.table):
        widest = max(len(str(m)) for m in rep.table["mode_label"])
        show(render(rc.cost_display(rep.table, tokens_per_month is not None, engineering_cost is not None),
                    f"cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour, host {host_price:g} and "
                    f"disk {disk_price:g} USD per GiB-hour",
                    "best qualifying batch per mode (all trials ok within the budget, ids equal to none's, "
                    "measured `repeats` times, SLOs met); USD/1M with the 95% interval of its throughput; saving "
                    "against none at the same prompt length, paired by repeat, with its 95% interval over the "
                    "pairs (paired: it need not equal 1 − the two USD/1M medians); verdict: lowers or raises cost "
                    "only when the pairs decide, else why not (the lines below say it whole)",
                    left=("scenario", "mode", "verdict"), wrap=("scenario", "mode", "saving % vs none", "verdict"),
                    min_width={"mode": min(28, max(12, widest)), "verdict": 12}), first=("scenario", "tokens/s", "pairs", "batch"))
    if len(rep.reuse):
        cells, marks = rc.reuse_cost_display(rep.reuse)
        server = rep.reuse["engine"].notna().any()
        show(render(cells, f"reuse: cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour, recompute vs "
                    "restore", ("each server mode at its own concurrency; " if server else
                                "the same requests one at a time; ")
                    + "vs: what the saving is taken against, cold = that baseline (none: recompute every prompt, "
                    "the reuse saving; a prefix-cache mode: the tier saving of a host or disk tier), warm = the mode "
                    "restoring stored prefixes (charged --host-price for "
                    "the memory it holds beside the device, --disk-price for its disk: the charged column says "
                    "what); tokens/s = generated tokens ÷ e2e time; saving with its 95% interval (the jackknife "
                    "over conversations of the request pairs); pairs (n quiet): busy pairs set no figure, the "
                    "tokens/s and costs are the quiet pairs' trials; prefill saved = prompt tokens restored instead "
                    "of computed"
                    + ("; a server mode's cold side is `none` on the same requests and concurrency, its tokens/s "
                       "÷ the time requests were in flight, a slot restore inside TTFT" if server else ""),
                    left=("scenario", "mode", "vs", "verdict"),
                    wrap=[c for c in cells.columns if c != "scenario"], min_width={"mode": 12}, marks=marks))
        for line in rc.reuse_verdicts(rep.reuse):
            out.print(f"  {escape(line)}", highlight=False)
    if len(rep.server_load) and (max_ttft_ms is not None or max_tpot_ms is not None):
        from kvbench.report.server_load import LOAD_CAPTION, server_load_display

        slo = " and ".join(f"{k} ≤ {v:g} ms" for k, v in (("TTFT", max_ttft_ms), ("TPOT", max_tpot_ms))
                           if v is not None)
        for group, part in rep.server_load.groupby("group", sort=False):
            show(render(server_load_display(part).drop(columns=["scenario"]),
                        f"{group}: goodput under {slo} per request", "goodput = requests meeting the SLO ÷ the "
                        "seconds requests were in flight / ÷ the load's wall-clock seconds; " + LOAD_CAPTION,
                        left=1, wrap=True))
    said = rep.verdicts()
    for group, lines in said.items():
        out.print(f"[bold]{escape(group)}:[/]", highlight=False)
        for line in lines:
            out.print(f"  {escape(line)}", highlight=False)
    if any(said.values()):
        out.print("a line's USD per 1M: none's × (1 − the mode's paired saving), as its pairs put it; the table's are "
                  "each mode's own median throughput, which need not imply the paired saving", highlight=False,
                  markup=False)
    for line in failed.values():  # a group with nothing to cost beside others that have
        out.print(f"[bold]not costed:[/] {escape(line)}", highlight=False)
    bases = rep.host_bases()
    out.print(f"host memory charged at {host_price:g} and disk at {disk_price:g} USD per GiB-hour"
              + (" (pass --host-price and --disk-price to charge them)" if host_price == 0 == disk_price else "")
              + (f"; host memory held: {', '.join(bases)}" if bases else ""), highlight=False, markup=False)
    show_problems(loaded)
    try:
        with handle_errors(), warnings_shown():
            files = rc.write_costs(rep.table, target, prices, rep.reuse, rep.server_load)
    except KeyboardInterrupt:
        err.print(f"interrupted while writing the cost files in {target}: each is whole, new or from before",
                  highlight=False, markup=False)
        raise typer.Exit(130) from None
    out.print(f"cost: {', '.join(str(f) for f in files)}", highlight=False, markup=False)


def _kvbench_only(flags: dict[str, Any], why: str) -> None:
    """Fail naming the flags of ``flags`` that were given (not None, 0 or False): they apply to kvbench runs, not
    to other tools' result files (``why``)."""
    given = [flag for flag, v in flags.items() if v is not None and v is not False and v != 0]
    if given:
        fail(f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} to kvbench runs, not to other tools' "
             f"result files ({why})")


def _peer_files(paths: list[Path]) -> list[Any] | None:
    """The runs of ``paths`` when they are other tools' result files (GuideLLM, AIPerf, vllm bench serve, llm-d
    reports), each file read once (:func:`kvbench.results.peers.peer_runs`, labels as
    :func:`~kvbench.results.peers.load_peers` gives them); None when they are kvbench runs; mixing both fails."""
    from kvbench.results.peers import distinct_labels, load_peers, peer_runs
    from kvbench.safe_read import find_below

    with handle_errors():
        found = [peer_runs(p) for p in paths]
    if all(f is None for f in found):
        return None
    for p, f in zip(paths, found):
        if f is not None:
            continue
        with handle_errors():  # BadFile: folders nested too deep to search
            ours = (p / "trials.jsonl").exists() or (p.is_file() and p.suffix == ".jsonl") or (
                p.is_dir() and bool(find_below(p, "trials.jsonl")))
        if ours:
            fail(f"give kvbench runs or other tools' result files, not both: {p} is a kvbench run")
        with handle_errors():
            load_peers([p])  # says why it is no result file
    runs = [run for f in found for run in f or []]
    distinct_labels(runs)
    return runs


def _peer_cost(runs: list[Any], target: Path, prices: Any, assume_quiet: bool) -> None:
    """``kvbench cost`` of other tools' runs: the table, the lines against the first file, the notes."""
    from kvbench.analysis.peer_cost import peer_cost_table
    from kvbench.report.peer_cost import CAPTION, peer_cost_display, peer_notes, peer_verdicts, write_peer_costs

    with handle_errors():
        table = peer_cost_table(runs, prices, assume_quiet)
    show(render(peer_cost_display(table), f"cost per 1M generated tokens at {prices.gpu_per_hour:g} USD per "
                f"GPU-hour (other tools' results; the first is the reference)", CAPTION,
                left=("file", "tool"), wrap=("file", "tool"), min_width={"file": 24, "tool": 16}))
    for line in peer_verdicts(table):
        out.print(f"  {escape(line)}", highlight=False)
    for line in peer_notes(runs):
        out.print(f"note: {escape(line)}", highlight=False)
    write_or_stop("the cost files", target, lambda: write_peer_costs(table, target, prices, runs), "cost")
