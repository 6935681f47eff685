"""The sweep of a server run: per repeat, every mode (a server configuration; ``none`` first, the others rotating
from repeat to repeat) on a server of its own started cold, the workload's requests sent as ``load:`` says, one row
per request written as it finishes.

A cold start is verified, not assumed: the first request a fresh server answers must report 0 cached prompt
tokens (``cold_verified``), and every request of a cold preset (``none``) too; a cold request that reused tokens is
``contaminated`` and never becomes the reference. A request that fails (the server's reply, a timeout, the server
gone) is an ``error`` row with the reason and the sweep goes on; a server that does not start gives every request
of that mode an ``error`` row with the log's last lines. Resumed, a mode whose requests are all written is not
started again; one with requests missing is restarted and, before them, the conversations' earlier turns are sent
again unrecorded so the server holds what it held (the session's refill, as
:meth:`~kvbench.bench.engines.base.Session.refill` does in process).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from kvbench.bench.engines.server.engine import ServerEngine
from kvbench.bench.engines.server.mode_run import run_mode
from kvbench.bench.roles import Record
from kvbench.bench.trial import reference_first
from kvbench.scenario import Scenario, ScenarioMode
from kvbench.scenario.servers import ServerMode

M = TypeVar("M", bound=ScenarioMode)


def mode_order(modes: Sequence[M], repeat: int) -> list[M]:
    """``none`` first (the reference), then the other modes rotated by ``repeat`` (so no mode always runs right
    after ``none``)."""
    ordered = reference_first(modes)
    head = ordered[:1] if ordered and ordered[0].kind == "none" else []
    rest = ordered[len(head):]
    k = repeat % len(rest) if rest else 0
    return head + rest[k:] + rest[:k]


def at_level(mode: ServerMode, level: int, levels: Sequence[int]) -> ServerMode:
    """``mode`` as it runs at concurrency ``level``: itself when the load has one level, else named
    ``<name>@c<level>`` (its preset kept), so that each level is a configuration of its own in the tables."""
    if len(levels) == 1:
        return mode
    return mode.model_copy(update={"name": f"{mode.name}@c{level}", "preset": mode.kind})


def server_sweep(s: Scenario, record: Record, engine: ServerEngine) -> None:
    """Run (or, resuming, look up) every request of every mode, concurrency level and repeat, in this order: each
    mode whose requests are not all written runs on a server of its own
    (:func:`~kvbench.bench.engines.server.mode_run.run_mode`), its rows written through ``record`` (the run's
    :class:`~kvbench.bench.plans.sweep.Recorder`) as its requests end."""
    requests = engine.source.requests[: s.load_spec.n_requests]
    levels = s.load_spec.levels
    modes = [m for m in s.modes if isinstance(m, ServerMode)]
    if len(modes) != len(s.modes):  # validation admits only server configurations here
        raise TypeError(f"{s.name}: a server run's modes are server configurations")
    for c in levels:
        for r in range(s.repeats):
            for m in mode_order(modes, r):
                mode = at_level(m, c, levels)
                trials = engine.trials(mode, r, requests, c)
                todo = [t for t in trials if t.trial_id not in record.rows]
                if todo:
                    run_mode(engine, record, mode, r, c, trials, todo)
