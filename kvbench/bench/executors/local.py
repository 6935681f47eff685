"""The executor seam between the sweep and the engines: the sweep (:func:`kvbench.bench.plans.sweep.run_sweep`) hands an
executor the run's :class:`~kvbench.bench.plans.sweep.Recorder` and the executor runs every trial through it.
:class:`LocalExecutor` runs them in the plan's order (:meth:`kvbench.bench.plans.plan.Plan.run`) on an engine in this
process's reach (the in-process transformers engine, or a server engine, whose plan starts a server per mode
session here); :class:`kvbench.bench.executors.ray.driver.RayExecutor` on the engines of a Ray cluster's workers, behind
the same :class:`~kvbench.bench.roles.Executor` protocol."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, cast

from kvbench.bench.engines.base import Engine, Session, SessionEngine
from kvbench.bench.engines.family import IN_PROCESS
from kvbench.bench.telemetry.machine_load import LoadWindow, other_gpu_processes
from kvbench.bench.telemetry.monitor import Sampler, TrialTimeline
from kvbench.bench.rows.reference import Reference
from kvbench.bench.rows.row import base_row, measured_fields
from kvbench.bench.plans.plan import plan_for
from kvbench.bench.trial import ReuseTrial, TrialSpec
from kvbench.offload.modes import ModeUnavailable
from kvbench.scenario import Scenario
from kvbench.workloads import TooLittleText
from kvbench.workloads.sessions import Stream
from kvbench.results.rows import Status


class TrialWatch:
    """The samplers and the machine's load around an engine's timed window (see
    :class:`~kvbench.bench.engines.base.Watch`): after the window, :attr:`timeline` holds its samples and
    :attr:`machine_load` the other processes' load during it
    (:class:`~kvbench.bench.telemetry.machine_load.LoadWindow`)."""

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
    (:mod:`kvbench.bench.rows.row`), comparing every trial's ids with the ``none`` reference.

    Args:
        environment: the run's (its ``cpu_count`` sets the busy threshold of the machine-load window).
        sampler: the samplers to use (default: one for the engine's device and process, as the scenario's
            ``monitor`` section says).
        on_alert: called with the event when device memory crosses ``monitor.alert_device_bytes`` during a trial
            (:class:`~kvbench.bench.telemetry.monitor.Sampler`).
    """

    def __init__(self, scenario: Scenario, engine: Engine, environment: dict[str, Any] | None = None,
                 sampler: Sampler | None = None, on_alert: Callable[[dict[str, Any]], None] | None = None):
        self.s, self.engine, self.plan = scenario, engine, plan_for(scenario)
        self._sampler, self._cpu_count, self._on_alert = sampler, (environment or {}).get("cpu_count"), on_alert
        self._watch: TrialWatch | None = None
        self.last_samples: list[dict[str, Any]] = []
        self._sessions: dict[str, Session] = {}  # the open sessions (:meth:`session`), by mode label

    @property
    def _runner(self) -> SessionEngine:
        """The engine as one that runs trials one at a time in mode sessions: the in-process family's (a server's
        modes run behind its own seam, from the plan, never trial by trial here).

        Raises:
            TypeError: the plan's family is not the in-process one.
        """
        if self.plan.family is not IN_PROCESS:
            raise TypeError(f"a {self.plan.kind} run's engine runs its requests itself, not trial by trial")
        return cast(SessionEngine, self.engine)

    @property
    def requests(self) -> list[str]:
        """The ids of the engine's request stream's requests ([] for a planned sweep's prompt source)."""
        source = self.engine.source
        return [q.id for q in source.requests] if isinstance(source, Stream) else []

    @property
    def reference(self) -> Reference:
        """The ``none`` outputs every trial is compared with: the engine's."""
        return self.engine.reference

    @property
    def sampler(self) -> Sampler:
        """The samplers (made at first use: a server run samples each mode's server itself, never this)."""
        if self._sampler is None:
            mon = self.s.monitor
            self._sampler = Sampler(
                self.engine.device, mon.interval_ms,
                int(mon.alert_device_bytes) if mon.alert_device_bytes is not None else None, pid=self.engine.pid,
                on_alert=self._on_alert)
        return self._sampler

    @property
    def watch(self) -> TrialWatch:
        """The samplers and the machine's load around each trial's timed window."""
        if self._watch is None:
            self._watch = TrialWatch(self.sampler, self._cpu_count)
        return self._watch

    @contextmanager
    def session(self, mode: Any, repeat: int) -> Iterator[Session]:
        """The engine's session of ``mode`` for ``repeat`` (:meth:`Engine.session
        <kvbench.bench.engines.base.SessionEngine.session>`), open while the block runs: :meth:`run` runs the trials of
        that mode in it meanwhile. Closed on every exit path."""
        with self._runner.session(mode, repeat) as ses:
            self._sessions[mode.label] = ses
            try:
                yield ses
            finally:
                self._sessions.pop(mode.label, None)

    def run(self, t: TrialSpec) -> dict[str, Any]:
        """Run one trial in its mode's open :meth:`session` (a reuse workload's, open for a repeat), else in a
        session of its own (not a warm trial: it would restore nothing), and return its row; failures become a row with
        ``status`` (``skipped``: the mode cannot run here; ``oom``; ``error``) and ``message``. Afterwards (outside the
        timed window) ``gc.collect()``; device memory is released by the sweep, not here (see :meth:`release`).
        KeyboardInterrupt is not caught."""
        row = base_row(self.s, t, self.engine.describe(t))
        self.watch.reset()
        try:
            session = self._sessions.get(t.mode.label)
            if session is None and isinstance(t, ReuseTrial) and t.warm:  # a session of its own holds nothing
                raise ValueError(f"{t.trial_id}: a warm trial restores what its mode's session holds: open the "
                                 "session first")
            with nullcontext(session) if session is not None else self._runner.session(t.mode, t.repeat) as ses:
                out = ses.run(t, self.watch, self.reference.wants_gaps(t))
            row.update(measured_fields(self.s, t, out, self.watch.timeline, self.watch.machine_load,
                                       self.sampler.notes, self.reference))
        except ModeUnavailable as exc:
            row.update(status=Status.SKIPPED, message=str(exc))
        except TooLittleText as exc:
            row.update(status=Status.ERROR, message=str(exc))
        except Exception as exc:
            oom = self.engine.capabilities.tells_oom and self._runner.is_oom(exc)
            row.update(status=Status.OOM if oom else Status.ERROR, message=f"{type(exc).__name__}: {exc}")
        finally:
            self.last_samples = self.watch.timeline.samples if self.watch.timeline is not None else []
            gc.collect()
        return row

    def sweep(self, scenario: Scenario, record: Any, trials: Sequence[TrialSpec] | None = None) -> None:
        """Run the scenario's trials here, through ``record``, in its plan's order
        (:meth:`Plan.run <kvbench.bench.plans.plan.Plan.run>`; ``trials``: only these of a planned sweep)."""
        self.plan.run(record, self.engine, trials)

    def close(self) -> None:
        """Release the samplers' NVML handle, where they were made."""
        if self._sampler is not None:
            self._sampler.close()

    def release(self) -> None:
        """Release the engine's memory before a new shape, where it holds memory of its own
        (:attr:`Capabilities.releases_memory <kvbench.bench.engines.base.Capabilities.releases_memory>`; a
        server's process is stopped after each mode instead)."""
        if self.engine.capabilities.releases_memory:
            self._runner.release()

    def remember(self, rows: Sequence[dict[str, Any]]) -> None:
        """Take earlier rows' ``none`` outputs as the reference (:meth:`Reference.remember`)."""
        self.reference.remember(rows)
