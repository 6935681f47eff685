"""What trials a scenario has and in which order: :class:`TrialSpec` (one point of a sweep), :class:`ReuseTrial`
(one request of a reuse workload), :func:`reference_first` (the ``none`` reference before the other modes) and
:func:`plan_trials` (a planned sweep's trials in run order), :func:`bounds` (a capacity search's range) and
:class:`TrialOutput` (what an engine hands back for one trial)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvbench.scenario import CAPACITY_DEFAULTS, CapacitySpec, Scenario, ScenarioMode
from kvbench.workloads.sessions import Request

M = TypeVar("M", bound=ScenarioMode)


@dataclass(frozen=True)
class TrialSpec:
    """One point of the sweep. ``mode`` is a scenario mode (it has ``kind``, ``label`` and ``options``);
    ``prompt_tokens`` and ``batch_size`` are counts; ``repeat`` counts from 0."""

    prompt_tokens: int
    batch_size: int
    mode: ScenarioMode
    repeat: int

    @property
    def trial_id(self) -> str:
        """Stable id, the key a resumed run looks trials up by: ``p<N>-b<B>-<mode label>-r<repeat>``."""
        return f"p{self.prompt_tokens}-b{self.batch_size}-{self.mode.label}-r{self.repeat}"

    @property
    def shape_key(self) -> tuple[object, ...]:
        """Trials with one key share their warm-up (run before the first of them)."""
        return (self.prompt_tokens, self.batch_size, self.mode.label)

    def warmup_spec(self) -> TrialSpec:
        """The unrecorded warm-up trial run before the first trial of this shape."""
        return TrialSpec(self.prompt_tokens, self.batch_size, self.mode, 0)


@dataclass(frozen=True)
class ReuseTrial(TrialSpec):
    """One request of a reuse workload (batch 1) in one mode: ``warm`` restores the longest stored prefix of its
    prompt from what the engine keeps for the mode (the transformers engine: a KV store per mode) and prefills the
    rest; cold recomputes it all. Build with :meth:`of`."""

    request: Request = field(kw_only=True)
    warm: bool = field(default=False, kw_only=True)

    @classmethod
    def of(cls, request: Request, mode: ScenarioMode, repeat: int, warm: bool) -> ReuseTrial:
        """The trial of ``request`` in ``mode``."""
        return cls(len(request.ids), 1, mode, repeat, request=request, warm=warm)

    @property
    def trial_id(self) -> str:
        """``<request id>-<mode label>-warm|cold-r<repeat>``, e.g. ``c0-t2-full-warm-r0``."""
        return f"{self.request.id}-{self.mode.label}-{'warm' if self.warm else 'cold'}-r{self.repeat}"

    @property
    def shape_key(self) -> tuple[object, ...]:
        """One warm-up per mode: prompts of a reuse workload all differ in length."""
        return ("reuse", self.mode.label)

    def warmup_spec(self) -> ReuseTrial:
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
    def shape_key(self) -> tuple[object, ...]:
        """One warm-up per server start (mode and repeat)."""
        return ("server", self.mode.label, self.repeat)


def reference_first(modes: Iterable[M]) -> list[M]:
    """The modes with ``none`` (the reference every trial's ids are compared with) first, the others in their
    order."""
    return sorted(modes, key=lambda m: m.kind != "none")


def plan_trials(s: Scenario) -> list[TrialSpec]:
    """Every recorded trial of a planned sweep (:class:`~kvbench.bench.plans.plan.SweepPlan`), in run order: prompt
    length, batch size, repeat, then mode (so modes are interleaved and share the machine's conditions), ``none``
    first so the others can be compared with it.

    Raises:
        ValueError: the scenario has no planned sweep (no lists of prompt lengths and batch sizes).
    """
    prompts, batches = s.prompt_tokens, s.batch_sizes
    if not isinstance(prompts, list) or not isinstance(batches, list):
        raise ValueError(f"{s.name} is a {s.run_kind} run: it has no planned sweep of prompt lengths × batch sizes")
    modes = reference_first(s.modes)
    return [
        TrialSpec(n, b, m, r)
        for n in prompts
        for b in batches
        for r in range(s.repeats)
        for m in modes
    ]


def bounds(s: Scenario, longest_prompt: int) -> tuple[int, int, int]:
    """``(start, limit, resolution)`` of the scenario's search from its ``capacity`` section and the defaults
    (:data:`kvbench.scenario.CAPACITY_DEFAULTS`); ``longest_prompt`` is the model's (max positions − new tokens),
    the default limit of a prompt-length search. ``start`` is capped at ``limit``."""
    if s.searched is None:
        raise ValueError(f"scenario {s.name} has no auto field to search")
    cap = s.capacity or CapacitySpec()
    start, resolution = CAPACITY_DEFAULTS[s.searched]
    limit = cap.max or (s.workload.n_prompts if s.searched == "batch_size" else longest_prompt)
    return min(cap.start or start, limit), limit, cap.resolution or resolution


@dataclass
class TrialOutput:
    """What one trial measured, as an engine hands it back.

    Attributes:
        t_start: clock reading (seconds, ``time.perf_counter``) when the trial's timed window began: the request
            sent, the prefill (or, for a warm trial, the restore) started.
        token_times: one clock reading per generated step (seconds, same clock), when its tokens were out.
        ids: the generated ids, ``[batch][steps]``; None where the engine does not return them (a server that
            withholds some: ``output_sha256`` then says what it generated).
        prompt_sha256: sha256 hex of the prompts as the engine fed them (for the ``none`` reference).
        memory: the KV peaks in bytes: ``kv_device_peak_bytes``, ``kv_host_peak_bytes``, ``kv_stored_peak_bytes``
            (every tier, each token once).
        reuse: a reuse trial's reading of what was restored (``tokens_restored``, ``tokens_prefilled``,
            ``store_hit_rate``, ``restore_host_bytes``, ``restore_disk_bytes``); None when nothing was (a cold
            trial).
        top2_gaps: the gap between the two largest logits at each step (batch row 0), when asked for.
        fields: the engine's own row fields (disk tier, transfers, allocator peaks...), in row order.
        notes: why some of ``fields`` are None, by field name.
        chunk_times: a streamed reply's clock reading per chunk that carried tokens (the ITL's gaps are between
            chunks); None: every step came on its own.
        output_sha256: the digest to compare outputs by where it is not the ids' (a server's: the sha256 hex of
            its text, since a server may withhold the id of a token that ends inside a UTF-8 character); None: the
            ids' digest (:func:`kvbench.bench.rows.row.ids_digest`).
        not_compared: why this output is not compared with (nor taken as) the ``none`` reference (a cold
            request that reused cached tokens), or None.
    """

    t_start: float
    token_times: list[float]
    ids: list[list[int]] | None
    prompt_sha256: str
    memory: dict[str, int]
    reuse: dict[str, Any] | None = None
    top2_gaps: list[float] | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    chunk_times: list[float] | None = None
    output_sha256: str | None = None
    not_compared: str | None = None
