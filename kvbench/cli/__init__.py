"""The `kvbench` command: a thin Typer layer over the library. Heavy imports (torch) happen inside commands,
so `kvbench --help` stays fast."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
import warnings
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

# transformers' GGUF loader draws a tqdm bar it offers no switch for; kvbench shows its own progress.
os.environ.setdefault("TQDM_DISABLE", "1")

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Measure what KV-cache offload really does.")
# Piped output (CI logs, README examples) gets 120 columns instead of Rich's 80.
out = Console(width=None if sys.stdout.isatty() else 120, soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        import kvbench

        out.print(f"kvbench {kvbench.__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="",
                                 help="Print the version."),
) -> None:
    """Measure what KV-cache offload really does."""


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False)


def _fail(msg: str, code: int = 2) -> None:
    """Print ``error: msg`` (``msg`` as it is: paths and values from files are never read as markup) and exit."""
    err.print(f"[red]error:[/] {escape(str(msg))}", highlight=False)
    raise typer.Exit(code)


def _count_units(n: float) -> str:
    """A count in B (10^9), M (10^6) or K (10^3), two decimals."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f}"


def _mib(v: Any) -> str:
    return "-" if v is None or v != v else f"{v / 2**20:,.1f}"


def _ms(med: Any, lo: Any, hi: Any) -> str:
    """Seconds as ``median (min–max)`` in milliseconds; whole milliseconds from 100 ms up."""
    if med is None or med != med:
        return "-"
    fmt = "{:,.0f}" if med >= 0.1 else "{:,.1f}"
    return f"{fmt.format(med * 1e3)} ({fmt.format(lo * 1e3)}–{fmt.format(hi * 1e3)})"


def _summary_table(frame: Any, title: str) -> Table:
    t = Table(title=escape(title), caption="median (min–max) over the measured repeats (ok, and over budget: *); "
                                           "same ids: greedy ids equal to `none`'s; KV MiB: device KV peak")
    for col in ("prompt", "batch", "mode", "ok", "same ids", "TTFT ms", "TPOT ms", "decode tok/s", "KV MiB", "RSS MiB"):
        if col == "mode":
            t.add_column(col, overflow="fold", min_width=12)  # window sizes must stay readable
        else:
            t.add_column(col, justify="right", no_wrap=col.endswith("ms"))
    for r in frame.to_dict("records"):
        tps = r["decode_tokens_per_s_median"]
        t.add_row(
            str(r["prompt_tokens"]), str(r["batch_size"]), r["mode_label"],
            f"{r['n_ok']}/{r['trials']}" + ("[yellow]*[/]" if r["status"] == "over_budget" else ""),
            {True: "yes", False: "[red]NO[/]"}.get(r["tokens_match"], "-"),
            _ms(r["ttft_s_median"], r["ttft_s_min"], r["ttft_s_max"]),
            _ms(r["tpot_s_median"], r["tpot_s_min"], r["tpot_s_max"]),
            "-" if tps is None or tps != tps else f"{tps:,.1f}",
            _mib(r["kv_device_peak_bytes_median"]), _mib(r["rss_peak_bytes_median"]),
        )
    return t


def _capacity_table(found: list[dict[str, Any]], points: Any) -> Table:
    """The capacity search's results: per fixed value and mode, the capacity, the probes and the figures there."""
    from kvbench.analysis.capacity import capacity_frame
    from kvbench.report import capacity_display

    what = "batch" if found[0]["searched"] == "batch_size" else "prompt (tokens)"
    return _table(capacity_display(capacity_frame(found, points)), f"capacity: the largest {what} within the budget",
                  "probes in order, ✗ = did not fit; figures at the capacity (median over its repeats)")


def _failures(rows: list[dict[str, Any]]) -> list[str]:
    """One line per distinct (mode, status, message) among trials that did not end ok."""
    seen: dict[tuple[str, str, str], int] = {}
    for r in rows:
        if r["status"] != "ok":
            # over budget: one line per mode (the table marks the points and shows their KV)
            msg = "device KV peak above the budget" if r["status"] == "over_budget" else r["message"]
            key = (r["mode_label"], r["status"], msg)
            seen[key] = seen.get(key, 0) + 1
    lines = [f"{mode}: {status} ({n} trials): {msg}" for (mode, status, msg), n in seen.items()]
    measured = [r for r in rows if r["status"] in ("ok", "over_budget")]
    busy = [r for r in measured if r.get("machine_busy") is True]
    if busy:
        lines.append(f"busy machine: {len(busy)} of {len(measured)} measured trials ran while other processes used "
                     f"at least {busy[0]['busy_threshold_percent']:.0f}% of a CPU (or the GPU): comparisons that "
                     "include them are inconclusive")
    return lines


def _reuse_summary(rows: list[dict[str, Any]], name: str, title: str) -> Table:
    """Per turn index and mode: TTFT recompute vs restore, tokens restored, hit rate, ids."""
    from kvbench.analysis.points import trials_frame
    from kvbench.report import reuse_display, reuse_terminal
    from kvbench.analysis.reuse import reuse_table

    return _table(reuse_terminal(reuse_display(reuse_table(trials_frame(rows, name)))), title,
                  "cold = recompute the whole prompt, warm = restore the stored prefix then prefill the rest; "
                  "TTFT median [min–max]; ÷: restore ÷ recompute TTFT paired by request, median [95% interval over "
                  "the pairs]; = none: greedy ids equal to none's recompute")


def _run_summary(rows: list[dict[str, Any]], sc: Any) -> Any:
    """The per-point table of a run's trials (no bootstrap: the run summary shows medians and ranges)."""
    from kvbench.analysis.points import point_table, trials_frame

    if not rows:
        import pandas as pd

        return pd.DataFrame(columns=["status"])
    table = point_table(trials_frame(rows, sc.name), n_boot=0)
    if sc.searched is not None:  # probes run in search order; show them by size
        table = table.sort_values(["prompt_tokens", "batch_size"], kind="stable", ignore_index=True)
    return table


