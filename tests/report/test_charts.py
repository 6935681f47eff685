"""The report's charts show what was measured: one outlier cannot stretch an axis (its value is marked at the edge),
lines of equal values stay apart, over-budget points are marked on the throughput panel too."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from golden_run import RUN
from kvbench.analysis.points import point_table
from kvbench.report import charts
from kvbench.report.chart_axes import OUTLIER_GID, central_range
from kvbench.results.load import load_results


@pytest.fixture
def figures(monkeypatch):
    """The figures the charts draw, kept open instead of saved."""
    kept = []
    monkeypatch.setattr(charts, "save_figure", lambda fig, path: kept.append(fig) or path)
    yield kept
    for fig in kept:
        charts.pyplot().close(fig)


def overheads(values: dict[tuple[str, int, int], tuple[float, float, float]]) -> pd.DataFrame:
    """A point table of offload modes: (mode, prompt, batch) → (overhead %, its interval's low, high)."""
    return pd.DataFrame([{"group": "g", "mode": m, "mode_label": m, "prompt_tokens": p, "batch_size": b,
                          "memory_saving_pct": 50.0, "time_overhead_pct": v, "time_overhead_ci_low": lo,
                          "time_overhead_ci_high": hi} for (m, p, b), (v, lo, hi) in values.items()])


def test_one_10x_outlier_cannot_stretch_the_overhead_axis(figures, tmp_path):
    """From the issue: one busy trial stretched the TPOT-overhead axis to 1,600% and flattened every real result
    onto zero. Seven points from +8% to +25%, one at +200% (10× the others' median): the axis holds the seven
    with their intervals, and the outlier is drawn at the top edge, marked and labelled."""
    values = {("full", 256, 1): (10.0, 5.0, 15.0), ("full", 256, 2): (12.0, 8.0, 16.0),
              ("full", 1024, 1): (18.0, 12.0, 24.0), ("full", 1024, 2): (20.0, 15.0, 26.0),
              ("hier", 256, 1): (8.0, 2.0, 12.0), ("hier", 256, 2): (9.0, 4.0, 13.0),
              ("hier", 1024, 1): (25.0, 20.0, 31.0), ("hier", 1024, 2): (200.0, 180.0, 1600.0)}
    charts.saving_and_overhead(overheads(values), "g", {"full": "C0", "hier": "C1"}, tmp_path / "x.png")
    overhead = figures[0].axes[1]
    low, high = overhead.get_ylim()
    assert 31.0 < high < 50.0 and -5.0 < low <= 0.0, (low, high)  # every other interval end shows, 0 too
    marked = [line for line in overhead.get_lines() if line.get_gid() == OUTLIER_GID]
    assert len(marked) == 1 and marked[0].get_ydata()[0] == pytest.approx(high) and marked[0].get_marker() == "^"
    assert marked[0].get_color() == "C1"
    assert "+200%" in [t.get_text() for t in overhead.texts]


def test_the_central_range_keeps_every_value_without_an_outlier():
    assert central_range([8, 9, 10, 12, 18, 20, 25]) == pytest.approx((0 - 0.08 * 25, 25 + 0.08 * 25))
    assert central_range([8, 9, 10, 12, 18, 20, 25, 200])[1] < 30  # 200 is beyond 3 spreads of the quartiles
    assert central_range([5.0, 400.0]) == pytest.approx((-32.0, 432.0))  # 2 values: no quartiles, both shown
    assert central_range([float("nan"), float("inf")], include=()) == (-1.0, 1.0)


def test_equal_lines_of_two_batch_sizes_stay_apart(figures, tmp_path):
    """From the issue: batch-1 and batch-2 lines of a mode overlapped unseen. Equal values: each series has its
    own marker and sits a little apart along the prompt axis."""
    same = (10.0, 5.0, 15.0)
    values = {(m, p, b): same for m in ("full", "hier") for p in (256, 1024) for b in (1, 2)}
    charts.saving_and_overhead(overheads(values), "g", {"full": "C0", "hier": "C1"}, tmp_path / "x.png")
    lines = [x for x in figures[0].axes[1].get_lines() if not x.get_label().startswith("_")]
    assert [x.get_label() for x in lines] == ["full, batch 1", "full, batch 2", "hier, batch 1", "hier, batch 2"]
    assert [x.get_marker() for x in lines] == ["o", "s", "o", "s"]
    xs = np.array([x.get_xdata() for x in lines], dtype=float)
    assert len({tuple(r) for r in xs.round(6)}) == 4  # no two series at the same x
    assert (np.abs(np.log2(xs / [[256, 1024]])) < 0.1).all()  # each still next to its prompt length


def test_over_budget_points_are_marked_on_the_throughput_panel(figures, tmp_path):
    """From the issue: `none` over budget was not marked on the throughput chart (only on the KV panel)."""
    table = point_table(load_results([RUN]).trials)
    charts.throughput_vs_batch(table, "golden", charts.mode_colours(list(table["mode_label"])), tmp_path / "x.png")
    throughput = figures[0].axes[0]
    marks = [c for c in throughput.collections if c.get_label() == "over the budget"]
    none = table[(table["mode"] == "none") & (table["prompt_tokens"] == 96)].sort_values("batch_size")
    assert list(none["n_over_budget"]) == [5, 5]  # the golden run's budget: none never fits 96 tokens
    assert len(marks) == 1
    np.testing.assert_allclose(marks[0].get_offsets(), [[1, none["throughput_tokens_per_s_median"].iloc[0]],
                                                        [2, none["throughput_tokens_per_s_median"].iloc[1]]])
    assert "over the budget" in [t.get_text() for t in throughput.get_legend().get_texts()]
