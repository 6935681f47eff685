"""The driver of a cluster run: :func:`start_cluster` joins Ray, checks the placement against the cluster and
starts the workers (:class:`~kvbench.bench.executors.ray.worker.TrialWorker`, one Ray actor each, every one loading the
model before any trial runs); :class:`RayExecutor` hands them the sweep's units of work and writes every row they
stream back through the run's own :class:`~kvbench.bench.plans.sweep.Recorder` (fsync per row, resume, the run's lock).

Units (:func:`~kvbench.bench.executors.ray.placement.unit_count`): a planned sweep's (prompt length, batch size) points,
whole; otherwise the whole sweep. Each machine kind runs every unit; its workers take them in plan order, one at a
time. Rows get the kind's label as ``machine``; with two kinds or more, trial ids get ``@<label>``.

Faults: a worker that dies records the trial it was running (a server engine's: every request in flight) as
``error``, ``worker lost (host …)``, and its unit goes back to the queue for another worker (avoiding that host
when another one of its kind is alive), which runs the trial once more (``attempt`` 1) after what already finished;
the dead worker is replaced by a new one when the cluster can start it within ``executor.startup_timeout_s``. A
unit lost :data:`MAX_UNIT_LOSSES` times is given up, and the sweep ends with
:class:`~kvbench.errors.SweepIncomplete` once nothing else can run. Ctrl-C kills the workers (their servers die
with them), writes the rows already received and stops.

Server logs (:mod:`~kvbench.bench.executors.ray.logs`): each reaches the run's ``servers/`` as its server stops; a
stopped worker hands over the rest as it closes; a lost worker's folder is read, then removed, on its node; a log
that could not be recovered (its node gone) is ``log: null`` in run.json's ``servers``, with ``log_lost`` saying
why.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

from kvbench.bench.executors.ray.connect import connect, import_ray
from kvbench.bench.executors.ray.logs import RunLogs, salvage_folders, stop_workers
from kvbench.bench.executors.ray.lost import logs_lost_reason, lost_entry, lost_row, lost_warning
from kvbench.bench.executors.ray.placement import WorkerKind, worker_kinds
from kvbench.bench.executors.ray.pool import Worker, kill_workers, start_kinds, start_workers
from kvbench.bench.plans.plan import plan_for
from kvbench.errors import SweepIncomplete
from kvbench.results.rows import retry_due
from kvbench.scenario import Scenario

#: A unit whose workers died this many times is given up (its trials wait for ``--resume``).
MAX_UNIT_LOSSES = 3


@dataclass
class _Unit:
    kind: WorkerKind
    trials: list[Any] | None  # None: the whole sweep
    losses: int = 0
    avoid_host: str | None = None


@dataclass
class ClusterEngine:
    """What the driver knows of the workers' engine: where the trials run (``device``, e.g. ``ray: 2 cpu workers
    on 1 host``) and the model's weights in bytes, as the first worker loaded them (None for a server engine)."""

    device: str
    weights_bytes: int | None


def start_cluster(s: Scenario, where: str, address: str | None, progress: Any) -> RayExecutor:
    """Join the cluster (:func:`~kvbench.bench.executors.ray.connect.connect`), plan the workers
    (:func:`~kvbench.bench.executors.ray.placement.worker_kinds`) and start them all; the executor that runs the sweep.

    Raises:
        ClusterError: Ray missing, an unreachable address, a placement no node satisfies, or a machine kind none
            of whose workers started (naming why).
        PrepareError: a worker cannot run the scenario (its model, data or preflight), or runs another kvbench.
    """
    ray = import_ray()
    started = connect(address)
    try:
        kinds = worker_kinds(s, ray.nodes())
        from kvbench.bench.executors.ray.worker import TrialWorker

        remote = ray.remote(TrialWorker)
        data = s.model_dump(mode="json")
        workers = start_kinds(ray, remote, kinds, data, where, s.executor.startup_timeout_s, progress)
        return RayExecutor(s, kinds, workers, started, ray, remote, data, where, progress.warning)
    except BaseException:
        if started:
            ray.shutdown()
        raise


