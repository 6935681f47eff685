"""A server run's load table for people: per mode, the concurrency asked for and reached, throughput over the time
requests were in flight and over the load's wall-clock time, the percentiles of TTFT, TPOT and ITL with their
counts, and goodput under SLOs (:func:`kvbench.analysis.server_load.server_load_table`)."""

from __future__ import annotations

import pandas as pd

from kvbench.analysis.latency import is_max_rank
from kvbench.analysis.server_load import PERCENTILES
from kvbench.report.format import missing, ms

#: The caption of a server run's load table (terminal, report.md and report.html).
LOAD_CAPTION = ("in flight: the concurrency asked for, the most requests in flight at once and the time-weighted mean "
                "while any was; tok/s = generated tokens ÷ the seconds requests were in flight / ÷ the load's "
                "wall-clock seconds (holds, slot saves and think time included); hit % = Σ cached ÷ Σ prompt "
                "tokens; TTFT and TPOT p50 / p90 / p99 over the requests (n: requests), ITL over every gap between "
                "streamed chunks (its n beside); max = the percentile is the largest value (p99 of at most 100, "
                "p90 of at most 10)")

#: The caption of a server run's load table with goodput under SLOs (``kvbench cost --max-ttft-ms/--max-tpot-ms``).
GOODPUT_CAPTION = ("goodput = requests meeting the SLO ÷ the seconds requests were in flight / ÷ the load's "
                   "wall-clock seconds; " + LOAD_CAPTION)


def percentile_cell(r: dict, name: str, with_n: bool = True) -> str:
    """``p50 / p90 / p99 (n N)`` of ``name`` in milliseconds, each percentile that the rank rule makes the maximum
    written ``max`` (p99 of at most 100 values, p90 of at most 10), e.g. ``596 / 1,190 / max 1,200 (n 18)``;
    without ``with_n`` the count is left to another column."""
    n = int(r.get(f"{name}_n") or 0)
    if not n:
        return "-"
    cells = [("max " if is_max_rank(n, p) else "") + ms(r[f"{name}_p{p}_s"]) for p in PERCENTILES]
    return " / ".join(cells) + (f" (n {n})" if with_n else "")


def server_load_display(table: pd.DataFrame) -> pd.DataFrame:
    """Text cells: ``mode``, ``requests`` (and failed: the n of the TTFT and TPOT percentiles), ``in flight``
    (asked for, the most reached and the time-weighted mean while any was: ``4: max 3, mean 2.4``), ``tok/s``
    (generated tokens ÷ the seconds requests were in flight, then ÷ the load's wall-clock seconds), ``hit %`` (Σ
    cached ÷ Σ prompt tokens), ``TTFT ms p50/p90/p99`` (:func:`percentile_cell`), the same of TPOT, and of ITL (one
    gap per streamed chunk) with its own n, and with an SLO ``SLO met %`` and ``goodput req/s`` (in flight / wall
    clock); ``scenario`` first."""
    if table.empty:
        return pd.DataFrame()
    rows = []
    for r in table.to_dict("records"):
        rec = {"scenario": r["group"], "mode": r["mode_label"],
               "requests": f"{r['requests']}" + (f" ({r['failed']} failed)" if r["failed"] else ""),
               "in flight": "-" if not r["requests"] else
               f"{int(r['concurrency'])}: max {int(r['in_flight_max'])}, mean {r['in_flight_mean']:.1f}",
               "tok/s busy / wall": " / ".join("-" if missing(v) else f"{v:,.2f}" for v in (
                   r["throughput_busy_tokens_per_s"], r["throughput_wall_tokens_per_s"])),
               "hit %": "-" if missing(r["cached_token_share"]) else f"{100 * r['cached_token_share']:.0f}"}
        for name in ("ttft", "tpot", "itl"):
            rec[f"{name.upper()} ms p{'/p'.join(map(str, PERCENTILES))}"] = percentile_cell(r, name, name == "itl")
        if "slo_met_pct" in r:
            rec["SLO met %"] = "-" if missing(r["slo_met_pct"]) else f"{r['slo_met_pct']:.0f}"
            rec["goodput req/s busy / wall"] = " / ".join("-" if missing(v) else f"{v:.3f}" for v in (
                r["goodput_busy_per_s"], r["goodput_wall_per_s"]))
        rows.append(rec)
    return pd.DataFrame(rows)


def concurrency_lines(table: pd.DataFrame) -> list[str]:
    """One line per mode whose requests never reached the concurrency it asked for (a workload of chained
    conversations holds at most one request per conversation in flight): asked, reached, mean."""
    out = []
    for r in table.to_dict("records"):
        asked = r.get("concurrency")
        if r["requests"] and not missing(asked) and r["in_flight_max"] < asked:
            out.append(f"`{r['mode_label']}`: asked for {int(asked)} requests in flight, at most "
                       f"{int(r['in_flight_max'])} were (mean {r['in_flight_mean']:.1f} while any was): the workload "
                       "cannot fill that level (a conversation's turns go one after another)")
    return out
