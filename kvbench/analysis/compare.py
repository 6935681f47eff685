"""``kvbench compare RUN_A RUN_B``: matched points side by side, the ratio B/A per metric, and thresholds that
fail (for CI gates).

A point is the in-process engine's (scenario, prompt length, batch size, mode label) of
:func:`kvbench.analysis.points.point_table`, or a server run's of plain prompts (scenario, prompt length,
concurrency, mode label: each request one sequence); a reuse workload (multi_turn, doc_qa) has none.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

from kvbench.analysis.points import POINT_KEYS, point_table
from kvbench.errors import BadParameter
from kvbench.results.load import Results
from kvbench.results.rows import agg

#: Metrics compare knows (their per-point medians; ITL's percentiles pooled over every gap of the point's
#: trials), and whether higher is better.
COMPARE_METRICS: dict[str, bool] = {
    "ttft_s": False, "tpot_s": False, "e2e_s": False,
    "throughput_tokens_per_s": True, "decode_tokens_per_s": True,
    "kv_device_peak_bytes": False, "peak_device_allocated_bytes": False, "rss_peak_bytes": False,
    "bytes_moved_per_token": False, "itl_p50_s": False, "itl_p99_s": False,
}
#: The metrics a server's rows carry (the rest are kvbench's own memory and traffic figures).
SERVER_METRICS = ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s", "decode_tokens_per_s", "itl_p50_s",
                  "itl_p99_s")
#: The keys of a compared point: a point's, and the server's concurrency (0 for kvbench's in-process engine,
#: whose load is its batch size; a server point's batch size is 1).
COMPARE_KEYS = [*POINT_KEYS, "concurrency"]


def _column(metric: str) -> str:
    """The column of :func:`kvbench.analysis.points.point_table` that holds ``metric``'s figure of a point."""
    return metric if metric.startswith("itl_") else agg(metric, "median")


@dataclass(frozen=True)
class Threshold:
    """A gate ``METRIC:PCT``: fail when B is worse than A by more than ``pct`` percent on ``metric``."""

    metric: str
    pct: float


#: The largest threshold percentage: B a million times worse than A.
MAX_FAIL_ON_PCT = 1e8


def parse_threshold(spec: str) -> Threshold:
    """Parse ``METRIC:PCT`` (e.g. ``tpot_s:10``, ``throughput_tokens_per_s:5%``).

    Raises:
        kvbench.errors.BadParameter: (``param`` ``"threshold"``) not of that form, an unknown metric (the message
            lists the known ones), or a PCT over :data:`MAX_FAIL_ON_PCT`.
    """
    m = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*:\s*([0-9]*\.?[0-9]+)\s*%?\s*", spec)
    if not m:
        raise BadParameter(f"{{threshold}} {spec!r}: expected METRIC:PCT, e.g. tpot_s:10", "threshold")
    metric, pct = m.group(1), float(m.group(2))
    if pct > MAX_FAIL_ON_PCT:  # '1' and 5,000 zeros is inf as a float: a gate that can never fail
        raise BadParameter(f"{{threshold}} {spec!r}: PCT must be at most {MAX_FAIL_ON_PCT:,.0f}", "threshold")
    if metric not in COMPARE_METRICS:
        raise BadParameter(f"{{threshold}} {spec!r}: unknown metric {metric!r}; known: "
                           f"{', '.join(COMPARE_METRICS)}", "threshold")
    return Threshold(metric, pct)


def plain_server_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The rows of server runs of plain prompts (``engine`` set, each request its own document: ``p<N>-i<k>``),
    not those of a server's reuse workloads (multi_turn, doc_qa), whose requests share documents."""
    if "engine" not in trials or "request_id" not in trials or "document" not in trials:
        return trials.iloc[0:0]
    return trials[trials["engine"].notna() & (trials["request_id"] == trials["document"])]


def compare_table(trials: pd.DataFrame) -> pd.DataFrame:
    """The measured points compare matches: :func:`kvbench.analysis.points.point_table`'s with
    ``concurrency`` 0, then those of plain-prompt server runs (:func:`plain_server_rows`) per scenario × prompt
    length × concurrency × mode label (their ``batch_size`` 1), by the same aggregates."""
    own = point_table(trials).assign(concurrency=0)
    rows = plain_server_rows(trials)
    if len(rows):
        level = pd.to_numeric(rows["concurrency"], errors="coerce").fillna(1) if "concurrency" in rows else 1
        # the level as the batch size: point_table then pairs each mode with `none` at its own level
        srv = point_table(rows.drop(columns="warm").assign(batch_size=level))
        own = pd.concat([own, srv.assign(concurrency=srv["batch_size"], batch_size=1)], ignore_index=True)
    return own[own["measured"] > 0]


