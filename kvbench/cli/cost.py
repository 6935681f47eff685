"""``kvbench cost``: USD per million generated tokens, the saving against ``none`` and its worth. One command with
three inputs: a what-if of two throughputs (printed here), kvbench runs (:mod:`kvbench.cli.cost_runs`) and other
tools' result files (:mod:`kvbench.cli.cost_peers`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kvbench.cli.common import (PRICE_FLAGS, fail, handle_errors, kvbench_runs_only, out, results_and_target,
                                stop_on_signals)
from kvbench.cli.cost_peers import show_peer_costs
from kvbench.cli.cost_runs import show_run_costs

if TYPE_CHECKING:
    from kvbench.analysis.cost import Prices


def cost(
    results: list[Path] = typer.Argument(None, help="Run directories, trials.jsonl files or folders of runs "
                                         "(default: the newest run under results/)."),
    gpu_price: float = typer.Option(..., "--gpu-price", help="USD per GPU-hour."),
    host_price: float = typer.Option(0.0, "--host-price", help="USD per GiB-hour of host memory held by KV."),
    disk_price: float = typer.Option(0.0, "--disk-price", help="USD per GiB-hour of disk held by KV."),
    tokens_per_month: float | None = typer.Option(None, "--tokens-per-month", help="For the saving per month."),
    engineering_cost: float | None = typer.Option(None, "--engineering-cost", help="USD, for the payback time."),
    max_ttft_ms: float | None = typer.Option(None, "--max-ttft-ms", help="SLO: TTFT at most this many ms (a "
                                                "point's median; a server request's own, for goodput)."),
    max_tpot_ms: float | None = typer.Option(None, "--max-tpot-ms", help="SLO: TPOT at most this many ms (a "
                                                "point's median; a server request's own, for goodput)."),
    host_tier: str = typer.Option("configured", "--host-tier", help="Servers: charge a host KV tier at the size "
                                  "its flags configure (configured: --cache-ram, --kv-offloading-size, "
                                  "--hicache-size) or at the server's RSS growth beyond none's (measured)."),
    base_throughput: float | None = typer.Option(None, "--base-throughput", help="What-if: tokens/s without "
                                                    "offload (with --offload-throughput; no results needed)."),
    offload_throughput: float | None = typer.Option(None, "--offload-throughput", help="What-if: with offload."),
    assume_quiet: bool = typer.Option(False, "--assume-quiet", help="Other tools' files only: they record no "
                                      "machine load, so no verdict is given unless you say the machine was quiet "
                                      "(the verdict then names it)."),
    out_dir: str | None = typer.Option(None, "--out", help="Where cost.csv, cost.json and cost.png go "
                                           "(default: <first path>/report)."),
) -> None:
    """Cost per 1M generated tokens per mode from measured throughput (or what-if figures), saving vs none.
    Ctrl-C or SIGTERM while it writes its files stops it with exit 130, leaving none half-written."""
    from kvbench.analysis.cost import Prices
    from kvbench.results.peers import peer_files

    stop_on_signals()
    with handle_errors(PRICE_FLAGS):
        prices = Prices(gpu_price, host_price, tokens_per_month, engineering_cost, disk_price)
    for name, v in (("--max-ttft-ms", max_ttft_ms), ("--max-tpot-ms", max_tpot_ms)):
        if v is not None and not (v > 0 and v != float("inf")):
            fail(f"{name} must be a finite number of milliseconds above 0, not {v}")
    if (base_throughput is None) != (offload_throughput is None):
        fail("--base-throughput and --offload-throughput go together")
    if base_throughput is not None and results:
        fail("give result directories or a what-if (--base-throughput, --offload-throughput), not both")
    if base_throughput is not None:
        _what_if(prices, base_throughput, offload_throughput)
        return
    results, target = results_and_target(results, out_dir, "costing", "give result directories, or "
                                         "--base-throughput and --offload-throughput for a what-if", "cost files")
    with handle_errors():
        peers = peer_files(results)
    if peers is not None:
        kvbench_runs_only({"--max-ttft-ms": max_ttft_ms, "--max-tpot-ms": max_tpot_ms, "--tokens-per-month":
                           tokens_per_month, "--engineering-cost": engineering_cost, "--host-price": host_price,
                           "--disk-price": disk_price, "--host-tier": host_tier != "configured"},
                          "they hold no memory figures or per-request SLO checks")
        show_peer_costs(peers, target, prices, assume_quiet)
        return
    if assume_quiet:
        fail("--assume-quiet is for other tools' files: kvbench's runs record the machine's load")
    show_run_costs(results, target, prices, max_ttft_ms, max_tpot_ms, host_tier)


def _what_if(prices: Prices, base: float, offload: float) -> None:
    """The what-if: the cost per 1M tokens at ``base`` and at ``offload`` tokens/s, and what the prices plan
    (:func:`kvbench.report.cost.what_if_lines`); nothing written."""
    from kvbench.analysis.cost import what_if
    from kvbench.report.cost import what_if_lines

    with handle_errors(PRICE_FLAGS):
        w = what_if(prices, base, offload)
    for line in what_if_lines(prices, w, base, offload):
        out.print(line, highlight=False, markup=False)
