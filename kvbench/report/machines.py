"""The machine dimension of a report. When one scenario ran on two or more placement kinds (a cluster run, split
into one group per machine by :mod:`kvbench.results.load`), its "Machines" section: a table of the machines (hosts,
GPU, driver, the measured host↔device link, trials) and one line per point and offload mode measured on at least
two of them, giving that mode's paired TPOT ratio to ``none`` on each machine beside the machine's link, or why
there is none. Also the line on trials whose worker was lost and retried."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvbench.report.advice import point_text
from kvbench.report.format import number, ratio_interval, status_counts
from kvbench.results.frame import numeric
from kvbench.results.load import Results, lost_host
from kvbench.results.rows import Status


@dataclass
class MachineSection:
    """The "Machines" section of one scenario: ``table``, text cells with one row per machine (``machine``,
    ``hosts``, ``GPU``, ``driver``, ``link H2D (GB/s)``, ``link D2H (GB/s)``: the medians of its rows'
    ``link_h2d_gbps``/``link_d2h_gbps``, ``trials``: counts per status); ``findings``, plain-language lines (see
    :func:`machine_findings`)."""

    table: pd.DataFrame
    findings: list[str]


def machine_groups(results: Results) -> dict[str, dict[str, str]]:
    """Per scenario split by machine (its group before the split: a run's ``base_group``), each machine's label →
    its group, in the order of :attr:`~kvbench.results.load.Results.runs`; scenarios not split are left out."""
    out: dict[str, dict[str, str]] = {}
    for run in results.runs:
        if "machine" in run:
            out.setdefault(run["base_group"], {}).setdefault(run["machine"], run["group"])
    return out


def machine_sections(results: Results, table: pd.DataFrame) -> dict[str, MachineSection]:
    """The "Machines" section of every scenario split by machine (:func:`machine_groups`), keyed by its group before
    the split. ``table``: :func:`kvbench.analysis.points.point_table` of ``results.trials``."""
    return {base: MachineSection(machine_table(results.trials, groups), machine_findings(results.trials, table, groups))
            for base, groups in machine_groups(results).items()}


def _distinct(rows: pd.DataFrame, col: str) -> str:
    """The distinct non-null values of a text column, sorted, comma-separated; ``-`` when there is none."""
    values = sorted({str(v) for v in rows[col].dropna()}) if col in rows else []
    return ", ".join(values) or "-"


def _trials(rows: pd.DataFrame) -> str:
    """Trial counts per status, e.g. ``18 ok, 2 error`` (:func:`kvbench.report.format.status_counts`)."""
    counts = rows["status"].value_counts()
    cells: dict[str, Any] = {f"n_{s.value}": int(counts.get(s.value, 0)) for s in Status}
    cells["n_other"] = len(rows) - sum(cells.values())
    return status_counts(cells)


def machine_table(trials: pd.DataFrame, groups: dict[str, str]) -> pd.DataFrame:
    """One row of text cells per machine of ``groups`` (label → group; see :class:`MachineSection`) from the trial
    rows of ``trials`` (the loader's frame) in its group; link bandwidths in GB/s, one decimal, ``-`` when not
    measured (CPU)."""
    out = []
    for label, group in groups.items():
        rows = trials[trials["group"] == group]
        out.append({"machine": label, "hosts": _distinct(rows, "host"), "GPU": _distinct(rows, "gpu"),
                    "driver": _distinct(rows, "gpu_driver"),
                    "link H2D (GB/s)": number(numeric(rows, "link_h2d_gbps").median(), ".1f"),
                    "link D2H (GB/s)": number(numeric(rows, "link_d2h_gbps").median(), ".1f"),
                    "trials": _trials(rows)})
    return pd.DataFrame(out, columns=["machine", "hosts", "GPU", "driver", "link H2D (GB/s)", "link D2H (GB/s)",
                                      "trials"])


def _link(gbps: float) -> str:
    return "link not measured" if gbps != gbps else f"link H2D {gbps:.1f} GB/s"


def _figure(r: dict[str, Any] | None, none_measured: bool) -> str:
    """What one machine's point says of its TPOT against ``none``: the paired ratio with its interval and pairs
    when the comparison may claim it; else why not (not run, not measured, no pairs, or the verdict of
    :func:`kvbench.analysis.intervals.judge`, never a ratio)."""
    if r is None:
        return "not run"
    if not r["measured"]:
        return f"not measured ({status_counts(r)})"
    if not r["pairs"]:
        return "no pairs: no measured `none` here" if not none_measured else "no pairs with `none`"
    if r["tpot_verdict"]:
        head, _, why = r["tpot_verdict"].partition(": ")
        return f"{head} ({why})" if why else head
    n = int(r["pairs"])
    return (f"{ratio_interval(r['tpot_s_ratio'], r['tpot_s_ratio_ci_low'], r['tpot_s_ratio_ci_high'])} over {n} "
            f"pair{'s' if n != 1 else ''}")


def machine_findings(trials: pd.DataFrame, table: pd.DataFrame, groups: dict[str, str]) -> list[str]:
    """One line per (prompt length, batch size, offload mode) of ``table`` (the point table) measured on at least two
    machines of ``groups`` (label → group), in the table's order: on each machine its measured link (the median of
    its rows' ``link_h2d_gbps``) and its TPOT ÷ ``none``'s (:func:`_figure`), e.g. "`full` at 4096 tokens × batch
    8, TPOT ÷ `none`'s: on h100 (link H2D 25.1 GB/s) 1.60 [1.50, 1.70] over 5 pairs; on l4 (link H2D 12.0 GB/s)
    inconclusive (3 pairs, need 5)"."""
    label_of = {g: label for label, g in groups.items()}
    t = table[table["group"].isin(label_of)]
    links = {label: numeric(trials[trials["group"] == g], "link_h2d_gbps").median() for label, g in groups.items()}
    base = t[(t["mode"] == "none") & (t["measured"] > 0)]
    with_none = set(zip(base["group"], base["prompt_tokens"], base["batch_size"]))
    out = []
    for (prompt, batch, mode), part in t[t["mode"] != "none"].groupby(["prompt_tokens", "batch_size", "mode_label"],
                                                                       sort=False):
        if (part["measured"] > 0).sum() < 2:
            continue
        rows = {label_of[r["group"]]: r for r in part.to_dict("records")}
        on = [f"on {label} ({_link(links[label])}) {_figure(rows.get(label), (g, prompt, batch) in with_none)}"
              for label, g in groups.items()]
        out.append(f"`{mode}` at {point_text(part.iloc[0])}, TPOT ÷ `none`'s: {'; '.join(on)}")
    return out


def lost_lines(results: Results, group: str) -> list[str]:
    """``3 trials lost their worker and were retried (hosts node-a, node-b)`` for ``group``'s trials whose first
    attempt a retry replaced (:attr:`~kvbench.results.load.Results.lost`); no line when there were none."""
    rows = [r for r in results.lost if r.get("group") == group]
    if not rows:
        return []
    n = len({r["trial_id"] for r in rows})
    hosts = sorted({lost_host(r) for r in rows})
    return [f"{n} trial{'s' if n != 1 else ''} lost {'their worker' if n != 1 else 'its worker'} and "
            f"{'were' if n != 1 else 'was'} retried (host{'s' if len(hosts) != 1 else ''} {', '.join(hosts)}); "
            "each counts by its retry"]


__all__ = ["MachineSection", "lost_lines", "machine_findings", "machine_groups", "machine_sections", "machine_table"]
