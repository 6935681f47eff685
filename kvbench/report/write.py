"""``kvbench report``'s files: :func:`write_report` computes the tables and texts, draws the charts, and writes
``summary.csv``, ``summary.md``, ``reuse.csv``, the PNG charts, ``report.md`` and ``report.html`` into a private
folder that is moved into place whole."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.analysis.break_even import BreakEvenMap, break_even_map
from kvbench.analysis.cost import Prices
from kvbench.analysis.points import point_table
from kvbench.results.load import Results
from kvbench.analysis.reuse import reuse_later_turns, reuse_table, reuse_trials
from kvbench.analysis.server_load import server_load_table
from kvbench.report.server_findings import server_findings, server_rows
from kvbench.report.server_load import concurrency_lines
from kvbench.arguments import path_arg
from kvbench.errors import BadParameter, UnwritableOutput, UserError
from kvbench.report import charts, scratch_dir
from kvbench.report.advice import (capacity_findings, capacity_recommendation, diagnoses, findings, recommendation,
                                   reuse_findings, reuse_recommendation)
from kvbench.report.break_even import map_display, map_finding
from kvbench.report.break_even_chart import break_even_heatmap
from kvbench.report.cost_section import CostSection, cost_markdown, cost_section
from kvbench.report.documents import Report, markdown, md_table
from kvbench.report.html_page import html_document
from kvbench.report.machines import lost_lines, machine_sections
from kvbench.report.samples import default_timelines, load_samples
from kvbench.report.tables import capacity_frames, display_frame, plan_frame
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.safe_text import unique_stems

#: USD per GPU-hour of the break-even map in a report (``kvbench map``'s default; no memory is charged).
REPORT_GPU_PRICE = 2.0
#: Panels per memory-timeline figure.
TIMELINE_PANELS = 8
#: The most trial ids a report draws timelines of (8 figures): each is a panel of its own.
MAX_TIMELINES = 64


def write_report(results: Results, out_dir: str | Path, timelines: list[str] | None = None) -> Report:
    """Write the report of ``results`` into ``out_dir`` (created): ``summary.csv`` (the per-point table, raw
    numbers), ``summary.md``, ``reuse.csv`` (reuse workloads: :func:`kvbench.analysis.reuse.reuse_table` per turn and
    per prompt length), the charts (PNG; for shared_prefix runs the break-even map's heatmaps,
    :func:`kvbench.analysis.break_even.break_even_map` at :data:`REPORT_GPU_PRICE` with no memory charged),
    ``report.md`` and ``report.html`` (with the cost section of :mod:`kvbench.report.cost_section`: each mode's
    paired saving against its baseline, price-free; report.html as :mod:`kvbench.report.html_page` lays it out).

    Args:
        results: from :func:`kvbench.results.load.load_results`.
        out_dir: where to write.
        timelines: trial ids whose memory timeline is drawn (a repeated one once; at most
            :data:`MAX_TIMELINES`); default: at each group's longest prompt and largest batch, the first measured
            trial of every mode.

    Returns:
        The :class:`~kvbench.report.documents.Report`, its chart and file paths inside ``out_dir``.

    Raises:
        kvbench.errors.BadParameter: a trial id in ``timelines`` that is not in the results, more than
            :data:`MAX_TIMELINES` of them (``param`` = ``"timelines"``), or an argument of another type.
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file or folder cannot be written (an ``OSError``).
    """
    if not isinstance(results, Results):
        raise BadParameter(f"{{results}} must be kvbench.load_results(...), not {type(results).__name__}", "results")
    if isinstance(timelines, str):
        raise BadParameter(f"{{timelines}} must be a list of trial ids, not the str {timelines!r}", "timelines")
    if timelines:
        timelines = list(dict.fromkeys(timelines))
        if len(timelines) > MAX_TIMELINES:
            raise BadParameter(f"{len(timelines):,} trial ids: at most {MAX_TIMELINES} timelines are drawn "
                               f"({MAX_TIMELINES // TIMELINE_PANELS} figures of {TIMELINE_PANELS} panels)", "timelines")
        unknown = sorted(set(timelines) - set(results.trials["trial_id"]))
        if unknown:
            shown = ", ".join(repr(u[:80]) for u in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise BadParameter(f"no trial {shown}{more} in these results", "timelines")
    final = path_arg(out_dir, "out_dir")
    refuse_symlink_dir(final)  # e.g. a report/ link inside a run directory from someone's tarball
    try:
        return _write_in_place(results, final, timelines)
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(final, exc.strerror or str(exc), "the report") from exc


def _write_in_place(results: Results, final: Path, timelines: list[str] | None) -> Report:
    """:func:`write_report` after its checks: everything is written into a private folder inside ``final``, then
    moved into place, so an interrupted or failed report leaves no half of itself behind; one left by a killed
    report (its owner provably dead) is removed first."""
    created = not final.exists()
    try:
        final.mkdir(parents=True, exist_ok=True)
        scratch_dir.sweep(final)
        out = scratch_dir.make(final)
        rep = _write(results, out, timelines)
        for f in out.iterdir():
            os.replace(f, final / f.name)
    except BaseException:  # also when the interrupt came as the folder was made (before its name was known here)
        scratch_dir.remove_own(final)
        if created:
            shutil.rmtree(final, ignore_errors=True)
        raise
    out.rmdir()
    rep.charts = [(title, final / p.name) for title, p in rep.charts]
    rep.files = {k: final / p.name for k, p in rep.files.items()}
    return rep


def _charts_drawn(jobs: list[tuple[str, Any, tuple]], problems: list[str]) -> list[tuple[str, Path]]:
    """Draw each ``(title, function, arguments)`` job: ``(title, path)`` of each chart drawn; one that failed (e.g. a
    text matplotlib cannot draw) adds one line to ``problems`` (:func:`~kvbench.report.charts.not_drawn`) and the
    report goes on without it. A file that could not be written fails the report, as every other file does."""
    drawn = []
    for title, fn, args in jobs:
        try:
            path = fn(*args)
        except OSError:
            raise
        except Exception as exc:
            problems.append(charts.not_drawn(title, exc))
            continue
        if path is not None:
            drawn.append((title, path))
    return drawn


#: A chart to draw: its title, the function of :mod:`kvbench.report.charts` (or
#: :func:`~kvbench.report.break_even_chart.break_even_heatmap`) that draws it, and that function's arguments (the
#: last one the PNG's path).
Job = tuple[str, Any, tuple]


def _write(results: Results, out: Path, timelines: list[str] | None) -> Report:
    """Every file of :func:`write_report` into the private folder ``out``: the tables, texts and CSV files, the
    charts, then ``report.md`` and ``report.html``. Returns the report, its paths inside ``out``."""
    table = _points(results)
    reuse_rows = reuse_trials(results.trials)
    reuse = {g: {"turn": reuse_table(part, "turn_index"), "length": reuse_table(part, "length_bin")}
             for g, part in reuse_rows.groupby("group", sort=False)}
    # shared_prefix runs: the break-even map at kvbench map's default prices (its files are kvbench map's: the
    # report's heatmaps have names of their own)
    be = break_even_map(results.trials, Prices(REPORT_GPU_PRICE))
    jobs = _chart_jobs(results, table, reuse, reuse_rows, be, timelines, out)
    shown = display_frame(table)
    rep = _texts(results, table, shown, reuse, be)
    _write_tables(results, rep, reuse, out)
    costs = cost_section(results, table)
    table.to_csv(out / "summary.csv", index=False)
    (out / "summary.md").write_text(md_table(shown) + "\n")
    rep.files.update({"summary.csv": out / "summary.csv", "summary.md": out / "summary.md"})
    rep.charts = _charts_drawn(jobs, results.problems)
    _write_documents(results, rep, shown, costs, out)
    return rep


def _points(results: Results) -> pd.DataFrame:
    """:func:`kvbench.analysis.points.point_table` of the trials; a capacity search's groups (whose probes come in
    search order) sorted by prompt length, then batch size, the groups in their first order."""
    table = point_table(results.trials)
    if any(r.get("capacity") for r in results.runs):
        rank = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
        table = (table.assign(_rank=table["group"].map(rank))
                 .sort_values(["_rank", "prompt_tokens", "batch_size"], kind="stable", ignore_index=True)
                 .drop(columns="_rank"))
    return table


def _chart_jobs(results: Results, table: pd.DataFrame, reuse: dict[str, dict[str, pd.DataFrame]],
                reuse_rows: pd.DataFrame, be: BreakEvenMap, timelines: list[str] | None, out: Path) -> list[Job]:
    """Every chart of the report, in its order: the break-even heatmaps per group and mode, TTFT restore vs
    recompute per reuse group, three charts per group (saving and overhead, throughput, bytes per token), then the
    memory timelines (:func:`_timeline_jobs`). A mode has one colour in every chart; file names are unique stems
    of the group names."""
    colours = charts.mode_colours(list(table["mode_label"]) + list(reuse_rows["mode_label"]))
    jobs: list[Job] = []
    maps = list(be.cells.groupby(["group", "mode_label"], sort=False)) if len(be.cells) else []
    for ((g, mode), part), stem in zip(maps, unique_stems([key for key, _ in maps])):
        jobs.append((f"{g}: break-even map, {mode}", break_even_heatmap,
                     (part, f"{g}, {mode}: saving of restore against recompute", out / f"break_even_{stem}.png")))
    groups = list(dict.fromkeys(table["group"]))
    named = list(dict.fromkeys([*groups, *reuse]))
    stems = dict(zip(named, unique_stems(named)))
    for g, frames in reuse.items():
        jobs.append((f"{g}: TTFT restore vs recompute", charts.reuse_ttft,
                     (frames["turn"], reuse_rows, g, colours, out / f"reuse_ttft_{stems[g]}.png")))
    for g in groups:
        s = stems[g]
        for title, fn, name in (("memory saving and time overhead vs prompt length", charts.saving_and_overhead,
                                 f"saving_overhead_{s}.png"),
                                ("throughput and device KV vs batch size", charts.throughput_vs_batch,
                                 f"throughput_batch_{s}.png"),
                                ("bytes moved per generated token", charts.bytes_per_token,
                                 f"bytes_per_token_{s}.png")):
            jobs.append((f"{g}: {title}", fn, (table[table["group"] == g], g, colours, out / name)))
    return jobs + _timeline_jobs(results, timelines, colours, out)


def _timeline_jobs(results: Results, timelines: list[str] | None, colours: dict[str, str], out: Path) -> list[Job]:
    """The memory-timeline figures of the trials ``timelines`` names (default:
    :func:`~kvbench.report.samples.default_timelines`), :data:`TIMELINE_PANELS` panels each; a trial without
    samples adds a line to ``results.problems`` and no panel."""
    picks = {"selected trials": list(timelines)} if timelines else default_timelines(results)
    samples = load_samples(results, [t for ids in picks.values() for t in ids])
    jobs: list[Job] = []
    for (name, ids), stem in zip(picks.items(), unique_stems(list(picks))):
        panels = []
        for tid in ids:
            if tid not in samples:
                results.problems.append(f"{tid}: no samples in samples.csv; no timeline")
                continue
            part, mode = samples[tid]
            panels.append((tid, part, colours.get(mode, "C0")))
        for k in range(0, len(panels), TIMELINE_PANELS):
            n = k // TIMELINE_PANELS + 1
            suffix = f"_{n}" if len(panels) > TIMELINE_PANELS else ""
            jobs.append((f"memory timelines: {name}{suffix.replace('_', ' part ')}", charts.memory_timelines,
                         (panels[k:k + TIMELINE_PANELS], f"{name}: memory over time",
                          out / f"timelines_{stem}{suffix}.png")))
    return jobs


def _texts(results: Results, table: pd.DataFrame, shown: pd.DataFrame, reuse: dict[str, dict[str, pd.DataFrame]],
           be: BreakEvenMap) -> Report:
    """The report's tables and texts per group: findings, recommendation and diagnoses of its points (of a
    capacity search: its capacities), of its reuse workload (a server's or kvbench's own) and of its break-even
    map; the machines sections and the lines of trials lost."""
    groups = list(dict.fromkeys(table["group"]))
    rep = Report(table, shown, {g: findings(table, g) for g in groups},
                 {g: recommendation(table, g) for g in groups},
                 {g: diagnoses(results, table, g) for g in groups},
                 capacity_frames(results, table), plan_frame(table))
    for g, frame in rep.capacity.items():  # a search's points are probes: its findings are the capacities
        rep.findings[g] = capacity_findings(frame)
        rep.recommendations[g] = capacity_recommendation(frame)
    rep.reuse = reuse
    for g, frames in reuse.items():
        if g not in rep.recommendations:
            rep.recommendations[g], rep.findings[g], rep.diagnoses[g] = "", [], []
        later = reuse_later_turns(results.trials)
        server = not server_rows(results.trials, g).empty
        if server:
            rep.findings[g] += server_findings(results.trials, g, later, [
                srv for r in results.runs if r.get("group") == g for srv in r.get("servers") or []])
        else:
            rep.findings[g] += reuse_findings(frames["turn"], g, later)
        rec = reuse_recommendation(frames["turn"], g, later, need_match=not server)
        rep.recommendations[g] = f"{rep.recommendations[g]} {rec}".strip()
    if len(be.cells):
        for (g, mode), part in be.cells.groupby(["group", "mode_label"], sort=False):
            rep.break_even.setdefault(g, {})[mode] = map_display(part)
            rep.findings.setdefault(g, []).append(map_finding(part, mode))
    rep.machines = machine_sections(results, table)
    for g in rep.diagnoses:
        rep.diagnoses[g] += lost_lines(results, g)
    return rep


def _write_tables(results: Results, rep: Report, reuse: dict[str, dict[str, pd.DataFrame]], out: Path) -> None:
    """``server_load.csv`` (server runs' load table; its concurrency lines join each group's findings) and
    ``reuse.csv`` (both tables of every reuse group, raw numbers: by turn_index, then by length_bin), each
    written only when it has rows."""
    load = server_load_table(results.trials)
    if len(load):
        rep.server_load = {g: part for g, part in load.groupby("group", sort=False)}
        for g, part in rep.server_load.items():
            rep.findings.setdefault(g, []).extend(concurrency_lines(part))
        load.to_csv(out / "server_load.csv", index=False)
        rep.files["server_load.csv"] = out / "server_load.csv"
    if reuse:
        pd.concat([f for frames in reuse.values() for f in frames.values()], ignore_index=True).to_csv(
            out / "reuse.csv", index=False)
        rep.files["reuse.csv"] = out / "reuse.csv"


def _write_documents(results: Results, rep: Report, shown: pd.DataFrame, costs: CostSection, out: Path) -> None:
    """``report.md`` (its cost section before the column glossary, where it has one) and ``report.html``."""
    head, glossary, rest = markdown(results, rep, shown).rpartition("\n## Columns\n")
    cost_md = cost_markdown(costs)
    (out / "report.md").write_text(f"{head}\n{cost_md}{glossary}{rest}" if cost_md and glossary else
                                   head + glossary + rest + cost_md)
    (out / "report.html").write_text(html_document(results, rep, shown, costs))
    rep.files.update({"report.md": out / "report.md", "report.html": out / "report.html"})


__all__ = ["REPORT_GPU_PRICE", "TIMELINE_PANELS", "write_report"]