def _sweep(sc: Any, rundir: Any, runner: Any, total: int) -> Any:
    """Run the sweep under a Rich progress bar with ETA."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from kvbench.bench.runner import run_sweep

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=err) as progress:
        task = progress.add_task(sc.name, total=total, completed=len(rundir.finished_trials()))
        return run_sweep(
            sc, rundir, runner,
            on_trial=lambda row: progress.advance(task),
            on_status=lambda text: progress.update(task, description=escape(f"{sc.name} {text}")),
        )


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (e.g. `kill`, a job scheduler) stops the sweep like Ctrl-C: finished trials kept, temporary files
    removed, the run resumable."""
    raise KeyboardInterrupt


@app.command()
def run(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file (optional with --resume)."),
    out_root: Optional[str] = typer.Option(None, "--out", help="Results root (default results/); the run goes in a new folder."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run directory, skipping finished trials."),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", metavar="",
        help="Let the model's own code run, when the scenario also sets model.trust_remote_code: true."),
) -> None:
    """Run a scenario's sweep and print its summary."""
    from kvbench.bench.machine import environment
    from kvbench.results.run_dir import RunDir, RunDirError
    from kvbench.scenario import ScenarioError, check_scenario, load_scenario, parse_scenario

    warnings.showwarning = _show_warning
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIG_IGN)
    if scenario is None and resume is None:
        _fail("give a scenario file, or --resume DIR")
    if resume is not None and out_root is not None:
        _fail(f"--out does not apply with --resume: the run stays in {resume}")
    if out_root is not None and not out_root.strip():
        _fail("--out is empty: give a directory")
    try:
        if resume is not None:
            rundir = RunDir.open(resume)
            sc = parse_scenario(rundir.meta["scenario"], resume / "run.json")
            if scenario is not None and load_scenario(scenario).model_dump(mode="json") != sc.model_dump(mode="json"):
                _fail(f"{scenario} differs from the scenario stored in {resume}/run.json; resume without the file")
            problems = check_scenario(sc)
            if problems:
                raise ScenarioError(resume / "run.json", problems)
            with rundir.lock():  # before anything reads the trials: a refused resume cuts nothing
                finished = rundir.finished_trials()
        else:
            sc = load_scenario(scenario)
            rundir = None
            _print_warnings(scenario, sc)
    except (ScenarioError, RunDirError) as exc:
        _fail(str(exc))
    if sc.model.trust_remote_code:
        _remote_code(sc, scenario if rundir is None else rundir.path / "run.json", trust_remote_code)

    import psutil

    from kvbench.models import ModelNotFound, resolve_device
    from kvbench.bench.capacity import device_problem
    from kvbench.models.load_errors import one_line
    from kvbench.results.files import ResultsNotWritten
    from kvbench.bench.runner import plan_trials, prepare
    from kvbench.workloads.sessions import NotEnoughRequests

    if (rundir is not None and sc.searched is None and not sc.workload.reuse
            and {t.trial_id for t in plan_trials(sc)} <= {r["trial_id"] for r in finished}):
        rows = finished
        out.print(_summary_table(_run_summary(rows, sc), f"{sc.name}: {sc.model.label}"))
        for line in _failures(rows):
            out.print(line, highlight=False, markup=False)
        out.print(f"nothing to run: every trial of {sc.name} is already in {rundir.trials_path}",
                  highlight=False, markup=False)
        return

    try:
        device = resolve_device(sc.device)
        env = environment(device)
    except ValueError as exc:
        _fail(str(exc))
    where = scenario if rundir is None else rundir.path / "run.json"
    if (why := device_problem(sc, device.type)) is not None:
        _fail(f"{where}: budget: {why}")
    busy = psutil.cpu_percent(interval=0.5)  # system-wide, while this process waits: the others' load
    if busy > 50:
        err.print(f"[yellow]warning:[/] the machine is busy ({busy:.0f}% of {env['cpu_count']} CPUs in use by other "
                  "processes): timings will be noisy", highlight=False)
    created = rundir is None
    if rundir is None:
        try:
            rundir = RunDir.create(Path(out_root or "results"), sc.model_dump(mode="json"), env)
        except OSError as exc:
            _fail(f"cannot create the run directory under {out_root or 'results'}: {exc.strerror or exc}")
    try:
        with rundir.lock():
            t0 = time.perf_counter()
            with err.status(escape(f"loading {sc.model.label} and the {sc.workload.source} workload")):
                try:
                    runner = prepare(sc, rundir.meta.get("environment"))
                    problems = runner.preflight()
                except NotEnoughRequests as exc:
                    _fail(f"{where}: workload.{sc.workload.reuse}: {exc}")
                except (ModelNotFound, ValueError, ImportError, OSError) as exc:
                    _fail(str(exc))
                except Exception as exc:  # noqa: BLE001 - anything else before the first trial refuses in one line
                    _fail(f"{where}: cannot prepare the run of model {sc.model.label}: {one_line(exc)}")
            if problems:
                _fail(f"{where}: cannot run:\n" + "\n".join(problems))
            watched = "device memory" if runner.m.device.type == "cuda" else "process RSS (CPU run)"
            runner.sampler.on_alert = lambda e: err.print(
                f"[yellow]alert:[/] {e['trial_id']} ({e['phase']}): {watched} {e['device_bytes'] / 2**20:,.1f} MiB "
                f"crossed monitor.alert_device_bytes {e['threshold_bytes'] / 2**20:,.1f} MiB", highlight=False)
            m = runner.m
            err.print(f"model {sc.model.label}: {m.shape.layers} layers, {m.shape.kv_heads} kv heads × "
                      f"{m.shape.head_dim}, {str(m.dtype).removeprefix('torch.')} on {m.device}; loaded in "
                      f"{time.perf_counter() - t0:.1f} s", highlight=False, markup=False)
            err.print(f"results: {rundir.path}", highlight=False, markup=False)
            planned = _planned(sc, runner)
            try:
                rundir.update(weights_bytes=m.weights_bytes, status="running")
                result = _sweep(sc, rundir, runner, planned)
            except OSError as exc:  # writing the results: disk full, quota, removed directory
                why = str(exc)  # the sweep's ResultsNotWritten says what it lost and what run.json says
                if not isinstance(exc, ResultsNotWritten):  # run.json, before the sweep
                    with contextlib.suppress(OSError):
                        rundir.update(status="interrupted")
                    why = f"cannot write the results in {rundir.path}: {exc.strerror or exc}"
                kept = len(rundir.finished_trials())
                if created and not kept:
                    _fail(f"{why}; no trial had finished: nothing was kept", 1)  # the directory is removed below
                _fail(f"{why}; {kept} finished trials are kept: make room, then continue with: kvbench run "
                      f"--resume {rundir.path}", 1)
    except RunDirError as exc:
        _fail(str(exc))
    except Exception:  # a refusal (typer.Exit) or a bug: a run this command made stays only with a trial in it
        if created and not rundir.finished_trials():
            shutil.rmtree(rundir.path, ignore_errors=True)  # nothing ran: leave no empty run behind
        raise
    except KeyboardInterrupt:  # before the sweep (model loading, preflight): run_sweep handles it after
        if created and not rundir.finished_trials():
            shutil.rmtree(rundir.path, ignore_errors=True)
            err.print("interrupted before the first trial: nothing was kept", highlight=False)
        else:
            rundir.update(status="interrupted")
            err.print(f"interrupted; continue with: kvbench run --resume {rundir.path}", highlight=False, markup=False)
        raise typer.Exit(130) from None
    rows = rundir.finished_trials()
    title = f"{sc.name}: {sc.model.label} on {m.device}"
    if sc.workload.reuse:
        if rows:
            out.print(_reuse_summary(rows, sc.name, title))
    else:
        frame = _run_summary(rows, sc)
        out.print(_summary_table(frame, title))
        if rundir.meta.get("capacity"):
            out.print(_capacity_table(rundir.meta["capacity"], frame))
    for line in _failures(rows):
        out.print(line, highlight=False, markup=False)
    errors = sum(r["status"] == "error" for r in rows)
    if result.interrupted:
        total = f" of {planned}" if planned else ""
        err.print(f"interrupted: {result.skipped_done + result.written}{total} trials kept in {rundir.path}; "
                  f"continue with: kvbench run --resume {rundir.path}", highlight=False, markup=False)
        raise typer.Exit(130)
    out.print(f"{result.written} trials written to {rundir.path / 'trials.jsonl'}"
              + (f" ({result.skipped_done} already there)" if result.skipped_done else ""),
              highlight=False, markup=False)
    if errors:
        err.print(f"[red]error:[/] {errors} trials failed with status error (see above)", highlight=False)
        raise typer.Exit(1)


