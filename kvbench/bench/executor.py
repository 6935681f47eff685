"""The executor seam between the sweep and the engines: the sweep (:func:`kvbench.bench.sweep.run_sweep`) hands an
executor the run's :class:`~kvbench.bench.sweep.Recorder` and the executor runs every trial through it.
:class:`LocalExecutor` runs them one at a time on an engine in this process's reach (the in-process transformers
engine); :class:`kvbench.bench.cluster.driver.RayExecutor` on the engines of a Ray cluster's workers, behind the
same :class:`~kvbench.bench.roles.Executor` protocol."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kvbench.bench.capacity import search_sweep
from kvbench.bench.engines.base import Engine
from kvbench.bench.machine_load import LoadWindow, other_gpu_processes
from kvbench.bench.monitor import Sampler, TrialTimeline
from kvbench.bench.reference import Reference
from kvbench.bench.row import base_row, measured_fields
from kvbench.bench.reuse import note_requests, reuse_sweep
from kvbench.bench.trial import TrialSpec, plan_trials
from kvbench.offload.modes import ModeUnavailable
from kvbench.scenario import Scenario
from kvbench.workloads import TooLittleText
from kvbench.results.rows import Status


class TrialWatch:
    """The samplers and the machine's load around an engine's timed window (see
    :class:`~kvbench.bench.engines.base.Watch`): after the window, :attr:`timeline` holds its samples and
    :attr:`machine_load` the other processes' load during it (:class:`~kvbench.bench.machine_load.LoadWindow`)."""

    def __init__(self, sampler: Sampler, cpu_count: int | None):
        self.sampler, self.cpu_count = sampler, cpu_count
        self.timeline: TrialTimeline | None = None
        self.machine_load: dict[str, Any] = {}

    def reset(self) -> None:
        """Forget the last trial's readings."""
        self.timeline, self.machine_load = None, {}

    @contextmanager
    def window(self, trial_id: str, kv_probe: Callable[[], tuple[int, int, int]] | None = None,
               pinned_probe: Callable[[], int] | None = None) -> Iterator[TrialTimeline]:
        """Sample (:meth:`Sampler.trial`) and measure the machine's load while the block runs; yields the
        timeline."""
        load = LoadWindow(self.cpu_count)
        with self.sampler.trial(trial_id, kv_probe=kv_probe, pinned_probe=pinned_probe) as timeline:
            self.timeline = timeline
            yield timeline
        nvml = self.sampler.nvml
        self.machine_load = load.stop(other_gpu_processes(nvml.raw().get("processes"), self.sampler.pid)
                                      if nvml is not None else None)

    def mark(self, phase: str) -> None:
        """The trial entered ``phase``: the sampler takes a sample soon."""
        self.sampler.mark(phase)


class LocalExecutor:
    """Runs trials one after the other on ``engine`` and turns what it hands back into rows
    (:mod:`kvbench.bench.row`), comparing every trial's ids with the ``none`` reference.

    Args:
        environment: the run's (its ``cpu_count`` sets the busy threshold of the machine-load window).
        sampler: the samplers to use (default: one for the engine's device and process, as the scenario's
            ``monitor`` section says).
    """

    def __init__(self, scenario: Scenario, engine: Engine, environment: dict[str, Any] | None = None,
                 sampler: Sampler | None = None):
        self.s, self.engine = scenario, engine
        mon = scenario.monitor
        self.sampler = sampler or Sampler(
            engine.device, mon.interval_ms,
            int(mon.alert_device_bytes) if mon.alert_device_bytes is not None else None, pid=engine.pid)
        self.watch = TrialWatch(self.sampler, (environment or {}).get("cpu_count"))
        self.reference = Reference()
        self.last_samples: list[dict[str, Any]] = []

    def run(self, t: TrialSpec) -> dict[str, Any]:
        """Run one trial and return its row; failures become a row with ``status`` (``skipped``: the mode cannot
        run here; ``oom``; ``error``) and ``message``. Afterwards (outside the timed window) ``gc.collect()``;
        device memory is released by the sweep, not here (see :meth:`release`). KeyboardInterrupt is not caught."""
        row = base_row(self.s, t, self.engine.describe(t))
        self.watch.reset()
        try:
            out = self.engine.run_trial(t, self.watch, self.reference.wants_gaps(t))
            row.update(measured_fields(self.s, t, out, self.watch.timeline, self.watch.machine_load,
                                       self.sampler.notes, self.reference))
        except ModeUnavailable as exc:
            row.update(status=Status.SKIPPED, message=str(exc))
        except TooLittleText as exc:
            row.update(status=Status.ERROR, message=str(exc))
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and the sweep goes on
            row.update(status=Status.OOM if self.engine.is_oom(exc) else Status.ERROR, message=f"{type(exc).__name__}: {exc}")
        finally:
            self.last_samples = self.watch.timeline.samples if self.watch.timeline is not None else []
            gc.collect()
        return row

    def sweep(self, scenario: Scenario, record: Any, trials: Sequence[TrialSpec] | None = None) -> None:
        """Run the scenario's trials here, one at a time, through ``record``: a reuse workload
        (:func:`~kvbench.bench.reuse.reuse_sweep`; its requests noted in run.json), a planned sweep (``trials``,
        by default all of :func:`~kvbench.bench.trial.plan_trials`, in their order) or a capacity search
        (:func:`~kvbench.bench.capacity.search_sweep`, whose results go into run.json as ``capacity``)."""
        if scenario.workload.reuse:
            note_requests(record.run, self.engine.source)
            reuse_sweep(scenario, record, self.engine)
        elif scenario.searched is None:
            for t in plan_trials(scenario) if trials is None else trials:
                record(t)
        else:
            search_sweep(scenario, record, TrialSpec, self.engine.longest_prompt,
                         on_capacity=lambda found: record.run.update(capacity=found))

    def release(self) -> None:
        """Release the engine's memory before a new shape."""
        self.engine.release()

    def remember(self, rows: Sequence[dict[str, Any]]) -> None:
        """See :meth:`Reference.remember`."""
        self.reference.remember(rows)
