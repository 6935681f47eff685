"""What reuse saves, with its interval: the requests of a reuse workload (:mod:`kvbench.bench.reuse`) served by recomputing
every prompt (cold) and by restoring stored prefixes (warm), priced per 1M generated tokens (:mod:`kvbench.analysis.cost`).

The saving is the workload's: Σ generated tokens ÷ Σ e2e seconds on each side, one request at a time. Its 95%
interval is a percentile bootstrap over request pairs (the warm and the cold run of one request in one repeat ran
back to back), recomputing that ratio of sums on each resample; the verdict is :func:`kvbench.analysis.intervals.judge`'s.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvbench.results.rows import MEASURED
from kvbench.analysis.cost import GIB, Prices
from kvbench.analysis.intervals import judge, pair_load, pair_with_reference
from kvbench.analysis.reuse import ids_verdict, recompute_side, reuse_trials

#: Bootstrap resamples of the saving's interval.
N_BOOT = 2000


def _saving_interval(pairs: pd.DataFrame, hourly_warm: float, hourly_cold: float, n_boot: int,
                     seed: int, overlap: tuple[float, float] = (1.0, 1.0)) -> tuple[float, float]:
    """95% percentile-bootstrap interval (percent) of 1 − (hourly_warm ÷ tokens/s warm) ÷ (hourly_cold ÷ tokens/s
    cold) over resamples of the request pairs, tokens/s = Σ tokens ÷ (Σ e2e × ``overlap``) of the resampled pairs;
    ``overlap`` (warm, cold): the seconds requests were in flight ÷ Σ e2e of each side (1 one at a time; below 1
    when requests overlapped), so that the whole sample gives the point estimate; NaN with fewer than 5 pairs."""
    n = len(pairs)
    if n < 5 or n_boot <= 0:
        return math.nan, math.nan
    tok_w = (pairs["n_output_tokens"] * pairs["batch_size"]).to_numpy(float)
    tok_c = (pairs["n_output_tokens_ref"] * pairs["batch_size_ref"]).to_numpy(float)
    e2e_w, e2e_c = pairs["e2e_s"].to_numpy(float), pairs["e2e_s_ref"].to_numpy(float)
    pos = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    tps_w = tok_w[pos].sum(axis=1) / (e2e_w[pos].sum(axis=1) * overlap[0])
    tps_c = tok_c[pos].sum(axis=1) / (e2e_c[pos].sum(axis=1) * overlap[1])
    saving = 100 * (1 - (hourly_warm / tps_w) / (hourly_cold / tps_c))
    lo, hi = np.quantile(saving, [0.025, 0.975])
    return float(lo), float(hi)


def busy_seconds(rows: pd.DataFrame) -> float:
    """Seconds a server was answering measured requests: per run and repeat, the length of the union of the
    requests' intervals [``start_s``, ``start_s`` + ``e2e_s``] (requests in flight together count once), summed.
    One request at a time, it is Σ e2e."""
    total = 0.0
    for _, part in rows.groupby(["run", "repeat"], sort=False):
        spans = sorted(zip(part["start_s"].astype(float), part["start_s"].astype(float) + part["e2e_s"].astype(float)))
        end = -math.inf
        for a, b in spans:
            if b > end:
                total += b - max(a, end)
                end = b
    return total


def reuse_cost(trials: pd.DataFrame, prices: Prices, n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """Per group × mode of a reuse workload: throughput and cost recomputing vs restoring, and the saving.

    Throughput = Σ generated tokens ÷ Σ e2e seconds over the measured trials of each side (a server run: ÷ the
    seconds it was answering them, :func:`busy_seconds`, since requests in flight together share the machine); USD per 1M generated
    tokens from it (:meth:`kvbench.analysis.cost.Prices.per_million`; restore is also charged for what its store held
    after a request, the medians of ``store_host_bytes`` at the host price and ``store_disk_bytes`` at the disk
    price; ``store_bytes`` is their sum; a server's tiers are its own memory, not priced apart); a server mode's
    recompute side is ``none`` on the same requests (:func:`kvbench.analysis.reuse.recompute_side`); ``saving_pct`` = 1 − restore's ÷ recompute's with ``saving_ci_low`` /
    ``saving_ci_high`` (see the module docstring), ``pairs``, ``pairs_busy_trials`` and ``saving_verdict`` ("" =
    decided); ``prefill_saved_pct`` = Σ tokens restored ÷ Σ prompt tokens of the warm trials (the prefill
    compute not done); ``engine`` (a server run's, else None); ``ttft_saved_s`` = Σ (recompute − restore) TTFT ÷ requests; ``tokens_match`` as in
    :func:`kvbench.analysis.reuse.reuse_table`.
    """
    rows = reuse_trials(trials)
    rows = rows[rows["status"].isin(MEASURED)]
    out = []
    for (group, mode), part in rows.groupby(["group", "mode_label"], sort=False):
        server = "engine" in part and part["engine"].notna().all()
        if server and part["mode"].eq("none").all():
            continue  # a server run's `none` is the recompute side of the other modes
        warm, cold = part[part["warm"].astype(bool)], recompute_side(rows, part, group)
        rec: dict[str, Any] = {"group": group, "mode_label": mode, "mode": part["mode"].iloc[0],
                               "engine": part["engine"].iloc[0] if server else None, "requests": len(warm)}
        host, disk = (float(warm[col].fillna(0).astype(float).median()) if len(warm) and col in warm else 0.0
                      for col in ("store_host_bytes", "store_disk_bytes"))
        rec["store_bytes"] = host + disk
        overlap = {}
        for side, frame, h, d in (("recompute", cold, 0.0, 0.0), ("restore", warm, host, disk)):
            total = frame["e2e_s"].astype(float).sum()
            e2e = busy_seconds(frame) if server else total
            overlap[side] = e2e / total if total > 0 else 1.0
            tps = (frame["n_output_tokens"] * frame["batch_size"]).sum() / e2e if e2e > 0 else math.nan
            rec[f"{side}_tokens_per_s"] = tps
            rec[f"{side}_usd_per_million"] = prices.per_million(tps, h, d) if tps == tps else math.nan
        rec["saving_pct"] = 100 * (1 - rec["restore_usd_per_million"] / rec["recompute_usd_per_million"])
        pairs = pair_with_reference(warm, cold, on=["request_id"]) if "request_id" in part else warm.iloc[:0]
        hourly_warm = prices.gpu_per_hour + prices.host_per_gib_hour * host / GIB + prices.disk_per_gib_hour * disk / GIB
        lo, hi = _saving_interval(pairs, hourly_warm, prices.gpu_per_hour, n_boot, seed,
                                  (overlap["restore"], overlap["recompute"])) if len(pairs) else (
            math.nan, math.nan)
        load = pair_load(pairs)
        busy, unknown = int(load["busy_trials"].sum()), int(load["load_unknown"].sum())
        rec.update(saving_ci_low=lo, saving_ci_high=hi, pairs=len(pairs), pairs_busy_trials=busy,
                   saving_verdict=judge(len(pairs), busy, unknown, lo, hi, no_change=0.0))
        prompt = warm["prompt_tokens"].sum()
        rec["prefill_saved_pct"] = 100 * warm["tokens_restored"].sum() / prompt if prompt else math.nan
        rec["ttft_saved_s"] = ((cold["ttft_s"].astype(float).sum() - warm["ttft_s"].astype(float).sum())
                               / len(warm) if len(warm) and len(cold) == len(warm) else math.nan)
        rec["tokens_match"] = ids_verdict(part)
        out.append(rec)
    return pd.DataFrame(out)


__all__ = ["N_BOOT", "reuse_cost"]
