"""A sweep of simulations: every trace × policy simulated in one pass each (kvbench.traces.simulate), locally or as
tasks on a Ray cluster when the traces outgrow one machine, and each curve priced in bytes of every model's KV.

The traces are read and checked here, on the driver (a faulty file stops the sweep before anything starts), and
reach Ray's workers through its object store (a worker needs kvbench installed, not the files). A hit rate depends
on the trace and the policy only; the models turn capacities into bytes, on the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.report.simulation import kv_bytes_per_token, table_capacities
from kvbench.traces.read import read_trace
from kvbench.traces.simulate import POLICIES, simulate
from kvbench.traces.trace import Trace

#: Executors a sweep runs on.
EXECUTORS = ("local", "ray")


def curve_rows(trace: Trace, policy: str) -> list[dict[str, Any]]:
    """One simulation of the sweep: the hit rates of ``trace`` under ``policy`` at the capacities a table shows
    (:func:`~kvbench.report.simulation.table_capacities`: 1, 3, 10... blocks, then the unlimited cache)."""
    curve = simulate(trace, policy)
    caps = table_capacities(curve.distinct_blocks)
    blocks, tokens = curve.rates(caps)
    return [{"trace": trace.source, "policy": policy, "capacity_blocks": int(c),
             "capacity_tokens": int(c) * trace.block_tokens, "hit_rate_blocks": float(b), "hit_rate_tokens": float(t),
             "unlimited": int(c) == curve.distinct_blocks} for c, b, t in zip(caps, blocks, tokens)]


def _on_ray(jobs: list[tuple[Trace, str]], address: str | None) -> list[list[dict[str, Any]]]:
    """``curve_rows`` of every job as Ray tasks (one CPU each), each trace put in the object store once."""
    from kvbench.bench.executors.ray.connect import connect, import_ray

    ray = import_ray()
    connected = connect(address)
    try:
        task = ray.remote(num_cpus=1)(curve_rows)
        refs: dict[int, Any] = {}
        futures = [task.remote(refs.setdefault(id(t), ray.put(t)), p) for t, p in jobs]
        return list(ray.get(futures))
    finally:
        if connected:
            ray.shutdown()


def sweep_simulations(paths: Sequence[str | Path], policies: Sequence[str] = ("lru",),
                      models: Sequence[str | None] = (None,), tp: int = 1, dtype: str = "bf16", fmt: str = "auto",
                      block_tokens: int | None = None, executor: str = "local",
                      address: str | None = None) -> pd.DataFrame:
    """Every trace of ``paths`` × every policy of ``policies``, simulated on ``executor`` (``ray``: tasks on the
    cluster at ``address``, ``auto`` or ``HOST:PORT``, None starting a local instance), priced in bytes of each of
    ``models`` (None: no bytes).

    Returns:
        One row per trace, policy, model and capacity: :func:`curve_rows`' columns, ``model`` and
        ``capacity_bytes`` (KV of one copy of the model at ``tp`` and ``dtype``; NaN without a model).

    Raises:
        kvbench.errors.BadFile: a trace that cannot be read (its faulty lines).
        kvbench.errors.BadParameter: an unknown policy, executor, dtype or model.
        kvbench.errors.ClusterError: Ray is missing or its cluster cannot be joined.
    """
    from kvbench.errors import BadParameter

    if executor not in EXECUTORS:
        raise BadParameter(f"{{executor}} {executor!r} is not one of: {', '.join(EXECUTORS)}", "executor")
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise BadParameter(f"{{policies}} {', '.join(bad) or 'none'}: give one or more of {', '.join(POLICIES)}",
                           "policies")
    per_token = {m: kv_bytes_per_token(m, tp, dtype) if m is not None else None for m in models}
    traces = [read_trace(p, fmt, block_tokens) for p in paths]
    jobs = [(t, p) for t in traces for p in policies]
    results = _on_ray(jobs, address) if executor == "ray" else [curve_rows(t, p) for t, p in jobs]
    rows = [{**r, "model": m, "capacity_bytes": r["capacity_tokens"] * b if b is not None else float("nan")}
            for part in results for r in part for m, b in per_token.items()]
    return pd.DataFrame(rows)
