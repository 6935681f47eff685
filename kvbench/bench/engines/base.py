"""The engine seam: what the sweep asks of whatever runs a trial, and what it hands back.

An engine runs one trial (:class:`~kvbench.bench.trial.TrialSpec`) and returns a :class:`TrialOutput`: the
token timestamps, the generated ids, the prompt's digest, memory readings and its own row fields. The sweep
(ordering, warm-up, resume, capacity search, the ``none`` reference, recording) only sees this protocol, through
an executor (:mod:`kvbench.bench.executor`), and builds the row (:mod:`kvbench.bench.row`).

The protocol is shaped for two kinds of engine: in-process (:mod:`kvbench.bench.engines.transformers`: a cache
object, a decode loop, this process's memory) and a server reached over HTTP (no cache object; it streams chunks
with timestamps, reports cached prompt tokens per request as :attr:`TrialOutput.reuse`, and runs in another
process, whose PID (:attr:`Engine.pid`) the samplers watch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvbench.bench.trial import ReuseTrial, TrialSpec


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
            ids' digest (:func:`kvbench.bench.row.ids_digest`).
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


class Watch(Protocol):
    """What the executor hands an engine to watch a trial's timed window (the samplers and the machine's load)."""

    def window(self, trial_id: str, kv_probe: Callable[[], tuple[int, int, int]] | None = None,
               pinned_probe: Callable[[], int] | None = None) -> AbstractContextManager[Any]:
        """Sample while the block runs (the engine's timed part). ``kv_probe``: the KV bytes held now on (device,
        host, disk), read with every sample (cheap: it runs on the sampler thread); ``pinned_probe``: the pinned
        host bytes the trial asked for at its peak."""
        ...

    def mark(self, phase: str) -> None:
        """The trial entered ``phase`` (``"decode"`` once the first token is out)."""
        ...


class Engine(Protocol):
    """Runs trials of one scenario on one model.

    Attributes:
        device: the torch device the model runs on (the samplers read NVML for a CUDA one).
        pid: the process the samplers watch (this one for an in-process engine, the server's otherwise).
        source: the prompts: a :class:`~kvbench.workloads.PromptSource`, or a reuse workload's
            :class:`~kvbench.workloads.sessions.Stream` (its ``requests`` and ``notes``).
        longest_prompt: the model's longest prompt in tokens (max positions less the tokens generated).
    """

    device: Any
    pid: int
    source: Any
    longest_prompt: int

    def describe(self, t: TrialSpec) -> dict[str, Any]:
        """The row fields every row of ``t`` has, whatever its status: ``device``, ``dtype``,
        ``kv_bytes_predicted`` and the plan predictions (:mod:`kvbench.bench.predict`)."""
        ...

    def preflight(self) -> list[str]:
        """The reasons the sweep cannot run (one line each), checked before the first trial; [] when it can."""
        ...

    def run_trial(self, t: TrialSpec, watch: Watch, keep_gaps: bool) -> TrialOutput:
        """Run ``t`` (its timed part inside ``watch.window``) and return what it measured; ``keep_gaps``: hand
        back the top-2 logit gaps.

        Raises:
            kvbench.offload.modes.ModeUnavailable: the mode cannot run here (the row is ``skipped``).
            Exception: any failure (the row is ``oom`` where :meth:`is_oom`, else ``error``).
        """
        ...

    def is_oom(self, exc: BaseException) -> bool:
        """Whether a failure of :meth:`run_trial` was the engine running out of memory."""
        ...

    def release(self) -> None:
        """Give back memory earlier trials left, before a new shape's warm-up. Optional: an engine without
        memory of its own to give back (a server engine, whose server stops after each mode) has none, and
        :meth:`LocalExecutor.release <kvbench.bench.executor.LocalExecutor.release>` skips it."""
        ...

    def reuse_round(self, modes: Sequence[Any]) -> AbstractContextManager[None]:
        """A fresh reuse state for one repeat of a reuse workload (what each mode keeps between requests), cleared
        on every exit path."""
        ...

    def refill(self, t: ReuseTrial) -> None:
        """Rebuild what a finished warm trial left for later requests (a resumed run), without recording it."""
        ...