def _remote_code(sc: Any, where: Path, allowed: bool) -> None:
    """Refuse a scenario asking for model code unless --trust-remote-code allowed it; warn naming the modules."""
    from kvbench.models.config import allowed_remote_code

    try:
        modules = ", ".join(allowed_remote_code(sc.model, allowed)) or "its auto_map names none"
    except (ValueError, LookupError) as exc:
        _fail(f"{where}: {exc}")
    line = f"{where}: model.trust_remote_code: {sc.model.label} runs its own code: {modules}"
    err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)


def _planned(sc: Any, runner: Any) -> int | None:
    """How many trials the sweep records (None for a capacity search: decided as it runs)."""
    from kvbench.bench.runner import plan_trials

    if sc.workload.reuse:
        return len(runner.source.requests) * len(sc.modes) * 2 * sc.repeats
    return None if sc.searched else len(plan_trials(sc))


def _print_warnings(file: Path, s) -> None:
    from kvbench.scenario import scenario_warnings

    for path, msg in scenario_warnings(s):
        err.print(f"[yellow]warning:[/] {escape(f'{file}: {path}: {msg}')}", highlight=False)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _reuse_shape(s: Any) -> tuple[str, int]:
    """(``multi_turn: 3 conversations × 4 turns`` or ``doc_qa: 3 documents × 4 questions ...``, requests)."""
    from kvbench.workloads.sessions import extra_documents

    mt, dq = s.workload.multi_turn, s.workload.doc_qa
    if mt is not None:
        return (f"multi_turn: {_count(mt.conversations, 'conversation')} × {_count(mt.turns, 'turn')}",
                mt.conversations * mt.turns)
    extra = extra_documents(dq.documents, dq.questions, dq.ratio)
    more = f" + {_count(extra, 'single-question document')} for hit:miss {dq.hit_miss_ratio}" if extra else ""
    return (f"doc_qa: {_count(dq.documents, 'document')} × {_count(dq.questions, 'question')}{more}",
            dq.documents * dq.questions + extra)


def _table(frame: Any, title: str, caption: str = "") -> Table:
    """A Rich table of a formatted DataFrame (first columns left-aligned, the rest right-aligned)."""
    t = Table(title=escape(title), caption=escape(caption) if caption else None)
    for i, col in enumerate(frame.columns):
        t.add_column(escape(str(col)), justify="left" if i < 4 else "right", overflow="fold",
                     no_wrap=col not in ("mode", "trials", "probes", "why it stops there"),
                     min_width={"mode": min(28, max([12, *(len(str(v)) for v in frame[col])])), "trials": 9,
                                "probes": 12, "why it stops there": 16}.get(col) if col in frame else None)
    for row in frame.itertuples(index=False):
        t.add_row(*(escape(str(v)) for v in row))
    return t


