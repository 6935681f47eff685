"""What reuse saves, with its interval: the requests of a reuse workload (:mod:`kvbench.bench.plans.reuse`) served by
recomputing every prompt (cold) and by restoring stored prefixes (warm), priced per 1M generated tokens
(:mod:`kvbench.analysis.cost`).

The saving is the workload's: Σ generated tokens ÷ Σ e2e seconds on each side, one request at a time. Its 95%
interval is the jackknife over independent units of request pairs (the warm and the cold run of one request in one
repeat ran back to back; the turns of one conversation are not independent, nor are requests in flight together),
recomputing that ratio of sums without each unit in turn (:func:`kvbench.analysis.intervals.jackknife_interval`:
94–96% measured coverage with 5 units, where a percentile cluster bootstrap covered about 84%); a busy pair is
counted but never part of the figure; the verdict is :func:`kvbench.analysis.intervals.judge`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvbench.results.rows import MEASURED
from kvbench.analysis.cost import GIB, Prices
from kvbench.analysis.engaged import reuse_not_engaged, warm_start
from kvbench.analysis.intervals import (MIN_INTERVAL_VALUES, PAIR_KEYS, jackknife_interval, judge, pair_load,
                                        pair_with_reference, quiet_pairs, unit_sums)
from kvbench.analysis.reuse import ids_verdict, recompute_side, reuse_trials, sampling_units, with_cells
from kvbench.analysis.tier import baseline_label, tier_not_engaged, tier_of

def _saving_interval(pairs: pd.DataFrame, hourly_warm: float, hourly_cold: float,
                     overlap: tuple[float, float] = (1.0, 1.0)) -> tuple[float, float, float, float]:
    """95% intervals of the saving, 1 − (hourly_warm ÷ tokens/s warm) ÷ (hourly_cold ÷ tokens/s cold) in percent,
    and of the difference in USD per 1M generated tokens, restore − recompute: the jackknife over independent
    units (:func:`~kvbench.analysis.reuse.sampling_units`: whole conversations, documents, prefixes, or whole
    loads at a concurrency above 1; :func:`~kvbench.analysis.intervals.jackknife_interval`), the saving's on the
    log scale of the cost ratio; tokens/s = Σ tokens ÷ (Σ e2e × ``overlap``) of the pairs; ``overlap`` (warm,
    cold): the seconds requests were in flight ÷ Σ e2e of each side (1 one at a time; below 1 when requests
    overlapped), so that the whole sample gives the point estimate. Returns ``(saving low, saving high, Δ USD low,
    Δ USD high)``; NaN with fewer than 5 pairs or 2 units."""
    if len(pairs) < MIN_INTERVAL_VALUES:
        return math.nan, math.nan, math.nan, math.nan
    sums = unit_sums(sampling_units(pairs)[0], [
        pairs["n_output_tokens"] * pairs["batch_size"], pairs["e2e_s"] * overlap[0],
        pairs["n_output_tokens_ref"] * pairs["batch_size_ref"], pairs["e2e_s_ref"] * overlap[1]])

    def usd(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # USD per 1M tokens, restore and recompute
        return hourly_warm * t[..., 1] / t[..., 0] / 3600 * 1e6, hourly_cold * t[..., 3] / t[..., 2] / 3600 * 1e6

    with np.errstate(divide="ignore", invalid="ignore"):
        _, lo, hi = jackknife_interval(sums, lambda t: np.log(usd(t)[0] / usd(t)[1]))
        _, dlo, dhi = jackknife_interval(sums, lambda t: usd(t)[0] - usd(t)[1])
    return 100 * (1 - math.exp(hi)), 100 * (1 - math.exp(lo)), dlo, dhi


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


#: How a server mode's host tier is charged (:func:`server_host_bytes`).
HOST_TIER_BASES = ("configured", "measured")


def _median(rows: pd.DataFrame, col: str) -> float:
    """The median of ``col`` over ``rows`` (a missing value counts 0; 0 without rows or column)."""
    return float(pd.to_numeric(rows[col], errors="coerce").fillna(0).median()) if len(rows) and col in rows else 0.0


def _size(n: float) -> str:
    """Bytes as text in B, KiB, MiB or GiB, one decimal above bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:.0f} B"


