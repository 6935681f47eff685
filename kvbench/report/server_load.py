"""A server run's load table for people: per mode, throughput, the percentiles of TTFT, TPOT and ITL, and goodput
under SLOs (:func:`kvbench.analysis.server_load.server_load_table`)."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.server_load import PERCENTILES
from kvbench.report.format import missing, ms


def server_load_display(table: pd.DataFrame) -> pd.DataFrame:
    """Text cells: ``mode``, ``requests`` (and failed), ``tok/s`` (generated tokens ÷ the seconds requests were
    in flight), ``TTFT ms p50/p90/p99``, the same of TPOT and ITL, and with an SLO ``SLO met %`` and ``goodput
    req/s``; ``scenario`` first."""
    if table.empty:
        return pd.DataFrame()
    rows = []
    for r in table.to_dict("records"):
        rec = {"scenario": r["group"], "mode": r["mode_label"],
               "requests": f"{r['requests']}" + (f" ({r['failed']} failed)" if r["failed"] else ""),
               "tok/s": "-" if missing(r["throughput_tokens_per_s"]) else f"{r['throughput_tokens_per_s']:,.2f}"}
        for name in ("ttft", "tpot", "itl"):
            rec[f"{name.upper()} ms p{'/p'.join(map(str, PERCENTILES))}"] = " / ".join(
                ms(r[f"{name}_p{p}_s"]) for p in PERCENTILES)
        if "slo_met_pct" in r:
            rec["SLO met %"] = "-" if missing(r["slo_met_pct"]) else f"{r['slo_met_pct']:.0f}"
            rec["goodput req/s"] = "-" if missing(r["goodput_per_s"]) else f"{r['goodput_per_s']:.3f}"
        rows.append(rec)
    return pd.DataFrame(rows)