def _load(paths: list[Path]) -> Any:
    from kvbench.analysis.points import ResultsError, load_results

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # problems are collected and shown once below
            return load_results(paths)
    except ResultsError as exc:
        _fail(str(exc))


def _problems(results: Any) -> None:
    if results.problems:
        err.print(f"[yellow]warning:[/] {_count(len(results.problems), 'problem')} while loading:", highlight=False)
        for p in results.problems:
            err.print(f"  {p}", highlight=False, markup=False)


#: Points per scenario that `kvbench report` prints; summary.md and report.html have them all.
REPORT_TERMINAL_ROWS = 60


@app.command()
def report(
    paths: list[Path] = typer.Argument(..., help="Run directories, trials.jsonl files or folders of runs."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Where to write (default: <first path>/report)."),
    timeline: list[str] = typer.Option([], "--timeline", help="A trial id whose memory timeline to draw "
                                       "(repeatable; default: every mode at each scenario's largest point)."),
) -> None:
    """Tables, charts and a Markdown/HTML report of one or many runs: memory saved and time it cost per mode.
    Ctrl-C or SIGTERM stops it with exit 130, its chart workers killed and nothing written."""
    from kvbench.report import (capacity_display, chart_pool, reuse_display, reuse_terminal, terminal_frame,
                                write_report)

    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    if out_dir is not None and not out_dir.strip():
        _fail("--out is empty: give a directory")
    first = paths[0]
    target = Path(out_dir) if out_dir else (first if first.is_dir() else first.parent) / "report"
    try:
        with chart_pool() as pool:  # its workers get ready while the results load
            results = _load(paths)
            try:
                rep = write_report(results, target, timelines=timeline or None, pool=pool)
            except ValueError as exc:
                _fail(str(exc))
            except OSError as exc:
                _fail(f"cannot write the report to {target}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        err.print(f"interrupted: no report written to {target}", highlight=False, markup=False)
        raise typer.Exit(130) from None
    shown = terminal_frame(rep.shown, rep.table) if len(rep.table) else None
    for g in rep.recommendations:
        part = shown[rep.table["group"] == g] if shown is not None else []
        if len(part):
            out.print(_table(part.head(REPORT_TERMINAL_ROWS), g, "medians over measured trials (TPOT: median "
                             "[min–max]); saving of device KV and TPOT overhead against `none` at the same point"))
        if len(part) > REPORT_TERMINAL_ROWS:
            out.print(f"... and {len(part) - REPORT_TERMINAL_ROWS} more points: see summary.md",
                      highlight=False, markup=False)
        if g in rep.reuse:
            out.print(_table(reuse_terminal(reuse_display(rep.reuse[g]["turn"])),
                             f"{g}: restore vs recompute per turn", "TTFT median [min–max] over the requests of "
                             "that turn and the repeats; restore includes the lookup and the copy; ÷: restore ÷ "
                             "recompute paired by request, median [95% interval over the pairs]"))
        if g in rep.capacity:
            out.print(_table(capacity_display(rep.capacity[g]), f"{g}: capacity within the budget",
                             "probes in order, ✗ = did not fit; figures at the capacity"))
        out.print(f"[bold]recommendation:[/] {escape(rep.recommendations[g])}", highlight=False)
        for f in rep.findings[g]:
            out.print(f"  - {escape(f)}", highlight=False)
        for d in rep.diagnoses[g]:
            out.print(f"  [yellow]![/] {escape(d)}", highlight=False)
    _problems(results)
    out.print(f"report: {rep.files['report.html']} (and report.md, summary.csv, {_count(len(rep.charts), 'chart')}) "
              f"in {target}", highlight=False, markup=False)


@app.command()
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


@app.command()
def cost(
    results: list[Path] = typer.Argument(None, help="Run directories, trials.jsonl files or folders of runs "
                                         "(default: the newest run under results/)."),
    gpu_price: float = typer.Option(..., "--gpu-price", help="USD per GPU-hour."),
    host_price: float = typer.Option(0.0, "--host-price", help="USD per GiB-hour of host memory held by KV."),
    disk_price: float = typer.Option(0.0, "--disk-price", help="USD per GiB-hour of disk held by KV."),
    tokens_per_month: Optional[float] = typer.Option(None, "--tokens-per-month", help="For the saving per month."),
    engineering_cost: Optional[float] = typer.Option(None, "--engineering-cost", help="USD, for the payback time."),
    max_ttft_ms: Optional[float] = typer.Option(None, "--max-ttft-ms", help="SLO: median TTFT at most this."),
    max_tpot_ms: Optional[float] = typer.Option(None, "--max-tpot-ms", help="SLO: median TPOT at most this."),
    base_throughput: Optional[float] = typer.Option(None, "--base-throughput", help="What-if: tokens/s without "
                                                    "offload (with --offload-throughput; no results needed)."),
    offload_throughput: Optional[float] = typer.Option(None, "--offload-throughput", help="What-if: with offload."),
    out_dir: Optional[str] = typer.Option(None, "--out", help="Where cost.csv, cost.json and cost.png go "
                                           "(default: <first path>/report)."),
) -> None:
    """Cost per 1M generated tokens per mode from measured throughput (or what-if figures), saving vs none.
    Ctrl-C or SIGTERM while it writes its files stops it with exit 130, leaving none half-written."""
    from kvbench.analysis.cost import Prices, what_if

    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    try:
        prices = Prices(gpu_price, host_price, tokens_per_month, engineering_cost, disk_price)
    except ValueError as exc:
        _fail(str(exc))
    for name, v in (("--max-ttft-ms", max_ttft_ms), ("--max-tpot-ms", max_tpot_ms)):
        if v is not None and not (v > 0 and v != float("inf")):
            _fail(f"{name} must be a finite number of milliseconds above 0, not {v}")
    if (base_throughput is None) != (offload_throughput is None):
        _fail("--base-throughput and --offload-throughput go together")
    if base_throughput is not None and results:
        _fail("give result directories or a what-if (--base-throughput, --offload-throughput), not both")
    if base_throughput is not None:
        try:
            w = what_if(prices, base_throughput, offload_throughput)
        except ValueError as exc:
            _fail(str(exc))
        out.print(f"cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour: {w['base_usd_per_million']:,.2f} "
                  f"→ {w['offload_usd_per_million']:,.2f} USD ({w['saving_pct']:.1f}% saving; "
                  f"{base_throughput:g} → {offload_throughput:g} tokens/s)", highlight=False, markup=False)
        if w["monthly_saving_usd"] is not None:
            out.print(f"at {tokens_per_month:,.0f} tokens per month: {w['monthly_saving_usd']:,.2f} USD per month",
                      highlight=False, markup=False)
        if w["payback_months"] is not None:
            out.print(f"payback of {engineering_cost:,.0f} USD: {w['payback_months']:.1f} months",
                      highlight=False, markup=False)
        elif engineering_cost is not None:
            out.print(f"no payback of {engineering_cost:,.0f} USD: offload saves nothing here",
                      highlight=False, markup=False)
        if w["saving_pct"] < 0:
            out.print("offload raises cost here: its throughput is lower than without it", highlight=False)
        return
    if not results:
        from kvbench.results.newest import newest_run

        found = newest_run("results")
        if found is None:
            _fail("no results given and no run under results/: give result directories, or --base-throughput and "
                  "--offload-throughput for a what-if")
        out.print(f"costing the newest run under results/: {found}", highlight=False, markup=False)
        results = [found]
    from kvbench.analysis.points import point_table
    from kvbench.analysis.cost import cost_table, verdicts
    from kvbench.analysis.reuse_cost import reuse_cost, reuse_verdicts
    from kvbench.analysis.intervals import pct_interval

    if out_dir is not None and not out_dir.strip():
        _fail("--out is empty: give a directory")
    first = results[0]
    target = Path(out_dir) if out_dir else (first if first.is_dir() else first.parent) / "report"
    from kvbench.results.run_dir import RunDirError, refuse_symlink_dir

    try:
        refuse_symlink_dir(target)  # before any output: a refused run prints no table
    except RunDirError as exc:
        _fail(str(exc))
    if target.exists() and not target.is_dir():
        _fail(f"{target} is not a directory: the cost files go in a directory (give another with --out)")
    loaded = _load(results)
    points = point_table(loaded.trials)
    table = cost_table(points, prices, loaded.trials, None if max_ttft_ms is None else max_ttft_ms / 1e3,
                       None if max_tpot_ms is None else max_tpot_ms / 1e3) if len(points) else points
    reuse = reuse_cost(loaded.trials, prices)
    monthly = tokens_per_month is not None
    t = Table(title=f"cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour, host {host_price:g} and disk "
                    f"{disk_price:g} USD per GiB-hour",
              caption="best qualifying batch per mode (all trials ok within the budget, ids equal to none's, measured "
                      "`repeats` times, SLOs met); USD/1M with the 95% interval of its throughput; saving against "
                      "none at the same prompt length, paired by repeat, with its 95% interval over the pairs")
    for c in ["scenario", "prompt", "mode", "batch", "tokens/s", "USD/1M", "saving %", "pairs"] + \
            (["USD/month"] if monthly else []) + (["payback months"] if engineering_cost is not None else []):
        t.add_column(c, justify="left" if c in ("scenario", "mode") else "right", overflow="fold")
    for r in table.to_dict("records"):
        if r["usd_per_million"] != r["usd_per_million"]:
            cells = ["-", "-", "-", escape(r["why"]), "-"] + (["-"] if monthly else []) + \
                    (["-"] if engineering_cost is not None else [])
        else:
            usd = f"{r['usd_per_million']:,.2f}" + ("" if r["usd_ci_low"] != r["usd_ci_low"] else
                                                    f" [{r['usd_ci_low']:,.2f}–{r['usd_ci_high']:,.2f}]")
            cells = [str(int(r["batch_size"])), f"{r['throughput_tokens_per_s']:,.2f}", usd,
                     "ref" if r["mode"] == "none" else
                     pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1).replace("%", ""),
                     "-" if r["mode"] == "none" else str(int(r["pairs"]))]
            if monthly:
                m = r["monthly_saving_usd"]
                cells.append("-" if m is None or m != m else f"{m:,.0f}")
            if engineering_cost is not None:
                pb = r["payback_months"]
                cells.append("-" if pb is None or pb != pb else f"{pb:.1f}")
        t.add_row(escape(r["group"]), str(int(r["prompt_tokens"])), escape(r["mode_label"]), *cells)
    if len(table):
        out.print(t)
    if len(reuse):
        out.print(_reuse_cost_table(reuse, gpu_price))
        for line in reuse_verdicts(reuse):
            out.print(f"  {escape(line)}", highlight=False)
    for group, lines in (verdicts(table) if len(table) else {}).items():
        out.print(f"[bold]{escape(group)}:[/]", highlight=False)
        for line in lines:
            out.print(f"  {escape(line)}", highlight=False)
    bases = sorted(set(table["host_basis"]) - {""}) if "host_basis" in table else []
    out.print(f"host memory charged at {host_price:g} and disk at {disk_price:g} USD per GiB-hour"
              + (" (pass --host-price and --disk-price to charge them)" if host_price == 0 == disk_price else "")
              + (f"; host memory held: {', '.join(bases)}" if bases else ""), highlight=False, markup=False)
    _problems(loaded)
    from kvbench.analysis.cost import write_costs

    try:
        files = write_costs(table, target, prices, reuse)
    except RunDirError as exc:  # a symbolic link where the files would go
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write {exc.filename or target}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        err.print(f"interrupted while writing the cost files in {target}: each is whole, new or from before",
                  highlight=False, markup=False)
        raise typer.Exit(130) from None
    out.print(f"cost: {', '.join(str(f) for f in files)}", highlight=False, markup=False)


def _reuse_cost_table(reuse: Any, gpu_price: float) -> Table:
    """Per reuse scenario and mode: throughput and cost recomputing every prompt vs restoring stored prefixes."""
    from kvbench.analysis.intervals import pct_interval

    t = Table(title=f"reuse: cost per 1M generated tokens at {gpu_price:g} USD per GPU-hour, recompute vs restore",
              caption="the same requests one at a time; cold = recompute every prompt, warm = restore stored "
                      "prefixes (charged --host-price for the store's memory, --disk-price for its disk); tokens/s = "
                      "generated tokens ÷ e2e time; saving with its 95% interval over request pairs; prefill saved "
                      "= prompt tokens restored instead of computed")
    for c in ("scenario", "mode", "requests", "tok/s cold", "tok/s warm", "USD/1M cold", "USD/1M warm", "saving %",
              "pairs", "prefill saved %", "TTFT saved ms", "= none"):
        t.add_column(c, justify="left" if c in ("scenario", "mode") else "right", overflow="fold",
                     no_wrap=c == "scenario", min_width=12 if c == "mode" else None)
    for r in reuse.to_dict("records"):
        def num(v: Any, fmt: str) -> str:
            if v is None or v != v:
                return "-"
            text = format(v, fmt)
            return format(0.0, fmt) if float(text.replace(",", "")) == 0 else text  # no "-0"

        t.add_row(r["group"], r["mode_label"], str(r["requests"]), num(r["recompute_tokens_per_s"], ",.2f"),
                  num(r["restore_tokens_per_s"], ",.2f"), num(r["recompute_usd_per_million"], ",.2f"),
                  num(r["restore_usd_per_million"], ",.2f"),
                  pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1).replace("%", ""),
                  str(r["pairs"]),
                  num(r["prefill_saved_pct"], ".1f"), num(r["ttft_saved_s"] * 1e3, ",.0f"),
                  {True: "yes", False: "[red]NO[/]", "near tie": "near tie"}.get(r["tokens_match"], "-"))
    return t


