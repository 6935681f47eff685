"""``kvbench cost`` of kvbench runs: the cost table per mode, the reuse table, goodput under the SLOs, the verdict
lines, and the cost files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from kvbench.cli.common import (PRICE_FLAGS, fail, handle_errors, load_runs, out, render, show, show_problems,
                                write_or_stop)

if TYPE_CHECKING:
    from kvbench.analysis.cost import Prices
    from kvbench.report.cost import CostReport

#: Said below the verdict lines: why a line's USD per 1M need not be the table's.
PAIRED_NOTE = ("a line's USD per 1M: none's × (1 − the mode's paired saving), as its pairs put it; the table's are "
               "each mode's own median throughput, which need not imply the paired saving")


def show_run_costs(paths: list[Path], target: Path, prices: Prices, max_ttft_ms: float | None,
                   max_tpot_ms: float | None, host_tier: str) -> None:
    """Cost the kvbench runs of ``paths`` at ``prices`` (SLOs in milliseconds; ``host_tier`` as ``--host-tier``),
    print the tables and lines, and write the cost files into ``target``. Fails (exit 2) when no group has a
    measured trial; a group without one beside others that have is said ``not costed``."""
    from kvbench.report import cost as rc

    loaded = load_runs(paths)
    failed = rc.failed_groups(loaded.trials)
    if failed and len(failed) == loaded.trials["group"].nunique():  # nothing to cost: said, and nothing written
        show_problems(loaded)
        fail(f"nothing to cost: {'; '.join(failed.values())}")
    with handle_errors(PRICE_FLAGS):
        rep = rc.compute_costs(loaded, prices, None if max_ttft_ms is None else max_ttft_ms / 1e3,
                               None if max_tpot_ms is None else max_tpot_ms / 1e3, host_tier)
    _cost_table(rep, prices)
    _reuse_table(rep, prices)
    _goodput_tables(rep, max_ttft_ms, max_tpot_ms)
    said = rep.verdicts()
    for group, lines in said.items():
        out.print(f"[bold]{escape(group)}:[/]", highlight=False)
        for line in lines:
            out.print(f"  {escape(line)}", highlight=False)
    if any(said.values()):
        out.print(PAIRED_NOTE, highlight=False, markup=False)
    for line in failed.values():  # a group with nothing to cost beside others that have
        out.print(f"[bold]not costed:[/] {escape(line)}", highlight=False)
    bases = rep.host_bases()
    host, disk = prices.host_per_gib_hour, prices.disk_per_gib_hour
    out.print(f"host memory charged at {host:g} and disk at {disk:g} USD per GiB-hour"
              + (" (pass --host-price and --disk-price to charge them)" if host == 0 == disk else "")
              + (f"; host memory held: {', '.join(bases)}" if bases else ""), highlight=False, markup=False)
    show_problems(loaded)
    write_or_stop("the cost files", target,
                  lambda: rc.write_costs(rep.table, target, prices, rep.reuse, rep.server_load), "cost")


def _cost_table(rep: CostReport, prices: Prices) -> None:
    """The cost table: the best qualifying batch per mode and prompt length (nothing when there are no points)."""
    from kvbench.report.cost import COST_CAPTION, cost_display

    if not len(rep.table):
        return
    widest = max(len(str(m)) for m in rep.table["mode_label"])
    cells = cost_display(rep.table, prices.tokens_per_month is not None, prices.engineering_cost is not None)
    show(render(cells, f"cost per 1M generated tokens at {prices.gpu_per_hour:g} USD per GPU-hour, host "
                f"{prices.host_per_gib_hour:g} and disk {prices.disk_per_gib_hour:g} USD per GiB-hour", COST_CAPTION,
                left=("scenario", "mode", "verdict"), wrap=("scenario", "mode", "saving % vs none", "verdict"),
                min_width={"mode": min(28, max(12, widest)), "verdict": 12}),
         first=("scenario", "tokens/s", "pairs", "batch"))


def _reuse_table(rep: CostReport, prices: Prices) -> None:
    """The reuse table, recompute against restore, and its verdict lines (nothing without reuse workloads)."""
    from kvbench.report.cost import reuse_cost_caption, reuse_cost_display, reuse_verdicts

    if not len(rep.reuse):
        return
    cells, marks = reuse_cost_display(rep.reuse)
    server = rep.reuse["engine"].notna().any()
    show(render(cells, f"reuse: cost per 1M generated tokens at {prices.gpu_per_hour:g} USD per GPU-hour, recompute "
                "vs restore", reuse_cost_caption(server), left=("scenario", "mode", "vs", "verdict"),
                wrap=[c for c in cells.columns if c != "scenario"], min_width={"mode": 12}, marks=marks))
    for line in reuse_verdicts(rep.reuse):
        out.print(f"  {escape(line)}", highlight=False)


def _goodput_tables(rep: CostReport, max_ttft_ms: float | None, max_tpot_ms: float | None) -> None:
    """Per server group, the load table with goodput under the SLOs given (nothing without an SLO or a server
    run)."""
    from kvbench.report.server_load import GOODPUT_CAPTION, server_load_display

    if not len(rep.server_load) or (max_ttft_ms is None and max_tpot_ms is None):
        return
    slo = " and ".join(f"{k} ≤ {v:g} ms" for k, v in (("TTFT", max_ttft_ms), ("TPOT", max_tpot_ms)) if v is not None)
    for group, part in rep.server_load.groupby("group", sort=False):
        show(render(server_load_display(part).drop(columns=["scenario"]),
                    f"{group}: goodput under {slo} per request", GOODPUT_CAPTION, left=1, wrap=True))
