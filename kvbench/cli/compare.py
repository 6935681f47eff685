"""``kvbench compare``: two runs point by point."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.cli.common import _fail, _load, _problems, err, out


def compare(
    run_a: Path = typer.Argument(..., help="The reference: a run directory, trials.jsonl or folder of runs."),
    run_b: Path = typer.Argument(..., help="The candidate, compared with A."),
    fail_on: list[str] = typer.Option([], "--fail-on", help="METRIC:PCT: exit 1 when B is worse than A by more "
                                      "than PCT percent on METRIC at any matched point (repeatable)."),
) -> None:
    """Matched points of two runs side by side with the ratio B/A per metric; a CI gate with --fail-on."""
    from kvbench.analysis.compare import COMPARE_METRICS, compare_points, parse_threshold, regressions, violations

    try:
        thresholds = [parse_threshold(x) for x in fail_on]
    except ValueError as exc:
        _fail(str(exc))
    a, b = _load([run_a]), _load([run_b])
    frame, only_a, only_b = compare_points(a, b)
    if frame.empty:
        from kvbench.analysis.reuse import reuse_trials

        reuse = "" if reuse_trials(a.trials).empty and reuse_trials(b.trials).empty else (
            "; reuse runs (multi_turn, doc_qa) have no such points: compare their restore vs recompute tables in "
            "`kvbench report` and `kvbench cost`")
        _fail(f"no point measured in both {run_a} and {run_b} (scenario, prompt length, batch size and mode must "
              f"match){reuse}")
    shown = {"ttft_s": "TTFT", "tpot_s": "TPOT", "throughput_tokens_per_s": "tok/s",
             "kv_device_peak_bytes": "KV device", "rss_peak_bytes": "RSS"}
    t = Table(title=escape(f"B / A  (A = {run_a}, B = {run_b})"),
              caption="ratios of medians; green: B better, red: B worse by more than 5%")
    for col in ("scenario", "prompt", "batch", "mode", *shown.values()):
        t.add_column(col, justify="left" if col in ("scenario", "mode") else "right", overflow="fold",
                     min_width=12 if col == "mode" else None)
    for _, r in frame.iterrows():
        cells = []
        for m in shown:
            ratio = r[f"{m}_ratio"]
            if ratio != ratio:
                cells.append("-")
                continue
            better = ratio > 1 if COMPARE_METRICS[m] else ratio < 1
            worse = (ratio < 0.95) if COMPARE_METRICS[m] else (ratio > 1.05)
            style = "red" if worse else "green" if better else ""
            cells.append(f"[{style}]{ratio:.3f}[/]" if style else f"{ratio:.3f}")
        t.add_row(r["group"], str(int(r["prompt_tokens"])), str(int(r["batch_size"])), r["mode_label"], *cells)
    out.print(t)
    if only_b:
        out.print(f"only in B: {', '.join(only_b)}", highlight=False, markup=False)
    _problems(a)
    _problems(b)
    for th in thresholds:
        if frame[f"{th.metric}_ratio"].notna().sum() == 0:
            _fail(f"--fail-on {th.metric}: no matched point has {th.metric} in both runs (CUDA-only figures are "
                  "empty on CPU runs)")
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
