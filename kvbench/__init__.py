"""kvbench: measure what KV-cache offload really does for a model, a machine and a workload.

The library does everything the ``kvbench`` command does, minus parsing flags and printing::

    import kvbench

    run = kvbench.run_scenario("scenarios/smoke.yaml", out="results")      # the sweep: trials.jsonl, run.json
    results = kvbench.load_results(run.run_dir)                            # Results: .trials, every trial
    kvbench.write_report(results, run.run_dir / "report")                  # tables, charts, Markdown, HTML
    costs = kvbench.cost_report(results, "costs", kvbench.Prices(gpu_per_hour=2.0))
    m = kvbench.break_even_report(results, "map", kvbench.Prices(2.0))    # shared_prefix runs: the map
    p = kvbench.plan("llama-3.1-8b", prompt_tokens=32768, batch=8)         # analytic: no GPU, no weights
    sim = kvbench.simulate("trace.jsonl", model="llama-3.1-8b")            # a trace's hit rates, every capacity

Each name is imported on first use, so ``import kvbench`` (and ``kvbench validate``) loads neither torch nor
pandas. Errors a user can cause are :class:`kvbench.errors.UserError`; see :mod:`kvbench.errors`.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvbench.version import __version__

#: Public name → the module that defines it.
_ENTRYPOINTS = {
    "run_scenario": "kvbench.bench.run",
    "RunResult": "kvbench.bench.run",
    "RunProgress": "kvbench.bench.run",
    "load_scenario": "kvbench.scenario",
    "Scenario": "kvbench.scenario",
    "load_results": "kvbench.results.load",
    "Results": "kvbench.results.load",
    "write_report": "kvbench.report.write",
    "cost_report": "kvbench.report.cost",
    "break_even_report": "kvbench.report.break_even",
    "write_llmd": "kvbench.report.llmd",
    "peer_cost_report": "kvbench.report.peer_cost",
    "Prices": "kvbench.analysis.cost",
    "read_trace": "kvbench.traces.read",
    "size_tiers": "kvbench.report.simulation_cost",
}

__all__ = ["__version__", "plan", "simulate", *_ENTRYPOINTS]


def __dir__() -> list[str]:
    return sorted({*globals(), *_ENTRYPOINTS})


def __getattr__(name: str) -> Any:
    if name in _ENTRYPOINTS:
        return getattr(importlib.import_module(_ENTRYPOINTS[name]), name)
    raise AttributeError(f"module 'kvbench' has no attribute {name!r}")


def plan(model: str, **options: Any) -> Any:
    """What ``kvbench plan`` computes (:func:`kvbench.report.plan.plan`: on ``tp`` GPUs of a preset, the reuse
    tier's TTFT restoring against recomputing, and kvbench's streaming offload: KV per sequence, the largest batch
    per mode, a decode-step roofline), with the host→device bandwidth ``kvbench env`` last measured
    (:func:`kvbench.bench.telemetry.machine.last_link_probe`) where it measured the same kind of GPU, unless
    ``link_gbps`` is given.

    Args:
        model: a preset (``kvbench list presets``), a config.json or a model directory.
        **options: the other arguments of :func:`kvbench.report.plan.plan` (``prompt_tokens``, ``batch``,
            ``dtype``, ``gpu``, ``tp``, ``gpu_mem``, ``host_mem``, ``window``, ``link_gbps``, ``hbm_gbps``,
            ``tflops``, ``gpu_price``).

    Returns:
        A :class:`kvbench.report.plan.Plan`.

    Raises:
        kvbench.errors.UserError: a model that cannot be found or read, or a figure out of range.
    """
    from kvbench.bench.telemetry.machine import last_link_probe
    from kvbench.report.plan import plan as plan_model

    return plan_model(model, **{"link_probe": last_link_probe, **options})


def simulate(trace: str, **options: Any) -> Any:
    """What ``kvbench simulate`` computes (:func:`kvbench.report.simulation.simulate_trace`): the trace read and
    checked, its prefix-cache hit rates at every capacity from one pass, in bytes of ``model``'s KV when given,
    split over tiers when ``device_tokens`` is given; :func:`kvbench.size_tiers` then prices each host tier size.

    Args:
        trace: a Mooncake or Bailian JSONL, or a CSV/JSONL of the columns timestamp (ms), input_length,
            output_length, hash_ids.
        **options: the other arguments of :func:`kvbench.report.simulation.simulate_trace` (``fmt``,
            ``block_tokens``, ``policy``, ``model``, ``tp``, ``dtype``, ``device_tokens``, ``host_tokens``,
            ``disk_tokens``, ``window_args``, ``max_bytes``).

    Returns:
        A :class:`kvbench.report.simulation.Simulation` (``.curve.rates(capacity_blocks)``, ``.curve.ceiling``).

    Raises:
        kvbench.errors.UserError: a trace that cannot be read (one line per faulty line), a model that cannot be
            found, a value out of range.
    """
    from kvbench.report.simulation import simulate_trace

    return simulate_trace(trace, **options)
