"""The engine seam: what the sweep asks of whatever runs a trial, and what it hands back.

An engine runs one trial (:class:`~kvbench.bench.trial.TrialSpec`) and returns a :class:`~kvbench.bench.trial.TrialOutput`: the
token timestamps, the generated ids, the prompt's digest, memory readings and its own row fields. The sweep
(ordering, warm-up, resume, capacity search, the ``none`` reference, recording) only sees this protocol, through
an executor (:mod:`kvbench.bench.executors.local`), and builds the row (:mod:`kvbench.bench.rows.row`).

The protocol is shaped for two kinds of engine: in-process (:mod:`kvbench.bench.engines.transformers`: a cache
object, a decode loop, this process's memory) and a server reached over HTTP (no cache object; it streams chunks
with timestamps, reports cached prompt tokens per request as :attr:`TrialOutput.reuse`, and runs in another
process, whose PID (:attr:`Engine.pid`) the samplers watch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from kvbench.bench.trial import ReuseTrial, TrialOutput, TrialSpec



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
        ``kv_bytes_predicted`` and the plan predictions (:mod:`kvbench.bench.engines.predict`)."""
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
        :meth:`LocalExecutor.release <kvbench.bench.executors.local.LocalExecutor.release>` skips it."""
        ...

    def reuse_round(self, modes: Sequence[Any]) -> AbstractContextManager[None]:
        """A fresh reuse state for one repeat of a reuse workload (what each mode keeps between requests), cleared
        on every exit path."""
        ...

    def refill(self, t: ReuseTrial) -> None:
        """Rebuild what a finished warm trial left for later requests (a resumed run), without recording it."""
        ...

