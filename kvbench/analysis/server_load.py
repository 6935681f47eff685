"""A server run's load per mode (a server configuration at one concurrency): throughput over the time requests
were in flight, the percentiles of TTFT, TPOT and ITL over its requests, and goodput under SLOs (the requests
whose TTFT and TPOT meet them, per second), as serving benchmarks report them."""

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


def server_load_table(trials: pd.DataFrame, max_ttft_s: float | None = None,
                      max_tpot_s: float | None = None) -> pd.DataFrame:
    """Per group × mode of the server rows (``engine`` set): ``requests`` (measured), ``failed``, ``busy_s`` (the
    seconds requests were in flight: :func:`~kvbench.analysis.reuse_cost.busy_seconds`), ``throughput_tokens_per_s``
    (generated tokens ÷ busy_s), ``request_rate_per_s``, ``ttft_p50_s``/``_p90_s``/``_p99_s``, the same of
    ``tpot`` (over requests) and ``itl`` (over every inter-token gap of every request), and with an SLO
    (``max_ttft_s``, ``max_tpot_s``: seconds, per request) ``slo_met_pct`` and ``goodput_per_s`` (requests meeting
    it ÷ busy_s); empty without server rows."""
    if "engine" not in trials:
        return pd.DataFrame()
    rows = trials[trials["engine"].notna()]
    out = []
    for (group, mode), part in rows.groupby(["group", "mode_label"], sort=False):
        ok = part[part["status"].isin(MEASURED)]
        rec: dict[str, Any] = {"group": group, "mode_label": mode, "mode": part["mode"].iloc[0],
                               "concurrency": part["concurrency"].max(), "requests": len(ok),
                               "failed": int((~part["status"].isin(MEASURED)).sum())}
        busy = busy_seconds(ok) if len(ok) else 0.0
        tokens = float(ok["n_output_tokens"].sum()) if len(ok) else 0.0
        rec.update(busy_s=busy, throughput_tokens_per_s=tokens / busy if busy > 0 else math.nan,
                   request_rate_per_s=len(ok) / busy if busy > 0 else math.nan)
        gaps = [g for v in ok["itl_s"] if isinstance(v, (list, tuple)) for g in v] if "itl_s" in ok else []
        for name, values in (("ttft", ok.get("ttft_s", [])), ("tpot", ok.get("tpot_s", [])), ("itl", gaps)):
            for p in PERCENTILES:
                rec[f"{name}_p{p}_s"] = _pct(list(values), p)
        if max_ttft_s is not None or max_tpot_s is not None:
            met = pd.Series(True, index=ok.index)
            if max_ttft_s is not None:
                met &= pd.to_numeric(ok["ttft_s"], errors="coerce") <= max_ttft_s
            if max_tpot_s is not None:
                met &= pd.to_numeric(ok["tpot_s"], errors="coerce") <= max_tpot_s
            rec["slo_met_pct"] = 100 * float(met.mean()) if len(ok) else math.nan
            rec["goodput_per_s"] = float(met.sum()) / busy if busy > 0 else math.nan
        out.append(rec)
    return pd.DataFrame(out)


__all__ = ["PERCENTILES", "server_load_table"]
