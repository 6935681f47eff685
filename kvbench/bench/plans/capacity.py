"""Capacity search: per offload mode, the largest batch (``batch_sizes: auto``) or the longest prompt
(``prompt_tokens: auto``) that completes within the device budget, by doubling then bisection.

A value *fits* when its trial ends ``ok``: it ran to the end and its device KV peak stayed within the scenario's
``budget`` (on CUDA without a budget: it did not run out of device memory). ``over_budget`` and ``oom`` do not fit;
any other status (``error``, ``skipped``) stops that mode's search with the reason. Every probe is a recorded trial
(repeat 0); the capacity is then measured ``repeats`` times in all, so its throughput — the figure
``kvbench cost`` must use — has a spread. Before each probe of an offload mode, ``none`` runs at the same point (if
it has not already) so that the probe's greedy ids are checked against it: on CPU ``none`` over the budget still
runs to the end, as in any sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvbench.bench.trial import TrialSpec, bounds, reference_first
from kvbench.results.rows import NO_FIT, Status
from kvbench.scenario import Scenario, ScenarioMode


@dataclass
class SearchResult:
    """One search.

    Attributes:
        capacity: the largest value that fit, or None when even the first probe did not.
        first_failure: the smallest value that did not fit (None when every probe up to the limit fit).
        probes: ``(value, status)`` in the order probed.
        stopped: why the search ended, in words.
    """

    capacity: int | None
    first_failure: int | None
    probes: list[tuple[int, str]] = field(default_factory=list)
    stopped: str = ""


def search(probe: Callable[[int], str], start: int, limit: int, resolution: int = 1) -> SearchResult:
    """Largest value in ``[start, limit]`` for which ``probe`` returns ``ok``, assuming larger values need more
    memory: probe ``start``, ``2 × start``, ... (the last capped at ``limit``) until one does not fit, then bisect
    between the last fit ``lo`` and the first failure ``hi`` until ``hi − lo ≤ resolution``.

    Args:
        probe: runs a trial at a value and returns its status (``ok`` fits, ``over_budget``/``oom`` do not,
            anything else stops the search).
        start, limit: the range, ``1 ≤ start ≤ limit``.
        resolution: how close fit and failure must be to stop bisecting (1 finds the exact capacity).

    Returns:
        A :class:`SearchResult`; at most ``log2(limit / start) + 1 + log2((hi − lo) / resolution)`` probes.

    Raises:
        ValueError: ``start`` or ``resolution`` below 1, or ``start > limit``.
    """
    if start < 1 or resolution < 1 or start > limit:
        raise ValueError(f"need 1 <= start <= limit and resolution >= 1 (got start {start}, limit {limit}, "
                         f"resolution {resolution})")
    probes: list[tuple[int, str]] = []

    def run(v: int) -> str:
        status = probe(v)
        probes.append((v, status))
        return status

    lo: int | None = None
    hi: int | None = None
    v = start
    while True:
        status = run(v)
        if status == Status.OK:
            lo = v
            if v >= limit:
                return SearchResult(lo, None, probes, f"reached capacity.max {limit}: it may fit more")
            v = min(2 * v, limit)
        elif status in NO_FIT:
            hi = v
            break
        else:
            return SearchResult(lo, None, probes, f"stopped: {v} ended {status}")
    fail_status = status
    while lo is not None and hi - lo > resolution:
        mid = (lo + hi) // 2
        status = run(mid)
        if status == Status.OK:
            lo = mid
        elif status in NO_FIT:
            hi, fail_status = mid, status
        else:
            return SearchResult(lo, hi, probes, f"stopped: {mid} ended {status}")
    if lo is None:
        return SearchResult(None, hi, probes, f"nothing fits: the first value {hi} ended {fail_status}")
    exact = "" if hi - lo <= 1 else f" (to within {hi - lo})"
    return SearchResult(lo, hi, probes, f"{hi} did not fit ({fail_status}){exact}")



def search_sweep(s: Scenario, record: Callable[[TrialSpec], dict[str, Any]],
                 spec: Callable[[int, int, ScenarioMode, int], TrialSpec],
                 longest_prompt: int, on_capacity: Callable[[list[dict[str, Any]]], None] | None = None,
                 ) -> list[dict[str, Any]]:
    """Run the capacity search of every mode at every fixed value (each prompt length for a batch search, each
    batch size for a prompt search), ``none`` first.

    Args:
        record: runs (or, on resume, looks up) one trial spec and returns its row.
        spec: ``spec(prompt_tokens, batch_size, mode, repeat)`` → a trial spec.
        longest_prompt: the model's longest prompt in tokens (see :func:`bounds`).
        on_capacity: called with the list so far after each search, to save it.

    Returns:
        One dict per (fixed value, mode): ``mode``, ``mode_label``, ``searched`` (``batch_size`` or
        ``prompt_tokens``), ``prompt_tokens`` or ``batch_size`` (the fixed one), ``capacity`` (None: nothing fit),
        ``first_failure``, ``probes`` (``[value, status]`` pairs), ``stopped``, ``trial_ids`` (the trials at
        capacity, all repeats).
    """
    field_name = s.searched
    start, limit, resolution = bounds(s, longest_prompt)
    fixed_values = s.prompt_tokens if field_name == "batch_size" else s.batch_sizes
    if not isinstance(fixed_values, list):  # a search varies one field at a fixed list of the other
        raise ValueError(f"{s.name} searches no field at a fixed list of the other")
    modes = reference_first(s.modes)
    reference = next((m for m in modes if m.kind == "none"), None)
    results: list[dict[str, Any]] = []
    for fixed in fixed_values:
        def at(v: int, mode: ScenarioMode, r: int, fixed: int = fixed) -> TrialSpec:
            return spec(fixed, v, mode, r) if field_name == "batch_size" else spec(v, fixed, mode, r)

        for mode in modes:
            def measure(v: int, r: int, mode: Any = mode) -> dict[str, Any]:
                if reference is not None and mode is not reference:
                    record(at(v, reference, r))  # the ids this trial must reproduce
                return record(at(v, mode, r))

            res = search(lambda v: measure(v, 0)["status"], start, limit, resolution)
            ids = []
            if res.capacity is not None:
                ids = [measure(res.capacity, r)["trial_id"] for r in range(s.repeats)]
            fixed_key = "prompt_tokens" if field_name == "batch_size" else "batch_size"
            results.append({"mode": mode.kind, "mode_label": mode.label, "searched": field_name, fixed_key: fixed,
                            "capacity": res.capacity, "first_failure": res.first_failure,
                            "probes": [list(p) for p in res.probes], "stopped": res.stopped, "trial_ids": ids})
            if on_capacity is not None:
                on_capacity(results)
    return results
