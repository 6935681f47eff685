"""``kvbench run``: a sweep of trials from a scenario file, or the rest of an interrupted run."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.cli.common import _fail, _mib, _ms, _print_warnings, _show_warning, _table, _terminated, err, out


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
    from kvbench.report.tables import capacity_display

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
    from kvbench.results.frame import trials_frame
    from kvbench.report.tables import reuse_display, reuse_terminal
    from kvbench.analysis.reuse import reuse_table

    return _table(reuse_terminal(reuse_display(reuse_table(trials_frame(rows, name)))), title,
                  "cold = recompute the whole prompt, warm = restore the stored prefix then prefill the rest; "
                  "TTFT median [min–max]; ÷: restore ÷ recompute TTFT paired by request, median [95% interval over "
                  "the pairs]; = none: greedy ids equal to none's recompute")


def _run_summary(rows: list[dict[str, Any]], sc: Any) -> Any:
    """The per-point table of a run's trials (no bootstrap: the run summary shows medians and ranges)."""
    from kvbench.analysis.points import point_table
    from kvbench.results.frame import trials_frame

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

    from kvbench.errors import ModelNotFound
    from kvbench.models import resolve_device
    from kvbench.bench.capacity import device_problem
    from kvbench.models.load import one_line
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
    from kvbench.errors import RemoteCodeRefused
    from kvbench.models.remote_code import allowed_remote_code

    try:
        modules = ", ".join(allowed_remote_code(sc.model, allowed)) or "its auto_map names none"
    except RemoteCodeRefused as exc:
        _fail(f"{where}: {exc}; pass --trust-remote-code to allow it, or set it to false")
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
