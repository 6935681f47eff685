"""``kvbench run``: a sweep of trials from a scenario file, or the rest of an interrupted run."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.bench.run import RunProgress
from kvbench.cli.common import (REUSE_WRAPPING, err, fail, handle_errors, out, render, show, show_warning,
                                stop_on_signals)


def _same_ids(r: dict[str, Any]) -> str:
    """The "same ids" cell: yes / NO, or a lossy mode's median KL against none (its ids may differ by design)."""
    from kvbench.report.format import kl_cell, missing

    if not missing(r.get("kl_mean_median")):
        return kl_cell(r["kl_mean_median"], r.get("kl_bound"))
    return {True: "yes", False: "[red]NO[/]"}.get(r["tokens_match"], "-")


def _summary_table(frame: Any, title: str) -> Table:
    from kvbench.report.format import mib, spread

    def ms(r: dict[str, Any], col: str) -> str:  # run's range: every figure at the median's precision, in ()
        return spread(r, col, "()", median_precision=True, collapse=False)

    t = Table(title=escape(title), caption="median (min–max) over the measured repeats (ok, and over budget: *); "
                                           "same ids: greedy ids equal to `none`'s (KL: a lossy host format's "
                                           "median KL against none, nats; KL ≥: a server's lower bound); KV MiB: "
                                           "device KV peak")
    machines = frame["group"].nunique() > 1 if "group" in frame else False  # a run across placement kinds
    if machines:
        t.add_column("machine")
    for col in ("prompt", "batch", "mode", "ok", "same ids", "TTFT ms", "TPOT ms", "decode tok/s", "KV MiB", "RSS MiB"):
        if col == "mode":
            widest = max([12, *(len(str(m)) for m in frame.get("mode_label", ()))])  # no rows: no column
            t.add_column(col, overflow="fold", min_width=min(28, widest))  # window sizes must stay readable
        else:
            t.add_column(col, justify="right", no_wrap=col.endswith("ms"))
    for r in frame.to_dict("records"):
        tps = r["decode_tokens_per_s_median"]
        t.add_row(
            *([escape(str(r["group"]).rpartition(" @ ")[2])] if machines else []),
            str(r["prompt_tokens"]), str(r["batch_size"]), escape(r["mode_label"]),
            f"{r['n_ok']}/{r['trials']}" + ("[yellow]*[/]" if r["status"] == "over_budget" else ""),
            _same_ids(r),
            ms(r, "ttft_s"), ms(r, "tpot_s"),
            "-" if tps is None or tps != tps else f"{tps:,.1f}",
            mib(r["kv_device_peak_bytes_median"]), mib(r["rss_peak_bytes_median"]),
        )
    return t


class _Console(RunProgress):
    """The run's progress on stderr: warnings, alerts, a spinner while loading, a progress bar with ETA."""

    def warning(self, text: str) -> None:
        err.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)

    def info(self, text: str) -> None:
        err.print(text, highlight=False, markup=False)

    def alert(self, text: str) -> None:
        err.print(f"[yellow]alert:[/] {text}", highlight=False)

    @contextlib.contextmanager
    def loading(self, text: str) -> Iterator[None]:
        with err.status(escape(text)):
            yield

    @contextlib.contextmanager
    def sweep(self, name: str, total: int | None, done: int) -> Iterator[None]:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=err) as self._bar:
            self._name, self._task = name, self._bar.add_task(name, total=total, completed=done)
            yield

    def trial_done(self, row: dict[str, Any]) -> None:
        self._bar.advance(self._task)

    def status(self, text: str) -> None:
        self._bar.update(self._task, description=escape(f"{self._name} {text}"))


class ExecutorKind(StrEnum):
    """The executors of ``kvbench run``: local (this process) and ray (actors on a Ray cluster)."""

    local = "local"
    ray = "ray"