def _bytes_option(value: str, option: str) -> int:
    from pydantic import ByteSize, TypeAdapter

    from kvbench.scenario.bounds import check_size_input

    try:
        n = TypeAdapter(ByteSize).validate_python(check_size_input(value))
    except ValueError:  # pydantic.ValidationError is one
        _fail(f"{option} {value!r}: give bytes or a size such as 80GiB, 512GB")
    if n <= 0:
        _fail(f"{option} {value!r}: must be more than 0 bytes")
    return int(n)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"


@app.command()
def plan(
    model: str = typer.Argument(..., metavar="MODEL",
                                help="A preset (see `kvbench list presets`), a config.json or a model directory."),
    prompt_tokens: int = typer.Option(4096, "--prompt-tokens", help="Context per sequence (tokens)."),
    batch: int = typer.Option(1, help="Sequences decoded together (the roofline's batch)."),
    dtype: str = typer.Option("bf16", help="KV and weights dtype: fp32, fp16, bf16, fp8 (or int8)."),
    gpu_mem: str = typer.Option("80GiB", "--gpu-mem", help="Device memory."),
    host_mem: Optional[str] = typer.Option(None, "--host-mem", help="Host memory for KV (default: this machine's)."),
    window: int = typer.Option(512, help="hierarchical's window (tokens on the device per layer)."),
    link_gbps: Optional[float] = typer.Option(None, "--link-gbps", help="Host→device bandwidth, GB/s (default: the "
                                              "last `kvbench env` probe on a GPU, else 50)."),
    hbm_gbps: float = typer.Option(2000.0, "--hbm-gbps", help="Device memory bandwidth, GB/s."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="USD per GPU-hour: adds cost per 1M tokens."),
) -> None:
    """Analytic KV footprint, the largest batch per mode and a decode-step roofline for a model config (no GPU)."""
    import difflib
    import math

    import psutil

    from kvbench.bench.machine import last_link_probe

    warnings.showwarning = _show_warning
    from kvbench.models import preset_names, preset_path
    from kvbench.analysis.plan import DTYPE_BYTES, architecture, cost_per_million, plan_modes, read_config

    if dtype not in DTYPE_BYTES:
        _fail(f"--dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    if prompt_tokens <= 0 or batch <= 0 or window < 0:
        bad = [f"{n} {v}" for n, v, least in (("--prompt-tokens", prompt_tokens, 1), ("--batch", batch, 1),
                                               ("--window", window, 0)) if v < least]
        _fail(f"{', '.join(bad)}: --prompt-tokens and --batch must be more than 0, --window 0 or more")
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if model in preset_names():
        path = preset_path(model)
    elif path.suffix == ".json" or path.exists():
        if not path.is_file():
            _fail(f"{path}: no such config.json")
    else:
        close = difflib.get_close_matches(model, preset_names(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        _fail(f"unknown model {model!r}: {hint}presets: {', '.join(preset_names())}; or give a config.json path")
    try:
        arch = architecture(read_config(path), model)
    except ValueError as exc:
        _fail(str(exc))
    except (OSError, KeyError) as exc:
        _fail(f"{path}: not a usable model config ({exc})")
    link_source = "--link-gbps"
    if link_gbps is None:
        probe = last_link_probe()
        link_gbps, link_source = probe if probe else (50.0, "default; measure it with kvbench env on a GPU")
    for name, v in (("--link-gbps", link_gbps), ("--hbm-gbps", hbm_gbps)):
        if not (v > 0 and math.isfinite(v)):
            _fail(f"{name} must be a finite number of GB/s above 0, not {v}")
    gpu = _bytes_option(gpu_mem, "--gpu-mem")
    host = _bytes_option(host_mem, "--host-mem") if host_mem else psutil.virtual_memory().total
    nbytes = DTYPE_BYTES[dtype]
    try:
        modes = plan_modes(arch, prompt_tokens, batch, nbytes, gpu, host, link_gbps * 1e9, hbm_gbps * 1e9, window)
        costs = [cost_per_million(gpu_price, m.tokens_per_s) for m in modes] if gpu_price is not None else None
    except ValueError as exc:
        _fail(str(exc))
    per_seq = arch.kv_bytes(prompt_tokens, nbytes)
    sliding = arch.layers - arch.full_layers
    out.print(f"{model}: {arch.layers} layers ({sliding} with a sliding window), {arch.kv_heads} kv heads × "
              f"{arch.head_dim}, {dtype}; {_count_units(arch.parameters)} parameters = weights "
              f"{_gib(arch.parameters * nbytes)}", highlight=False, markup=False)
    out.print(f"KV: {per_seq / prompt_tokens:,.0f} bytes per token at {prompt_tokens:,} tokens "
              f"({2 * arch.kv_heads * arch.head_dim * nbytes * arch.layers:,} for full attention in every layer); "
              f"{_gib(per_seq)} per sequence, {_gib(per_seq * batch)} for batch {batch}", highlight=False, markup=False)
    out.print(f"assumed: GPU {_gib(gpu)} (10% reserved), host {_gib(host)}, link {link_gbps:g} GB/s ({link_source}), "
              f"device memory {hbm_gbps:g} GB/s", highlight=False, markup=False)
    unit_name, unit = ("GiB", 2**30) if per_seq >= 2**30 else ("MiB", 2**20)
    cap = Table(title=f"capacity at {prompt_tokens:,} tokens per sequence",
                caption="KV per sequence on the device (with the layers in flight) and in host memory; max batch: "
                        "device KV within the GPU less weights and reserve, host KV within host memory")
    for c in ("mode", f"device KV/seq ({unit_name})", f"host KV/seq ({unit_name})", "max batch"):
        cap.add_column(c, justify="left" if c == "mode" else "right")
    roof = Table(title=f"decode step at batch {batch}",
                 caption="memory: weights + 3 passes over the KV in device memory (the cache's torch.cat reads and "
                         "writes it, attention reads it); link: history copied host→device; TPOT = "
                         "the larger (copies overlapped); link-bound from: the batch from which the link sets it")
    widest = max(len(m.mode) for m in modes)
    for c in ["mode", f"link {unit_name}", "link ms", "memory ms", "TPOT ms", "tok/s", "bound",
              "link-bound from"] + (["USD/1M tok"] if costs else []):
        roof.add_column(c, justify="left" if c in ("mode", "bound") else "right", no_wrap=True,
                        min_width=widest if c == "mode" else None)
    for i, m in enumerate(modes):
        cross = ("-" if m.link_bound_batch is None else "batch 1" if m.link_bound_batch < 1
                 else f"batch {math.floor(m.link_bound_batch) + 1:,}")
        cap.add_row(m.mode, f"{m.device_bytes_per_seq / unit:,.2f}", f"{m.host_bytes_per_seq / unit:,.2f}",
                    f"{m.max_batch:,}")
        roof.add_row(m.mode, f"{m.link_bytes_per_step / unit:,.2f}", f"{m.link_s * 1e3:,.1f}",
                     f"{m.memory_s * 1e3:,.1f}", f"{m.step_s * 1e3:,.1f}", f"{m.tokens_per_s:,.1f}",
                     "link" if m.bound == "link" else "memory", cross, *([f"{costs[i]:,.2f}"] if costs else []))
    out.print(cap)
    out.print(roof)
    weights = arch.parameters * nbytes
    if weights > gpu * 0.9:
        err.print(f"[yellow]warning:[/] the weights ({_gib(weights)}) do not fit in {_gib(gpu * 0.9)} of the GPU (10% "
                  "reserved): no batch fits in any mode; the decode step above assumes they did", highlight=False)
    over = [f"{m.mode} ({m.max_batch})" for m in modes if 0 < m.max_batch < batch]
    if over and weights <= gpu * 0.9:
        err.print(f"[yellow]warning:[/] batch {batch} does not fit every mode (max batch: {', '.join(over)}); the "
                  f"decode step above is for batch {batch} anyway (--host-mem and --gpu-mem set the limits)",
                  highlight=False)
    if arch.max_positions and prompt_tokens > arch.max_positions:
        err.print(f"[yellow]warning:[/] {prompt_tokens:,} tokens is beyond the model's max_position_embeddings "
                  f"({arch.max_positions:,})", highlight=False)
    if arch.full_layers == 0:
        out.print("every layer has a sliding window: its KV is capped and stays on the device; offload moves "
                  "nothing", highlight=False)


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="Scenario YAML files.")) -> None:
    """Check scenario files without loading any model weights (reads the model's config for its context limit);
    warn about configurations that run but mislead. Exit 2 when a file is invalid (each is reported), as `run`."""
    from kvbench.scenario import ScenarioError, load_scenario

    bad = 0
    for f in files:
        try:
            s = load_scenario(f)
        except ScenarioError as exc:
            bad += 1
            err.print(str(exc), highlight=False, markup=False)
        else:
            _print_warnings(f, s)
            if s.searched is not None:
                cap = s.capacity
                fixed = s.prompt_tokens if s.searched == "batch_size" else s.batch_sizes
                noun = "prompt length" if s.searched == "batch_size" else "batch size"
                limit = cap.max if cap and cap.max else (s.largest_batch if s.searched == "batch_size"
                                                         else "the model's longest prompt")
                out.print(f"{f}: ok (capacity search of {s.searched} up to {limit}: {_count(len(fixed), noun)} × "
                          f"{_count(len(s.modes), 'mode')}; trials are decided as it runs)",
                          highlight=False, markup=False)
                continue
            if s.workload.reuse:
                shape, requests = _reuse_shape(s)
                n = requests * len(s.modes) * 2 * s.repeats
                out.print(f"{f}: ok ({n} trials: {shape} = {_count(requests, 'request')} × "
                          f"{_count(len(s.modes), 'mode')} × cold and warm × {_count(s.repeats, 'repeat')}; prompts "
                          "are built from the data as it runs)", highlight=False, markup=False)
                continue
            n = len(s.prompt_tokens) * len(s.batch_sizes) * len(s.modes) * s.repeats
            out.print(f"{f}: ok ({n} trials: {_count(len(s.prompt_tokens), 'prompt length')} × "
                      f"{_count(len(s.batch_sizes), 'batch size')} × {_count(len(s.modes), 'mode')} × "
                      f"{_count(s.repeats, 'repeat')})", highlight=False, markup=False)
    if bad:
        raise typer.Exit(2)  # bad input, as `run` says of the same file


@app.command("env")
def env_(
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N: the device whose link is probed."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw JSON (as stored in every run.json)."),
) -> None:
    """Print the machine: CPU, memory, GPUs with their PCIe link, versions; on CUDA measure host↔device copy
    bandwidth (pinned and pageable, GB/s, median of 5 copies of 256 MiB)."""
    import json

    import re

    from kvbench.bench.machine import environment, save_link_probe
    from kvbench.models import resolve_device

    if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", device):
        _fail(f"--device: must be auto, cpu, cuda or cuda:N (got {device!r})")
    try:
        e = environment(resolve_device(device))
    except ValueError as exc:
        _fail(str(exc))
    warnings.showwarning = _show_warning
    kept = save_link_probe(e)
    if as_json:
        out.print_json(json.dumps(e, default=str))
        return
    t = Table(show_header=False, box=None)
    t.add_column("what", style="bold")
    t.add_column("value")
    for key in ("kvbench", "torch", "transformers", "python", "platform", "cpu", "cpu_count", "cuda", "driver"):
        t.add_row(key, str(e.get(key)))
    t.add_row("memory", f"{e['memory_total_bytes'] / 2**30:.1f} GiB")
    for g in e.get("gpus") or []:
        link = (f"PCIe gen {g['pcie_gen']} x{g['pcie_width']} (max gen {g['pcie_gen_max']} x{g['pcie_width_max']})"
                if g.get("pcie_gen") else "PCIe link not reported")
        t.add_row(f"gpu {g['index']}", f"{g['name']}, {g['memory_total_bytes'] / 2**30:.1f} GiB, {link}")
    if not e.get("gpus"):
        t.add_row("gpus", e.get("note", "none"))
    bw = e.get("link_bandwidth")
    if bw:
        for k, v in bw.items():
            t.add_row(k.removesuffix("_gbps").replace("_", " "), f"{v:.1f} GB/s")
    else:
        t.add_row("link bandwidth", e.get("link_bandwidth_note", "not measured"))
    mem = e.get("memory_bandwidth")
    t.add_row("memory bandwidth", f"{mem['memory_gbps']:.1f} GB/s read + write ({mem['device']}, a copy of 256 MiB)"
              if mem else e.get("memory_bandwidth_note", "not measured"))
    if kept:
        t.add_row("kept", f"{kept} (kvbench plan's default --link-gbps)")
    git = e.get("git") or {}
    t.add_row("git", f"{git.get('commit')}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit")
              else str(git.get("note")))
    out.print(t)