def server_host_bytes(warm: pd.DataFrame, cold: pd.DataFrame, basis: str = "configured") -> tuple[float, str]:
    """``(bytes, source)``: the host memory a server mode is charged for, and where that figure comes from (``""``
    when its flags configure no host tier).

    ``configured``: the host KV tier its flags set (``server_host_tier_bytes``: llama.cpp ``--cache-ram``, vLLM
    ``--kv-offloading-size``, SGLang ``--hicache-size``), the size one must provision; where the flags do not say
    (``server_host_tier`` tells why), the measured figure instead. ``measured``: the median over the mode's
    requests of the server's RSS growth since its first measured request (``server_rss_growth_bytes``), less the
    same median of ``none`` on the same requests (``cold``: its prefill buffers grow too), at least 0.

    Raises:
        ValueError: ``basis`` is not one of :data:`HOST_TIER_BASES`.
    """
    if basis not in HOST_TIER_BASES:
        raise ValueError(f"host tier basis {basis!r}: one of {', '.join(HOST_TIER_BASES)}")
    tier = pd.to_numeric(warm["server_host_tier_bytes"], errors="coerce") if "server_host_tier_bytes" in warm \
        else pd.Series(dtype=float)
    if basis == "configured" and tier.notna().any():
        source = str(warm["server_host_tier"].dropna().iloc[0]) if "server_host_tier" in warm else ""
        return (float(tier.max()), f"{source}, configured") if tier.max() > 0 else (0.0, "")
    growth = [pd.to_numeric(f["server_rss_growth_bytes"], errors="coerce").dropna() if "server_rss_growth_bytes"
              in f else pd.Series(dtype=float) for f in (warm, cold)]
    why = "" if basis == "measured" else ", its flags do not say"
    if growth[0].empty:
        return 0.0, f"not charged: no RSS reading{why}"
    mine, none = float(growth[0].median()), float(growth[1].median()) if len(growth[1]) else 0.0
    return max(0.0, mine - none), f"RSS +{_size(mine)} less none's +{_size(none)}, measured{why}"


