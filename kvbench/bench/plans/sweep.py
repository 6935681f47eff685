"""The sweep: every trial of a scenario not yet in its run, in order (a planned sweep, a capacity search or a reuse
workload), each shape preceded by its warm-up, every row written as its trial ends, Ctrl-C and a full disk
stopping it cleanly. It drives an executor (:mod:`kvbench.bench.executors.local`) and never knows which engine runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, cast

from kvbench.bench.engines.base import RunRecord, Session
from kvbench.bench.roles import Executor, TrialRunner
from kvbench.bench.trial import TrialSpec
from kvbench.errors import SweepIncomplete
from kvbench.results.files import ResultsNotWritten, failure_reason
from kvbench.results.run_dir import RunDir, utc_now
from kvbench.scenario import Scenario, ScenarioMode
from kvbench.results.rows import Status, retry_due


@dataclass
class SweepResult:
    """What a sweep did: trials written now, trials already there (resume), and whether Ctrl-C stopped it."""

    written: int
    skipped_done: int
    interrupted: bool


class Recorder:
    """Runs and writes the trials of one run: a trial already in the run (resumed) is looked up, not rerun;
    the first trial of each (prompt length, batch, mode) shape is preceded by a release of memory
    (:meth:`TrialRunner.release <kvbench.bench.roles.TrialRunner.release>`) and then the scenario's warm-up trials (not
    recorded; the rest of them are skipped once one does not end ``ok``, since they would fail alike). Nothing is
    released between a warm-up and the trials it prepares, nor between repeats of a shape.

    ``run`` is the :class:`~kvbench.results.run_dir.RunDir` (or, on a cluster worker, a stand-in with its
    ``meta``, ``update``, ``finished_trials`` and ``record_trial``); ``where`` the fields every row written gets
    (:data:`~kvbench.results.rows.PLACEMENT_COLUMNS`, :func:`~kvbench.bench.telemetry.machine.where_fields`). A trial
    whose last row says its worker was lost (:func:`~kvbench.results.rows.retry_due`) is not finished: it is in
    :attr:`lost`, runs again, and its new row has ``attempt`` 1. :meth:`write` may be called from several
    threads."""

    def __init__(self, scenario: Scenario, run: RunRecord, executor: Executor,
                 on_trial: Callable[[dict[str, Any]], None] | None = None,
                 on_status: Callable[[str], None] | None = None, where: dict[str, Any] | None = None,
                 on_start: Callable[[TrialSpec], None] | None = None):
        self.s, self.run, self.executor = scenario, run, executor
        self.on_trial, self.on_status, self.on_start = on_trial, on_status, on_start
        self.where = dict(where or {})
        finished = run.finished_trials()
        executor.remember(finished)
        last = {r["trial_id"]: r for r in finished}
        #: trials whose worker was lost once: they run again
        self.lost: dict[str, dict[str, Any]] = {k: r for k, r in last.items() if retry_due(r)}
        self.rows: dict[str, dict[str, Any]] = {k: r for k, r in last.items() if k not in self.lost}
        self.already = len(self.rows)
        self.written = 0
        self.not_kept: str | None = None  # the trial whose files could not be written
        self._warmed: set[tuple] = set()
        self._lock = threading.Lock()

    @property
    def _runner(self) -> TrialRunner:
        """The executor as one that runs trials one at a time here (a local executor: the plans that call a
        recorder trial by trial run on one; a cluster's driver only writes the rows its workers send)."""
        return cast(TrialRunner, self.executor)

    def __call__(self, t: TrialSpec) -> dict[str, Any]:
        """The row of trial ``t``: the one already written, or a new one (run, then its samples and row written
        and fsynced: :meth:`RunDir.record_trial`); it runs in its mode's session where the plan opened one
        (:meth:`session`).

        Raises:
            OSError: the trial's files could not be written; :attr:`not_kept` is its id.
        """
        if t.trial_id in self.rows:
            return self.rows[t.trial_id]
        key = t.shape_key
        if key not in self._warmed:
            self._warmed.add(key)
            self._runner.release()
            for w in range(self.s.warmup):
                if self.on_status:
                    self.on_status(f"warm-up {w + 1}/{self.s.warmup}: {t.mode.label} p{t.prompt_tokens} "
                                   f"b{t.batch_size}")
                if self._runner.run(t.warmup_spec())["status"] != Status.OK:
                    break
        if self.on_status:
            self.on_status(t.trial_id)
        if self.on_start:
            self.on_start(t)
        return self.write(self._runner.run(t), self._runner.last_samples)

    def session(self, mode: ScenarioMode, repeat: int) -> AbstractContextManager[Session]:
        """``mode``'s session for ``repeat``
        (:meth:`Engine.session <kvbench.bench.engines.base.SessionEngine.session>`), open while the block runs: the
        trials of that mode run meanwhile (warm-ups included) run in it."""
        return self._runner.session(mode, repeat)

    def write(self, row: dict[str, Any], samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Write a trial's ``row`` (with :attr:`where`'s fields it lacks, and ``attempt`` 1 when
        the trial's worker was lost before) and its ``samples``, fsynced (:meth:`RunDir.record_trial`); the trial
        is then finished, unless the row says its worker was lost for the first time.

        Raises:
            OSError: the trial's files could not be written; :attr:`not_kept` is its id.
        """
        tid = row["trial_id"]
        with self._lock:
            row = {**row, **{k: v for k, v in self.where.items() if k not in row}}
            if tid in self.lost and not retry_due(row):
                row["attempt"] = max(1, row.get("attempt") or 0)
            try:
                self.run.record_trial(row, samples or [])
            except OSError:
                self.not_kept = tid
                raise
            if retry_due(row):
                self.lost[tid] = row
            else:
                self.rows[tid] = row
                self.written += 1  # trials finished: a lost worker's row is not one
        if self.on_trial:
            self.on_trial(row)
        return row


def run_sweep(
    scenario: Scenario,
    run: RunDir,
    executor: Executor,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> SweepResult:
    """Run every trial not yet in ``run``'s trials file: the planned sweep (:func:`~kvbench.bench.trial.plan_trials`);
    for a scenario with ``batch_sizes: auto`` / ``prompt_tokens: auto`` the capacity search
    (:mod:`kvbench.bench.plans.capacity`), whose results go into run.json as ``capacity``; for a reuse workload its
    requests warm and cold (:mod:`kvbench.bench.plans.reuse`).

    The executor runs them (:meth:`Executor.sweep <kvbench.bench.roles.Executor.sweep>`: in this process,
    or on a cluster's workers).
    Each row is appended (and fsynced) as soon as its trial ends, under :meth:`RunDir.lock`. Ctrl-C stops after
    writing what finished and marks run.json ``interrupted``; a finished sweep marks it ``complete``.

    Args:
        on_trial: called with each row written; on_status: with what runs now (a trial id, a warm-up).

    Raises:
        ResultsNotWritten: the run's files could not be written (disk full...): run.json is marked
            ``interrupted`` with a ``reason`` where it can be; the trials written before are kept.
        RunDirError: another process holds the run's lock; ForeignRow: a row there was written under another
            scenario.
        SweepIncomplete: the executor could not run every trial (a cluster's workers were lost for good):
            run.json is marked ``interrupted`` with the ``reason``; what finished is kept.
    """
    with run.lock():
        return _sweep_locked(scenario, run, executor, on_trial, on_status)


def _sweep_locked(scenario: Scenario, run: RunDir, executor: Executor,
                  on_trial: Callable[[dict[str, Any]], None] | None,
                  on_status: Callable[[str], None] | None) -> SweepResult:
    from kvbench.bench.telemetry.machine import where_fields

    record = Recorder(scenario, run, executor, on_trial, on_status, where=where_fields(run.meta.get("environment")))
    run.meta.pop("reason", None)  # an earlier stop's: this sweep's end writes its own status
    try:
        executor.sweep(scenario, record)
        run.update(status="complete", finished_at=utc_now())
    except KeyboardInterrupt:
        run.update(status="interrupted", interrupted_at=utc_now())
        return SweepResult(record.written, record.already, interrupted=True)
    except SweepIncomplete as exc:  # workers lost for good: what finished stays, the rest waits for --resume
        run.update(status="interrupted", reason=str(exc), interrupted_at=utc_now())
        raise
    except OSError as exc:  # writing the results: disk full, quota, a removed directory
        try:
            run.update(status="interrupted", reason=failure_reason(exc), interrupted_at=utc_now())
            status_error = None
        except OSError as again:
            status_error = again.strerror or str(again)
        raise ResultsNotWritten(exc, run.path, record.not_kept, status_error) from exc
    return SweepResult(record.written, record.already, interrupted=False)
