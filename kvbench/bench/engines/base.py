"""The engine seam: what the plans ask of whatever runs a trial, and what it hands back.

An engine opens a **mode session** (:meth:`SessionEngine.session`: one mode, one repeat, its slots): the state that mode
keeps between requests, from a cold start. In the in-process family (:mod:`kvbench.bench.engines.transformers`:
a cache object, a decode loop, this process's memory) a session (:class:`Session`) runs one trial at a time and
hands back what it measured (:class:`~kvbench.bench.trial.TrialOutput`: token timestamps, generated ids, the
prompt's digest, memory readings, its own row fields); the executor turns it into a row through the one row
builder (:mod:`kvbench.bench.rows.row`). A server reached over HTTP (:mod:`kvbench.bench.engines.server`: no cache
object; it streams chunks with timestamps, reports cached prompt tokens per request and serves requests that
overlap, in another process whose PID (:attr:`Engine.pid`) the samplers watch) runs a mode's requests behind the
seam under the load profile and writes each row, built by the same row builder, through a :class:`RowSink` as
its request ends (:func:`kvbench.bench.engines.server.mode_run.run_mode`). The plans
(:mod:`kvbench.bench.plans`) decide which trials run in which order, never what a family does to run them. What
only one family has is declared in its :class:`Capabilities`, not stubbed in the other.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kvbench.bench.rows.reference import Reference
from kvbench.bench.trial import ReuseTrial, TrialOutput, TrialSpec
from kvbench.scenario import ScenarioMode
from kvbench.workloads import PromptSource
from kvbench.workloads.sessions import Stream

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Capabilities:
    """What an engine family has that another may lack, declared so that its callers ask rather than probe.

    Attributes:
        releases_memory: it holds memory of its own between trials (the in-process engine's device allocator),
            given back by :meth:`SessionEngine.release` before a new shape's warm-up; a server engine stops its server
            after each mode and has none to give back.
        tells_oom: a failed trial can be told apart as running out of memory (:meth:`SessionEngine.is_oom`: the row is
            ``oom``, not ``error``).

    What a trial measured of the cache (the KV bytes of a cache object in this process, or the cached prompt
    tokens a server reports per reply) travels in its :class:`~kvbench.bench.trial.TrialOutput`, with a note
    where an engine cannot say.
    """

    releases_memory: bool
    tells_oom: bool


class Watch(Protocol):
    """What the executor hands an engine to watch a trial's timed window (the samplers and the machine's load)."""

    def window(self, trial_id: str, kv_probe: Callable[[], tuple[int, int, int]] | None = None,
               pinned_probe: Callable[[], int] | None = None) -> AbstractContextManager[object]:
        """Sample while the block runs (the engine's timed part). ``kv_probe``: the KV bytes held now on (device,
        host, disk), read with every sample (cheap: it runs on the sampler thread); ``pinned_probe``: the pinned
        host bytes the trial asked for at its peak."""
        ...

    def mark(self, phase: str) -> None:
        """The trial entered ``phase`` (``"decode"`` once the first token is out)."""
        ...


class Session(Protocol):
    """One mode's state for one repeat in an engine that runs one trial at a time (the in-process engine)."""

    def run(self, t: TrialSpec, watch: Watch, keep_gaps: bool) -> TrialOutput:
        """Run ``t`` (its timed part inside ``watch.window``) and return what it measured; ``keep_gaps``: hand
        back the top-2 logit gaps.

        Raises:
            kvbench.offload.modes.ModeUnavailable: the mode cannot run here (the row is ``skipped``).
            Exception: any failure (the row is ``oom`` where the engine tells OOM apart, else ``error``).
        """
        ...

    def refill(self, t: ReuseTrial) -> None:
        """Rebuild what a finished warm trial left for later requests (a resumed run), without recording it."""
        ...

    def facts(self) -> dict[str, Any]:
        """What the session holds now, as row fields (a KV store's chunks, bytes per tier, evictions)."""
        ...


