"""The library entrypoint for running: :func:`run_scenario` runs a scenario's sweep (or the rest of an interrupted
run) end to end, from the scenario file to the summary, calling back a :class:`RunProgress` as it goes."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.bench.plans.plan import Plan, plan_for
from kvbench.bench.roles import Executor
from kvbench.bench.summary import capacity_summary, failure_lines, last_rows, point_summary, reuse_summary
from kvbench.arguments import path_arg
from kvbench.errors import (BadValue, NotEnoughRequests, PrepareError, RemoteCodeRefused, RunDirError, RunStopped,
                            ScenarioError, ServerConfigRefused, UserError)
from kvbench.results.files import ResultsNotWritten
from kvbench.results.run_dir import RunDir, utc_now
from kvbench.scenario import Scenario
from kvbench.results.rows import Status, retry_due

#: System-wide CPU percent (others' load, sampled for 0.5 s before the run) above which timings will be noisy.
BUSY_PERCENT = 50


class RunProgress:
    """What :func:`run_scenario` reports as it goes; every method does nothing here (a CLI or notebook overrides
    the ones it shows)."""

    def warning(self, text: str) -> None:
        """A warning (a scenario's, the remote code that will run, a busy machine), one line."""

    def info(self, text: str) -> None:
        """A line on what happens (the model loaded, where the results go)."""

    def alert(self, text: str) -> None:
        """Device memory crossed the scenario's ``monitor.alert_device_bytes`` during a trial."""

    @contextlib.contextmanager
    def loading(self, text: str) -> Iterator[None]:
        """While the model and the workload load (``text`` says which)."""
        yield

    @contextlib.contextmanager
    def sweep(self, name: str, total: int | None, done: int) -> Iterator[None]:
        """While the sweep runs: ``total`` trials planned (None: a capacity search), ``done`` already there."""
        yield

    def trial_done(self, row: dict[str, Any]) -> None:
        """A trial's row was written."""

    def status(self, text: str) -> None:
        """What runs now: a trial id, or a warm-up."""


@dataclass
class RunResult:
    """What a run did.

    Attributes:
        scenario: the scenario run.
        run_dir: the run directory; None when this call made it and removed it (interrupted before any trial).
        rows: the run's finished trials (those of earlier calls included), the last row of each trial id (a trial
            retried after its worker was lost counts by its retry).
        swept: whether the sweep ran (False: nothing left to run, or interrupted before the first trial).
        interrupted: Ctrl-C (or SIGTERM, where the caller maps it to KeyboardInterrupt) stopped the run.
        written, already: trials written by this call; trials already in the run.
        planned: trials the sweep records (None for a capacity search).
        device: where the model ran (None when it did not load).
        summary: the per-point frame (:func:`~kvbench.bench.summary.point_summary`; None for a reuse workload).
        reuse: a reuse workload's frame (:func:`~kvbench.bench.summary.reuse_summary`), None otherwise or without
            rows.
        capacity: the capacity search's frame (:func:`~kvbench.bench.summary.capacity_summary`), else None.
        failures: :func:`~kvbench.bench.summary.failure_lines` of the rows.
    """

    scenario: Scenario
    run_dir: Path | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    swept: bool = False
    interrupted: bool = False
    written: int = 0
    already: int = 0
    planned: int | None = None
    device: str | None = None
    summary: Any = None
    reuse: Any = None
    capacity: Any = None
    failures: list[str] = field(default_factory=list)

    @property
    def n_ok(self) -> int:
        """Trials that ended ``ok``."""
        return sum(r["status"] == Status.OK for r in self.rows)

    @property
    def n_errors(self) -> int:
        """Trials that failed with status ``error`` (a bug or a broken mode: the run's exit status is 1)."""
        return sum(r["status"] == Status.ERROR for r in self.rows)


def run_scenario(scenario: str | Path | None = None, *, out: str | Path | None = None,
                 resume: str | Path | None = None, trust_remote_code: bool = False,
                 trust_server_config: bool = False, progress: RunProgress | None = None, executor: str | None = None,
                 address: str | None = None) -> RunResult:
    """Run a scenario file's sweep in a new run directory under ``out`` (default ``results``), or continue the
    run in ``resume`` (skipping its finished trials; ``scenario``, if given, must equal the one stored there).

    Args:
        trust_remote_code: let the model's own code run, when the scenario also sets
            ``model.trust_remote_code: true``.
        trust_server_config: let a server scenario (or a resumed run's) run its own ``engine.binary`` and server
            flags that read or write files, fetch weights or code, run code or reach another machine
            (:func:`~kvbench.scenario.programs.consent_needed`); each is named in a warning.
        progress: called back as the run goes (default: silent).
        executor: ``local`` or ``ray`` (default: the scenario's ``executor.kind``; an ``address`` means ``ray``).
        address: the Ray cluster to join (``auto`` or ``HOST:PORT``; default: the scenario's
            ``executor.address``, else a local Ray instance). A process already connected to Ray stays on its
            cluster.

    Returns:
        A :class:`RunResult`; trials that failed are rows with their status (see :attr:`RunResult.n_errors`).

    Raises:
        BadValue: neither ``scenario`` nor ``resume`` given, or both ``out`` and ``resume``; BadParameter: one
            of them is no path.
        ScenarioError, RunDirError: the scenario or the run cannot be read, differ, or cannot run here.
        RemoteCodeRefused: the scenario asks for the model's own code and ``trust_remote_code`` is false.
        ServerConfigRefused: the scenario needs ``trust_server_config`` and it is false (before anything runs).
        ModelNotFound, ModelLoadError, PrepareError, NotEnoughRequests: the run cannot be prepared.
        ClusterError: the Ray executor cannot run (Ray missing, address unreachable, placement unsatisfiable).
        RunStopped: the results could not be written (disk full...).
        SweepIncomplete: a cluster's workers were lost for good; the finished trials are kept.
    """
    progress = progress or RunProgress()
    scenario, resume = (None if p is None else path_arg(p, name) for p, name in ((scenario, "scenario"),
                                                                                (resume, "resume")))
    out = None if out is None else path_arg(out, "out")
    if scenario is None and resume is None:
        raise BadValue("give a scenario file, or a run directory to resume")
    if resume is not None and out is not None:
        raise BadValue(f"a resumed run stays in {resume}: no results root applies")
    rundir, sc, where, finished = _open(scenario, resume, progress)
    on_ray = _cluster(sc, where, executor, address)
    if sc.model.trust_remote_code:
        _remote_code(sc, where, trust_remote_code, progress)
    _server_consent(sc, where, trust_server_config, progress)
    rows = last_rows(finished)
    plan = plan_for(on_ray or sc)
    if rundir is not None and not any(retry_due(r) for r in rows) and plan.done(rundir.meta, rows):
        # nothing left to run: the summary, without loading a model, the workload or a server
        return RunResult(sc, rundir.path, rows, already=len(rows), failures=failure_lines(finished),
                         **_summaries(plan, rows, rundir.meta))
    return _run(plan, rundir, where, Path(out if out is not None else "results"), progress, on_ray is not None)


def _summaries(plan: Plan, rows: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """:class:`RunResult`'s summary fields of ``rows``, the summary ``plan``'s kind has: a request stream's table
    (``reuse``), or the per-point table (``summary``) and, after a capacity search, its results (``capacity``)."""
    if plan.summary == "requests":
        return {"reuse": reuse_summary(rows, plan.s) if rows else None}
    points = point_summary(rows, plan.s)
    return {"summary": points,
            "capacity": capacity_summary(meta["capacity"], points) if meta.get("capacity") else None}


def _cluster(sc: Scenario, where: Path, executor: str | None, address: str | None) -> Scenario | None:
    """The scenario with the executor the run asks for (:func:`~kvbench.scenario.cluster.override_executor`)
    when it goes to Ray, None for a local run.

    Raises:
        BadParameter: an executor other than local or ray, a malformed address, or an address for a local run.
        ScenarioError: a placement for a local run.
    """
    from kvbench.scenario.cluster import check_placement, override_executor

    spec = override_executor(sc.executor, executor, address)
    check_placement(spec, sc.placement, where)
    if spec.kind == "local":
        return None
    return sc.model_copy(update={"executor": spec})


def _open(scenario: Path | None, resume: Path | None,
          progress: RunProgress) -> tuple[RunDir | None, Scenario, Path, list[dict[str, Any]]]:
    """The run to continue (None: a new one), its scenario, the file to name in messages, and the run's
    finished trials."""
    from kvbench.bench.engines.server.keys import sweep_keys
    from kvbench.scenario import check_scenario, load_scenario, parse_scenario, scenario_warnings

    if resume is None:
        sc = load_scenario(scenario)
        for path, msg in scenario_warnings(sc, consent=False):  # _server_consent refuses or names those
            progress.warning(f"{scenario}: {path}: {msg}")
        return None, sc, scenario, []
    rundir = RunDir.open(resume)
    if rundir.meta.get("scenario") is None:  # report and cost read such a run; running it needs its scenario
        raise RunDirError(f"{resume / 'run.json'}: no scenario in it: this run cannot be resumed")
    sc = parse_scenario(rundir.meta["scenario"], resume / "run.json")
    if scenario is not None and _identity(load_scenario(scenario)) != _identity(sc):
        raise RunDirError(f"{scenario} differs from the scenario stored in {resume}/run.json; resume without the "
                          "file")
    problems = check_scenario(sc)
    if problems:
        raise ScenarioError(resume / "run.json", problems)
    with rundir.lock():  # before anything reads the trials: a refused resume cuts nothing
        finished = rundir.finished_trials()
        sweep_keys(rundir.path / "servers", [m.label for m in sc.modes])  # a killed run's: its servers went too
    return rundir, sc, rundir.path / "run.json", finished


def _identity(sc: Scenario) -> dict[str, Any]:
    """What must be equal for a file to be the scenario of a run: all of it but where it runs (``executor``)."""
    return {k: v for k, v in sc.model_dump(mode="json").items() if k != "executor"}


def _remote_code(sc: Scenario, where: Path, allowed: bool, progress: RunProgress) -> None:
    """Refuse a scenario asking for model code unless the run allowed it; warn naming the modules."""
    from kvbench.models.remote_code import remote_code_modules

    try:
        modules = remote_code_modules(sc.model)
    except (ValueError, LookupError) as exc:  # the model cannot be found, its config is no JSON object
        raise PrepareError(f"{where}: {exc}") from exc
    if not allowed:
        raise RemoteCodeRefused(f"{where}: model.trust_remote_code: true runs the model's own code "
                                f"({', '.join(modules) if modules else 'its auto_map names no module'})")
    progress.warning(f"{where}: model.trust_remote_code: {sc.model.label} runs its own code: "
                     f"{', '.join(modules) or 'its auto_map names none'}")


def _server_consent(sc: Scenario, where: Path, allowed: bool, progress: RunProgress) -> None:
    """Refuse a server scenario that runs what the user did not allow (another program, flags acting beyond
    serving the model); warn naming each when allowed (other scenarios need no consent)."""
    from kvbench.scenario.programs import consent_needed

    needs = consent_needed(sc)
    if needs and not allowed:
        raise ServerConfigRefused(where, needs)
    for path, why in needs:
        progress.warning(f"{where}: {path}: {why} (allowed by --trust-server-config)")


def _run(plan: Plan, rundir: RunDir | None, where: Path, out: Path, progress: RunProgress,
         cluster: bool = False) -> RunResult:
    """Probe the machine, make (or lock) the run directory, load the engine (here, or on a cluster's workers),
    sweep, summarise."""
    import psutil

    from kvbench.bench.telemetry.machine import environment
    from kvbench.models import resolve_device

    sc = plan.s
    if cluster:  # the driver: each worker probes its own machine and device
        env = environment(None)
    else:
        try:
            device = resolve_device(sc.device)
            env = environment(device)
        except ValueError as exc:
            raise PrepareError(str(exc)) from exc
        if (problem := plan.problem(device.type)) is not None:
            raise ScenarioError(where, [problem])
    busy = psutil.cpu_percent(interval=0.5)  # system-wide, while this process waits: the others' load
    if not cluster and busy > BUSY_PERCENT:
        progress.warning(f"the machine is busy ({busy:.0f}% of {env['cpu_count']} CPUs in use by other processes): "
                         "timings will be noisy")
    created = rundir is None
    if rundir is None:
        try:
            rundir = RunDir.create(out, sc.model_dump(mode="json"), env)
        except OSError as exc:
            raise RunDirError(f"cannot create the run directory under {out}: {exc.strerror or exc}") from exc
    try:
        with rundir.lock():
            executor = _prepare_cluster(sc, rundir, where, progress) if cluster else \
                _prepare(plan, rundir, where, progress)
            try:
                result = _sweep(plan, rundir, executor, created, progress)
            finally:
                executor.close()
    except RunDirError:
        raise
    except Exception:  # a refusal or a bug: a run this call made stays only with a trial in it
        if created and not rundir.finished_trials():
            shutil.rmtree(rundir.path, ignore_errors=True)  # nothing ran: leave no empty run behind
        raise
    except KeyboardInterrupt:  # before the sweep (model loading, preflight): the sweep handles it after
        if created and not rundir.finished_trials():
            shutil.rmtree(rundir.path, ignore_errors=True)
            return RunResult(sc, None, interrupted=True)
        rundir.update(status="interrupted")
        return RunResult(sc, rundir.path, rundir.finished_trials(), interrupted=True)
    every = rundir.finished_trials()
    rows = last_rows(every)  # a trial retried after its worker was lost counts once, by its retry
    result.rows, result.failures = rows, failure_lines(every)
    for name, value in _summaries(plan, rows, rundir.meta).items():
        setattr(result, name, value)
    return result


def _prepare(plan: Plan, rundir: RunDir, where: Path, progress: RunProgress) -> Executor:
    """Load the engine of the plan's family here and check every trial can be built; the executor that runs
    them."""
    from kvbench.bench.executors.local import LocalExecutor

    sc = plan.s
    with progress.loading(plan.family.loading(sc)), _preparing(sc, where):
        engine, line = plan.family.load(sc, where, rundir.path, rundir.meta.get("environment"))
        problems = engine.preflight()
    if problems:
        raise PrepareError(f"{where}: cannot run:\n" + "\n".join(problems))
    watched = "device memory" if engine.device.type == "cuda" else "process RSS (CPU run)"
    executor = LocalExecutor(sc, engine, rundir.meta.get("environment"), on_alert=lambda e: progress.alert(
        f"{e['trial_id']} ({e['phase']}): {watched} {e['device_bytes'] / 2**20:,.1f} MiB crossed "
        f"monitor.alert_device_bytes {e['threshold_bytes'] / 2**20:,.1f} MiB"))
    _note_executor(rundir, {"kind": "local"})
    progress.info(line)
    progress.info(f"results: {rundir.path}")
    return executor


@contextlib.contextmanager
def _preparing(sc: Scenario, where: Path) -> Iterator[None]:
    """Anything that fails while the engine and the workload load refuses the run in one line: a user error as
    it is (too few texts naming the workload key), a bad value or a missing file or package as
    :class:`PrepareError`, anything else as :class:`PrepareError` naming the model and the cause."""
    from kvbench.models.load import one_line

    try:
        yield
    except NotEnoughRequests as exc:
        raise NotEnoughRequests(f"{where}: workload.{sc.workload.reuse}: {exc}") from exc
    except UserError:
        raise
    except (ValueError, ImportError, OSError) as exc:
        raise PrepareError(str(exc)) from exc
    except Exception as exc:
        raise PrepareError(f"{where}: cannot prepare the run of model {sc.model.label}: {one_line(exc)}") from exc


def _note_executor(rundir: RunDir, entry: dict[str, Any], **fields: Any) -> None:
    """run.json's ``executor`` (what runs this sweep) and ``executors`` (each one that ran part of the run, in
    order, with when it started: a run resumed elsewhere lists both)."""
    seen = list(rundir.meta.get("executors") or [])
    if not seen and rundir.meta.get("executor"):
        seen = [rundir.meta["executor"]]
    seen.append({**entry, "started_at": utc_now()})
    rundir.update(executor=entry, executors=seen, **fields)


def _prepare_cluster(sc: Scenario, rundir: RunDir, where: Path, progress: RunProgress) -> Executor:
    """Join the Ray cluster and start its workers, each loading the engine (:mod:`kvbench.bench.executors.ray`)."""
    from kvbench.bench.executors.ray.driver import start_cluster

    with progress.loading(f"starting Ray workers for {sc.model.label}"), _preparing(sc, where):
        executor = start_cluster(sc, str(where), sc.executor.address, progress)
    import ray

    _note_executor(rundir, {"kind": "ray", "address": sc.executor.address, "ray": ray.__version__},
                   machines=executor.machines)
    for label, m in executor.machines.items():
        for w in m["workers"]:
            progress.info(f"worker {w['worker'][:12]}{f' ({label})' if label else ''}: {w['host']}, "
                          f"{w['gpu'] or 'CPU'}")
    progress.info(f"results: {rundir.path}")
    return executor


def _sweep(plan: Plan, rundir: RunDir, executor: Executor, created: bool, progress: RunProgress) -> RunResult:
    """Run the sweep; a results file that cannot be written stops the run (:class:`RunStopped`)."""
    from kvbench.bench.plans.sweep import run_sweep

    sc = plan.s
    planned = plan.planned(len(executor.requests))
    if planned is not None and len(sc.placement or ()) > 1:  # every trial once per machine kind
        planned *= len(sc.placement)
    try:
        rundir.update(weights_bytes=executor.engine.weights_bytes, status="running", planned=planned)
        with progress.sweep(sc.name, planned, len(rundir.finished_trials())):
            res = run_sweep(sc, rundir, executor, on_trial=progress.trial_done, on_status=progress.status)
    except OSError as exc:  # writing the results: disk full, quota, removed directory
        why = str(exc)  # the sweep's ResultsNotWritten says what it lost and what run.json says
        if not isinstance(exc, ResultsNotWritten):  # run.json, before the sweep
            with contextlib.suppress(OSError):
                rundir.update(status="interrupted")
            why = f"cannot write the results in {rundir.path}: {exc.strerror or exc}"
        kept = len(rundir.finished_trials())
        raise RunStopped(why, kept, None if created and not kept else rundir.path) from exc
    return RunResult(sc, rundir.path, swept=True, interrupted=res.interrupted, written=res.written,
                     already=res.skipped_done, planned=planned, device=str(executor.engine.device))
