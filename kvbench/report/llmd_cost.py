"""The cost in kvbench's llm-d extension: the figure ``kvbench cost`` gives the same point, so the export and the
table never disagree (:mod:`kvbench.report.llmd`)."""

from __future__ import annotations

import math
from typing import Any

from kvbench.analysis.cost import Prices
from kvbench.analysis.reuse_cost import reuse_cost
from kvbench.results.load import Results


def export_cost(point: dict[str, Any] | None, throughput: float, prices: Prices) -> dict[str, Any]:
    """The extension's ``cost`` at ``prices``: an in-process report's is its point's in ``kvbench cost``
    (``point``, a row of :func:`kvbench.analysis.cost.point_costs`: USD per 1M generated tokens from the median
    of its trials' throughput, the host and disk KV it held charged; none where the point does not qualify, with
    ``why``); a server mode's is its figure in ``kvbench cost`` too (:func:`server_costs`), and where cost gives
    none (a map run's cells, a server run without ``none``), the report's output rate (``throughput``, tokens/s),
    no memory charged."""
    prices_used = {"gpu_usd_per_hour": prices.gpu_per_hour, "host_usd_per_gib_hour": prices.host_per_gib_hour,
                   "disk_usd_per_gib_hour": prices.disk_per_gib_hour}
    if point is None:
        return {**prices_used, "usd_per_million_output_tokens": prices.per_million(throughput)
                if throughput > 0 else None, "basis": "output_token_rate of this report; no host or disk memory "
                "charged", "why": ""}
    usd = point["usd_per_million"]
    return {**prices_used, "usd_per_million_output_tokens": usd if usd == usd else None,
            "usd_ci": [point["usd_ci_low"], point["usd_ci_high"]] if usd == usd and point["usd_ci_low"] == point[
                "usd_ci_low"] else None,
            "host_kv_bytes": point["host_kv_bytes"], "disk_kv_bytes": point["disk_kv_bytes"],
            "basis": "kvbench cost: the median throughput of the point's measured trials, its host and disk KV "
                     "charged", "why": point["why"]}


def server_costs(results: Results, prices: Prices) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (group, mode label) of a server run, its USD per 1M generated tokens as ``kvbench cost`` gives it
    (:func:`kvbench.analysis.reuse_cost.reuse_cost`: Σ tokens ÷ the seconds the server was answering, the quiet
    pairs', its host tier and slot files charged; ``none`` as the recompute side), shaped as a
    :func:`~kvbench.analysis.cost.point_costs` row (no interval: cost gives a saving's, not a side's). A map run's
    modes are costed per cell there, so they have none here (the report pools its cells)."""
    trials = results.trials
    if "engine" not in trials or trials["engine"].isna().all():
        return {}
    rows = reuse_cost(trials, prices, servers=results.servers)
    if rows.empty or "cell" in rows:
        return {}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows[rows["saving_kind"] == "reuse"].to_dict("records"):
        for label, side, host, disk in ((r["mode_label"], "restore", r["store_host_bytes"], r["store_disk_bytes"]),
                                        (r["baseline"], "recompute", 0.0, 0.0)):
            out.setdefault((r["group"], label), {
                "usd_per_million": r[f"{side}_usd_per_million"], "usd_ci_low": math.nan, "usd_ci_high": math.nan,
                "host_kv_bytes": host, "disk_kv_bytes": disk, "why": ""})
    return out


__all__ = ["export_cost", "server_costs"]
