"""``kvbench compare``: two runs point by point."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from kvbench.cli.common import err, fail, handle_errors, load_runs, out, render, show, show_problems


def compare(
    run_a: Path = typer.Argument(..., help="The reference: a run directory, trials.jsonl or folder of runs."),
    run_b: Path = typer.Argument(..., help="The candidate, compared with A."),
    fail_on: list[str] = typer.Option([], "--fail-on", help="METRIC:PCT: exit 1 when B is worse than A by more "
                                      "than PCT percent on METRIC at any matched point (repeatable)."),
) -> None:
    """Matched points of two runs side by side with the ratio B/A per metric; a CI gate with --fail-on."""
    from kvbench.analysis.compare import compare_points, parse_threshold, regressions, violations
    from kvbench.report.compare import compare_display, missing_metric_reason, unmatched_reason

    with handle_errors({"threshold": "--fail-on"}):
        thresholds = [parse_threshold(x) for x in fail_on]
        a, b = load_runs([run_a]), load_runs([run_b])
        frame, only_a, only_b = compare_points(a, b)
    if frame.empty:
        fail(f"no point measured in both {run_a} and {run_b} (scenario, prompt length, batch size or a server's "
             f"concurrency, and mode must match): {unmatched_reason(a, b)}")
    cells, marks = compare_display(frame)
    show(render(cells, f"B / A  (A = {run_a}, B = {run_b})", "ratios of medians (ITL: of the pooled "
                "percentiles); green: B better, red: B worse by more than 5%", left=("scenario", "mode"),
                wrap=True, min_width={"mode": 12}, marks=marks))
    if only_b:
        out.print(f"only in B: {', '.join(only_b)}", highlight=False, markup=False)
    show_problems(a)
    show_problems(b)
    for th in thresholds:
        if frame[f"{th.metric}_ratio"].notna().sum() == 0:
            fail(f"--fail-on {th.metric}: {missing_metric_reason(frame, th.metric)}")
    lost = regressions(frame, only_a)
    for line in lost:
        err.print(f"[yellow]regression:[/] {escape(line)}", highlight=False)
    # a gate: lost or broken points fail it whatever the metrics say
    bad = lost + violations(frame, thresholds) if thresholds else []
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        err.print(f"[red]fail:[/] {escape(bad[0])}{more}", highlight=False)
        raise typer.Exit(1)
    if thresholds:
        out.print(f"pass: no matched point worse than {', '.join(f'{t.metric} {t.pct:g}%' for t in thresholds)}",
                  highlight=False, markup=False)
