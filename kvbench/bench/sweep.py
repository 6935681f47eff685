"""The sweep: every trial of a scenario not yet in its run, in order (a planned sweep, a capacity search or a reuse
workload), each shape preceded by its warm-up, every row written as its trial ends, Ctrl-C and a full disk
stopping it cleanly. It drives an executor (:mod:`kvbench.bench.executor`) and never knows which engine runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvbench.bench.capacity import search_sweep
from kvbench.bench.executor import Executor
from kvbench.bench.reuse import reuse_sweep
from kvbench.bench.trial import TrialSpec, plan_trials
from kvbench.results.files import ResultsNotWritten, failure_reason
from kvbench.results.run_dir import RunDir, utc_now
from kvbench.scenario import Scenario
from kvbench.results.rows import Status


@dataclass
class SweepResult:
    """What a sweep did: trials written now, trials already there (resume), and whether Ctrl-C stopped it."""

    written: int
    skipped_done: int
    interrupted: bool


class Recorder:
    """Runs and writes the trials of one run: a trial already in the run (resumed) is looked up, not rerun;
    the first trial of each (prompt length, batch, mode) shape is preceded by a release of memory
    (:meth:`Executor.release`) and then the scenario's warm-up trials (not recorded; the rest of them are skipped
    once one does not end ``ok``, since they would fail alike). Nothing is released between a warm-up and the
    trials it prepares, nor between repeats of a shape."""

    def __init__(self, scenario: Scenario, run: RunDir, executor: Executor,
                 on_trial: Callable[[dict[str, Any]], None] | None = None,
                 on_status: Callable[[str], None] | None = None):
        self.s, self.run, self.executor = scenario, run, executor
        self.on_trial, self.on_status = on_trial, on_status
        finished = run.finished_trials()
        executor.remember(finished)
        self.rows: dict[str, dict[str, Any]] = {r["trial_id"]: r for r in finished}
        self.already = len(self.rows)
        self.written = 0
        self.not_kept: str | None = None  # the trial whose files could not be written
        self._warmed: set[tuple] = set()

    def __call__(self, t: TrialSpec) -> dict[str, Any]:
        """The row of trial ``t``: the one already written, or a new one (run, then its samples and row written
        and fsynced: :meth:`RunDir.record_trial`).

        Raises:
            OSError: the trial's files could not be written; :attr:`not_kept` is its id.
        """
        if t.trial_id in self.rows:
            return self.rows[t.trial_id]
        key = t.shape_key
        if key not in self._warmed:
            self._warmed.add(key)
            self.executor.release()
            for w in range(self.s.warmup):
                if self.on_status:
                    self.on_status(f"warm-up {w + 1}/{self.s.warmup}: {t.mode.label} p{t.prompt_tokens} "
                                   f"b{t.batch_size}")
                if self.executor.run(t.warmup_spec())["status"] != Status.OK:
                    break
        if self.on_status:
            self.on_status(t.trial_id)
        return self.write(t, self.executor.run(t), self.executor.last_samples)

    def write(self, t: TrialSpec, row: dict[str, Any], samples: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
        """Write trial ``t``'s ``row`` (and its ``samples``) and fsync them (:meth:`RunDir.record_trial`); the
        row is then finished.

        Raises:
            OSError: the trial's files could not be written; :attr:`not_kept` is its id.
        """
        try:
            self.run.record_trial(row, samples or [])
        except OSError:
            self.not_kept = t.trial_id
            raise
        self.rows[t.trial_id] = row
        self.written += 1
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
    """Run every trial not yet in ``run``'s trials file: the planned sweep (:func:`plan_trials`); for a scenario
    with ``batch_sizes: auto`` / ``prompt_tokens: auto`` the capacity search (:mod:`kvbench.bench.capacity`), whose
    results go into run.json as ``capacity``; for a reuse workload its requests warm and cold
    (:mod:`kvbench.bench.reuse`).

    Each row is appended (and fsynced) as soon as its trial ends, under :meth:`RunDir.lock`. Ctrl-C stops after
    writing what finished and marks run.json ``interrupted``; a finished sweep marks it ``complete``.

    Args:
        on_trial: called with each row written; on_status: with what runs now (a trial id, a warm-up).

    Raises:
        ResultsNotWritten: the run's files could not be written (disk full...): run.json is marked
            ``interrupted`` with a ``reason`` where it can be; the trials written before are kept.
        RunDirError: another process holds the run's lock; ForeignRow: a row there was written under another
            scenario.
    """
    with run.lock():
        return _sweep_locked(scenario, run, executor, on_trial, on_status)


def _sweep_locked(scenario: Scenario, run: RunDir, executor: Executor,
                  on_trial: Callable[[dict[str, Any]], None] | None,
                  on_status: Callable[[str], None] | None) -> SweepResult:
    record = Recorder(scenario, run, executor, on_trial, on_status)
    run.meta.pop("reason", None)  # an earlier stop's: this sweep's end writes its own status
    try:
        if scenario.engine.server:
            from kvbench.bench.servers.sweep import server_sweep

            _note_requests(run, executor.engine.source)
            server_sweep(scenario, record, executor.engine)
        elif scenario.workload.reuse:
            stream = executor.engine.source
            _note_requests(run, stream)
            reuse_sweep(scenario, record, executor.engine)
        elif scenario.searched is None:
            for t in plan_trials(scenario):
                record(t)
        else:
            search_sweep(scenario, record, TrialSpec, executor.engine.longest_prompt,
                         on_capacity=lambda found: run.update(capacity=found))
        run.update(status="complete", finished_at=utc_now())
    except KeyboardInterrupt:
        run.update(status="interrupted", interrupted_at=utc_now())
        return SweepResult(record.written, record.already, interrupted=True)
    except OSError as exc:  # writing the results: disk full, quota, a removed directory
        try:
            run.update(status="interrupted", reason=failure_reason(exc), interrupted_at=utc_now())
            status_error = None
        except OSError as again:
            status_error = again.strerror or str(again)
        raise ResultsNotWritten(exc, run.path, record.not_kept, status_error) from exc
    return SweepResult(record.written, record.already, interrupted=False)


def _note_requests(run: RunDir, stream: Any) -> None:
    """The requests of a stream into run.json (``requests``, ``workload_notes``)."""
    run.update(workload_notes=stream.notes, requests=[
        {"id": q.id, "document": q.document, "turn_index": q.turn_index, "prompt_tokens": len(q.ids),
         "held_tokens": len(q.held)} for q in stream.requests])