def compare_points(a: Results, b: Results) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Points measured in both A and B (matched on :data:`COMPARE_KEYS`: scenario, prompt length, batch size, mode
    label and a server's concurrency; see :func:`compare_table`).

    Returns:
        (frame, only_in_a, only_in_b): frame has the keys and, per metric of :data:`COMPARE_METRICS`,
        ``<metric>_a``, ``<metric>_b`` (medians over measured trials; ITL percentiles pooled) and
        ``<metric>_ratio`` = B / A (NaN where either side is missing or A is 0); the other two list the points
        (:func:`point_name`) that only one side measured.
    """
    cols = [_column(m) for m in COMPARE_METRICS]
    ta, tb = compare_table(a.trials), compare_table(b.trials)
    ta = ta.assign(_order=range(len(ta)))
    tb = tb.assign(_order=range(len(ta), len(ta) + len(tb)))
    extra = ["tokens_match", "n_ok", "trials", "_order"]
    merged = ta[COMPARE_KEYS + cols + extra].merge(tb[COMPARE_KEYS + cols + extra], on=COMPARE_KEYS,
                                                   how="outer", suffixes=("_a", "_b"), indicator=True)
    # A's sweep order, then what only B has (an outer merge sorts the keys)
    merged = merged.sort_values(["_order_a", "_order_b"]).drop(columns=["_order_a", "_order_b"])

    def names(part: pd.DataFrame) -> list[str]:
        return [point_name(r) for _, r in part.iterrows()]

    only_a = names(merged[merged["_merge"] == "left_only"])
    only_b = names(merged[merged["_merge"] == "right_only"])
    frame = merged[merged["_merge"] == "both"].drop(columns="_merge").reset_index(drop=True)
    frame = frame.rename(columns={f"{_column(m)}_{s}": f"{m}_{s}" for m in COMPARE_METRICS for s in "ab"})
    for m in COMPARE_METRICS:
        frame[f"{m}_ratio"] = frame[f"{m}_b"] / frame[f"{m}_a"].where(frame[f"{m}_a"] != 0)
    return frame, only_a, only_b


def regressions(frame: pd.DataFrame, only_a: list[str]) -> list[str]:
    """What B lost against A whatever the metrics say: points A measured and B did not (missing, failed or
    skipped), greedy ids that stopped matching ``none``'s, and points whose trials all ended ``ok`` in A but not in
    B (over the budget, out of memory, failed). One line each."""
    lines = [f"{p}: measured in A, not in B" for p in only_a]
    for _, r in frame.iterrows():
        if r["tokens_match_b"] is False and r["tokens_match_a"] is not False:
            lines.append(f"{point_name(r)}: generated ids no longer match none's")
        if r["n_ok_a"] == r["trials_a"] and r["n_ok_b"] < r["trials_b"]:
            lines.append(f"{point_name(r)}: {int(r['trials_b'] - r['n_ok_b'])} of {int(r['trials_b'])} trials no "
                         "longer end ok (over budget, out of memory or failed)")
    return lines


def point_name(r: pd.Series) -> str:
    """``scenario p<prompt> b<batch> mode``; a server's point ``scenario p<prompt> c<concurrency> mode``."""
    level = r.get("concurrency", 0)
    load = f"c{int(level)}" if level == level and level else f"b{int(r['batch_size'])}"
    return f"{r['group']} p{int(r['prompt_tokens'])} {load} {r['mode_label']}"


def worse_pct(metric: str, ratio: float) -> float:
    """How much worse B is than A in percent (negative: better), given the ratio B/A."""
    return (ratio - 1) * 100 if not COMPARE_METRICS[metric] else (1 - ratio) * 100


def violations(frame: pd.DataFrame, thresholds: list[Threshold]) -> list[str]:
    """One line per (threshold, point) where B is worse than A by more than the threshold, worst first, e.g.
    ``tpot_s worse by 23.4% (limit 10%) at golden p96 b2 full: 0.0801 → 0.0989``."""
    found: list[tuple[float, str]] = []
    for th in thresholds:
        for _, r in frame.iterrows():
            ratio = r[f"{th.metric}_ratio"]
            if ratio is None or math.isnan(ratio):
                continue
            worse = worse_pct(th.metric, ratio)
            if worse > th.pct:
                found.append((worse, f"{th.metric} worse by {worse:.1f}% (limit {th.pct:g}%) at {point_name(r)}: "
                                     f"{r[f'{th.metric}_a']:.4g} → {r[f'{th.metric}_b']:.4g}"))
    return [line for _, line in sorted(found, key=lambda x: -x[0])]


__all__ = ["COMPARE_KEYS", "COMPARE_METRICS", "SERVER_METRICS", "Threshold", "compare_points", "compare_table",
           "parse_threshold", "plain_server_rows", "point_name", "regressions", "violations", "worse_pct"]
