"""The workers of a cluster run as Ray actors: starting them (each loads the model, then says it is ready, or why
not) and stopping them (after they removed their files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.bench.cluster.placement import WorkerKind

#: Seconds a worker gets to remove its files before it is killed at the end of a run.
CLOSE_TIMEOUT_S = 10.0


@dataclass
class Worker:
    """One started worker: its kind, its Ray actor handle and what it said when ready
    (:meth:`~kvbench.bench.cluster.worker.TrialWorker.ready`)."""

    kind: WorkerKind
    actor: Any
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def host(self) -> str:
        """The worker's host name."""
        return self.info["where"]["host"]


def kill_workers(ray: Any, workers: list[Worker], tidy: bool) -> None:
    """Kill the workers' actors (their server processes die with them); with ``tidy``, let each remove its
    files first (at most :data:`CLOSE_TIMEOUT_S` in all)."""
    if tidy and workers:
        refs = [w.actor.close.remote() for w in workers]
        ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT_S)
    for w in workers:
        ray.kill(w.actor, no_restart=True)


def start_workers(ray: Any, remote: Any, kind: WorkerKind, n: int, scenario: dict[str, Any], where: str,
                  timeout_s: float) -> tuple[list[Worker], list[str]]:
    """Start ``n`` workers of ``kind`` and wait (up to ``timeout_s``) until each has loaded the model; the ready
    ones and the problems of the others."""
    # two threads per actor: close() runs while a unit still streams (a Ctrl-C), then the actor is killed
    started = [Worker(kind, remote.options(**kind.options, max_restarts=0, max_concurrency=2).remote(
        scenario, where)) for _ in range(n)]
    refs = {w.actor.ready.remote(): w for w in started}
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    ok, problems, dead = [], [], []
    for ref, w in refs.items():
        if ref not in done:
            problems.append(f"a worker{f' of {kind.label}' if kind.label else ''} did not start within "
                            f"{timeout_s:g} s (the cluster's resources are busy, or loading is slow: see "
                            "executor.startup_timeout_s)")
            dead.append(w)
            continue
        try:
            w.info = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the actor died while starting
            problems.append(f"a worker died while starting: {str(exc).splitlines()[0]}")
            dead.append(w)
            continue
        if w.info["problem"]:
            problems.append(w.info["problem"])
            dead.append(w)
        else:
            ok.append(w)
    kill_workers(ray, dead, tidy=False)
    return ok, problems



__all__ = ["CLOSE_TIMEOUT_S", "Worker", "kill_workers", "start_workers"]
