"""The scenario of an llm-d Benchmark Report (:mod:`kvbench.report.llmd`): the engine as a stack component (a
server's command line, environment and version as kvbench started it, or kvbench's in-process engine) and kvbench
as the load generator (lengths, concurrency, rate, multi-turn)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pandas as pd


def clean(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without None or NaN values (the schema's optional fields are left out, never null)."""
    return {k: v for k, v in d.items() if v is not None and not (isinstance(v, float) and v != v)}


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


def stack(run: dict[str, Any], rows: pd.DataFrame, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``scenario.stack``: the engine as an ``inference_engine`` component: a server's command line, environment
    and version as kvbench started it (run.json ``servers``), or kvbench's in-process transformers engine."""
    first = rows.iloc[0].to_dict()
    env = run.get("environment") or {}
    model = (run.get("scenario") or {}).get("model")
    model_name = model if isinstance(model, str) else (model or {}).get("name", "unknown") if model else "unknown"
    engine = first.get("engine") if isinstance(first.get("engine"), str) else None
    if servers or engine:
        s = servers[0] if servers and isinstance(servers[0], dict) else {}
        argv = [str(a) for a in s.get("argv")] if isinstance(s.get("argv"), list) else []
        env_vars = s.get("environment") if isinstance(s.get("environment"), dict) else {}
        native = {"args": _flags(argv), "envars": {str(k): str(v) for k, v in env_vars.items()},
                  "config": {"argv": argv, "log": s.get("log"), "servers": len(servers)}}
        tool = str(s.get("engine") or engine)
        version = str(s.get("version") or "unknown (run.json names no server of this mode)")
    else:
        native = {"args": {}, "envars": {}, "config": {"mode": first.get("mode"),
                                                        "mode_options": first.get("mode_options") or {}}}
        tool = "kvbench-transformers"
        version = f"kvbench {env.get('kvbench') or 'unknown'}, transformers {env.get('transformers') or 'unknown'}"
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


def load(run: dict[str, Any], rows: pd.DataFrame) -> dict[str, Any]:
    """``scenario.load``: kvbench as the load generator, the workload's lengths, concurrency (a server's slots,
    the in-process batch) and rate; the scenario itself as ``native.config``."""
    scenario = run.get("scenario") or {}
    workload = scenario.get("workload") or {}
    first = rows.iloc[0].to_dict()
    source = workload.get("source") if isinstance(workload, dict) else None
    load = scenario.get("load") or {}
    std: dict[str, Any] = {"tool": "kvbench", "tool_version": str((run.get("environment") or {}).get("kvbench")
                                                                  or "unknown"),
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
        std["multi_turn"] = clean(std["multi_turn"])
    return {"metadata": {"description": f"kvbench scenario {scenario.get('name', first.get('scenario'))}"},
            "standardized": clean(std), "native": {"args": {}, "envars": {}, "config": scenario}}

__all__ = ["clean", "load", "stack"]
