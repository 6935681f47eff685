"""Which workers a cluster run starts: per machine kind of the scenario's ``placement`` (one kind, unnamed,
without it), the Ray resources each worker asks for and how many of them the cluster's nodes hold.

A worker is one Ray actor that loads the model once and runs trials one at a time: on a GPU, one per GPU
(``num_gpus: 1``) so two trials never share a device; on CPUs, ``executor.cpus_per_worker`` CPUs each. A worker
kind's count is what the alive nodes that have its resources can hold at once (from their totals in
``ray.nodes()``), at most ``executor.workers`` and at most the units of work there are (:func:`unit_count`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvbench.errors import ClusterError
from kvbench.scenario import Scenario
from kvbench.bench.plans.plan import plan_for


@dataclass(frozen=True)
class WorkerKind:
    """One machine kind's workers.

    Attributes:
        label: the placement's label (None: the scenario has no placement).
        options: the Ray actor options of each worker (``num_cpus``, ``num_gpus``, ``resources``).
        count: how many workers to start.
        gpu: whether each worker holds a GPU (else it runs on CPUs).
    """

    label: str | None
    options: dict[str, Any]
    count: int
    gpu: bool


def unit_count(s: Scenario) -> int:
    """How many units of work a kind's workers share: a planned sweep's (prompt length, batch size) points, each
    run whole by one worker (its ``none`` reference, warm-ups and interleaved modes together); a reuse workload,
    a capacity search or a server engine is one unit (its trials depend on each other: the plan says which
    sweeps divide, :meth:`~kvbench.bench.plans.plan.Plan.units`)."""
    units = plan_for(s).units()
    return 1 if units is None else len(units)


def _wants_gpu(s: Scenario, nodes: list[dict[str, Any]]) -> bool:
    if s.device == "cpu":
        return False
    if s.device == "cuda":
        return True
    if s.device.startswith("cuda:"):
        raise ClusterError(f"device: {s.device} names one GPU of one machine; on a cluster give cuda (a GPU per "
                           "worker) or auto")
    return any(n["Resources"].get("GPU", 0) >= 1 for n in nodes)  # auto


def _describe(nodes: list[dict[str, Any]]) -> str:
    parts = []
    for n in nodes:
        res = n["Resources"]
        extra = sorted(k for k in res if k not in ("CPU", "GPU", "memory", "object_store_memory")
                       and not k.startswith("node:"))
        parts.append(f"{n.get('NodeManagerHostname') or n.get('NodeManagerAddress')}: {res.get('CPU', 0):g} CPU, "
                     f"{res.get('GPU', 0):g} GPU" + (f", {', '.join(extra)}" if extra else ""))
    return "; ".join(parts) or "no alive node"


def worker_kinds(s: Scenario, nodes: list[dict[str, Any]]) -> list[WorkerKind]:
    """The workers to start for scenario ``s`` on a cluster whose nodes are ``nodes`` (``ray.nodes()``: dicts
    with ``Alive``, ``Resources``, ``NodeManagerHostname``).

    Raises:
        ClusterError: a placement (or, without one, the device) that no alive node satisfies, naming what each
            node has; a device that names one GPU (``cuda:N``).
    """
    alive = [n for n in nodes if n.get("Alive")]
    ex = s.executor
    kinds = s.placement or [None]
    units = unit_count(s)
    out = []
    for i, p in enumerate(kinds):
        need = p.ray_resources() if p is not None else {}
        fit = [n for n in alive if all(n["Resources"].get(k, 0) >= v for k, v in need.items())]
        gpu = _wants_gpu(s, fit if p is not None else alive)
        per_worker = {"CPU": ex.cpus_per_worker, **({"GPU": 1} if gpu else {}), **need}
        count = sum(min(math.floor(n["Resources"].get(k, 0) / v + 1e-9) for k, v in per_worker.items()) for n in fit)
        where = f"placement[{i}] ({p.label})" if p is not None else f"device {s.device}"
        if count == 0:
            asked = ", ".join(f"{k} {v:g}" + (" (executor.cpus_per_worker)" if k == "CPU" else "")
                              for k, v in per_worker.items())
            raise ClusterError(f"{where}: no node of the Ray cluster can hold a worker ({asked}); the cluster has: "
                               f"{_describe(alive)}")
        count = min(count, units, ex.workers or count)
        options = {"num_cpus": ex.cpus_per_worker, "num_gpus": 1 if gpu else 0}
        if need:
            options["resources"] = dict(need)
        out.append(WorkerKind(p.label if p is not None else None, options, count, gpu))
    return out


__all__ = ["WorkerKind", "unit_count", "worker_kinds"]
