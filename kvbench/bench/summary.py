"""What a run's summary shows, computed from its rows: the per-point table (medians and ranges), a reuse
workload's cold-vs-warm table, the capacity search's results, and one line per kind of failure."""

from __future__ import annotations

from typing import Any

from kvbench.scenario import Scenario
from kvbench.results.rows import MEASURED, Status


def point_summary(rows: list[dict[str, Any]], s: Scenario) -> Any:
    """The per-point DataFrame of a run's trials (:func:`kvbench.analysis.points.point_table`, no bootstrap: the
    run summary shows medians and ranges); a capacity search's probes sorted by size; with two placement kinds or
    more, each machine's points apart (group ``<name> @ <machine>``). An empty frame (one ``status`` column)
    without rows."""
    from kvbench.analysis.points import point_table
    from kvbench.results.frame import trials_frame

    import pandas as pd

    if not rows:
        return pd.DataFrame(columns=["status"])
    machines = [r.get("machine") for r in rows]
    split = len({m for m in machines if m is not None}) > 1  # each placement kind is a group of its own
    group = pd.Series([f"{s.name} @ {m}" for m in machines]) if split else s.name
    table = point_table(trials_frame(rows, group))
    if s.searched is not None:  # probes run in search order; show them by size
        table = table.sort_values(["prompt_tokens", "batch_size"], kind="stable", ignore_index=True)
    elif s.prompt_tokens and s.batch_sizes:  # in plan order, as a cluster's workers finish points in any order
        rank = {(n, b): i for i, (n, b) in enumerate((n, b) for n in s.prompt_tokens for b in s.batch_sizes)}
        kinds = {f"{s.name} @ {m}": i for i, m in enumerate(s.machines)}  # machines in the placement's order
        order = [(kinds.get(g, 0), rank.get((n, b), len(rank)))
                 for g, n, b in zip(table["group"], table["prompt_tokens"], table["batch_size"])]
        table = table.assign(_plan=order).sort_values("_plan", kind="stable", ignore_index=True).drop(
            columns="_plan")
    return table


def reuse_summary(rows: list[dict[str, Any]], s: Scenario) -> Any:
    """A reuse workload's table per turn index and mode (:func:`kvbench.analysis.reuse.reuse_table`); a break-even
    map run's (``shared_prefix``) per cell and mode, never pooling its prompt lengths."""
    from kvbench.results.frame import trials_frame
    from kvbench.analysis.reuse import reuse_table

    frame = trials_frame(rows, s.name)
    cells = "shared_prefix_tokens" in frame and frame["shared_prefix_tokens"].notna().any()
    return reuse_table(frame, "cell" if cells else "turn_index")


def capacity_summary(found: list[dict[str, Any]], points: Any) -> Any:
    """The capacity search's results (run.json's ``capacity``) with the figures at each capacity from ``points``
    (:func:`point_summary`): :func:`kvbench.analysis.capacity.capacity_frame`."""
    from kvbench.analysis.capacity import capacity_frame

    return capacity_frame(found, points)


def last_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last row of each ``trial_id`` in ``rows`` (file order), in the order the ids first appear: a trial whose
    worker was lost is replaced by its retry (:func:`kvbench.results.load.last_rows_of`)."""
    from kvbench.results.load import last_rows_of

    return last_rows_of(rows).rows


def failure_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per distinct (mode, status, message) among trials that did not end ok, one on trials that ran while
    the machine was busy, and one on trials retried after their worker was lost (``worker lost: 2 trials retried
    (hosts node-a, node-b)``). ``rows`` may hold a lost worker's row and its retry under one trial id: each trial
    counts by its last row (:func:`last_rows`)."""
    from kvbench.results.load import last_rows_of

    found = last_rows_of(rows)
    seen: dict[tuple[str, str, str], int] = {}
    for r in found.rows:
        if r["status"] != Status.OK:
            # over budget: one line per mode (the table marks the points and shows their KV)
            msg = "device KV peak above the budget" if r["status"] == Status.OVER_BUDGET else r["message"]
            key = (r["mode_label"], r["status"], msg)
            seen[key] = seen.get(key, 0) + 1
    lines = [f"{mode}: {status} ({n} trials): {msg}" for (mode, status, msg), n in seen.items()]
    measured = [r for r in found.rows if r["status"] in MEASURED]
    busy = [r for r in measured if r.get("machine_busy") is True]
    if busy:
        lines.append(f"busy machine: {len(busy)} of {len(measured)} measured trials ran while other processes used "
                     f"at least {busy[0]['busy_threshold_percent']:.0f}% of a CPU (or the GPU): comparisons that "
                     "include them are inconclusive")
    if found.retried:
        lines.append(lost_line(found.retried))
    return lines


def lost_line(retried: list[dict[str, Any]]) -> str:
    """``worker lost: N trials retried (hosts H, ...)`` for the lost workers' rows that a retry replaced: N distinct
    trial ids, the hosts (their ``host``, else the one their message names) sorted, each once."""
    from kvbench.results.load import lost_host

    n = len({r["trial_id"] for r in retried})
    hosts = sorted({lost_host(r) for r in retried})
    return (f"worker lost: {n} trial{'s' if n != 1 else ''} retried (host{'s' if len(hosts) != 1 else ''} "
            f"{', '.join(hosts)})")
