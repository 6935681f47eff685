"""A server run's load per mode (a server configuration at one concurrency): the concurrency it reached,
throughput over the time requests were in flight and over the load's wall-clock time, the percentiles of TTFT,
TPOT, NTPOT and ITL over its requests with their counts, the token-weighted cache hit rate, and goodput under SLOs
(the requests whose TTFT and TPOT meet them, per second), as serving benchmarks report them (vLLM's ``vllm bench
serve`` divides by the benchmark's wall-clock duration)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvbench.analysis.latency import higher_percentile
from kvbench.analysis.reuse_cost import busy_seconds
from kvbench.results.rows import MEASURED

#: The percentiles of each latency (numpy's ``higher`` method, as the trials' ITL percentiles).
PERCENTILES = (50, 90, 99)


def _pct(values: Any, p: int) -> float:
    v = higher_percentile([float(x) for x in values if x is not None and x == x], p)
    return math.nan if v is None else v


def in_flight(rows: pd.DataFrame) -> tuple[int, float, float]:
    """``(most, busy_s, wall_s)`` of measured server rows: the most requests in flight at one time (per run and
    repeat, from the intervals [``start_s``, ``start_s`` + ``e2e_s``]), the seconds at least one was in flight
    (:func:`~kvbench.analysis.reuse_cost.busy_seconds`), and the load's wall-clock seconds (per run and repeat,
    from the load's start, 0, to the last request's end; summed): the time-weighted mean in flight while any was
    is Σ e2e ÷ busy_s."""
    most, wall = 0, 0.0
    for _, part in rows.groupby(["run", "repeat"], sort=False):
        start = part["start_s"].astype(float).to_numpy()
        end = start + part["e2e_s"].astype(float).to_numpy()
        # +1 at each start, −1 at each end; an end sorts before a start at the same instant
        events = sorted([(a, 1) for a in start] + [(b, -1) for b in end], key=lambda e: (e[0], e[1]))
        now = 0
        for _, step in events:
            now += step
            most = max(most, now)
        wall += float(end.max()) if len(end) else 0.0
    return most, busy_seconds(rows), wall


def server_load_table(trials: pd.DataFrame, max_ttft_s: float | None = None,
                      max_tpot_s: float | None = None) -> pd.DataFrame:
    """Per group × mode of the server rows (``engine`` set): ``requests`` (measured), ``failed``, ``concurrency``
    (the level asked for), ``in_flight_max`` and ``in_flight_mean`` (achieved: the most requests in flight at once,
    and the time-weighted mean while any was; :func:`in_flight`), ``busy_s`` (the seconds requests were in
    flight), ``wall_s`` (the load's wall-clock seconds, holds and think time included),
    ``throughput_busy_tokens_per_s`` (generated tokens ÷ busy_s) and ``throughput_wall_tokens_per_s`` (÷ wall_s,
    as vLLM's ``output_throughput``), ``request_rate_busy_per_s`` and ``request_rate_wall_per_s``,
    ``cached_token_share`` (Σ cached ÷ Σ prompt tokens over its requests: the
    token-weighted hit rate; NaN where the server reported no cached tokens), the p50/p90/p99 of ``ttft``,
    ``tpot``, ``ntpot`` (over requests) and ``itl`` (over every inter-chunk gap of every request), each with its
    count (``ttft_n``, ...: at most 100 values make p99 their maximum, :func:`~kvbench.analysis.latency.is_max_rank`),
    and with an SLO (``max_ttft_s``, ``max_tpot_s``: seconds, per request) ``slo_met_pct``,
    ``goodput_busy_per_s`` (requests meeting it ÷ busy_s) and ``goodput_wall_per_s`` (÷ wall_s); empty without
    server rows."""
    if "engine" not in trials:
        return pd.DataFrame()
    rows = trials[trials["engine"].notna()]
    out = []
    for (group, mode), part in rows.groupby(["group", "mode_label"], sort=False):
        ok = part[part["status"].isin(MEASURED)]
        rec: dict[str, Any] = {"group": group, "mode_label": mode, "mode": part["mode"].iloc[0],
                               "concurrency": part["concurrency"].max(), "requests": len(ok),
                               "failed": int((~part["status"].isin(MEASURED)).sum())}
        most, busy, wall = in_flight(ok) if len(ok) else (0, 0.0, 0.0)
        tokens = float(ok["n_output_tokens"].sum()) if len(ok) else 0.0
        e2e = float(ok["e2e_s"].astype(float).sum()) if len(ok) else 0.0
        rec.update(in_flight_max=most, in_flight_mean=e2e / busy if busy > 0 else math.nan, busy_s=busy,
                   wall_s=wall)
        for suffix, seconds in (("_busy", busy), ("_wall", wall)):
            rec[f"throughput{suffix}_tokens_per_s"] = tokens / seconds if seconds > 0 else math.nan
            rec[f"request_rate{suffix}_per_s"] = len(ok) / seconds if seconds > 0 else math.nan
        cached = (pd.to_numeric(ok["cached_prompt_tokens"], errors="coerce") if "cached_prompt_tokens" in ok
                  else pd.Series(dtype=float))
        rec["cached_token_share"] = (float(cached.sum() / ok.loc[cached.notna(), "prompt_tokens"].sum())
                                     if cached.notna().any() else math.nan)
        gaps = [g for v in ok["itl_s"] if isinstance(v, (list, tuple)) for g in v] if "itl_s" in ok else []
        for name, values in (("ttft", ok.get("ttft_s", [])), ("tpot", ok.get("tpot_s", [])),
                             ("ntpot", ok.get("ntpot_s", [])), ("itl", gaps)):
            values = [float(x) for x in values if x is not None and x == x]
            rec[f"{name}_n"] = len(values)
            for p in PERCENTILES:
                rec[f"{name}_p{p}_s"] = _pct(values, p)
        if max_ttft_s is not None or max_tpot_s is not None:
            met = pd.Series(True, index=ok.index)
            if max_ttft_s is not None:
                met &= pd.to_numeric(ok["ttft_s"], errors="coerce") <= max_ttft_s
            if max_tpot_s is not None:
                met &= pd.to_numeric(ok["tpot_s"], errors="coerce") <= max_tpot_s
            rec["slo_met_pct"] = 100 * float(met.mean()) if len(ok) else math.nan
            rec["goodput_busy_per_s"] = float(met.sum()) / busy if busy > 0 else math.nan
            rec["goodput_wall_per_s"] = float(met.sum()) / wall if wall > 0 else math.nan
        out.append(rec)
    return pd.DataFrame(out)


__all__ = ["PERCENTILES", "in_flight", "server_load_table"]