def reuse_cost(trials: pd.DataFrame, prices: Prices,
               host_tier: str = "configured", servers: Sequence[dict[str, Any]] = ()) -> pd.DataFrame:
    """Per group × mode of a reuse workload: throughput and cost of the mode against its baseline, and the saving.

    Every mode has its *reuse saving*, against recomputing every prompt (``baseline`` ``none``, ``saving_kind``
    ``reuse``); a server's host/disk tier mode (:func:`kvbench.analysis.tier.tier_of`) has a second row, its
    *tier saving*, against the same engine's prefix-cache mode of the group (``baseline`` its label, e.g.
    ``prefix-cache`` or ``radix``; ``saving_kind`` ``tier``): the figure a user with prefix caching on needs.

    Throughput = Σ generated tokens ÷ Σ e2e seconds over the measured trials of each side (a server run: ÷ the
    seconds it was answering them, :func:`busy_seconds`, since requests in flight together share the machine); USD
    per 1M generated tokens from it (:meth:`kvbench.analysis.cost.Prices.per_million`; restore is also charged for
    what its store held after a request, the medians of ``store_host_bytes`` at the host price and
    ``store_disk_bytes`` at the disk price; ``store_bytes`` is their sum; a server mode is charged its host tier as
    ``host_tier`` says (:func:`server_host_bytes`) and its slot files on disk, ``store_disk_bytes``; ``charged``
    says what was charged, ``host 256.0 MiB, disk 3.2 KiB`` or ``none``, and ``charged_from`` where each figure
    comes from). The ``recompute_*`` columns are the baseline side's: a server mode's reuse baseline is ``none``
    on the same requests (:func:`kvbench.analysis.reuse.recompute_side`), its tier baseline the prefix-cache
    mode's requests at the same concurrency, charged what that mode holds. ``saving_pct`` = 1 − the mode's ÷ the
    baseline's with ``saving_ci_low`` / ``saving_ci_high`` (see the module docstring), ``delta_usd_per_million``
    = the mode's − the baseline's USD per 1M with ``delta_usd_ci_low`` / ``delta_usd_ci_high`` (the same
    resamples), ``pairs``, ``units``, ``unit``, ``pairs_busy_trials`` and ``saving_verdict`` ("" = decided; a
    reuse row that reused nothing and a tier row whose tier's own counters did not move are "not engaged":
    :func:`kvbench.analysis.engaged.reuse_not_engaged`, :func:`kvbench.analysis.tier.tier_not_engaged`, which
    reads ``servers``, run.json's server entries; a server that began warm gets none either:
    :func:`kvbench.analysis.engaged.warm_start`); ``prefill_saved_pct`` = Σ tokens restored ÷ Σ prompt tokens of
    the warm trials (the prefill compute not done; a tier row: Σ ``tier_hit_tokens``, what the tier itself
    served, NaN where not told per request); ``engine`` (a server run's, else None); ``ttft_saved_s`` = Σ
    (baseline − mode) TTFT ÷ requests; ``tokens_match`` as in :func:`kvbench.analysis.reuse.reuse_table`. A server
    group without a ``none`` mode has no reuse rows (nothing recomputed every prompt). A break-even map run's
    rows are costed per cell (``cell``: :func:`kvbench.analysis.reuse.with_cells`), each against its own cell.
    """
    every = with_cells(reuse_trials(trials))
    rows = every[every["status"].isin(MEASURED)]
    cells = ["cell"] if "cell" in rows else []  # a map run: per cell, never pooled
    out = []
    for key, part in rows.groupby(["group", "mode_label", *cells], sort=False):
        group, mode = key[0], key[1]
        where = {"cell": key[2]} if cells else None
        server = "engine" in part and part["engine"].notna().all()
        if server and part["mode"].eq("none").all():
            continue  # a server run's `none` is the recompute side of the other modes
        warm, cold = part[part["warm"].astype(bool)], recompute_side(rows, part, group, where)
        engine = part["engine"].iloc[0] if server else None
        rec: dict[str, Any] = {"group": group, "mode_label": mode, "mode": part["mode"].iloc[0], "engine": engine,
                               "requests": len(warm), **(where or {})}
        charge = _charges(warm, cold, server, host_tier)
        if not server or rows.loc[rows["group"] == group, "mode"].eq("none").any():  # a reuse saving's baseline
            out.append(_saving({**rec, "baseline": "none", "saving_kind": "reuse"}, warm, cold, charge, (0.0, 0.0),
                               prices, server, reuse_not_engaged(warm) or warm_start(part)))
            out[-1]["tokens_match"] = ids_verdict(part)
        base = baseline_label(every, part) if server and tier_of(engine, rec["mode"]) else None
        if base is None:
            continue
        ref = rows[(rows["group"] == group) & (rows["mode_label"] == base) & rows["warm"].astype(bool)
                   & (rows["cell"] == key[2] if cells else True)]
        base_charge = _charges(ref, cold, server, host_tier)
        missing = f"no tier verdict: `{base}` measured no request" if ref.empty else ""
        out.append(_saving({**rec, "baseline": base, "saving_kind": "tier"}, warm, ref, charge,
                           (base_charge[0], base_charge[1]), prices, server,
                           missing or tier_not_engaged(warm, servers, engine, mode)
                           or warm_start(pd.concat([part, ref]))))
        out[-1]["tokens_match"] = ids_verdict(part)
        hits = pd.to_numeric(warm["tier_hit_tokens"], errors="coerce") if "tier_hit_tokens" in warm else None
        prompt = warm["prompt_tokens"].sum()
        out[-1]["prefill_saved_pct"] = (100 * hits.clip(lower=0).sum() / prompt if hits is not None
                                        and hits.notna().any() and prompt else math.nan)
    return pd.DataFrame(out)


def _charges(warm: pd.DataFrame, cold: pd.DataFrame, server: bool, host_tier: str) -> tuple[float, float, str, str]:
    """``(host bytes, disk bytes, charged, charged_from)`` of a mode's ``warm`` trials (``cold``: its recompute
    side, for a server's measured host basis): see :func:`reuse_cost`."""
    host, disk = (_median(warm, col) for col in ("store_host_bytes", "store_disk_bytes"))
    charged, sources = [], []
    if server:
        host, source = server_host_bytes(warm, cold, host_tier)
        sources.append(f"host: {source}" if source else "")
        if disk:
            sources.append("disk: slot files")
    elif host or disk:
        sources.append("the store, median after a request")
    if host:
        charged.append(f"host {_size(host)}")
    if disk:
        charged.append(f"disk {_size(disk)}")
    return host, disk, ", ".join(charged) or "none", "; ".join(c for c in sources if c)


