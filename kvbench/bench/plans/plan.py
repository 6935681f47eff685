"""Which trials a scenario runs, and in what order: the one place that tells a planned sweep, a capacity search,
a reuse workload and a server run apart. An executor places the work (:mod:`kvbench.bench.executors.local` here, a Ray
cluster's workers); it never re-decides the plan."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.bench.plans.capacity import search_sweep
from kvbench.bench.plans.reuse import note_requests, reuse_sweep
from kvbench.bench.roles import Record
from kvbench.bench.trial import TrialSpec, plan_trials
from kvbench.scenario import Scenario


def divisible(s: Scenario) -> bool:
    """Whether the sweep of ``s`` splits into units that run apart (a planned sweep's (prompt length, batch)
    points): not a server run, a reuse workload (whose requests share what each mode keeps) or a capacity search
    (whose trials depend on their outcomes)."""
    return not (s.engine.server or s.workload.reuse or s.searched is not None)


def run_plan(s: Scenario, record: Record, engine: Any, trials: Sequence[TrialSpec] | None = None) -> None:
    """Run ``s``'s trials through ``record`` on ``engine``: a server run's requests (each mode on a server of its
    own, :func:`~kvbench.bench.plans.server.server_sweep`) or a reuse workload's
    (:func:`~kvbench.bench.plans.reuse.reuse_sweep`), their requests noted in run.json; a planned sweep (``trials``, by
    default all of :func:`~kvbench.bench.trial.plan_trials`, in their order); or a capacity search
    (:func:`~kvbench.bench.plans.capacity.search_sweep`, whose results go into run.json as ``capacity``)."""
    if engine.capabilities.max_in_flight is None:  # requests that overlap: a server's, under the load profile
        from kvbench.bench.plans.server import server_sweep

        note_requests(record.run, engine.source)
        server_sweep(s, record, engine)
    elif s.workload.reuse:
        note_requests(record.run, engine.source)
        reuse_sweep(s, record, engine)
    elif s.searched is None:
        for t in plan_trials(s) if trials is None else trials:
            record(t)
    else:
        search_sweep(s, record, TrialSpec, engine.longest_prompt,
                     on_capacity=lambda found: record.run.update(capacity=found))
