"""A cluster worker: the body of one Ray actor. It loads the scenario's model once (or, for a server engine,
its tokenizer and requests; each server then starts and stops in this worker), probes its own machine once
(:func:`~kvbench.bench.telemetry.machine.environment`: on CUDA the link bandwidth) and runs the units of work the driver
hands it, one trial at a time, through the same :class:`~kvbench.bench.plans.sweep.Recorder` and
:meth:`~kvbench.bench.executors.local.LocalExecutor.sweep` as a local run: warm-ups, the ``none``-first order and the
interleaving of modes hold within each worker. Every row, status and run.json update streams back to the driver
(:meth:`TrialWorker.sweep`), which writes them; a worker writes no file of the run. A server engine's worker
keeps its servers' logs in a folder of its own (:mod:`~kvbench.bench.executors.ray.watch`), made at its first unit,
each log sent as its server stops, the folder removed when the worker closes (or, lost, by the driver's
:func:`~kvbench.bench.executors.ray.watch.salvage`)."""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvbench.bench.executors.ray.watch import FOLDER_PREFIX, LOG_NAME, MAX_LOG_BYTES, EngineWatch, LogShipper


def _own_priority() -> int:
    """Bring this process to nice 0 where it runs below it (Ray starts workers at nice 15 unless the cluster was
    started with ``RAY_worker_niceness=0``; raising a priority needs the privilege to); its nice value after."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:  # no privilege: the driver warns
            return nice
    return os.getpriority(os.PRIO_PROCESS, 0)


class _WorkerRun:
    """The run as a worker's Recorder sees it: run.json's ``meta`` (a copy), the unit's finished rows, and
    ``record_trial``/``update`` sent to the driver as events instead of written."""

    def __init__(self, meta: dict[str, Any], finished: list[dict[str, Any]], send: Callable[[tuple], None]):
        self.meta, self._finished, self._send = meta, finished, send

    def finished_trials(self) -> list[dict[str, Any]]:
        return list(self._finished)

    def record_trial(self, row: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        self._send(("row", (row, samples)))

    def update(self, **fields: Any) -> None:
        self.meta.update(fields)
        self._send(("meta", fields))


class TrialWorker:
    """One worker (wrapped by ``ray.remote`` in :mod:`kvbench.bench.executors.ray.driver`).

    Args:
        scenario: the scenario as run.json stores it (``Scenario.model_dump(mode="json")``).
        where: the scenario file or run.json to name in messages.

    A failure to load is not raised (Ray would only say the actor died): :meth:`ready` reports it.
    """

    def __init__(self, scenario: dict[str, Any], where: str):
        self.problem: str | None = None
        self.where: dict[str, Any] = {}
        self.env: dict[str, Any] = {}
        self.node: str | None = None
        #: this worker's folder (made at its first unit; a server engine's only)
        self._root: Path | None = None
        self._made = False
        self._watch: EngineWatch | None = None
        try:
            self._load(scenario, where)
        except Exception as exc:
            from kvbench.errors import UserError
            from kvbench.models.load import one_line

            self.problem = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {one_line(exc)}"

    def _load(self, scenario: dict[str, Any], where: str) -> None:
        import ray

        from kvbench.bench.telemetry.machine import environment, where_fields
        from kvbench.models import resolve_device
        from kvbench.scenario import parse_scenario

        self.s = parse_scenario(scenario, where)
        self.nice = _own_priority()
        device = resolve_device(self.s.device)
        self.device = str(device)
        self.env = environment(device)
        self.where = where_fields(self.env, worker=ray.get_runtime_context().get_actor_id())
        self.node = ray.get_runtime_context().get_node_id()
        from kvbench.bench.executors.local import LocalExecutor
        from kvbench.bench.plans.plan import plan_for

        family = plan_for(self.s).family
        if family.own_files:
            # the servers' logs, on this worker's disk; made at the first unit, so a worker that never runs one
            # (it failed to load, or was stopped while starting) leaves nothing behind
            self._root = Path(tempfile.gettempdir()) / f"{FOLDER_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        engine, _ = family.load(self.s, Path(where), self._root or Path(where), self.env)
        self.executor: Any = LocalExecutor(self.s, engine, self.env)
        if family.own_files:
            self._shipper = LogShipper(self._root)
            self._watch = EngineWatch(engine, self._shipper, self.where)
        problems = engine.preflight()
        if problems:
            self.problem = f"{where}: cannot run on {self.where['host']}:\n" + "\n".join(problems)

    def ready(self) -> dict[str, Any]:
        """What the driver needs before the first trial: ``problem`` (None when the worker can run), ``where``
        (its rows' placement fields), ``environment`` (its probe), ``kvbench`` (the version), ``pid``, ``nice``
        (its process's nice value: above 0, other processes take its CPU first), ``device``, ``weights_bytes``
        (None for a server engine), the workload's ``requests`` (ids; a reuse workload's or a server run's
        stream), ``node`` (its Ray node's id) and ``folder`` (a server engine's folder on that node, else None:
        what :func:`~kvbench.bench.executors.ray.watch.salvage` removes when the worker is lost)."""
        from kvbench.version import __version__

        source_engine = getattr(getattr(self, "executor", None), "engine", None)
        source = getattr(source_engine, "source", None)
        return {"problem": self.problem, "where": self.where, "environment": self.env, "kvbench": __version__,
                "nice": getattr(self, "nice", None), "pid": os.getpid(), "device": getattr(self, "device", None),
                "weights_bytes": getattr(source_engine, "weights_bytes", None),
                "requests": [q.id for q in getattr(source, "requests", None) or []], "node": self.node,
                "folder": None if self._root is None else str(self._root)}

    def sweep(self, trials: list[Any] | None, finished: list[dict[str, Any]], meta: dict[str, Any],
              logs_taken: list[str] = ()) -> Iterator[tuple[str, Any]]:
        """Run one unit of work (``trials`` of a planned sweep, in order; None: the whole sweep of a reuse
        workload, a capacity search or a server engine) given the unit's ``finished`` rows (skipped, and the
        ``none`` reference where they are), run.json's ``meta`` and the server logs the run already has
        (``logs_taken``: names in its ``servers/`` or its run.json, which this worker's servers do not reuse). A
        Ray streaming generator of events: ``("start", row)`` (a trial, or a server's measured request, begins:
        its fields as a row; several requests may be in flight at once), ``("row", (row, samples))``,
        ``("status", text)``, ``("meta", fields)`` (a run.json update), ``("file", (name, bytes))`` (a server's
        log, at most :data:`~kvbench.bench.executors.ray.watch.MAX_LOG_BYTES` of its end, as its server stops; any
        other at the unit's end), then ``("done", None)``, or ``("failed", traceback)`` when the sweep raised (a
        bug: the driver stops the run)."""
        from kvbench.bench.rows.row import base_row
        from kvbench.bench.plans.sweep import Recorder

        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        if self._root is not None:
            if not self._made:
                self._root.mkdir(mode=0o700)  # a new name (pid and 48 random bits): never someone else's folder
                self._made = True
            self._shipper.begin(list(logs_taken))

        def body() -> None:
            try:
                record = Recorder(self.s, _WorkerRun(dict(meta), finished, events.put), self.executor,
                                  on_status=lambda text: events.put(("status", text)), where=self.where,
                                  on_start=lambda t: events.put(("start", self._watch.start_row(t) if self._watch
                                                                 else base_row(self.s, t, {}))))
                if self._watch is not None:
                    self._watch.begin(events.put)
                try:
                    self.executor.sweep(self.s, record, trials)
                finally:
                    if self._watch is not None:
                        self._watch.end()
                        for found in self._shipper.rest():
                            events.put(("file", found))
                events.put(("done", None))
            except BaseException:
                events.put(("failed", traceback.format_exc()))

        threading.Thread(target=body, name="kvbench-unit", daemon=True).start()
        while True:
            event = events.get()
            yield event
            if event[0] in ("done", "failed"):
                return

    def close(self, again: bool = False) -> list[tuple[str, bytes]]:
        """Remove what this worker made on its machine (its folder: the servers' logs and slots), which may run
        while a unit still streams (the run was stopped).

        Args:
            again: also return the logs sent already (the run was stopped: the events that carried them may not
                have reached the driver).

        Returns:
            The server logs not sent yet, ``(name, bytes)`` each (a running server's: what it wrote so far).
        """
        if self._root is None or not self._made:
            return []
        rest = self._shipper.rest(again)
        shutil.rmtree(self._root, ignore_errors=True)
        self._made = False
        return rest


__all__ = ["LOG_NAME", "MAX_LOG_BYTES", "TrialWorker"]
