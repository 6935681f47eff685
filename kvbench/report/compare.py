"""``kvbench compare``'s table as text: per matched point, the ratio B/A of each metric shown, marked ``better``
or ``worse`` (by more than 5%)."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.compare import COMPARE_METRICS
from kvbench.results.load import Results
from kvbench.analysis.reuse import reuse_trials

#: The metrics the table shows, with their column names.
SHOWN = {"ttft_s": "TTFT", "tpot_s": "TPOT", "throughput_tokens_per_s": "tok/s", "kv_device_peak_bytes": "KV device",
         "rss_peak_bytes": "RSS"}
#: Ratios B/A past which B is marked worse: below the first for metrics where higher is better, above the second
#: for the others (5% either way).
WORSE_RATIOS = (0.95, 1.05)


def compare_display(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`kvbench.analysis.compare.compare_points`'s frame as text cells: scenario, prompt, batch, mode and the
    ratio B/A (three decimals; ``-`` where either side is missing) of each metric of :data:`SHOWN`.

    Returns:
        (cells, marks): marks has, per ratio cell, ``better`` (B better than A), ``worse`` (B worse by more than 5%,
        :data:`WORSE_RATIOS`) or ``""``.
    """
    cols = ["scenario", "prompt", "batch", "mode", *SHOWN.values()]
    rows, marks = [], []
    for r in frame.to_dict("records"):
        cells, mark = [r["group"], str(int(r["prompt_tokens"])), str(int(r["batch_size"])), r["mode_label"]], [""] * 4
        for m in SHOWN:
            ratio = r[f"{m}_ratio"]
            if ratio != ratio:
                cells.append("-")
                mark.append("")
                continue
            higher_better = COMPARE_METRICS[m]
            better = ratio > 1 if higher_better else ratio < 1
            worse = ratio < WORSE_RATIOS[0] if higher_better else ratio > WORSE_RATIOS[1]
            cells.append(f"{ratio:.3f}")
            mark.append("worse" if worse else "better" if better else "")
        rows.append(cells)
        marks.append(mark)
    return pd.DataFrame(rows, columns=cols, dtype=object), pd.DataFrame(marks, columns=cols, dtype=object)


def unmatched_hint(a: Results, b: Results) -> str:
    """What to add when two runs share no point: reuse runs (multi_turn, doc_qa) have none to share."""
    if reuse_trials(a.trials).empty and reuse_trials(b.trials).empty:
        return ""
    return ("; reuse runs (multi_turn, doc_qa) have no such points: compare their restore vs recompute tables in "
            "`kvbench report` and `kvbench cost`")


__all__ = ["SHOWN", "WORSE_RATIOS", "compare_display", "unmatched_hint"]
