"""The roles the sweep's pieces play for each other, as protocols: the :class:`Executor` the sweep drives, the
:class:`TrialRunner` a :class:`~kvbench.bench.plans.sweep.Recorder` runs one trial on, and the :class:`Record` a plan
writes its trials through. The modules that play them import this one, never each other, so there is no import
circle between the sweep, the executors and the plans."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from kvbench.bench.engines.base import Engine, RunRecord, Session
from kvbench.bench.trial import TrialSpec
from kvbench.scenario import Scenario, ScenarioMode


class Executor(Protocol):
    """What the sweep (:mod:`kvbench.bench.plans.sweep`) drives.

    Attributes:
        engine: the engine (or a stand-in for remote ones: its ``device`` and ``weights_bytes``).
        requests: the ids of the request stream's requests (a reuse workload's or a server run's; [] otherwise).
    """

    engine: Engine
    requests: list[str]

    def sweep(self, scenario: Scenario, record: Record, trials: Sequence[TrialSpec] | None = None) -> None:
        """Run every trial of ``scenario`` not yet in ``record`` (a :class:`~kvbench.bench.plans.sweep.Recorder`),
        writing each row through it as its trial ends; ``trials``: only these of a planned sweep (in their
        order; a cluster worker's unit of work). KeyboardInterrupt is not caught.

        Raises:
            SweepIncomplete: not every trial could run (workers lost for good).
        """
        ...

    def remember(self, rows: Sequence[dict[str, Any]]) -> None:
        """Take earlier rows (a resumed run) as the ``none`` reference where they are."""
        ...

    def close(self) -> None:
        """Give back what the executor holds (its samplers' NVML handle; a cluster's workers and their files),
        after the sweep, on every exit path."""
        ...


class TrialRunner(Protocol):
    """What :meth:`Recorder.__call__ <kvbench.bench.plans.sweep.Recorder.__call__>` runs one trial on (a
    :class:`~kvbench.bench.executors.local.LocalExecutor`).

    Attributes:
        engine: the engine whose ``source``, ``longest_prompt`` and ``session`` the sweep's pieces use.
        last_samples: the samples of the last trial :meth:`run` ran (dicts with
            :data:`kvbench.results.samples.SAMPLE_COLUMNS`), for ``samples.csv``.
    """

    engine: Engine
    last_samples: list[dict[str, Any]]

    def run(self, t: TrialSpec) -> dict[str, Any]:
        """Run trial ``t`` (in its mode's open :meth:`session`, else one of its own) and return its row; a
        failure is a row with its ``status`` and ``message``. KeyboardInterrupt is not caught."""
        ...

    def session(self, mode: ScenarioMode, repeat: int) -> AbstractContextManager[Session]:
        """The engine's session of ``mode`` for ``repeat``, open while the block runs; the trials of that mode
        run meanwhile run in it."""
        ...

    def release(self) -> None:
        """Give back memory earlier trials left (before a new shape's warm-up)."""
        ...


class Record(Protocol):
    """What the plans (:mod:`kvbench.bench.plans.reuse`, :func:`kvbench.bench.plans.server.server_sweep`) run their
    trials through: the run's :class:`~kvbench.bench.plans.sweep.Recorder` (a server's mode writes its rows through
    it as a :class:`~kvbench.bench.engines.base.RowSink`).

    Attributes:
        run: the run directory (:class:`~kvbench.results.run_dir.RunDir`, or a cluster worker's stand-in): its
            ``meta`` and ``update``.
        rows: the rows written so far (and a resumed run's), by trial id.
        on_status: called with what runs now (a trial id, a server starting), or None.
        on_start: called with each measured trial as it begins, or None.
    """

    run: RunRecord
    rows: dict[str, dict[str, Any]]
    on_status: Callable[[str], None] | None
    on_start: Callable[[TrialSpec], None] | None

    def __call__(self, t: TrialSpec) -> dict[str, Any]:
        """Run trial ``t`` (after its shape's warm-up; in its mode's session where one is open) and write its row,
        or return the row already written."""
        ...

    def session(self, mode: ScenarioMode, repeat: int) -> AbstractContextManager[Session]:
        """``mode``'s session for ``repeat``, open while the block runs (a reuse workload keeps every mode's open
        for a repeat); the trials of that mode run meanwhile run in it."""
        ...

    def write(self, row: dict[str, Any], samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Write a row the caller built (a server request's) and its samples; returns the row as written."""
        ...
