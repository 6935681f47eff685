"""Capacity results as a table: per offload mode the capacity the search (:mod:`kvbench.bench.plans.capacity`) found,
with the measured figures at that point."""

from __future__ import annotations

from typing import Any

from kvbench.results.rows import NO_FIT, Status, agg


def _probe_text(probes: list[list[Any]]) -> str:
    """``1 2 4 8✗ 6 7✗``: the values probed in order, ✗ where they did not fit (or the status if another)."""
    marks = {Status.OK: ""}
    return " ".join(f"{v}{marks.get(st, '✗' if st in NO_FIT else f'({st})')}" for v, st in probes)


def capacity_frame(found: list[dict[str, Any]], points: Any) -> Any:
    """A table of capacity results (run.json ``capacity``) with the measured figures at each capacity.

    Args:
        found: the list :func:`kvbench.bench.plans.capacity.search_sweep` returns.
        points: the per-point table (:func:`kvbench.analysis.points.point_table`) of the same run.

    Returns:
        A DataFrame, one row per (fixed value, mode): ``prompt_tokens``, ``batch_size`` (one of them the capacity,
        NaN where nothing fit), ``mode_label``, ``capacity``, ``probes`` (text), ``stopped``, and at the capacity
        point ``n_ok``, ``tokens_match``, ``throughput_tokens_per_s_median``, ``kv_device_peak_bytes_median``.
    """
    import pandas as pd

    keys = ["prompt_tokens", "batch_size", "mode_label"]
    rows = []
    for f in found:
        searched = f["searched"]
        other = "prompt_tokens" if searched == "batch_size" else "batch_size"
        rows.append({other: f[other], searched: f["capacity"], "mode_label": f["mode_label"],
                     "searched": searched, "capacity": f["capacity"], "probes": _probe_text(f["probes"]),
                     "stopped": f["stopped"]})
    frame = pd.DataFrame(rows, columns=[*keys, "searched", "capacity", "probes", "stopped"])
    measured = ["n_ok", "tokens_match", agg("throughput_tokens_per_s", "median"), agg("kv_device_peak_bytes", "median")]
    if len(points):
        have = points[keys + [c for c in measured if c in points]].copy()
        frame = frame.astype({"prompt_tokens": "float64", "batch_size": "float64"}).merge(
            have.astype({"prompt_tokens": "float64", "batch_size": "float64"}), on=keys, how="left")
    for c in measured:
        if c not in frame:
            frame[c] = None
    return frame
