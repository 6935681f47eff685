"""What trials a scenario has and in which order: :class:`TrialSpec` (one point of a sweep), :class:`ReuseTrial`
(one request of a reuse workload), :func:`reference_first` (the ``none`` reference before the other modes) and
:func:`plan_trials` (a planned sweep's trials in run order)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvbench.scenario import Scenario


@dataclass(frozen=True)
class TrialSpec:
    """One point of the sweep. ``mode`` is a scenario mode (it has ``kind``, ``label`` and ``options``);
    ``prompt_tokens`` and ``batch_size`` are counts; ``repeat`` counts from 0."""

    prompt_tokens: int
    batch_size: int
    mode: Any
    repeat: int

    @property
    def trial_id(self) -> str:
        """Stable id, the key a resumed run looks trials up by: ``p<N>-b<B>-<mode label>-r<repeat>``."""
        return f"p{self.prompt_tokens}-b{self.batch_size}-{self.mode.label}-r{self.repeat}"

    @property
    def shape_key(self) -> tuple:
        """Trials with one key share their warm-up (run before the first of them)."""
        return (self.prompt_tokens, self.batch_size, self.mode.label)

    def warmup_spec(self) -> "TrialSpec":
        """The unrecorded warm-up trial run before the first trial of this shape."""
        return TrialSpec(self.prompt_tokens, self.batch_size, self.mode, 0)


@dataclass(frozen=True)
class ReuseTrial(TrialSpec):
    """One request of a reuse workload (batch 1) in one mode: ``warm`` restores the longest stored prefix of its
    prompt from what the engine keeps for the mode (the transformers engine: a KV store per mode) and prefills the
    rest; cold recomputes it all. Build with :meth:`of`."""

    request: Any = None  # a kvbench.workloads.sessions.Request
    warm: bool = False

    @classmethod
    def of(cls, request: Any, mode: Any, repeat: int, warm: bool) -> "ReuseTrial":
        """The trial of ``request`` (a :class:`~kvbench.workloads.sessions.Request`) in ``mode``."""
        return cls(len(request.ids), 1, mode, repeat, request, warm)

    @property
    def trial_id(self) -> str:
        """``<request id>-<mode label>-warm|cold-r<repeat>``, e.g. ``c0-t2-full-warm-r0``."""
        return f"{self.request.id}-{self.mode.label}-{'warm' if self.warm else 'cold'}-r{self.repeat}"

    @property
    def shape_key(self) -> tuple:
        """One warm-up per mode: prompts of a reuse workload all differ in length."""
        return ("reuse", self.mode.label)

    def warmup_spec(self) -> "ReuseTrial":
        """A cold run of the same request (a warm one would change the store)."""
        return ReuseTrial.of(self.request, self.mode, 0, warm=False)


@dataclass(frozen=True)
class ServerTrial(ReuseTrial):
    """One request sent to a server in one mode (a server configuration) and repeat. ``warm`` is whether the
    mode may reuse cached prompt tokens (every preset but a cold one such as ``none``): the server, not kvbench,
    decides what it restores; ``concurrency`` is the load's level (the server's slots). Build with :meth:`of`."""

    concurrency: int = 1

    @property
    def trial_id(self) -> str:
        """``<request id>-<mode name>-r<repeat>``, e.g. ``c0-t2-prefix-cache-r0``."""
        return f"{self.request.id}-{self.mode.label}-r{self.repeat}"

    @property
    def shape_key(self) -> tuple:
        """One warm-up per server start (mode and repeat)."""
        return ("server", self.mode.label, self.repeat)


def reference_first(modes: Iterable[Any]) -> list[Any]:
    """The modes with ``none`` (the reference every trial's ids are compared with) first, the others in their
    order."""
    return sorted(modes, key=lambda m: m.kind != "none")


def plan_trials(s: Scenario) -> list[TrialSpec]:
    """Every recorded trial of a scenario, in run order: prompt length, batch size, repeat, then mode (so modes
    are interleaved and share the machine's conditions), ``none`` first so the others can be compared with it.

    Raises:
        ValueError: the scenario searches capacity (its trials depend on their outcomes) or is a reuse workload.
    """
    if s.engine.server:
        raise ValueError(f"{s.name} runs on {s.engine.kind}: its requests go through the server sweep")
    if s.searched is not None:
        raise ValueError(f"{s.name} searches {s.searched}: its trials are decided as it runs")
    if s.workload.reuse:
        raise ValueError(f"{s.name} is a {s.workload.reuse} workload: its requests are built from the data")
    modes = reference_first(s.modes)
    return [
        TrialSpec(n, b, m, r)
        for n in s.prompt_tokens
        for b in s.batch_sizes
        for r in range(s.repeats)
        for m in modes
    ]


def planned_count(s: Scenario, n_requests: int = 0) -> int | None:
    """How many trials a sweep of ``s`` records: a reuse workload's ``n_requests`` × modes × (warm, cold) ×
    repeats; None for a capacity search (decided as it runs)."""
    if s.engine.server:
        n = min(n_requests, s.load_spec.n_requests or n_requests)
        return n * len(s.modes) * s.repeats * len(s.load_spec.levels)
    if s.workload.reuse:
        return n_requests * len(s.modes) * 2 * s.repeats
    return None if s.searched else len(plan_trials(s))
