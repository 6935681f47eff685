"""llm-d Benchmark Reports out: one report (version 0.2.1 of llm-d-benchmark's schema,
``llmdbenchmark/analysis/benchmark_report/br_v0_2_1_json_schema.json``) per mode of a run, so that llm-d's tools
and dashboards read kvbench's measurements.

A report's unit is one workload under one configuration: a server run's mode at one concurrency (its label,
``prefix-cache@c4``), an in-process run's mode at one prompt length and batch. Fields, in the schema's units:
``results.request_performance.aggregate`` holds TTFT (``s``), TPOT, NTPOT and ITL (``s/token``; ITL over every
inter-chunk gap), request latency (``s``), input and output lengths (``count``) and the rates (``tokens/s``,
``queries/s``): percentiles by the ``higher`` method (a value that happened, as kvbench's own tables), so an
export read back gives kvbench's medians. ``results.session_performance`` is filled for multi-turn runs (a
session = one conversation of one repeat), ``results.observability.components`` the engine's prefix-cache hit
rate (cached ÷ prompt tokens, ``fraction``) and memory. What the schema has no field for goes where it allows
extra keys, ``results.observability.kvbench`` (:func:`kvbench_extension`).
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.cost import Prices, point_costs
from kvbench.analysis.intervals import busy_flags, load_known
from kvbench.analysis.latency import higher_percentile
from kvbench.analysis.points import point_table
from kvbench.analysis.server_load import in_flight
from kvbench.analysis.tier import tier_hits, tier_not_engaged, tier_of
from kvbench.arguments import path_arg
from kvbench.errors import BadParameter, ResultsError, UnwritableOutput, UserError
from kvbench.report.format import finite_json
from kvbench.report.cost import replacing
from kvbench.report.llmd_cost import export_cost, server_costs
from kvbench.report.llmd_scenario import clean, load, stack
from kvbench.results.load import Results
from kvbench.results.rows import MEASURED, Status
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.safe_text import unique_stems, visible
from kvbench.serving import KINDS
from kvbench.version import __version__

#: The Benchmark Report version written.
LLMD_VERSION = "0.2.1"
#: The percentiles of every Statistics object, as the schema names them.
PERCENTILES = {"p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90, "p95": 95, "p99": 99}
#: The name and version of kvbench's extension under ``results.observability``.
EXTENSION = "kvbench"
EXTENSION_VERSION = 3


def statistics(values: Any, units: str, scale: float = 1.0) -> dict[str, Any] | None:
    """A schema ``Statistics`` object of ``values`` (None and NaN left out) times ``scale``: ``units``, ``mean``,
    ``stddev`` (population), ``min``, ``max`` and :data:`PERCENTILES` (numpy's ``higher`` method, as
    :func:`kvbench.analysis.latency.higher_percentile`); None when no value is left."""
    v = [float(x) * scale for x in values if x is not None and x == x]
    if not v:
        return None
    out: dict[str, Any] = {"units": units, "mean": float(np.mean(v)), "stddev": float(np.std(v)),
                           "min": min(v), "max": max(v)}
    out.update({k: higher_percentile(v, p) for k, p in PERCENTILES.items()})
    return out


def _rate(value: float, units: str) -> dict[str, Any] | None:
    return {"units": units, "mean": value} if value == value and math.isfinite(value) else None


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(rows: pd.DataFrame) -> dict[str, Any] | None:
    """``run.time``: the first request's start, the last one's end (start + e2e) and the duration (ISO 8601)."""
    starts = pd.to_datetime(rows["started_at"], utc=True, errors="coerce") if "started_at" in rows else None
    if starts is None or starts.isna().all():
        return None
    ends = starts + pd.to_timedelta(pd.to_numeric(rows["e2e_s"], errors="coerce").fillna(0), unit="s")
    first, last = starts.min().floor("us").to_pydatetime(), ends.max().floor("us").to_pydatetime()
    seconds = max((last - first) / timedelta(seconds=1), 0.0)
    return {"start": _iso(first), "end": _iso(last), "duration": f"PT{seconds:.3f}S"}


def _sessions(rows: pd.DataFrame, all_rows: pd.DataFrame, wall_s: float) -> dict[str, Any] | None:
    """``results.session_performance`` of a multi-turn run: a session is one conversation of one repeat."""
    if "turn_index" not in rows or rows["turn_index"].isna().all() or rows["document"].isna().all():
        return None
    keys = ["document", "repeat"]
    ok = all_rows["status"].isin(MEASURED)
    failed = set(map(tuple, all_rows.loc[~ok, keys].to_numpy().tolist()))
    by = rows.groupby(keys, sort=False)
    start = pd.to_numeric(rows["start_s"], errors="coerce") if "start_s" in rows else None
    durations = ((start + pd.to_numeric(rows["e2e_s"], errors="coerce")).groupby([rows[k] for k in keys]).max()
                 - start.groupby([rows[k] for k in keys]).min()) if start is not None else pd.Series(dtype=float)
    total = len(set(map(tuple, all_rows[keys].to_numpy().tolist())))
    return {"sessions": clean({
        "total": total, "succeeded": total - len(failed), "failed": len(failed),
        "total_events": int(len(all_rows)), "total_events_completed": int(ok.sum()),
        "session_rate": _rate(total / wall_s if wall_s > 0 else math.nan, "queries/s"),
        "session_duration": statistics(durations, "s"),
        "events_per_session": statistics(by.size(), "count"),
        "input_tokens_per_session": statistics(by["prompt_tokens"].sum(), "count"),
        "output_tokens_per_session": statistics(by["n_output_tokens"].sum(), "count")})}


def _sum(rows: pd.DataFrame, column: str) -> int | None:
    if column not in rows:
        return None
    v = pd.to_numeric(rows[column], errors="coerce").dropna()
    return int(v.sum()) if len(v) else None


def _peak(rows: pd.DataFrame, column: str) -> int | None:
    if column not in rows:
        return None
    v = pd.to_numeric(rows[column], errors="coerce").dropna()
    return int(v.max()) if len(v) else None


def status(rows: pd.DataFrame, all_rows: pd.DataFrame, why: str = "") -> dict[str, Any]:
    """The extension's ``status``: how a report's trials ended, so that a point over the budget, on a busy machine
    or failed never reads as an ordinary result. ``result``: ``failed`` (no trial measured), ``over_budget`` (a
    trial's device KV above the budget), ``partly_failed`` (some trials failed), ``busy`` (a measured trial ran
    while the machine was busy), ``load_unknown`` (a measured trial's load not recorded) or ``ok``, the first that
    applies; ``trials`` (count per status), ``busy_trials``, ``load_unknown_trials`` and ``why`` (why ``kvbench
    cost`` gives the point no cost; ``""`` when it does)."""
    counts = all_rows["status"].value_counts()
    busy = int(busy_flags(rows["machine_busy"]).sum()) if "machine_busy" in rows else 0
    unknown = int((~load_known(rows["machine_busy"])).sum()) if "machine_busy" in rows else len(rows)
    result = ("failed" if rows.empty else "over_budget" if counts.get(Status.OVER_BUDGET, 0) else
              "partly_failed" if len(rows) < len(all_rows) else "busy" if busy else
              "load_unknown" if unknown else "ok")
    return {"result": result, "trials": {str(k): int(v) for k, v in counts.items()}, "busy_trials": busy,
            "load_unknown_trials": unknown, "why": why}


def kvbench_extension(rows: pd.DataFrame, all_rows: pd.DataFrame, servers: list[dict[str, Any]],
                      cost: dict[str, Any]) -> dict[str, Any]:
    """``results.observability.kvbench``: what the schema has no field for. ``extension_version``; ``mode``
    (label, kind, options); ``exactness`` (outputs compared with ``none``'s and equal; first divergence steps);
    ``cold_start`` (servers whose first request reused 0 tokens, and the reset probes); ``cache`` (Σ cached and Σ
    prompt tokens); ``counters`` (each server's ``/metrics`` deltas, holds taken out); ``memory`` (peak device,
    host, host allocated, pinned and disk KV bytes; the host tier a server's flags configure); ``bytes_moved``
    (Σ host→device, device→host, disk read and write bytes); ``cost`` (given:
    :func:`~kvbench.report.llmd_cost.export_cost`); ``tier`` (a host or disk tier mode's tier, the baselines of its
    savings and what its own counters served: :func:`_tier`); ``status`` (:func:`status`, with ``cost``'s ``why``);
    ``machine_busy_requests``, ``failed_requests``. Bytes in bytes, times in seconds."""
    first = all_rows.iloc[0].to_dict()
    match = rows["tokens_match"] if "tokens_match" in rows else pd.Series(dtype=object)
    compared = match.map(lambda v: v is True or v is False)
    steps = pd.to_numeric(rows.get("first_divergence_step"), errors="coerce").dropna() \
        if "first_divergence_step" in rows else pd.Series(dtype=float)
    cold = [r for r in rows.to_dict("records") if r.get("cold_verified") is not None
            and r.get("cold_verified") == r.get("cold_verified")]
    ext: dict[str, Any] = {
        "extension_version": EXTENSION_VERSION,
        "doc": "kvbench docs, docs/other-tools.md",
        "mode": {"label": first["mode_label"], "kind": first["mode"], "options": first.get("mode_options") or {}},
        "exactness": {"compared": int(compared.sum()), "equal_to_none": int(match.map(lambda v: v is True).sum()),
                      "first_divergence_steps": sorted(int(s) for s in steps)},
        "cold_start": {"first_requests": len(cold), "verified": sum(bool(r["cold_verified"]) for r in cold),
                       "reset_probes": [s["cold_probe"] for s in servers if s.get("cold_probe")]},
        "cache": {"cached_prompt_tokens": _sum(rows, "cached_prompt_tokens"),
                  "prompt_tokens": _sum(rows, "prompt_tokens")},
        "counters": [s["metrics_delta"] for s in servers if s.get("metrics_delta")],
        "memory": clean({"kv_device_peak_bytes": _peak(rows, "kv_device_peak_bytes"),
                          "kv_host_peak_bytes": _peak(rows, "kv_host_peak_bytes"),
                          "kv_host_allocated_peak_bytes": _peak(rows, "kv_host_allocated_peak_bytes"),
                          "pinned_host_allocated_peak_bytes": _peak(rows, "pinned_host_allocated_peak_bytes"),
                          "kv_disk_peak_bytes": _peak(rows, "kv_disk_peak_bytes"),
                          "server_host_tier_bytes": _peak(rows, "server_host_tier_bytes"),
                          "server_host_tier": first.get("server_host_tier") or None,
                          "server_slot_files_peak_bytes": _peak(rows, "store_disk_bytes")}),
        "bytes_moved": clean({"h2d_bytes": _sum(rows, "h2d_bytes"), "d2h_bytes": _sum(rows, "d2h_bytes"),
                               "disk_read_bytes": _sum(rows, "disk_read_bytes"),
                               "disk_write_bytes": _sum(rows, "disk_write_bytes")}),
        "cost": cost,
        "tier": _tier(rows, servers, first),
        "status": status(rows, all_rows, cost.get("why", "")),
        "machine_busy_requests": int(rows["machine_busy"].map(lambda v: v is True).sum())
        if "machine_busy" in rows else 0,
        "failed_requests": int((~all_rows["status"].isin(MEASURED)).sum())
        * int(pd.to_numeric(all_rows["batch_size"], errors="coerce").fillna(1).iloc[0]),
    }
    return ext


def _tier(rows: pd.DataFrame, servers: list[dict[str, Any]], first: dict[str, Any]) -> dict[str, Any] | None:
    """The extension's ``tier``: for a server mode with a host or disk tier on top of its prefix cache, the tier
    (``host``/``disk``), the baselines its savings are taken against (``reuse_saving_vs``: ``none``;
    ``tier_saving_vs``: the engine's prefix-cache preset), what its own counters served
    (:func:`kvbench.analysis.tier.tier_hits`: ``served``, ``served_from``) and ``not_engaged`` (why it has no tier
    verdict, ``""`` when it engaged); None for any other mode."""
    engine, mode = first.get("engine"), first.get("mode")
    tier = tier_of(engine, mode)
    if tier is None:
        return None
    label = str(first["mode_label"])
    served, source = tier_hits(rows, servers, engine, label)
    return {"tier": tier, "reuse_saving_vs": "none", "tier_saving_vs": KINDS[engine].prefix_preset,
            "served": served, "served_from": source or None,
            "not_engaged": tier_not_engaged(rows, servers, engine, label)}


def _units(trials: pd.DataFrame) -> list[tuple[str, pd.DataFrame, bool]]:
    """``(name, rows, server)`` of each report: per run and mode label (a server mode holds its concurrency in the
    label), for the in-process engine per prompt length and batch too; a unit none of whose trials ran here (all
    ``skipped``) has none. ``name``: the group, ``@<run>`` where several runs share it, ``/<mode label>``."""
    out = []
    runs_of = trials.groupby("group")["run_path"].nunique()
    bases: set[str] = set()
    for (_, group), part in trials.groupby(["run_path", "group"], sort=False):
        server = bool("engine" in part and part["engine"].notna().any())
        keys = ["mode_label"] + ([] if server else ["prompt_tokens", "batch_size"])
        base = group if runs_of[group] == 1 else f"{group}@{part['run'].iloc[0]}"
        while base in bases:  # two runs in folders of one name
            base += "+"
        bases.add(base)
        for key, rows in part.groupby(keys, sort=False):
            key = key if isinstance(key, tuple) else (key,)
            if (rows["status"] == Status.SKIPPED).all():
                continue
            out.append((f"{base}/{key[0]}" + ("" if server else f"-p{key[1]}-b{key[2]}"), rows, server))
    return out


def llmd_reports(results: Results, prices: Prices | None = None) -> list[tuple[str, dict[str, Any]]]:
    """One Benchmark Report v0.2.1 per mode of ``results`` (see the module docstring): ``(name, report)`` pairs,
    ``name`` = ``<group>/<mode label>`` (in-process: ``-p<prompt>-b<batch>`` added; ``<group>@<run>`` where several
    runs share a group). ``prices``: for the cost in the extension (default 2 USD per GPU-hour, the map's). A mode
    whose requests all failed still gets a report (``requests.total`` and ``failures``, no latency); one none of
    whose trials ran here (all ``skipped``, e.g. ``hf-offloaded`` without CUDA) gets none. Requests are sequences:
    an in-process trial of batch B is B requests.

    Raises:
        kvbench.errors.BadParameter: ``results`` is no :class:`~kvbench.results.load.Results`, ``prices`` no
            :class:`~kvbench.analysis.cost.Prices`.
    """
    if not isinstance(results, Results):
        raise BadParameter(f"{{results}} must be kvbench.load_results(...), not {type(results).__name__}", "results")
    if prices is not None and not isinstance(prices, Prices):
        raise BadParameter(f"{{prices}} must be a kvbench.Prices, not {type(prices).__name__}", "prices")
    prices = prices or Prices(2.0)
    runs = {r["path"]: r for r in results.runs}
    points = point_table(results.trials)
    costs = {(r["group"], float(r["prompt_tokens"]), r["mode_label"], float(r["batch_size"])): r
             for r in point_costs(points, prices, results.trials).to_dict("records")} if len(points) else {}
    served = server_costs(results, prices)
    out = []
    for name, all_rows, server in _units(results.trials):
        all_rows = all_rows[all_rows["status"] != Status.SKIPPED]
        rows = all_rows[all_rows["status"].isin(MEASURED)]
        run = runs.get(all_rows["run_path"].iloc[0], {})
        label = all_rows["mode_label"].iloc[0]
        servers = [s for s in run.get("servers") or [] if s.get("mode_label") == label]
        wall = (in_flight(rows)[2] if server else float(pd.to_numeric(rows["e2e_s"]).sum())) if len(rows) else 0.0
        sequences = int(pd.to_numeric(all_rows["batch_size"], errors="coerce").fillna(1).iloc[0])
        batch = pd.to_numeric(rows["batch_size"], errors="coerce").fillna(1)
        n_out = float((pd.to_numeric(rows.get("n_output_tokens"), errors="coerce").fillna(0) * batch).sum()) \
            if len(rows) else 0.0
        n_in = float((pd.to_numeric(rows["prompt_tokens"], errors="coerce") * batch).sum()) if len(rows) else 0.0
        per_s = (lambda x, wall=wall: x / wall) if wall > 0 else (lambda x: math.nan)
        gaps = [g for v in rows.get("itl_s", []) if isinstance(v, (list, tuple)) for g in v]
        latency = {"time_to_first_token": statistics(rows.get("ttft_s", []), "s"),
                   "normalized_time_per_output_token": statistics(rows.get("ntpot_s", []), "s/token"),
                   "time_per_output_token": statistics(rows.get("tpot_s", []), "s/token"),
                   "inter_token_latency": statistics(gaps, "s/token"),
                   "request_latency": statistics(rows.get("e2e_s", []), "s")}
        requests = {"total": len(all_rows) * sequences,
                    "failures": int((~all_rows["status"].isin(MEASURED)).sum()) * sequences,
                    "input_length": statistics(rows["prompt_tokens"], "count"),
                    "output_length": statistics(rows.get("n_output_tokens", []), "count")}
        throughput = {"input_token_rate": _rate(per_s(n_in), "tokens/s"),
                      "output_token_rate": _rate(per_s(n_out), "tokens/s"),
                      "total_token_rate": _rate(per_s(n_in + n_out), "tokens/s"),
                      "request_rate": _rate(per_s(float(batch.sum())), "queries/s")}
        cached = pd.to_numeric(rows.get("cached_prompt_tokens"), errors="coerce") \
            if "cached_prompt_tokens" in rows else pd.Series(dtype=float)
        component: dict[str, Any] = {}
        if cached.notna().any():
            component["cache_hit_rate"] = {"units": "fraction", "mean": float(
                cached.sum() / pd.to_numeric(rows.loc[cached.notna(), "prompt_tokens"]).sum())}
        for field, column, units in (("cpu_memory_usage", "rss_peak_bytes", "bytes"),
                                     ("gpu_memory_usage", "nvml_process_peak_bytes", "bytes"),
                                     ("cpu_utilization", "cpu_percent_mean", "percent"),
                                     ("gpu_utilization", "gpu_util_mean_percent", "percent"),
                                     ("power_consumption", "power_mean_w", "Watts")):
            if column in rows:
                component[field] = statistics(rows[column], units)
        engine = stack(run, all_rows, servers)
        first = all_rows.iloc[0]
        point = served.get((first["group"], label)) if server else costs.get(
            (first["group"], float(first["prompt_tokens"]), label, float(first["batch_size"])))
        ext = kvbench_extension(rows, all_rows, servers, export_cost(point, per_s(n_out), prices))
        observability: dict[str, Any] = {EXTENSION: ext}
        component = clean(component)
        if component:
            observability["components"] = [{"component_label": engine[0]["metadata"]["label"],
                                            "aggregate": component}]
        results_doc = {"request_performance": {"aggregate": {
            "requests": clean(requests), "latency": clean(latency), "throughput": clean(throughput)}},
            "observability": observability}
        sessions = _sessions(rows, all_rows, wall) if server else None
        if sessions:
            results_doc["session_performance"] = sessions
        run_name, shown = visible(all_rows["run"].iloc[0]), visible(name)  # a folder's undecodable bytes as \xff
        out.append((name, {
            "version": LLMD_VERSION,
            "run": clean({"uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kvbench:{run_name}:{shown}")),
                           "eid": run_name, "time": _time(rows if len(rows) else all_rows),
                           "description": f"exported by kvbench {__version__}: {shown}",
                           "keywords": ["kvbench", "kv-cache", str(all_rows['mode'].iloc[0])]
                           + ([f"status:{ext['status']['result']}"] if ext["status"]["result"] not in (
                               "ok", "load_unknown") else [])}),
            "scenario": {"stack": engine, "load": load(run, all_rows)},
            "results": results_doc}))
    return out


def file_names(names: list[str]) -> list[str]:
    """The reports' file names, one per name and never two alike: ``<group>__<mode label>.json``, each part as
    :func:`~kvbench.safe_text.unique_stems` makes it (``none?`` and ``none!`` of one group: ``g__none-04713f71``
    and ``g__none-a47d933f``, 8 hex digits of each name)."""
    return [f"{stem}.json" for stem in unique_stems([tuple(n.split("/", 1)) for n in names], sep="__")]


def write_llmd(results: Results, out_dir: str | Path, prices: Prices | None = None) -> list[Path]:
    """:func:`llmd_reports` of ``results`` as JSON files in ``out_dir`` (created), one per mode
    (``<group>__<mode label>.json``, :func:`file_names`), each written beside its place and moved onto it (a
    symbolic link there is replaced, never followed); returns their paths.

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written (naming it).
        kvbench.errors.ResultsError: no trial of ``results`` ran (all skipped): nothing is written.
    """
    out = path_arg(out_dir, "out_dir")
    refuse_symlink_dir(out)
    reports = llmd_reports(results, prices)
    if not reports:
        raise ResultsError("nothing to export: no trial of these runs ran (every one was skipped)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for (_, doc), file in zip(reports, file_names([name for name, _ in reports])):
            text = json.dumps(finite_json(doc), indent=2, allow_nan=False) + "\n"
            paths.append(replacing(out / file, lambda tmp, text=text: tmp.write_text(text)))
        return paths
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(exc.filename or out, exc.strerror or str(exc)) from exc


__all__ = ["EXTENSION", "LLMD_VERSION", "PERCENTILES", "file_names", "kvbench_extension", "llmd_reports", "statistics",
           "status", "write_llmd"]
