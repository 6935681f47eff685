"""``kvbench report``: tables, charts, Markdown and HTML from result directories."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer
from rich.markup import escape

from kvbench.cli.common import (REUSE_WRAPPING, err, fail, handle_errors, load_runs, out, plural, render, show,
                                show_problems, stop_on_signals)


#: Points per scenario that `kvbench report` prints; summary.md and report.html have them all.
REPORT_TERMINAL_ROWS = 60


def report(
    paths: list[Path] = typer.Argument(..., help="Run directories, trials.jsonl files or folders of runs; or the "
                                       ".json files of benchmarks/gpu.sh, printed as tables; or the folders of "
                                       "kvbench simulate."),
    out_dir: str | None = typer.Option(None, "--out", help="Where to write (default: <first path>/report)."),
    timeline: list[str] = typer.Option([], "--timeline", help="A trial id whose memory timeline to draw "
                                       "(repeatable; default: every mode at each scenario's largest point)."),
    fmt: Literal["kvbench", "llm-d"] = typer.Option(
        "kvbench", "--format", help="kvbench: tables, charts, report.md/.html; llm-d: one llm-d Benchmark Report "
        "v0.2.1 (JSON) per mode, into --out (default: <first path>/report/llm-d)."),
) -> None:
    """Tables, charts and a Markdown/HTML report of one or many runs: memory saved and time it cost per mode.
    Ctrl-C or SIGTERM stops it with exit 130 and nothing written. Files of the GPU checks
    (gpu-<date>-<device>.json) are printed instead: machine, steps and each step's figures; and so is a
    simulation (its folder or simulation.json): the trace, its unlimited cache and what to buy."""
    from kvbench.report.gpu_checks import is_gpu_checks
    from kvbench.report.server_load import LOAD_CAPTION, server_load_display
    from kvbench.report.tables import capacity_display, reuse_display, reuse_terminal, terminal_frame
    from kvbench.report.write import write_report

    stop_on_signals()

    if any(is_gpu_checks(p) for p in paths):
        if out_dir is not None or timeline or fmt != "kvbench":
            fail("--out, --timeline and --format apply to runs: a file of GPU checks (.json) is only printed")
        _gpu_checks(paths)
        return

    from kvbench.report.simulation_read import simulation_file, simulation_lines

    simulations = [simulation_file(p) for p in paths]
    if any(simulations):
        if not all(simulations) or out_dir is not None or timeline or fmt != "kvbench":
            fail("a simulation (simulation.json) is only printed: give simulations alone, without --out, "
                 "--timeline or --format")
        for f in filter(None, simulations):
            with handle_errors():
                lines = simulation_lines(f)
            for line in lines:
                out.print(line, highlight=False, markup=False)
        return

    if out_dir is not None and not out_dir.strip():
        fail("--out is empty: give a directory")
    first = paths[0]
    target = Path(out_dir) if out_dir else (first if first.is_dir() else first.parent) / "report"
    if fmt == "llm-d":
        if timeline:
            fail("--timeline draws a chart of the kvbench report; --format llm-d writes no chart")
        _llmd(paths, Path(out_dir) if out_dir else target / "llm-d")
        return
    try:
        with handle_errors({"timelines": "--timeline"}):
            results = load_runs(paths)
            rep = write_report(results, target, timelines=timeline or None)
    except KeyboardInterrupt:
        err.print(f"interrupted: no report written to {target}", highlight=False, markup=False)
        raise typer.Exit(130) from None
    shown = terminal_frame(rep.shown, rep.table) if len(rep.table) else None
    for g in rep.recommendations:
        part = shown[rep.table["group"] == g] if shown is not None else []
        if len(part):
            show(render(part.head(REPORT_TERMINAL_ROWS), g, "medians over measured trials (TPOT: median "
                        "[min–max]); saving of device KV and TPOT overhead against `none` at the same point"),
                 first=("tok/s e2e", "TTFT ms", "pairs", "KV dev MiB", "TPOT ms", "trials"))
        if len(part) > REPORT_TERMINAL_ROWS:
            out.print(f"... and {len(part) - REPORT_TERMINAL_ROWS} more points: see summary.md",
                      highlight=False, markup=False)
        if g in rep.reuse:
            show(render(reuse_terminal(reuse_display(rep.reuse[g]["turn"])),
                        f"{g}: restore vs recompute per turn", "TTFT median [min–max] over the requests of "
                        "that turn and the repeats; restore includes the lookup and the copy; ÷: restore ÷ "
                        "recompute TTFT, Σ over request pairs [95% jackknife interval over the independent "
                        "units: conversations, documents or prefixes]; = none: greedy ids equal to none's "
                        "recompute (KL ≥: a lossy preset's median KL against none, nats, a lower bound from the "
                        "server's top-k log-probabilities)", wrap=REUSE_WRAPPING),
                 first=("prompt", "pairs", "restored", "recompute TTFT ms"))
        if g in rep.server_load:
            show(render(server_load_display(rep.server_load[g]).drop(columns=["scenario"]),
                        f"{g}: load per mode", LOAD_CAPTION, left=1, wrap=True))
        if g in rep.capacity:
            show(render(capacity_display(rep.capacity[g]), f"{g}: capacity within the budget",
                        "probes in order, ✗ = did not fit; figures at the capacity"))
        out.print(f"[bold]recommendation:[/] {escape(rep.recommendations[g])}", highlight=False)
        for f in rep.findings[g]:
            out.print(f"  - {escape(f)}", highlight=False)
        for d in rep.diagnoses[g]:
            out.print(f"  [yellow]![/] {escape(d)}", highlight=False)
    for base, sec in rep.machines.items():
        show(render(sec.table, f"{base}: machines", "hosts, GPU and driver its trials ran on; link: the median "
                    "of their own pinned-copy probe; TPOT ÷ none's per machine below, paired by repeat"))
        for f in sec.findings:
            out.print(f"  - {escape(f)}", highlight=False)
    show_problems(results)
    out.print(f"report: {rep.files['report.html']} (and report.md, summary.csv, {plural(len(rep.charts), 'chart')}) "
              f"in {target}", highlight=False, markup=False)


def _gpu_checks(paths: list[Path]) -> None:
    """The tables of files of kvbench's GPU checks (``benchmarks/gpu.sh``: machine, steps, figures); nothing is
    written."""
    from kvbench.report.gpu_checks import LABELS, WRAPPING, gpu_check_tables, is_gpu_checks, read_gpu_checks

    if not all(is_gpu_checks(p) for p in paths):
        fail("give files of GPU checks (.json) or runs, not both")
    with handle_errors():
        docs = [(p, read_gpu_checks(p)) for p in paths]
    for p, doc in docs:
        for t in gpu_check_tables(doc, p.name):
            show(render(t.frame, t.title, t.caption, left=LABELS, wrap=WRAPPING))


def _llmd(paths: list[Path], target: Path) -> None:
    """``--format llm-d``: the Benchmark Reports of ``paths``, one file per mode, listed; a symbolic link at the
    folder or at any folder between it and the first existing one is refused before anything is read."""
    from kvbench.report.llmd import write_llmd
    from kvbench.results.run_dir import refuse_symlink_dir

    with handle_errors():
        for folder in (target, *target.parents):
            refuse_symlink_dir(folder)
            if folder.exists():
                break
    if target.exists() and not target.is_dir():
        fail(f"{target} is not a directory: the llm-d reports go in a directory (give another with --out)")

    try:
        with handle_errors():
            results = load_runs(paths)
            files = write_llmd(results, target)
    except KeyboardInterrupt:
        err.print(f"interrupted while writing the llm-d reports in {target}: each file is whole, new or from before",
                  highlight=False, markup=False)
        raise typer.Exit(130) from None
    for f in files:
        out.print(f"llm-d report: {f}", highlight=False, markup=False)
    show_problems(results)
    out.print(f"{plural(len(files), 'llm-d Benchmark Report')} (v0.2.1) in {target}", highlight=False, markup=False)
