"""The run and cost summaries of a break-even map run are per cell: a run of 256- and 1,024-token cells was summed
up as "prompt 640" (a length no trial had) and costed as one pooled saving."""

from __future__ import annotations

import pytest

from kvbench.analysis.cost import Prices
from kvbench.analysis.reuse_cost import reuse_cost
from kvbench.bench.summary import reuse_summary
from kvbench.report.cost import reuse_cost_display, reuse_verdicts
from kvbench.results.frame import trials_frame
from kvbench.scenario import parse_scenario
from test_break_even import base_scenario, synthetic_rows

CELLS = ["256 tokens, 0% shared, 5 prefixes", "256 tokens, 80% shared, 5 prefixes",
         "1,024 tokens, 0% shared, 5 prefixes", "1,024 tokens, 80% shared, 5 prefixes"]


def map_rows_of_two_lengths() -> list[dict]:
    return synthetic_rows(lengths=(256, 1024), shares=(0, 80))


def test_the_run_summary_of_a_map_run_has_a_row_per_cell_with_its_own_prompt_length():
    table = reuse_summary(map_rows_of_two_lengths(), parse_scenario(base_scenario()))
    assert table["prompt_tokens"].tolist() == [256, 256, 1024, 1024]  # pooled: 640 at every turn
    assert table["cell"].tolist() == CELLS and table["n"].tolist() == [15] * 4


def test_the_cost_summary_of_a_map_run_costs_each_cell_against_its_own_recompute():
    rows = map_rows_of_two_lengths()
    costs = reuse_cost(trials_frame(rows, "be"), Prices(2.0))
    assert costs["requests"].tolist() == [15] * 4  # pooled: one row of 60 requests
    assert costs["cell"].tolist() == CELLS
    # each cell's figure is that of its own trials costed alone
    for cell, (n, pct) in zip(CELLS, ((256, 0), (256, 80), (1024, 0), (1024, 80))):
        alone = reuse_cost(trials_frame([r for r in rows if r["prompt_tokens"] == n
                                         and r["shared_prefix_tokens"] == round(n * pct / 100)], "be"), Prices(2.0))
        mine = costs[costs["cell"] == cell].iloc[0]
        assert mine["saving_pct"] == pytest.approx(alone["saving_pct"].iloc[0], rel=1e-12), cell
    by = costs.set_index("cell")["saving_pct"]
    assert by[CELLS[3]] == pytest.approx(34.7, abs=0.5) and by[CELLS[1]] == pytest.approx(18.2, abs=0.5)
    shown = reuse_cost_display(costs)[0]
    assert shown["mode"].tolist() == [f"none ({c})" for c in CELLS]
    assert reuse_verdicts(costs)[3].startswith("be: `none (1,024 tokens, 80% shared, 5 prefixes)` restoring")
