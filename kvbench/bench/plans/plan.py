"""The run kinds, decided once: :func:`plan_for` reads the scenario's :attr:`~kvbench.scenario.Scenario.run_kind`
and returns its :class:`Plan`, which every other piece asks for what a kind decides: the engine family that runs
it (:attr:`Plan.family`), its trials and their order (:meth:`Plan.run`), how many the run records
(:meth:`Plan.planned`), whether a resumed run is done (:meth:`Plan.done`), the units a cluster splits it into
(:meth:`Plan.units`) and which summary it has (:attr:`Plan.summary`).

The kinds: a planned ``sweep`` (prompt lengths × batch sizes × modes × repeats), a ``capacity`` search (its trials
depend on their outcomes), a ``reuse`` workload (every request of a stream cold and warm, :mod:`~.reuse`) and a
``server`` run (a server per mode, the requests under a load profile, :mod:`~.server`). An executor places the
work (:mod:`kvbench.bench.executors.local` here, a Ray cluster's workers); it never re-decides the plan.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from kvbench.bench.engines.base import Engine
from kvbench.bench.engines.family import IN_PROCESS, SERVER, Family
from kvbench.bench.plans.capacity import search_sweep
from kvbench.bench.plans.reuse import note_requests, reuse_sweep
from kvbench.bench.roles import Record
from kvbench.bench.trial import TrialSpec, plan_trials
from kvbench.scenario import RunKind, Scenario
from kvbench.workloads.sessions import Stream


class Plan(ABC):
    """What one run kind decides, for scenario ``s`` (build with :func:`plan_for`).

    Attributes:
        kind: the run kind (:attr:`kvbench.scenario.Scenario.run_kind`).
        family: the engine family that runs it (:mod:`kvbench.bench.engines.family`).
        summary: the run summary it has: ``points`` (the per-point table,
            :func:`kvbench.bench.summary.point_summary`) or ``requests`` (the cold-vs-warm table of a request
            stream, :func:`kvbench.bench.summary.reuse_summary`).
    """

    kind: ClassVar[RunKind]
    family: ClassVar[Family] = IN_PROCESS
    summary: ClassVar[Literal["points", "requests"]] = "points"

    def __init__(self, s: Scenario):
        self.s = s

    @abstractmethod
    def run(self, record: Record, engine: Engine, trials: Sequence[TrialSpec] | None = None) -> None:
        """Run (or, resuming, look up) the run's trials through ``record`` on ``engine``; ``trials``: only these,
        a cluster worker's unit of a divisible plan (:meth:`units`)."""

    def planned(self, n_requests: int) -> int | None:
        """How many trials the run records on one machine kind (None: decided as it runs); ``n_requests``: how
        many requests a request stream has (0 for a planned sweep)."""
        return len(plan_trials(self.s))

    def done(self, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> bool:
        """Whether a resumed run has nothing left to run, from run.json's ``meta`` and the rows that stand (the
        last of each trial, none due for a retry), without loading a model, a workload or a server."""
        return False

    def units(self) -> list[list[TrialSpec]] | None:
        """The units a cluster's workers run apart, each whole on one worker, in order; None: the run is one
        unit (its trials depend on each other: a request stream, a search)."""
        return None

    def problem(self, device_type: str) -> tuple[str, str] | None:
        """Why this run cannot run on a device of ``device_type`` (``cpu``, ``cuda``): the scenario's key path at
        fault and the reason; None when it can."""
        return None


class SweepPlan(Plan):
    """A planned sweep: :func:`~kvbench.bench.trial.plan_trials` in their order; a cluster's units are its
    (prompt length, batch size) points, each with its ``none`` reference, warm-ups and interleaved modes."""

    kind = "sweep"

    def run(self, record: Record, engine: Engine, trials: Sequence[TrialSpec] | None = None) -> None:
        for t in plan_trials(self.s) if trials is None else trials:
            record(t)

    def done(self, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> bool:
        """Every planned trial has a row (with two placement kinds or more, each once per kind:
        ``<id>@<label>``)."""
        ids = {t.trial_id for t in plan_trials(self.s)}
        if len(self.s.machines) > 1:
            ids = {f"{i}@{label}" for i in ids for label in self.s.machines}
        return ids <= {r["trial_id"] for r in rows}

    def units(self) -> list[list[TrialSpec]]:
        return [list(g) for _, g in itertools.groupby(plan_trials(self.s),
                                                      key=lambda t: (t.prompt_tokens, t.batch_size))]


class CapacityPlan(Plan):
    """A capacity search (:func:`~kvbench.bench.plans.capacity.search_sweep`), whose results go into run.json as
    ``capacity``; never done before it runs, since its trials are decided as it runs."""

    kind = "capacity"

    def run(self, record: Record, engine: Engine, trials: Sequence[TrialSpec] | None = None) -> None:
        search_sweep(self.s, record, TrialSpec, engine.longest_prompt,
                     on_capacity=lambda found: record.run.update(capacity=found))

    def planned(self, n_requests: int) -> int | None:
        return None

    def problem(self, device_type: str) -> tuple[str, str] | None:
        """Without CUDA there is no device memory to run out of, so a search needs a ``budget``."""
        if self.s.budget is None and device_type != "cuda":
            return "budget", (f"{self.s.searched} search on {device_type} needs a device KV budget: there is no "
                              "device memory to run out of (set budget, e.g. 256MiB)")
        return None


class _RequestPlan(Plan):
    """A request stream's run (reuse workload, server): its requests noted in run.json; done when the sweep
    ended ``complete`` with run.json's ``planned`` rows, since its trials depend on the requests drawn."""

    summary = "requests"

    def done(self, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> bool:
        planned = meta.get("planned")
        return meta.get("status") == "complete" and type(planned) is int and len(rows) >= planned >= 0


class ReusePlan(_RequestPlan):
    """A reuse workload (:func:`~kvbench.bench.plans.reuse.reuse_sweep`): every request × mode × (warm, cold) ×
    repeat."""

    kind = "reuse"

    def run(self, record: Record, engine: Engine, trials: Sequence[TrialSpec] | None = None) -> None:
        stream = _stream(engine)
        note_requests(record.run, stream)
        reuse_sweep(self.s, record, stream.requests)

    def planned(self, n_requests: int) -> int | None:
        return n_requests * len(self.s.modes) * 2 * self.s.repeats


class ServerPlan(_RequestPlan):
    """A server run (:func:`~kvbench.bench.plans.server.server_sweep`): every request (up to
    ``load.n_requests``) × mode × repeat × concurrency level."""

    kind = "server"
    family = SERVER

    def run(self, record: Record, engine: Engine, trials: Sequence[TrialSpec] | None = None) -> None:
        from kvbench.bench.engines.server.engine import ServerEngine
        from kvbench.bench.plans.server import server_sweep

        if not isinstance(engine, ServerEngine):
            raise TypeError(f"a server run needs its family's engine, not {type(engine).__name__}")
        note_requests(record.run, _stream(engine))
        server_sweep(self.s, record, engine)

    def planned(self, n_requests: int) -> int | None:
        n = min(n_requests, self.s.load_spec.n_requests or n_requests)
        return n * len(self.s.modes) * self.s.repeats * len(self.s.load_spec.levels)


def _stream(engine: Engine) -> Stream:
    """The engine's request stream (a reuse workload's or a server run's).

    Raises:
        TypeError: its source is no request stream.
    """
    if not isinstance(engine.source, Stream):
        raise TypeError(f"a request stream's run needs one, not {type(engine.source).__name__}")
    return engine.source


#: The plan of each run kind.
PLANS: dict[str, type[Plan]] = {p.kind: p for p in (SweepPlan, CapacityPlan, ReusePlan, ServerPlan)}


def plan_for(s: Scenario) -> Plan:
    """The plan of ``s``'s run kind (:attr:`~kvbench.scenario.Scenario.run_kind`)."""
    return PLANS[s.run_kind](s)
