"""The workers of a cluster run as Ray actors: starting them (each loads the model, then says it is ready, or why
not) and stopping them (after they removed their files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.bench.executors.ray.placement import WorkerKind
from kvbench.errors import ClusterError, PrepareError

#: Seconds a worker gets to remove its files before it is killed at the end of a run.
CLOSE_TIMEOUT_S = 10.0


@dataclass
class Worker:
    """One started worker: its kind, its Ray actor handle and what it said when ready
    (:meth:`~kvbench.bench.executors.ray.worker.TrialWorker.ready`)."""

    kind: WorkerKind
    actor: Any
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def host(self) -> str:
        """The worker's host name."""
        return self.info["where"]["host"]


def kill_workers(ray: Any, workers: list[Worker], tidy: bool, again: bool = False) -> list[tuple[Worker, Any]]:
    """Kill the workers' actors (their server processes die with them); with ``tidy``, let each remove its
    files first (:meth:`~kvbench.bench.executors.ray.worker.TrialWorker.close`, at most :data:`CLOSE_TIMEOUT_S` in all;
    ``again``: each returns the logs it sent already too).

    Returns:
        With ``tidy``, each worker and what its ``close()`` returned (the server logs it had not sent), None for
        one that did not answer in time or had died (its folder may still be on its node); else nothing.
    """
    closed: list[tuple[Worker, Any]] = []
    if tidy and workers:
        refs = [w.actor.close.remote(again) for w in workers]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT_S)
        answered = set(done)
        for w, ref in zip(workers, refs):
            got = None
            if ref in answered:
                try:
                    got = ray.get(ref)
                except Exception:
                    got = None
            closed.append((w, got))
    for w in workers:
        ray.kill(w.actor, no_restart=True)
    return closed


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
        except Exception as exc:
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


def start_kinds(ray: Any, remote: Any, kinds: list[WorkerKind], scenario: dict[str, Any], where: str,
                timeout_s: float, progress: Any) -> list[Worker]:
    """Start every kind's workers (:func:`start_workers`; ``progress`` says so and warns of the workers that did
    not start while others of their kind did, and of those that run below nice 0); all of them, ready.

    Raises:
        ClusterError: a machine kind none of whose workers started (naming why).
        PrepareError: a worker cannot run the scenario (its model, data or preflight), or runs another kvbench.
        Any of these (and Ctrl-C) stops the workers started so far first.
    """
    from kvbench.version import __version__

    workers: list[Worker] = []
    try:
        for kind in kinds:
            progress.info(f"starting {kind.count} {'GPU' if kind.gpu else 'CPU'} worker(s)"
                          + (f" on {kind.label}" if kind.label else "") + " (each loads the model)")
            ok, problems = start_workers(ray, remote, kind, kind.count, scenario, where, timeout_s)
            workers += ok
            wrong = [w for w in ok if w.info["kvbench"] != __version__]
            if wrong:
                raise PrepareError(f"{where}: the worker on {wrong[0].host} runs kvbench {wrong[0].info['kvbench']}, "
                                   f"this driver {__version__}: install the same version on every node")
            loads = [p for p in problems if "did not start" not in p and "died while starting" not in p]
            if loads:
                raise PrepareError(loads[0])
            if not ok:
                raise ClusterError(f"{kind.label or 'the cluster'}: no worker started: {problems[0]}")
            for p in problems:
                progress.warning(p)
            for w in ok:
                if w.info.get("nice"):
                    progress.warning(f"the worker on {w.host} runs at nice {w.info['nice']}: any other process there "
                                     "takes its CPU first; start the cluster with RAY_worker_niceness=0")
    except BaseException:
        kill_workers(ray, workers, tidy=True)
        raise
    return workers


__all__ = ["CLOSE_TIMEOUT_S", "Worker", "kill_workers", "start_kinds", "start_workers"]