def _saving(rec: dict[str, Any], warm: pd.DataFrame, ref: pd.DataFrame, charge: tuple[float, float, str, str],
            ref_charge: tuple[float, float], prices: Prices, server: bool,
            not_engaged: str) -> dict[str, Any]:
    """``rec`` with the cost of ``warm`` against the baseline trials ``ref`` (charged ``ref_charge``: host and
    disk bytes), their paired saving with its interval and verdict (``not_engaged``: why there is none, or "")."""
    host, disk, charged, charged_from = charge
    rec.update(store_bytes=host + disk, store_host_bytes=host, store_disk_bytes=disk, charged=charged,
               charged_from=charged_from)
    pairs = pair_with_reference(warm, ref, on=["request_id"]) if "request_id" in warm else warm.iloc[:0]
    load = pair_load(pairs)
    busy, unknown = int(load["busy_trials"].sum()), int(load["load_unknown"].sum())
    labels, unit = sampling_units(pairs)
    figure, interval = quiet_pairs(load)
    if not figure.all():  # a busy pair is counted, never a figure: the quiet requests' saving
        keys = ["request_id", *PAIR_KEYS]
        quiet = pairs.loc[figure, keys].drop_duplicates()
        warm, ref = warm.merge(quiet, on=keys), ref.merge(quiet, on=keys)
    overlap = {}
    for side, frame, (h, d) in (("recompute", ref, ref_charge), ("restore", warm, (host, disk))):
        total = frame["e2e_s"].astype(float).sum()
        e2e = busy_seconds(frame) if server else total
        overlap[side] = e2e / total if total > 0 else 1.0
        tps = (frame["n_output_tokens"] * frame["batch_size"]).sum() / e2e if e2e > 0 else math.nan
        rec[f"{side}_tokens_per_s"] = tps
        rec[f"{side}_usd_per_million"] = prices.per_million(tps, h, d) if tps > 0 else math.nan  # NaN, 0: none
    rec["saving_pct"] = 100 * (1 - rec["restore_usd_per_million"] / rec["recompute_usd_per_million"])
    no_tokens = ("not costed: its trials record no generated tokens (n_output_tokens 0)"
                 if not rec["restore_tokens_per_s"] > 0 or not rec["recompute_tokens_per_s"] > 0 else "")
    lo, hi, dlo, dhi = (_saving_interval(pairs[interval], _hourly(prices, host, disk), _hourly(prices, *ref_charge),
                                         (overlap["restore"], overlap["recompute"]))
                        if interval.any() else (math.nan,) * 4)
    rec.update(delta_usd_per_million=rec["restore_usd_per_million"] - rec["recompute_usd_per_million"],
               delta_usd_ci_low=dlo, delta_usd_ci_high=dhi)
    rec.update(saving_ci_low=lo, saving_ci_high=hi, pairs=len(pairs), pairs_figure=int(figure.sum()),
               units=int(labels.nunique()), unit=unit,
               pairs_busy_trials=busy,
               saving_verdict=not_engaged or no_tokens or judge(len(pairs), busy, unknown, lo, hi, no_change=0.0,
                                                               units=(int(labels.nunique()), unit)))
    prompt = warm["prompt_tokens"].sum()
    rec["prefill_saved_pct"] = 100 * warm["tokens_restored"].sum() / prompt if prompt else math.nan
    rec["ttft_saved_s"] = ((ref["ttft_s"].astype(float).sum() - warm["ttft_s"].astype(float).sum())
                           / len(warm) if len(warm) and len(ref) == len(warm) else math.nan)
    return rec


def _hourly(prices: Prices, host: float, disk: float) -> float:
    """USD per hour of one GPU holding ``host`` and ``disk`` bytes of KV beside it."""
    return prices.gpu_per_hour + prices.host_per_gib_hour * host / GIB + prices.disk_per_gib_hour * disk / GIB


__all__ = ["reuse_cost"]