class RayExecutor:
    """Runs a sweep on a Ray cluster's workers (see the module docstring); built by :func:`start_cluster`.

    Attributes:
        engine: a :class:`ClusterEngine` (request ids, where the trials run).
        machines: per machine label (``""`` without placement) its workers' ids, hosts, GPUs and environments
            (run.json's ``machines``).
    """

    def __init__(self, s: Scenario, kinds: list[WorkerKind], workers: list[Worker], started: bool, ray: Any,
                 remote: Any, data: dict[str, Any], where: str, warn: Any = None):
        self.s, self.kinds, self.workers, self._started, self._ray = s, kinds, workers, started, ray
        self._warn = warn or (lambda text: None)
        self._remote, self._data, self._where = remote, data, where
        first = workers[0].info
        hosts = sorted({w.host for w in workers})
        self.engine = ClusterEngine(f"ray: {len(workers)} {'GPU' if kinds[0].gpu else 'CPU'} workers on "
                                    f"{len(hosts)} host{'s' if len(hosts) > 1 else ''} ({', '.join(hosts)})",
                                    first.get("weights_bytes"))
        #: the request stream's request ids, as the first worker built them ([] for a planned sweep)
        self.requests: list[str] = list(first["requests"])
        self.multi = len(kinds) > 1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._events: queue.Queue[tuple] = queue.Queue()
        self._failure: str | None = None
        self._lost_ids: set[str] = set()
        self._all_workers = list(workers)
        self._logs: RunLogs | None = None

    @property
    def machines(self) -> dict[str, Any]:
        """run.json's ``machines``: per label, ``workers``: each one's ``worker`` id, ``host``, ``gpu`` and
        ``environment`` (the workers started so far, lost ones included)."""
        out: dict[str, Any] = {}
        for w in self._all_workers:
            out.setdefault(w.kind.label or "", {"workers": []})["workers"].append(
                {"worker": w.info["where"]["worker"], "host": w.host, "gpu": w.info["where"]["gpu"],
                 "environment": w.info["environment"]})
        return out

    def remember(self, rows: Any) -> None:
        """Nothing to keep here: each unit's finished rows go to the worker that runs it."""

    def close(self) -> None:
        """Stop every worker (after it removed its files and handed over the server logs it had not sent) and
        leave a Ray instance this run started."""
        stop_workers(self._ray, self.workers, self._logs, again=False)
        self.workers = []
        self._settle_logs()
        if self._started:
            self._ray.shutdown()
            self._started = False

    # --- the sweep -------------------------------------------------------------------------------------------

    def _local_id(self, kind: WorkerKind, trial_id: str) -> str | None:
        if not self.multi:
            return trial_id
        suffix = f"@{kind.label}"
        return trial_id[:-len(suffix)] if trial_id.endswith(suffix) else None

    def _units(self) -> list[_Unit]:
        points = plan_for(self.s).units()
        if points is None:
            return [_Unit(k, None) for k in self.kinds]
        return [_Unit(k, p) for k in self.kinds for p in points]

    def sweep(self, scenario: Scenario, record: Any, trials: None = None) -> None:
        """Run every unit on the workers, writing rows (and run.json updates) in this thread as they arrive
        (``trials``: always None; the units are the scenario's).

        Raises:
            SweepIncomplete: trials are left that no worker can run (workers lost for good).
            RuntimeError: a worker's sweep raised (a bug), with its traceback.
        """
        self._record = record
        self._logs = RunLogs(record.run)
        self._lost_ids = set(record.lost)
        self._done = dict(record.rows)  # rows received (written or about to be): never handed out again
        self._queue = {k.label: deque(u for u in self._units() if u.kind is k and self._todo(u)) for k in self.kinds}
        self._busy = {k.label: 0 for k in self.kinds}
        self._given_up: list[_Unit] = []
        threads = [threading.Thread(target=self._serve, args=(w,), name=f"kvbench-worker-{i}", daemon=True)
                   for i, w in enumerate(self.workers)]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads) or not self._events.empty():
                try:
                    self._handle(self._events.get(timeout=0.2))
                except queue.Empty:
                    continue
                if self._failure:
                    break
        except BaseException:  # Ctrl-C or a write that failed: stop the workers, keep what they finished
            self._halt(threads)
            raise
        if self._failure:
            self._halt(threads)
            raise RuntimeError(f"a worker's sweep failed:\n{self._failure}")
        self._settle_logs()
        left = [u for q in self._queue.values() for u in q] + self._given_up
        if left:
            n = sum(len(u.trials) if u.trials is not None else 1 for u in left)
            raise SweepIncomplete(f"{n} {'trials' if all(u.trials is not None for u in left) else 'units'} could "
                                  "not run: their workers were lost and none could be started again; the finished "
                                  "trials are kept: resume the run to run the rest")

    def _todo(self, unit: _Unit) -> bool:
        if unit.trials is None:
            return True
        return any(self._id(unit.kind, t.trial_id) not in self._done for t in unit.trials)

    def _id(self, kind: WorkerKind, local_id: str) -> str:
        return f"{local_id}@{kind.label}" if self.multi else local_id

    def _halt(self, threads: list[threading.Thread]) -> None:
        """Stop every worker (keeping the logs each hands over), then write what had arrived."""
        self._stop.set()
        with self._lock:
            workers = list(self.workers)
        stop_workers(self._ray, workers, self._logs, again=True)
        for t in threads:
            t.join(timeout=30)
        self._drain()
        self._settle_logs()

    def _drain(self) -> None:
        """Write the rows, server logs and run.json updates that arrived before the stop (finished trials are
        kept)."""
        while True:
            try:
                kind, _, payload = self._events.get_nowait()
            except queue.Empty:
                return
            if kind in ("row", "lost"):
                self._record.write(*payload)
            elif kind == "file":
                with contextlib.suppress(OSError):
                    self._logs.write(*payload)
            elif kind == "meta":
                with contextlib.suppress(OSError), self._lock:
                    self._record.run.update(**self._logs.amend_fields(payload))

    def _settle_logs(self) -> None:
        """run.json's ``servers`` names no log the run folder lacks (see :meth:`RunLogs.settle`)."""
        if self._logs is not None:
            self._logs.settle("the run ended before its worker sent it (the worker was stopped or lost)", self._lock)

    def _handle(self, event: tuple) -> None:
        kind, worker, payload = event
        if kind == "row" or kind == "lost":
            self._record.write(*payload)
        if kind == "gone":
            self._gone(payload)
        elif kind == "status" and self._record.on_status:
            self._record.on_status(f"{worker.kind.label + ' ' if worker.kind.label else ''}{worker.host} pid "
                                   f"{worker.info['pid']}: {payload}")
        elif kind == "meta":
            with self._lock:
                self._record.run.update(**self._logs.amend_fields(payload))
        elif kind == "failed":
            self._failure = payload
        elif kind == "file":
            self._logs.write(*payload)

    def _gone(self, lost: dict[str, Any]) -> None:
        """A lost worker (its :func:`~kvbench.bench.executors.ray.lost.lost_entry`) into run.json's ``lost_workers``,
        its logs that could not be recovered marked in ``servers``, and a warning that says what it was doing."""
        if lost["folder"]:
            self._logs.worker_lost(lost["worker"], logs_lost_reason(lost))
        with self._lock:
            meta = self._record.run.meta
            fields = {"lost_workers": [*meta.get("lost_workers", []), lost]}
            self._record.run.update(**self._logs.amend_fields(
                {**fields, "servers": meta["servers"]} if isinstance(meta.get("servers"), list) else fields))
        self._warn(lost_warning(lost, self.s.run_kind == "server"))

    def _take(self, worker: Worker) -> _Unit | None | bool:
        """The next unit for ``worker``; None when its kind has nothing left; False: wait (a unit in flight may
        come back, or the only unit left avoids this host while another host can take it)."""
        label = worker.kind.label
        with self._lock:
            q = self._queue[label]
            for u in q:
                if u.avoid_host != worker.host or not any(
                        o.kind is worker.kind and o.host != worker.host for o in self.workers):
                    q.remove(u)
                    self._busy[label] += 1
                    return u
            return False if q or self._busy[label] else None

    def _finished(self, unit: _Unit) -> list[dict[str, Any]]:
        """The unit's finished rows as its worker knows them (local trial ids)."""
        ids = None if unit.trials is None else {t.trial_id for t in unit.trials}
        out = []
        with self._lock:
            for tid, row in self._done.items():
                local = self._local_id(unit.kind, tid)
                if local is not None and (ids is None or local in ids) and not retry_due(row):
                    out.append({**row, "trial_id": local})
        return out

    def _serve(self, worker: Worker) -> None:
        """One worker's thread: take units and stream their events to the driver's thread until none is left,
        replacing the worker when it dies; anything it raises stops the run (a bug)."""
        try:
            self._serve_units(worker)
        except BaseException:
            self._events.put(("failed", worker, traceback.format_exc()))

    def _serve_units(self, worker: Worker) -> None:
        while not self._stop.is_set():
            unit = self._take(worker)
            if unit is None:
                return
            if unit is False:
                self._stop.wait(0.2)
                continue
            if not self._run_unit(worker, unit):
                worker = self._replace(worker)
                if worker is None:
                    return

    def _run_unit(self, worker: Worker, unit: _Unit) -> bool:
        """Run ``unit`` on ``worker``; False when the worker died under it (the unit is back in the queue, or
        given up)."""
        ray, running = self._ray, {}  # local trial id -> its start row: the trial (or requests) in flight
        try:
            with self._lock:
                meta = dict(self._record.run.meta)
            stream = worker.actor.sweep.remote(unit.trials, self._finished(unit), meta, self._logs.taken())
            for ref in stream:
                what, payload = ray.get(ref)
                if what == "start":
                    running[payload["trial_id"]] = payload
                elif what == "row":
                    row, samples = payload
                    running.pop(row["trial_id"], None)
                    row = {**row, "trial_id": self._id(unit.kind, row["trial_id"]), "machine": unit.kind.label}
                    samples = [{**x, "trial_id": row["trial_id"]} for x in samples]
                    with self._lock:
                        if not retry_due(row):
                            self._done[row["trial_id"]] = row
                    self._events.put(("row", worker, (row, samples)))
                elif what in ("status", "meta", "failed", "file"):
                    if what == "file":
                        self._logs.expect(payload[0])
                    self._events.put((what, worker, payload))
                if what in ("done", "failed"):
                    break
        except ray.exceptions.RayTaskError as exc:  # the stream itself raised: a bug
            self._events.put(("failed", worker, str(exc)))
            return True
        except ray.exceptions.RayError as exc:  # the actor, its process or its node died
            if self._stop.is_set():
                return True
            self._lost(worker, unit, list(running.values()), exc)
            return False
        with self._lock:
            self._busy[unit.kind.label] -= 1
        return True

    def _lost(self, worker: Worker, unit: _Unit, running: list[dict[str, Any]], exc: Exception) -> None:
        """Record what ``worker`` was running (``running``: the start rows of the trial, or of a server's requests,
        in flight) as lost (run.json's ``lost_workers`` lists every loss, a trial running or not), recover its
        server logs from its node (then remove its folder there) and put its unit back (or give it up)."""
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        folder = worker.info.get("folder")
        [(files, problem)] = salvage_folders(self._ray, [(worker.info["node"], folder)]) if folder else [([], None)]
        for name, data in files:  # written (in the driver's thread) before the unit can be taken again
            self._logs.expect(name)
            self._events.put(("file", worker, (name, data)))
        ids = [self._id(unit.kind, r["trial_id"]) for r in running]
        self._events.put(("gone", worker, lost_entry(worker, unit.kind.label, why, ids, files, problem)))
        for tid, started in zip(ids, running):
            row = lost_row(started, worker, tid, unit.kind.label, why)
            with self._lock:
                if tid in self._lost_ids:  # its retry died too: that is its row
                    row["attempt"] = 1
                    self._done[tid] = row
                self._lost_ids.add(tid)
            self._events.put(("lost", worker, (row, [])))  # before the unit can be taken again: written first
        with self._lock:
            unit.losses += 1
            unit.avoid_host = worker.host
            self._busy[unit.kind.label] -= 1
            if unit.losses < MAX_UNIT_LOSSES:
                self._queue[unit.kind.label].appendleft(unit)
            else:
                self._given_up.append(unit)

    def _replace(self, dead: Worker) -> Worker | None:
        """A new worker of the dead one's kind (None when none starts within the startup timeout)."""
        with self._lock:
            if dead in self.workers:
                self.workers.remove(dead)
        if self._stop.is_set():
            return None
        ok, problems = start_workers(self._ray, self._remote, dead.kind, 1, self._data, self._where,
                              self.s.executor.startup_timeout_s)
        if not ok:
            if self._record.on_status:
                self._events.put(("status", dead, f"no new worker: {problems[0]}"))
            return None
        with self._lock:
            if self._stop.is_set():
                kill_workers(self._ray, ok, tidy=False)
                return None
            self.workers.append(ok[0])
            self._all_workers.append(ok[0])
            machines = self.machines
        self._events.put(("meta", ok[0], {"machines": machines}))  # run.json lists the new worker too
        return ok[0]


__all__ = ["ClusterEngine", "MAX_UNIT_LOSSES", "RayExecutor", "start_cluster"]
