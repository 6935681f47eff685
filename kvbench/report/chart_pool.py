"""The worker processes that draw a report's charts: forked, warmed up while the results load, and never left
behind: they die with the report (``PR_SET_PDEATHSIG`` on Linux, even when it is SIGKILLed) and are killed when it
stops early (an error, Ctrl-C, SIGTERM)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from kvbench.parent_death import die_with_parent
from kvbench.report import charts

#: At most this many chart worker processes.
CHART_WORKERS = 4


class _InProcess:
    """A stand-in for a process pool that runs each job at once, in this process."""

    def submit(self, fn: Any, *args: Any) -> Future:
        """Run ``fn(*args)`` now; its result, or the exception it raised, is the future's (as a worker's would
        be)."""
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def __enter__(self) -> "_InProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def stop(self) -> None:
        """Nothing runs in the background here."""


def _worker_start(parent: int) -> None:
    """In each worker: Ctrl-C is left to the report (which stops and kills its workers), and the worker gets
    SIGKILL when the report's process ends however it ends; a report already gone when this runs ends it too
    (:func:`kvbench.parent_death.die_with_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent)


class _Workers:
    """A forked process pool that, on leaving its ``with`` block by an exception, cancels what is queued and kills
    its workers instead of waiting for them."""

    def __init__(self, workers: int):
        self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"), initializer=_worker_start,
                                         initargs=(os.getpid(),))
        for _ in range(workers):  # workers start on demand: one warm-up job each starts them all now
            self._pool.submit(charts.warm_up)
        self._procs = list(self._pool._processes.values())  # forked at the first submit, all of them

    def submit(self, fn: Any, *args: Any) -> Future:
        """Queue ``fn(*args)`` on a worker."""
        return self._pool.submit(fn, *args)

    def __enter__(self) -> "_Workers":
        return self

    def stop(self) -> None:
        """Cancel the queued jobs and kill the workers now (nothing they were drawing is finished)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5)

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self._pool.shutdown(wait=True)
        else:
            self.stop()


def chart_pool() -> Any:
    """Where the report's charts are drawn: with more than one CPU, forked worker processes (the charts are
    independent, and matplotlib cannot draw in threads), started now and warmed up (:func:`charts.warm_up`), so
    that they import matplotlib while the caller loads results; on one CPU, this process. Use as a context manager
    (leaving it by an exception kills the workers) and pass to :func:`kvbench.report.write_report`."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(cpus, CHART_WORKERS)
    if workers < 2 or "fork" not in mp.get_all_start_methods():
        return _InProcess()
    return _Workers(workers)


__all__ = ["CHART_WORKERS", "chart_pool"]
