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

import hashlib
import json
import math
import re
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.cost import Prices
from kvbench.analysis.latency import higher_percentile
from kvbench.analysis.server_load import in_flight
from kvbench.arguments import path_arg
from kvbench.errors import UnwritableOutput, UserError
from kvbench.report.cost import replacing
from kvbench.results.load import Results
from kvbench.results.rows import MEASURED
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.version import __version__

#: The Benchmark Report version written.
LLMD_VERSION = "0.2.1"
#: The percentiles of every Statistics object, as the schema names them.
PERCENTILES = {"p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90, "p95": 95, "p99": 99}
#: The name and version of kvbench's extension under ``results.observability``.
EXTENSION = "kvbench"
EXTENSION_VERSION = 1


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


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without None values (the schema's optional fields are left out, never null)."""
    return {k: v for k, v in d.items() if v is not None}


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


def _flags(argv: list[str]) -> dict[str, Any]:
    """A server's command line as ``native.args``: each ``--flag`` (or ``-f``) with the value that follows it,
    null for a flag without one; the program itself is left out (it is ``native.config.argv``)."""
    args: dict[str, Any] = {}
    k = 1
    while k < len(argv):
        a = argv[k]
        if a.startswith("-") and not re.fullmatch(r"-\d.*", a):
            if "=" in a and a.startswith("--"):
                name, value = a.split("=", 1)
                args[name] = value
            elif k + 1 < len(argv) and not (argv[k + 1].startswith("-") and not re.fullmatch(r"-\d.*", argv[k + 1])):
                args[a] = argv[k + 1]
                k += 1
            else:
                args[a] = None
        k += 1
    return args


def _accelerator(env: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, dict)]
    name = row.get("gpu") or (gpus[0].get("name") if gpus else None)
    return {"model": str(name or env.get("cpu") or "cpu"), "count": len(gpus) if name else 0,
            "parallelism": {"tp": 1, "dp": 1, "dp_local": 1, "workers": 1, "ep": 1, "pp": 1}}


def _stack(run: dict[str, Any], rows: pd.DataFrame, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``scenario.stack``: the engine as an ``inference_engine`` component: a server's command line, environment
    and version as kvbench started it (run.json ``servers``), or kvbench's in-process transformers engine."""
    first = rows.iloc[0].to_dict()
    env = run.get("environment") or {}
    model = (run.get("scenario") or {}).get("model")
    model_name = model if isinstance(model, str) else (model or {}).get("name", "unknown") if model else "unknown"
    if servers:
        s = servers[0]
        argv = [str(a) for a in s.get("argv") or []]
        native = {"args": _flags(argv), "envars": dict(s.get("environment") or {}),
                  "config": {"argv": argv, "log": s.get("log"), "servers": len(servers)}}
        tool, version = str(s.get("engine") or first.get("engine")), str(s.get("version") or "unknown")
    else:
        versions = env.get("versions") or {}
        native = {"args": {}, "envars": {}, "config": {"mode": first.get("mode"),
                                                        "mode_options": first.get("mode_options") or {}}}
        tool, version = "kvbench-transformers", f"kvbench {__version__}, transformers {versions.get('transformers')}"
    cfg = hashlib.sha256(json.dumps(native, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return [{"metadata": {"label": tool, "cfg_id": cfg, "description": f"mode {first['mode_label']}"},
             "standardized": {"kind": "inference_engine", "tool": tool, "tool_version": version, "role": "replica",
                              "replicas": 1, "model": {"name": str(model_name)},
                              "accelerator": _accelerator(env, first)},
             "native": native}]


def _seq_len(values: pd.Series) -> dict[str, Any] | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return None
    if v.min() == v.max():
        return {"distribution": "fixed", "value": int(v.iloc[0])}
    return {"distribution": "other", "value": float(v.mean()), "std_dev": float(v.std(ddof=0)),
            "min": int(v.min()), "max": int(v.max())}


def _load(run: dict[str, Any], rows: pd.DataFrame) -> dict[str, Any]:
    """``scenario.load``: kvbench as the load generator, the workload's lengths, concurrency (a server's slots,
    the in-process batch) and rate; the scenario itself as ``native.config``."""
    scenario = run.get("scenario") or {}
    workload = scenario.get("workload") or {}
    first = rows.iloc[0].to_dict()
    source = workload.get("source") if isinstance(workload, dict) else None
    load = scenario.get("load") or {}
    std: dict[str, Any] = {"tool": "kvbench", "tool_version": __version__,
                           "source": {"sharegpt": "sampled", "files": "sampled", "synthetic": "random"}.get(
                               source, "unknown"),
                           "input_seq_len": _seq_len(rows["prompt_tokens"]),
                           "output_seq_len": _seq_len(rows["n_output_tokens"] if "n_output_tokens" in rows
                                                      else rows["max_new_tokens"])}
    conc = first.get("concurrency")
    std["concurrency"] = int(conc) if conc == conc and conc is not None else int(first["batch_size"])
    if isinstance(load, dict) and load.get("profile") == "poisson" and load.get("rate"):
        std["rate_qps"] = float(load["rate"])
    if "turn_index" in rows and isinstance(workload, dict) and workload.get("multi_turn"):
        turns = pd.to_numeric(rows["turn_index"], errors="coerce").dropna()
        std["multi_turn"] = {"enabled": True, "max_turns": _seq_len(turns.groupby(
            [rows["document"], rows["repeat"]]).max()) if len(turns) else None}
        std["multi_turn"] = _clean(std["multi_turn"])
    return {"metadata": {"description": f"kvbench scenario {scenario.get('name', first.get('scenario'))}"},
            "standardized": _clean(std), "native": {"args": {}, "envars": {}, "config": scenario}}


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
    return {"sessions": _clean({
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


def kvbench_extension(rows: pd.DataFrame, all_rows: pd.DataFrame, servers: list[dict[str, Any]],
                      throughput: float, prices: Prices) -> dict[str, Any]:
    """``results.observability.kvbench``: what the schema has no field for. ``extension_version``; ``mode``
    (label, kind, options); ``exactness`` (outputs compared with ``none``'s and equal; first divergence steps);
    ``cold_start`` (servers whose first request reused 0 tokens, and the reset probes); ``cache`` (Σ cached and Σ
    prompt tokens); ``counters`` (each server's ``/metrics`` deltas, holds taken out); ``memory`` (peak device,
    host, host allocated, pinned and disk KV bytes; the host tier a server's flags configure); ``bytes_moved``
    (Σ host→device, device→host, disk read and write bytes); ``cost`` (USD per 1M generated tokens at
    ``prices.gpu_per_hour`` and the throughput the report gives, no memory charged); ``machine_busy_requests``.
    Bytes in bytes, times in seconds."""
    first = all_rows.iloc[0].to_dict()
    match = rows["tokens_match"] if "tokens_match" in rows else pd.Series(dtype=object)
    compared = match.map(lambda v: v is True or v is False)
    steps = pd.to_numeric(rows.get("first_divergence_step"), errors="coerce").dropna() \
        if "first_divergence_step" in rows else pd.Series(dtype=float)
    cold = [r for r in rows.to_dict("records") if r.get("cold_verified") is not None
            and r.get("cold_verified") == r.get("cold_verified")]
    ext: dict[str, Any] = {
        "extension_version": EXTENSION_VERSION,
        "doc": "kvbench README, 'llm-d Benchmark Reports and other tools' results'",
        "mode": {"label": first["mode_label"], "kind": first["mode"], "options": first.get("mode_options") or {}},
        "exactness": {"compared": int(compared.sum()), "equal_to_none": int(match.map(lambda v: v is True).sum()),
                      "first_divergence_steps": sorted(int(s) for s in steps)},
        "cold_start": {"first_requests": len(cold), "verified": sum(bool(r["cold_verified"]) for r in cold),
                       "reset_probes": [s["cold_probe"] for s in servers if s.get("cold_probe")]},
        "cache": {"cached_prompt_tokens": _sum(rows, "cached_prompt_tokens"),
                  "prompt_tokens": _sum(rows, "prompt_tokens")},
        "counters": [s["metrics_delta"] for s in servers if s.get("metrics_delta")],
        "memory": _clean({"kv_device_peak_bytes": _peak(rows, "kv_device_peak_bytes"),
                          "kv_host_peak_bytes": _peak(rows, "kv_host_peak_bytes"),
                          "kv_host_allocated_peak_bytes": _peak(rows, "kv_host_allocated_peak_bytes"),
                          "pinned_host_allocated_peak_bytes": _peak(rows, "pinned_host_allocated_peak_bytes"),
                          "kv_disk_peak_bytes": _peak(rows, "kv_disk_peak_bytes"),
                          "server_host_tier_bytes": _peak(rows, "server_host_tier_bytes"),
                          "server_host_tier": first.get("server_host_tier") or None,
                          "server_slot_files_peak_bytes": _peak(rows, "store_disk_bytes")}),
        "bytes_moved": _clean({"h2d_bytes": _sum(rows, "h2d_bytes"), "d2h_bytes": _sum(rows, "d2h_bytes"),
                               "disk_read_bytes": _sum(rows, "disk_read_bytes"),
                               "disk_write_bytes": _sum(rows, "disk_write_bytes")}),
        "cost": {"gpu_usd_per_hour": prices.gpu_per_hour,
                 "usd_per_million_output_tokens": prices.per_million(throughput) if throughput > 0 else None,
                 "basis": "output_token_rate of this report; no host or disk memory charged"},
        "machine_busy_requests": int(rows["machine_busy"].map(lambda v: v is True).sum())
        if "machine_busy" in rows else 0,
        "failed_requests": int((~all_rows["status"].isin(MEASURED)).sum()),
    }
    return ext


def _units(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """A report's rows: per group and mode label (a server mode holds its concurrency in the label), and for the
    in-process engine per prompt length and batch too; reuse workloads' cold copies of a warm mode
    (in-process ``warm`` False under an offload mode) stay with their mode."""
    keys = ["group", "mode_label"]
    server = "engine" in rows and rows["engine"].notna().any()
    if not server:
        keys += ["prompt_tokens", "batch_size"]
    out = []
    for key, part in rows.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        suffix = "" if server else f"-p{key[2]}-b{key[3]}"
        out.append((f"{key[0]}/{key[1]}{suffix}", part))
    return out


def llmd_reports(results: Results, prices: Prices | None = None) -> list[tuple[str, dict[str, Any]]]:
    """One Benchmark Report v0.2.1 per mode of ``results`` (see the module docstring): ``(name, report)`` pairs,
    ``name`` = ``<group>/<mode label>`` (in-process: ``-p<prompt>-b<batch>`` added). ``prices``: for the cost in
    the extension (default 2 USD per GPU-hour, the map's). A mode whose requests all failed still gets a report
    (``requests.total`` and ``failures``, no latency)."""
    prices = prices or Prices(2.0)
    trials = results.trials
    runs = {r["path"]: r for r in results.runs}
    out = []
    for name, all_rows in _units(trials):
        rows = all_rows[all_rows["status"].isin(MEASURED)]
        run = runs.get(all_rows["run_path"].iloc[0], {})
        label = all_rows["mode_label"].iloc[0]
        servers = [s for s in run.get("servers") or [] if s.get("mode_label") == label]
        server = "engine" in rows and rows["engine"].notna().any()
        wall = in_flight(rows)[2] if server and len(rows) else float(pd.to_numeric(rows["e2e_s"]).sum())
        batch = pd.to_numeric(rows["batch_size"], errors="coerce").fillna(1)
        n_out = float((pd.to_numeric(rows.get("n_output_tokens"), errors="coerce").fillna(0) * batch).sum()) \
            if len(rows) else 0.0
        n_in = float((pd.to_numeric(rows["prompt_tokens"], errors="coerce") * batch).sum()) if len(rows) else 0.0
        per_s = (lambda x: x / wall) if wall > 0 else (lambda x: math.nan)
        gaps = [g for v in rows.get("itl_s", []) if isinstance(v, (list, tuple)) for g in v]
        latency = {"time_to_first_token": statistics(rows.get("ttft_s", []), "s"),
                   "normalized_time_per_output_token": statistics(rows.get("ntpot_s", []), "s/token"),
                   "time_per_output_token": statistics(rows.get("tpot_s", []), "s/token"),
                   "inter_token_latency": statistics(gaps, "s/token"),
                   "request_latency": statistics(rows.get("e2e_s", []), "s")}
        requests = {"total": int(len(all_rows) * (batch.max() if len(batch) else 1)),
                    "failures": int((~all_rows["status"].isin(MEASURED)).sum()),
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
        stack = _stack(run, all_rows, servers)
        observability: dict[str, Any] = {EXTENSION: kvbench_extension(rows, all_rows, servers,
                                                                       per_s(n_out), prices)}
        component = _clean(component)
        if component:
            observability["components"] = [{"component_label": stack[0]["metadata"]["label"],
                                            "aggregate": component}]
        results_doc = {"request_performance": {"aggregate": {
            "requests": _clean(requests), "latency": _clean(latency), "throughput": _clean(throughput)}},
            "observability": observability}
        sessions = _sessions(rows, all_rows, wall) if server else None
        if sessions:
            results_doc["session_performance"] = sessions
        run_name = str(all_rows["run"].iloc[0])
        out.append((name, {
            "version": LLMD_VERSION,
            "run": _clean({"uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kvbench:{run_name}:{name}")),
                           "eid": run_name, "time": _time(rows if len(rows) else all_rows),
                           "description": f"kvbench {__version__}: {name}",
                           "keywords": ["kvbench", "kv-cache", str(all_rows['mode'].iloc[0])]}),
            "scenario": {"stack": stack, "load": _load(run, all_rows)},
            "results": results_doc}))
    return out


def _file_name(name: str) -> str:
    """A report's file name: its name with anything but letters, digits, ``.``, ``-``, ``_`` and ``@`` as ``_``."""
    return re.sub(r"[^A-Za-z0-9._@-]", "_", name.replace("/", "__")) + ".json"


def write_llmd(results: Results, out_dir: str | Path, prices: Prices | None = None) -> list[Path]:
    """:func:`llmd_reports` of ``results`` as JSON files in ``out_dir`` (created), one per mode
    (``<group>__<mode label>.json``), each written beside its place and moved onto it (a symbolic link there is
    replaced, never followed); returns their paths.

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written (naming it).
    """
    out = path_arg(out_dir, "out_dir")
    refuse_symlink_dir(out)
    reports = llmd_reports(results, prices)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, doc in reports:
            text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
            paths.append(replacing(out / _file_name(name), lambda tmp, text=text: tmp.write_text(text)))
        return paths
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(exc.filename or out, exc.strerror or str(exc)) from exc


__all__ = ["EXTENSION", "LLMD_VERSION", "PERCENTILES", "kvbench_extension", "llmd_reports", "statistics",
           "write_llmd"]