class ListWhat(str, Enum):
    scenarios = "scenarios"
    modes = "modes"
    presets = "presets"


@app.command("list")
def list_(
    what: ListWhat = typer.Argument(..., help="scenarios, modes or presets"),
    directory: Path = typer.Option(Path("scenarios"), "--dir", help="Where to look for scenarios."),
) -> None:
    """List the scenario files in a folder, the offload modes, or the architecture presets."""
    t = Table()
    if what is ListWhat.modes:
        from kvbench.offload.registry import MODES

        t.add_column("mode")
        t.add_column("what stays on the device")
        t.add_column("needs")
        for m in MODES.values():
            t.add_row(m.kind, m.summary, "CUDA" if m.needs_cuda else "-")
    elif what is ListWhat.presets:
        from kvbench.models import preset_names

        t.add_column("preset")
        for name in preset_names():
            t.add_row(name)
    else:
        from kvbench.scenario import ScenarioError, parse_scenario, read_yaml

        files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
        if not files:
            import kvbench

            shipped = Path(kvbench.__file__).resolve().parent.parent / "scenarios"
            hint = f"; kvbench's own are in {shipped}" if shipped.is_dir() and shipped != directory.resolve() else ""
            _fail(f"no scenario files (*.yaml) in {directory.resolve()}: pass --dir DIR{hint}")
        t.add_column("file")
        t.add_column("name")
        t.add_column("description")
        for f in files:
            try:
                s = parse_scenario(read_yaml(f), f)
                t.add_row(escape(str(f)), s.name, escape(s.description))
            except ScenarioError as exc:
                t.add_row(escape(str(f)), "[red]invalid[/]", escape(str(exc).splitlines()[0]))
    out.print(t)