class RunRecord(Protocol):
    """The run's files as the sweep's pieces see them: a :class:`~kvbench.results.run_dir.RunDir`, or a cluster
    worker's stand-in that sends what it is given to the driver.

    Attributes:
        meta: run.json's fields.
    """

    meta: dict[str, Any]

    def update(self, **fields: Any) -> None:
        """Set ``fields`` in run.json (written atomically)."""
        ...

    def finished_trials(self) -> list[dict[str, Any]]:
        """The rows written so far, in order."""
        ...

    def record_trial(self, row: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """Append a trial's row and its samples, fsynced.

        Raises:
            OSError: they could not be written (disk full...).
        """
        ...


class RowSink(Protocol):
    """What an engine that writes its own rows (a server's, whose requests overlap: each row is written as its
    request ends, :func:`kvbench.bench.engines.server.mode_run.run_mode`) writes them through: the run's
    :class:`~kvbench.bench.plans.sweep.Recorder`.

    Attributes:
        run: the run directory (:class:`~kvbench.results.run_dir.RunDir`, or a cluster worker's stand-in): its
            ``meta`` (run.json) and ``update`` (fields written to run.json).
        rows: the rows written so far (and a resumed run's), by trial id.
        on_status: called with what runs now (a server starting), or None.
        on_start: called with each measured request as it is sent, or None.
    """

    run: RunRecord
    rows: dict[str, dict[str, Any]]
    on_status: Callable[[str], None] | None
    on_start: Callable[[TrialSpec], None] | None

    def write(self, row: dict[str, Any], samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Write a row the engine built and its samples (fsynced); returns the row as written. May be called
        from another thread than the sweep's.

        Raises:
            OSError: the row could not be written (disk full...).
        """
        ...


class Engine(Protocol):
    """What every engine family gives the plans and the run, for one scenario on one model.

    Attributes:
        device: the torch device the model runs on (the samplers read NVML for a CUDA one).
        pid: the process the samplers watch (this one for an in-process engine, the server's otherwise).
        source: the prompts: a :class:`~kvbench.workloads.PromptSource`, or a request stream
            (:class:`~kvbench.workloads.sessions.Stream`: its ``requests`` and ``notes``).
        longest_prompt: the model's longest prompt in tokens (max positions less the tokens generated).
        capabilities: what this engine family has (:class:`Capabilities`).
        reference: the ``none`` outputs every trial of this engine is compared with
            (:class:`~kvbench.bench.rows.reference.Reference`).
    """

    device: torch.device
    pid: int
    source: PromptSource | Stream
    longest_prompt: int
    capabilities: Capabilities
    reference: Reference

    @property
    def weights_bytes(self) -> int | None:
        """Bytes of the model's weights in this process (None for a server engine: they are its server's)."""
        ...

    def describe(self, t: TrialSpec) -> dict[str, Any]:
        """The row fields every row of ``t`` has, whatever its status: ``device``, ``dtype``,
        ``kv_bytes_predicted`` and the plan predictions (:mod:`kvbench.bench.engines.predict`)."""
        ...

    def preflight(self) -> list[str]:
        """The reasons the sweep cannot run (one line each), checked before the first trial; [] when it can."""
        ...


class SessionEngine(Engine, Protocol):
    """An engine whose executor runs one trial at a time in a mode :class:`Session` (the in-process family)."""

    def session(self, mode: ScenarioMode, repeat: int, slots: int = 1) -> AbstractContextManager[Session]:
        """The state ``mode`` keeps for ``repeat``, from a cold start, with ``slots`` requests at once at most;
        everything it made (a store's disk files) is removed on every exit path."""
        ...

    def is_oom(self, exc: BaseException) -> bool:
        """Whether a failed trial ran out of memory. Only where ``capabilities.tells_oom``."""
        ...

    def release(self) -> None:
        """Give back memory earlier trials left, before a new shape's warm-up. Only where
        ``capabilities.releases_memory``."""
        ...
