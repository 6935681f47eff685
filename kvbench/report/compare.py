"""``kvbench compare``'s table as text: per matched point, the ratio B/A of each metric shown, marked ``better``
or ``worse`` (by more than 5%); and what to say when two runs share no point, or no figure of a metric."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.compare import COMPARE_METRICS, SERVER_METRICS, compare_table, plain_server_rows, point_name
from kvbench.analysis.reuse import reuse_trials
from kvbench.results.load import Results
from kvbench.results.rows import MEASURED

#: The metrics the table shows, with their column names.
SHOWN = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_p99_s": "ITL p99", "throughput_tokens_per_s": "tok/s",
         "kv_device_peak_bytes": "KV device", "rss_peak_bytes": "RSS"}
#: Ratios B/A past which B is marked worse: below the first for metrics where higher is better, above the second
#: for the others (5% either way).
WORSE_RATIOS = (0.95, 1.05)
#: Points of a side named in a message about points that do not match.
NAMED_POINTS = 3


def compare_display(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`kvbench.analysis.compare.compare_points`'s frame as text cells: scenario, prompt, batch (a server
    point's concurrency: the column ``concurrency`` when every point is a server's, cells ``b<B>`` / ``c<C>`` when
    both kinds are there), mode and the ratio B/A (three decimals; ``-`` where either side is missing) of each
    metric of :data:`SHOWN`; a metric no point has (a server's KV and RSS) is left out.

    Returns:
        (cells, marks): marks has, per ratio cell, ``better`` (B better than A), ``worse`` (B worse by more than 5%,
        :data:`WORSE_RATIOS`) or ``""``.
    """
    server = frame["concurrency"] > 0 if "concurrency" in frame else pd.Series(False, index=frame.index)
    load = "concurrency" if server.all() and len(frame) else "batch" if not server.any() else "batch / concurrency"
    shown = {m: name for m, name in SHOWN.items() if frame[f"{m}_ratio"].notna().any() or not len(frame)}
    cols = ["scenario", "prompt", load, "mode", *shown.values()]
    rows, marks = [], []
    for r, srv in zip(frame.to_dict("records"), server):
        n = int(r["concurrency"] if srv else r["batch_size"])
        level = f"{'c' if srv else 'b'}{n}" if load == "batch / concurrency" else str(n)
        cells, mark = [r["group"], str(int(r["prompt_tokens"])), level, r["mode_label"]], [""] * 4
        for m in shown:
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


def _nothing_comparable(side: str, results: Results) -> str | None:
    """Why ``results`` has no point compare could match (None when it has some)."""
    trials = results.trials
    if len(compare_table(trials)):
        return None
    server = trials[trials["engine"].notna()] if "engine" in trials else trials.iloc[0:0]
    plain = plain_server_rows(trials)
    reuse = len(reuse_trials(trials[~trials.index.isin(server.index)])) + len(server) - len(plain)
    if reuse:
        return (f"{side} is a reuse run (multi_turn, doc_qa): a reuse workload has no such points; compare the "
                "restore vs recompute tables of `kvbench report` and `kvbench cost`")
    if len(trials) == 0:
        return f"{side} holds no trial"
    failed = trials[~trials["status"].isin(MEASURED)]
    if failed.empty:
        return None
    first = failed.iloc[0]
    why = str(first.get("message") or "").strip().splitlines()
    return (f"{side} measured no point: all {len(trials)} of its trials ended "
            f"{', '.join(sorted(set(failed['status'].astype(str))))} (the first, {first['trial_id']}: "
            f"{why[0] if why else first['status']})")


def unmatched_reason(a: Results, b: Results) -> str:
    """What exactly keeps two runs from sharing a point, as one sentence (see
    :func:`kvbench.analysis.compare.compare_table` for what a point is): a side that measured none (a reuse run, or
    every trial failed, with the first's message), points of the in-process engine against a server's, other
    scenario names, or else the first points of each side."""
    reasons = [why for side, res in (("A", a), ("B", b)) if (why := _nothing_comparable(side, res))]
    if reasons:
        return "; ".join(reasons)
    ta, tb = compare_table(a.trials), compare_table(b.trials)
    kinds = [("server" if (t["concurrency"] > 0).all() else "in-process" if (t["concurrency"] == 0).all() else "")
             for t in (ta, tb)]
    if {"server", "in-process"} == set(kinds):
        engine = " and ".join(sorted(set(plain_server_rows(a.trials if kinds[0] == "server" else b.trials)["engine"])))
        srv, own = ("A", "B") if kinds[0] == "server" else ("B", "A")
        return (f"{srv} ran on a server ({engine}: points by concurrency), {own} on kvbench's in-process engine "
                "(points by batch size): a server's point never matches an in-process one")
    ga, gb = list(dict.fromkeys(ta["group"])), list(dict.fromkeys(tb["group"]))
    if not set(ga) & set(gb):
        return f"A measured the scenario {', '.join(ga)}, B {', '.join(gb)}: the scenario names differ"

    def first(t: pd.DataFrame) -> str:
        names = [point_name(r) for _, r in t.head(NAMED_POINTS).iterrows()]
        return ", ".join(names) + (f" and {len(t) - NAMED_POINTS} more" if len(t) > NAMED_POINTS else "")

    return f"A measured {first(ta)}; B {first(tb)}"


def missing_metric_reason(frame: pd.DataFrame, metric: str) -> str:
    """Why no matched point of ``frame`` has ``metric`` in both runs: a figure server rows do not carry, or one
    measured on CUDA only."""
    if "concurrency" in frame and (frame["concurrency"] > 0).all() and metric not in SERVER_METRICS:
        return (f"no matched point has {metric} in both runs: server rows carry {', '.join(SERVER_METRICS)}, not "
                "kvbench's own memory and traffic figures")
    return f"no matched point has {metric} in both runs (CUDA-only figures are empty on CPU runs)"


__all__ = ["NAMED_POINTS", "SHOWN", "WORSE_RATIOS", "compare_display", "missing_metric_reason", "unmatched_reason"]
