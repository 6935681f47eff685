"""The `kvbench` command: a thin Typer layer over the library. Heavy imports (torch) happen inside commands,
so `kvbench --help` stays fast."""

from __future__ import annotations

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

        out.print(f"kvbench {kvbench.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Measure what KV-cache offload really does."""


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    err.print(f"[yellow]warning:[/] {message}", highlight=False)


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def _mib(v: Any) -> str:
    return "-" if v is None or v != v else f"{v / 2**20:,.1f}"


def _ms(med: Any, lo: Any, hi: Any) -> str:
    """Seconds as ``median (min–max)`` in milliseconds; whole milliseconds from 100 ms up."""
    if med is None or med != med:
        return "-"
    fmt = "{:,.0f}" if med >= 0.1 else "{:,.1f}"
    return f"{fmt.format(med * 1e3)} ({fmt.format(lo * 1e3)}–{fmt.format(hi * 1e3)})"


def _summary_table(frame: Any, title: str) -> Table:
    t = Table(title=title, caption="median (min–max) over the measured repeats (ok, and over budget: *); same ids: "
                                   "greedy ids equal to `none`'s; KV MiB: device KV peak")
    for col in ("prompt", "batch", "mode", "ok", "same ids", "TTFT ms", "TPOT ms", "decode tok/s", "KV MiB", "RSS MiB"):
        if col == "mode":
            t.add_column(col, overflow="fold", min_width=12)  # window sizes must stay readable
        else:
            t.add_column(col, justify="right", no_wrap=col.endswith("ms"))
    for r in frame.to_dict("records"):
        tps = r["decode_tokens_per_s_median"]
        t.add_row(
            str(r["prompt_tokens"]), str(r["batch_size"]), r["mode"],
            f"{r['ok']}/{r['trials']}" + ("[yellow]*[/]" if r["status"] == "over_budget" else ""),
            {True: "yes", False: "[red]NO[/]", None: "-"}[r["tokens_match"]],
            _ms(r["ttft_s_median"], r["ttft_s_min"], r["ttft_s_max"]),
            _ms(r["tpot_s_median"], r["tpot_s_min"], r["tpot_s_max"]),
            "-" if tps is None or tps != tps else f"{tps:,.1f}",
            _mib(r["kv_device_peak_bytes_median"]), _mib(r["rss_peak_bytes_max"]),
        )
    return t


def _failures(frame: Any) -> list[str]:
    """One line per distinct (mode, status, message) among trials that did not end ok."""
    seen: dict[tuple[str, str, str], int] = {}
    for r in frame.to_dict("records"):
        if r["status"] != "ok":
            key = (r["mode"], r["status"], r["message"])
            seen[key] = seen.get(key, 0) + r["trials"] - r["ok"]
    return [f"{mode}: {status} ({n} trials): {msg}" for (mode, status, msg), n in seen.items()]


def _sweep(sc: Any, rundir: Any, runner: Any, total: int) -> Any:
    """Run the sweep under a Rich progress bar with ETA."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from kvbench.runner import run_sweep

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=err) as progress:
        task = progress.add_task(sc.name, total=total, completed=len(rundir.finished_trials()))
        return run_sweep(
            sc, rundir, runner,
            on_trial=lambda row: progress.advance(task),
            on_status=lambda text: progress.update(task, description=f"{sc.name} {text}"),
        )


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (e.g. `kill`, a job scheduler) stops the sweep like Ctrl-C: finished trials kept, temporary files
    removed, the run resumable."""
    raise KeyboardInterrupt


@app.command()
def run(
    scenario: Optional[Path] = typer.Argument(None, help="Scenario YAML file (optional with --resume)."),
    out_root: Optional[Path] = typer.Option(None, "--out", help="Results root (default results/); the run goes in a new folder."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run directory, skipping finished trials."),
) -> None:
    """Run a scenario's sweep and print its summary."""
    from kvbench.machine import environment
    from kvbench.results import RunDir, RunDirError, read_trials, summary_frame
    from kvbench.scenario import ScenarioError, check_scenario, load_scenario, parse_scenario

    warnings.showwarning = _show_warning
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIG_IGN)
    if scenario is None and resume is None:
        _fail("give a scenario file, or --resume DIR")
    if resume is not None and out_root is not None:
        _fail(f"--out does not apply with --resume: the run stays in {resume}")
    try:
        if resume is not None:
            rundir = RunDir.open(resume)
            sc = parse_scenario(rundir.meta["scenario"], resume / "run.json")
            if scenario is not None and load_scenario(scenario).model_dump(mode="json") != sc.model_dump(mode="json"):
                _fail(f"{scenario} differs from the scenario stored in {resume}/run.json; resume without the file")
            problems = check_scenario(sc)
            if problems:
                raise ScenarioError(resume / "run.json", problems)
        else:
            sc = load_scenario(scenario)
            rundir = None
            _print_warnings(scenario, sc)
    except (ScenarioError, RunDirError) as exc:
        _fail(str(exc))

    import psutil

    from kvbench.models import ModelNotFound, resolve_device
    from kvbench.runner import plan_trials, prepare

    if rundir is not None and {t.trial_id for t in plan_trials(sc)} <= {r["trial_id"] for r in rundir.finished_trials()}:
        frame = summary_frame(read_trials(rundir.trials_path))
        out.print(_summary_table(frame, f"{sc.name}: {sc.model.label}"))
        for line in _failures(frame):
            out.print(line, highlight=False)
        out.print(f"nothing to run: every trial of {sc.name} is already in {rundir.trials_path}", highlight=False)
        return

    try:
        env = environment(resolve_device(sc.device))
    except ValueError as exc:
        _fail(str(exc))
    busy = psutil.cpu_percent(interval=0.5)  # system-wide, while this process waits: the others' load
    if busy > 50:
        err.print(f"[yellow]warning:[/] the machine is busy ({busy:.0f}% of {env['cpu_count']} CPUs in use by other "
                  "processes): timings will be noisy", highlight=False)
    created = rundir is None
    if rundir is None:
        try:
            rundir = RunDir.create(out_root or Path("results"), sc.model_dump(mode="json"), env)
        except OSError as exc:
            _fail(f"cannot create the run directory under {out_root or 'results'}: {exc.strerror or exc}")
    try:
        with rundir.lock():
            t0 = time.perf_counter()
            with err.status(f"loading {sc.model.label} and the {sc.workload.source} workload"):
                try:
                    runner = prepare(sc)
                    problems = runner.preflight()
                except (ModelNotFound, ValueError, ImportError, OSError) as exc:
                    _fail(str(exc))
            if problems:
                _fail("the workload cannot fill every trial:\n" + "\n".join(problems))
            watched = "device memory" if runner.m.device.type == "cuda" else "process RSS (CPU run)"
            runner.sampler.on_alert = lambda e: err.print(
                f"[yellow]alert:[/] {e['trial_id']} ({e['phase']}): {watched} {e['device_bytes'] / 2**20:,.1f} MiB "
                f"crossed monitor.alert_device_bytes {e['threshold_bytes'] / 2**20:,.1f} MiB", highlight=False)
            m = runner.m
            err.print(f"model {sc.model.label}: {m.shape.layers} layers, {m.shape.kv_heads} kv heads × "
                      f"{m.shape.head_dim}, {str(m.dtype).removeprefix('torch.')} on {m.device}; loaded in "
                      f"{time.perf_counter() - t0:.1f} s", highlight=False)
            rundir.update(weights_bytes=m.weights_bytes, status="running")
            err.print(f"results: {rundir.path}", highlight=False)
            result = _sweep(sc, rundir, runner, len(plan_trials(sc)))
    except RunDirError as exc:
        _fail(str(exc))
    except typer.Exit:
        if created and not rundir.finished_trials():
            shutil.rmtree(rundir.path, ignore_errors=True)  # nothing ran: leave no empty run behind
        raise
    except KeyboardInterrupt:  # before the sweep (model loading, preflight): run_sweep handles it after
        if created and not rundir.finished_trials():
            shutil.rmtree(rundir.path, ignore_errors=True)
            err.print("interrupted before the first trial: nothing was kept", highlight=False)
        else:
            rundir.update(status="interrupted")
            err.print(f"interrupted; continue with: kvbench run --resume {rundir.path}", highlight=False)
        raise typer.Exit(130) from None
    total = len(plan_trials(sc))
    frame = summary_frame(read_trials(rundir.trials_path))
    out.print(_summary_table(frame, f"{sc.name}: {sc.model.label} on {m.device}"))
    for line in _failures(frame):
        out.print(line, highlight=False)
    errors = int((frame["status"] == "error").sum()) if "status" in frame else 0
    if result.interrupted:
        err.print(f"interrupted: {result.skipped_done + result.written} of {total} trials kept in {rundir.path}; "
                  f"continue with: kvbench run --resume {rundir.path}", highlight=False)
        raise typer.Exit(130)
    out.print(f"{result.written} trials written to {rundir.path / 'trials.jsonl'}"
              + (f" ({result.skipped_done} already there)" if result.skipped_done else ""), highlight=False)
    if errors:
        err.print(f"[red]error:[/] trials failed with status error at {errors} point(s) (see above)", highlight=False)
        raise typer.Exit(1)


def _print_warnings(file: Path, s) -> None:
    from kvbench.scenario import scenario_warnings

    for path, msg in scenario_warnings(s):
        err.print(f"[yellow]warning:[/] {file}: {path}: {msg}", highlight=False)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


@app.command()
def validate(files: list[Path] = typer.Argument(..., help="Scenario YAML files.")) -> None:
    """Check scenario files without loading any model weights (reads the model's config for its context limit);
    warn about configurations that run but mislead."""
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
            n = len(s.prompt_tokens) * len(s.batch_sizes) * len(s.modes) * s.repeats
            out.print(f"{f}: ok ({n} trials: {_count(len(s.prompt_tokens), 'prompt length')} × "
                      f"{_count(len(s.batch_sizes), 'batch size')} × {_count(len(s.modes), 'mode')} × "
                      f"{_count(s.repeats, 'repeat')})", highlight=False)
    if bad:
        raise typer.Exit(1)


@app.command("env")
def env_(
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N: the device whose link is probed."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw JSON (as stored in every run.json)."),
) -> None:
    """Print the machine: CPU, memory, GPUs with their PCIe link, versions; on CUDA measure host↔device copy
    bandwidth (pinned and pageable, GB/s, median of 5 copies of 256 MiB)."""
    import json

    import re

    from kvbench.machine import environment
    from kvbench.models import resolve_device

    if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", device):
        _fail(f"--device: must be auto, cpu, cuda or cuda:N (got {device!r})")
    try:
        e = environment(resolve_device(device))
    except ValueError as exc:
        _fail(str(exc))
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
            _fail(f"no scenario files (*.yaml) in {directory}")
        t.add_column("file")
        t.add_column("name")
        t.add_column("description")
        for f in files:
            try:
                s = parse_scenario(read_yaml(f), f)
                t.add_row(str(f), s.name, s.description)
            except ScenarioError as exc:
                t.add_row(str(f), "[red]invalid[/]", str(exc).splitlines()[0])
    out.print(t)


if __name__ == "__main__":
    app()
