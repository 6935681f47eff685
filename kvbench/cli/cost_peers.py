"""``kvbench cost`` of other tools' result files (GuideLLM, AIPerf, vllm bench serve, llm-d reports): the table
against the first file, the verdict lines, the notes, and the cost files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from kvbench.cli.common import handle_errors, out, render, show, write_or_stop

if TYPE_CHECKING:
    from kvbench.analysis.cost import Prices
    from kvbench.results.peers import PeerRun


def show_peer_costs(runs: list[PeerRun], target: Path, prices: Prices, assume_quiet: bool) -> None:
    """Cost ``runs`` (:func:`kvbench.results.peers.peer_files`) at ``prices``, the first as the reference, print
    the table and lines, and write ``peer_cost.csv`` and ``peer_cost.json`` into ``target``. ``assume_quiet``:
    give verdicts although the files record no machine load."""
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