def run(
    scenario: Path | None = typer.Argument(None, help="Scenario YAML file (optional with --resume)."),
    out_root: str | None = typer.Option(None, "--out",
                                        help="Results root (default results/); the run goes in a new folder."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue this run directory, skipping finished trials."),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", metavar="",
        help="Let the model's own code run, when the scenario also sets model.trust_remote_code: true."),
    trust_server_config: bool = typer.Option(
        False, "--trust-server-config", metavar="",
        help="Let a server scenario (or the run resumed) run its own engine.binary, and server flags that read or "
             "write files, fetch weights or code, run code or reach another machine (--path, --log-file, -hf, any "
             "path or URL...). Without it kvbench runs only the engine's own program on the scenario's model."),
    executor: ExecutorKind | None = typer.Option(
        None, "--executor", case_sensitive=False,
        help="Where trials run: local (this process) or ray (Ray actors, one per GPU; needs kvbench\\[ray]). Default: "
             "the scenario's executor.kind (local when it has none)."),
    address: str | None = typer.Option(
        None, "--address", metavar="auto|HOST:PORT",
        help="The Ray cluster to join: auto (the one `ray start` made on this machine, or RAY_ADDRESS) or HOST:PORT "
             "of its head; implies --executor ray. Default: the scenario's executor.address, else a Ray instance "
             "started for the run."),
) -> None:
    """Run a scenario's sweep and print its summary."""
    from kvbench.bench.run import run_scenario
    from kvbench.errors import RemoteCodeRefused, RunStopped, ServerConfigRefused

    warnings.showwarning = show_warning
    stop_on_signals()
    if scenario is None and resume is None:
        fail("give a scenario file, or --resume DIR")
    if resume is not None and out_root is not None:
        fail(f"--out does not apply with --resume: the run stays in {resume}")
    if out_root is not None and not out_root.strip():
        fail("--out is empty: give a directory")
    with handle_errors({"executor": "--executor", "address": "--address"}):
        try:
            res = run_scenario(scenario, out=out_root, resume=resume, trust_remote_code=trust_remote_code,
                               trust_server_config=trust_server_config, progress=_Console(),
                               executor=None if executor is None else executor.value,
                               address=address)
        except RemoteCodeRefused as exc:
            fail(f"{exc}; pass --trust-remote-code to allow it, or set it to false")
        except ServerConfigRefused as exc:
            fail(f"{exc}; kvbench runs only the engine's own program on the scenario's model unless you pass "
                 "--trust-server-config (read the scenario first: these would run as you)")
        except RunStopped as exc:
            fail(str(exc) if exc.path is None else f"{exc.reason}; {exc.kept} finished trials are kept: make "
                 f"room, then continue with: kvbench run --resume {exc.path}", 1)
    sc, where = res.scenario, res.run_dir
    if res.interrupted and not res.swept:  # before the first trial of this call
        if where is None:
            err.print("interrupted before the first trial: nothing was kept", highlight=False)
        else:
            err.print(f"interrupted; continue with: kvbench run --resume {where}", highlight=False, markup=False)
        raise typer.Exit(130)
    title = f"{sc.name}: {sc.model.label}" + (f" on {sc.engine.kind}" if sc.run_kind == "server" else
                                               f" on {res.device}" if res.swept else "")
    if res.reuse is not None:
        from kvbench.report.tables import reuse_display, reuse_terminal

        how = ("recompute = `none` (the server recomputing every prompt), restore = the mode's server; restored = "
               "cached prompt tokens the server reported; hit % = of what earlier turns held" if sc.run_kind == "server"
               else "cold = recompute the whole prompt, warm = restore the stored prefix then prefill the rest")
        show(render(reuse_terminal(reuse_display(res.reuse)), title,
                    f"{how}; TTFT median [min–max]; ÷: restore ÷ recompute TTFT, Σ over request pairs [95% "
                    "jackknife interval over the independent units: conversations, documents or prefixes]; = "
                    "none: greedy ids equal to none's recompute (KL ≥: a lossy preset's median KL against none, "
                    "nats, a lower bound from the server's top-k log-probabilities)",
                    wrap=REUSE_WRAPPING), first=("prompt", "pairs", "restored", "recompute TTFT ms"))
    elif res.summary is not None:
        show(_summary_table(res.summary, title))
    if res.capacity is not None:
        from kvbench.report.tables import capacity_display

        what = "batch" if sc.searched == "batch_size" else "prompt (tokens)"
        show(render(capacity_display(res.capacity), f"capacity: the largest {what} within the budget",
                    "probes in order, ✗ = did not fit; figures at the capacity (median over its repeats)"))
    for line in res.failures:
        out.print(line, highlight=False, markup=False)
    if not res.swept:
        out.print(f"nothing to run: every trial of {sc.name} is already in {where / 'trials.jsonl'}",
                  highlight=False, markup=False)
        return
    if res.interrupted:
        total = f" of {res.planned}" if res.planned else ""
        err.print(f"interrupted: {res.already + res.written}{total} trials kept in {where}; continue with: kvbench "
                  f"run --resume {where}", highlight=False, markup=False)
        raise typer.Exit(130)
    out.print(f"{res.written} trials written to {where / 'trials.jsonl'}"
              + (f" ({res.already} already there)" if res.already else ""), highlight=False, markup=False)
    if res.n_errors:
        err.print(f"[red]error:[/] {res.n_errors} trials failed with status error (see above)", highlight=False)
        raise typer.Exit(1)
