"""A worker lost in a cluster run (its process or its node died under a unit): its entry in run.json's
``lost_workers``, the error row of each trial (or server request) it had in flight, and the words the driver
warns with and marks its unrecoverable logs with."""

from __future__ import annotations

from typing import Any

from kvbench.bench.executors.ray.pool import Worker
from kvbench.results.rows import WORKER_LOST, Status
from kvbench.results.run_dir import utc_now


def lost_entry(worker: Worker, machine: str, why: str, in_flight: list[str], files: list[tuple[str, bytes]],
               problem: str | None) -> dict[str, Any]:
    """run.json's ``lost_workers`` entry of ``worker``: its ``worker`` id, ``host``, ``pid``, ``machine``, ``at``
    (UTC), ``reason`` (Ray's first line, ``why``), ``trial_id`` (the first of ``in_flight``, None when nothing was
    running), ``in_flight`` (every trial or server request that was running: run ids), ``folder`` (its server
    logs' folder on its node, None without a server engine), ``logs_recovered`` (the names read from it) and
    ``logs_problem`` (why it could not be read, None when it could)."""
    return {"worker": worker.info["where"]["worker"], "host": worker.host, "pid": worker.info["pid"],
            "machine": machine, "at": utc_now(), "reason": why, "trial_id": in_flight[0] if in_flight else None,
            "in_flight": list(in_flight), "folder": worker.info.get("folder"),
            "logs_recovered": sorted(name for name, _ in files), "logs_problem": problem}


def lost_row(started: dict[str, Any], worker: Worker, trial_id: str, machine: str, why: str) -> dict[str, Any]:
    """The ``error`` row of a trial (or request) ``worker`` had in flight: its ``started`` fields, the worker's
    placement, message ``worker lost (host …, pid …): <why>`` (:data:`~kvbench.results.rows.WORKER_LOST`: it
    runs once more)."""
    return {**started, **worker.info["where"], "trial_id": trial_id, "machine": machine, "status": Status.ERROR,
            "message": f"{WORKER_LOST} (host {worker.host}, pid {worker.info['pid']}): {why}"}


def logs_lost_reason(lost: dict[str, Any]) -> str:
    """Why the logs of a lost worker (its :func:`lost_entry`) that the run folder lacks are lost."""
    head = f"its worker (host {lost['host']}, pid {lost['pid']}) was lost, "
    if lost["logs_problem"]:
        return head + f"and its folder there could not be read: {lost['logs_problem']}"
    return head + "and the log was not in its folder"


def lost_warning(lost: dict[str, Any], server: bool) -> str:
    """The warning of a lost worker (its :func:`lost_entry`; ``server``: a server engine's): what it was doing
    (the trial running, or the requests in flight), Ray's reason, what became of its logs."""
    ids = lost["in_flight"]
    if ids:
        doing = f"mid-request ({', '.join(ids)} in flight)" if server else f"running {', '.join(ids)}"
    else:
        doing = "between requests (a server starting or stopping, or a warm-up)" if server else \
            "between trials or in a warm-up"
    logs = (f"; its server logs could not be recovered: {lost['logs_problem']}" if lost["logs_problem"] else
            f"; {len(lost['logs_recovered'])} server logs recovered from its folder" if lost["logs_recovered"]
            else "")
    return (f"worker {lost['worker'][:12]} on {lost['host']} (pid {lost['pid']}) was lost {doing}: "
            f"{lost['reason']}{logs}; its unit goes to another worker")


__all__ = ["logs_lost_reason", "lost_entry", "lost_row", "lost_warning"]
