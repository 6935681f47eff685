"""``kvbench cost``: USD per million generated tokens, the saving against ``none`` and its worth."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.cli.common import _fail, _load, _problems, _terminated, err, out


def cost(
    results: list[Path] = typer.Argument(None, help="Run directories, trials.jsonl files or folders of runs "
                                         "(default: the newest run under results/)."),
    gpu_price: float = typer.Option(..., "--gpu-price", help="USD per GPU-hour."),
    host_price: float = typer.Option(0.0, "--host-price", help="USD per GiB-hour of host memory held by KV."),
    disk_price: float = typer.Option(0.0, "--disk-price", help="USD per GiB-hour of disk held by KV."),
    tokens_per_month: Optional[float] = typer.Option(None, "--tokens-per-month", help="For the saving per month."),
    engineering_cost: Optional[float] = typer.Option(None, "--engineering-cost", help="USD, for the payback time."),
    max_ttft_ms: Optional[float] = typer.Option(None, "--max-ttft-ms", help="SLO: median TTFT at most this."),
    max_tpot_ms: Optional[float] = typer.Option(None, "--max-tpot-ms", help="SLO: median TPOT at most this."),
    base_throughput: Optional[float] = typer.Option(None, "--base-throughput", help="What-if: tokens/s without "
                                                    "offload (with --offload-throughput; no results needed)."),
    offload_throughput: Optional[float] = typer.Option(None, "--offload-throughput", help="What-if: with offload."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Where cost.csv, cost.json and cost.png go "
                                           "(default: <first path>/report)."),
) -> None:
    """Cost per 1M generated tokens per mode from measured throughput (or what-if figures), saving vs none.
    Ctrl-C or SIGTERM while it writes its files stops it with exit 130, leaving none half-written."""
    from kvbench.analysis.cost import Prices, what_if

    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    try:
        prices = Prices(gpu_price, host_price, tokens_per_month, engineering_cost, disk_price)
    except ValueError as exc:
        _fail(str(exc))
    for name, v in (("--max-ttft-ms", max_ttft_ms), ("--max-tpot-ms", max_tpot_ms)):
        if v is not None and not (v > 0 and v != float("inf")):
            _fail(f"{name} must be a finite number of milliseconds above 0, not {v}")
    if (base_throughput is None) != (offload_throughput is None):
        _fail("--base-throughput and --offload-throughput go together")
    if base_throughput is not None and results:
        _fail("give result directories or a what-if (--base-throughput, --offload-throughput), not both")
    if base_throughput is not None:
        try:
            w = what_if(prices, base_throughput, offload_throughput)
        except ValueError as exc:
            _fail(str(exc))
        out.print(f"cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour: {w['base_usd_per_million']:,.2f} "
                  f"→ {w['offload_usd_per_million']:,.2f} USD ({w['saving_pct']:.1f}% saving; "
                  f"{base_throughput:g} → {offload_throughput:g} tokens/s)", highlight=False, markup=False)
        if w["monthly_saving_usd"] is not None:
            out.print(f"at {tokens_per_month:,.0f} tokens per month: {w['monthly_saving_usd']:,.2f} USD per month",
                      highlight=False, markup=False)
        if w["payback_months"] is not None:
            out.print(f"payback of {engineering_cost:,.0f} USD: {w['payback_months']:.1f} months",
                      highlight=False, markup=False)
        elif engineering_cost is not None:
            out.print(f"no payback of {engineering_cost:,.0f} USD: offload saves nothing here",
                      highlight=False, markup=False)
        if w["saving_pct"] < 0:
            out.print("offload raises cost here: its throughput is lower than without it", highlight=False)
        return
    if not results:
        from kvbench.results.newest import newest_run

        found = newest_run("results")
        if found is None:
            _fail("no results given and no run under results/: give result directories, or --base-throughput and "
                  "--offload-throughput for a what-if")
        out.print(f"costing the newest run under results/: {found}", highlight=False, markup=False)
        results = [found]
    from kvbench.analysis.points import point_table
    from kvbench.analysis.cost import cost_table, verdicts
    from kvbench.analysis.reuse_cost import reuse_cost, reuse_verdicts
    from kvbench.analysis.intervals import pct_interval

    if out_dir is not None and not out_dir.strip():
        _fail("--out is empty: give a directory")
    first = results[0]
    target = Path(out_dir) if out_dir else (first if first.is_dir() else first.parent) / "report"
    from kvbench.results.run_dir import RunDirError, refuse_symlink_dir

    try:
        refuse_symlink_dir(target)  # before any output: a refused run prints no table
    except RunDirError as exc:
        _fail(str(exc))
    if target.exists() and not target.is_dir():
        _fail(f"{target} is not a directory: the cost files go in a directory (give another with --out)")
    loaded = _load(results)
    points = point_table(loaded.trials)
    table = cost_table(points, prices, loaded.trials, None if max_ttft_ms is None else max_ttft_ms / 1e3,
                       None if max_tpot_ms is None else max_tpot_ms / 1e3) if len(points) else points
    reuse = reuse_cost(loaded.trials, prices)
    monthly = tokens_per_month is not None
    t = Table(title=f"cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour, host {host_price:g} and disk "
                    f"{disk_price:g} USD per GiB-hour",
              caption="best qualifying batch per mode (all trials ok within the budget, ids equal to none's, measured "
                      "`repeats` times, SLOs met); USD/1M with the 95% interval of its throughput; saving against "
                      "none at the same prompt length, paired by repeat, with its 95% interval over the pairs")
    for c in ["scenario", "prompt", "mode", "batch", "tokens/s", "USD/1M", "saving %", "pairs"] + \
            (["USD/month"] if monthly else []) + (["payback months"] if engineering_cost is not None else []):
        t.add_column(c, justify="left" if c in ("scenario", "mode") else "right", overflow="fold")
    for r in table.to_dict("records"):
        if r["usd_per_million"] != r["usd_per_million"]:
            cells = ["-", "-", "-", escape(r["why"]), "-"] + (["-"] if monthly else []) + \
                    (["-"] if engineering_cost is not None else [])
        else:
            usd = f"{r['usd_per_million']:,.2f}" + ("" if r["usd_ci_low"] != r["usd_ci_low"] else
                                                    f" [{r['usd_ci_low']:,.2f}–{r['usd_ci_high']:,.2f}]")
            cells = [str(int(r["batch_size"])), f"{r['throughput_tokens_per_s']:,.2f}", usd,
                     "ref" if r["mode"] == "none" else
                     pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1).replace("%", ""),
                     "-" if r["mode"] == "none" else str(int(r["pairs"]))]
            if monthly:
                m = r["monthly_saving_usd"]
                cells.append("-" if m is None or m != m else f"{m:,.0f}")
            if engineering_cost is not None:
                pb = r["payback_months"]
                cells.append("-" if pb is None or pb != pb else f"{pb:.1f}")
        t.add_row(escape(r["group"]), str(int(r["prompt_tokens"])), escape(r["mode_label"]), *cells)
    if len(table):
        out.print(t)
    if len(reuse):
        out.print(_reuse_cost_table(reuse, gpu_price))
        for line in reuse_verdicts(reuse):
            out.print(f"  {escape(line)}", highlight=False)
    for group, lines in (verdicts(table) if len(table) else {}).items():
        out.print(f"[bold]{escape(group)}:[/]", highlight=False)
        for line in lines:
            out.print(f"  {escape(line)}", highlight=False)
    bases = sorted(set(table["host_basis"]) - {""}) if "host_basis" in table else []
    out.print(f"host memory charged at {host_price:g} and disk at {disk_price:g} USD per GiB-hour"
              + (" (pass --host-price and --disk-price to charge them)" if host_price == 0 == disk_price else "")
              + (f"; host memory held: {', '.join(bases)}" if bases else ""), highlight=False, markup=False)
    _problems(loaded)
    from kvbench.analysis.cost import write_costs

    try:
        files = write_costs(table, target, prices, reuse)
    except RunDirError as exc:  # a symbolic link where the files would go
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write {exc.filename or target}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        err.print(f"interrupted while writing the cost files in {target}: each is whole, new or from before",
                  highlight=False, markup=False)
        raise typer.Exit(130) from None
    out.print(f"cost: {', '.join(str(f) for f in files)}", highlight=False, markup=False)


def _reuse_cost_table(reuse: Any, gpu_price: float) -> Table:
    """Per reuse scenario and mode: throughput and cost recomputing every prompt vs restoring stored prefixes."""
    from kvbench.analysis.intervals import pct_interval

    t = Table(title=f"reuse: cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour, recompute vs restore",
              caption="the same requests one at a time; cold = recompute every prompt, warm = restore stored "
                      "prefixes (charged --host-price for the store's memory, --disk-price for its disk); tokens/s = "
                      "generated tokens ÷ e2e time; saving with its 95% interval over request pairs; prefill saved "
                      "= prompt tokens restored instead of computed")
    for c in ("scenario", "mode", "requests", "tok/s cold", "tok/s warm", "USD/1M cold", "USD/1M warm", "saving %",
              "pairs", "prefill saved %", "TTFT saved ms", "= none"):
        t.add_column(c, justify="left" if c in ("scenario", "mode") else "right", overflow="fold",
                     no_wrap=c == "scenario", min_width=12 if c == "mode" else None)
    for r in reuse.to_dict("records"):
        def num(v: Any, fmt: str) -> str:
            if v is None or v != v:
                return "-"
            text = format(v, fmt)
            return format(0.0, fmt) if float(text.replace(",", "")) == 0 else text  # no "-0"

        t.add_row(r["group"], r["mode_label"], str(r["requests"]), num(r["recompute_tokens_per_s"], ",.2f"),
                  num(r["restore_tokens_per_s"], ",.2f"), num(r["recompute_usd_per_million"], ",.2f"),
                  num(r["restore_usd_per_million"], ",.2f"),
                  pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1).replace("%", ""),
                  str(r["pairs"]),
                  num(r["prefill_saved_pct"], ".1f"), num(r["ttft_saved_s"] * 1e3, ",.0f"),
                  {True: "yes", False: "[red]NO[/]", "near tie": "near tie"}.get(r["tokens_match"], "-"))
    return t
