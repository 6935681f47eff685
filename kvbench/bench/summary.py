"""What a run's summary shows, computed from its rows: the per-point table (medians and ranges), a reuse
workload's cold-vs-warm table, the capacity search's results, and one line per kind of failure."""

from __future__ import annotations

from typing import Any

from kvbench.scenario import Scenario
from kvbench.results.rows import MEASURED, Status


def point_summary(rows: list[dict[str, Any]], s: Scenario) -> Any:
    """The per-point DataFrame of a run's trials (:func:`kvbench.analysis.points.point_table`, no bootstrap: the
    run summary shows medians and ranges); a capacity search's probes sorted by size. An empty frame (one
    ``status`` column) without rows."""
    from kvbench.analysis.points import point_table
    from kvbench.results.frame import trials_frame

    if not rows:
        import pandas as pd

        return pd.DataFrame(columns=["status"])
    table = point_table(trials_frame(rows, s.name), n_boot=0)
    if s.searched is not None:  # probes run in search order; show them by size
        table = table.sort_values(["prompt_tokens", "batch_size"], kind="stable", ignore_index=True)
    return table


def reuse_summary(rows: list[dict[str, Any]], s: Scenario) -> Any:
    """A reuse workload's table per turn index and mode (:func:`kvbench.analysis.reuse.reuse_table`)."""
    from kvbench.results.frame import trials_frame
    from kvbench.analysis.reuse import reuse_table

    return reuse_table(trials_frame(rows, s.name))


def capacity_summary(found: list[dict[str, Any]], points: Any) -> Any:
    """The capacity search's results (run.json's ``capacity``) with the figures at each capacity from ``points``
    (:func:`point_summary`): :func:`kvbench.analysis.capacity.capacity_frame`."""
    from kvbench.analysis.capacity import capacity_frame

    return capacity_frame(found, points)


def failure_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per distinct (mode, status, message) among trials that did not end ok, and one on trials that ran
    while the machine was busy."""
    seen: dict[tuple[str, str, str], int] = {}
    for r in rows:
        if r["status"] != Status.OK:
            # over budget: one line per mode (the table marks the points and shows their KV)
            msg = "device KV peak above the budget" if r["status"] == Status.OVER_BUDGET else r["message"]
            key = (r["mode_label"], r["status"], msg)
            seen[key] = seen.get(key, 0) + 1
    lines = [f"{mode}: {status} ({n} trials): {msg}" for (mode, status, msg), n in seen.items()]
    measured = [r for r in rows if r["status"] in MEASURED]
    busy = [r for r in measured if r.get("machine_busy") is True]
    if busy:
        lines.append(f"busy machine: {len(busy)} of {len(measured)} measured trials ran while other processes used "
                     f"at least {busy[0]['busy_threshold_percent']:.0f}% of a CPU (or the GPU): comparisons that "
                     "include them are inconclusive")
    return lines
