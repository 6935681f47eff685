"""What a host (or disk) KV tier of each size saves on a trace: the simulated hits (kvbench.traces.simulate) turned
into time with the break-even map's roofline constants (kvbench.analysis.break_even_fit: measured by ``kvbench
map`` or assumed by ``kvbench plan``) and into USD per 1M generated tokens.

Per request ``i`` of prompt ``P`` tokens and ``O`` generated, with ``d`` tokens found on the device, ``h`` restored
from the host tier and ``s`` from the disk tier (the cascade of kvbench.traces.simulate.tier_hits), ``k = d + h + s``
and ``n = P − k`` prefilled, in seconds (the roofline of kvbench.analysis.break_even_fit):

    TTFT  = overhead + prefill × n + attention × n × (k + n / 2) + restore_host × h + restore_disk × s
    GPU-s = TTFT + max(O − 1, 0) × (decode ÷ B + decode_per_token × (P + O / 2))

the prefill one request at a time, the decode in batches of ``B`` sequences (a decode step reads the weights once
for the batch and each sequence's own KV: ``B`` = 1 serves one request at a time), so that GPU-seconds per request
are its share of the GPUs' time × the GPUs of one copy of the model; USD per 1M generated tokens = (GPUs × USD per
GPU-hour + host GiB × USD per GiB-hour + disk GiB × USD per GiB-hour) × Σ GPU-s ÷ 3600 ÷ Σ O × 10^6. Every
figure is linear in the constants, so each bootstrap draw of measured constants gives the whole table again; the
95% intervals are the 2.5th and 97.5th percentiles over the draws (the trace's hits are exact: the interval is
the constants' uncertainty). Assumed constants have no draws and no interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvbench.errors import BadValue
from kvbench.traces.simulate import HitCurve

#: The constants of the cost, in the order of :func:`feature_sums`' columns.
TERMS = ("overhead_s", "prefill_s_per_token", "attention_s_per_token_pair", "restore_host_s_per_token",
         "restore_disk_s_per_token", "decode_s", "decode_s_per_context_token")
#: With no price on host memory, the knee is the smallest host size with at least this share of the largest
#: size's saving against the device alone.
KNEE_SHARE = 0.99


def feature_sums(curve: HitCurve, device_blocks: int, host_blocks: int, disk_blocks: int = 0,
                 decode_batch: int = 1) -> np.ndarray:
    """The sums over requests that multiply each of :data:`TERMS` in Σ GPU-s: float64 ``(len(TERMS),)``."""
    t = curve.trace
    _, dev = curve.per_request(device_blocks)
    _, dev_host = curve.per_request(device_blocks + host_blocks)
    _, total = curve.per_request(device_blocks + host_blocks + disk_blocks)
    p = t.input_tokens.astype(np.float64)
    o = t.output_tokens.astype(np.float64)
    k = total.astype(np.float64)
    n = p - k
    steps = np.maximum(o - 1, 0)
    return np.array([len(p), n.sum(), (n * (k + n / 2)).sum(), float((dev_host - dev).sum()),
                     float((total - dev_host).sum()), steps.sum() / decode_batch, (steps * (p + o / 2)).sum()])


def no_cache_sums(curve: HitCurve, decode_batch: int = 1) -> np.ndarray:
    """:func:`feature_sums` of serving every request with nothing cached (every prompt token prefilled)."""
    t = curve.trace
    p = t.input_tokens.astype(np.float64)
    o = t.output_tokens.astype(np.float64)
    steps = np.maximum(o - 1, 0)
    return np.array([len(p), p.sum(), (p * p / 2).sum(), 0.0, 0.0, steps.sum() / decode_batch,
                     (steps * (p + o / 2)).sum()])


@dataclass(frozen=True)
class SizingInput:
    """What turns hits into money: the roofline ``values`` (:data:`TERMS` → seconds; a missing restore tier is
    None) and their bootstrap ``draws`` (constant → array, or None for assumed constants); the ``gpus`` of one
    copy of the model, the prices (USD per GPU-hour, per GiB-hour of host memory and of disk), the KV bytes of
    one block over those GPUs and the sequences decoded together (``decode_batch``)."""

    values: dict[str, float | None]
    draws: dict[str, np.ndarray] | None
    gpus: int
    gpu_per_hour: float
    host_per_gib_hour: float
    disk_per_gib_hour: float
    block_bytes: int
    decode_batch: int = 1


def _matrix(c: SizingInput) -> np.ndarray:
    """The constants as ``[1 + draws, len(TERMS)]``: the point values, then each draw (a missing tier: 0)."""
    point = np.array([[c.values.get(k) or 0.0 for k in TERMS]])
    if not c.draws:
        return point
    n = min(len(v) for v in c.draws.values())
    cols = [np.asarray(c.draws[k], dtype=np.float64)[:n] if k in c.draws else np.full(n, point[0, i])
            for i, k in enumerate(TERMS)]
    return np.vstack([point, np.column_stack(cols)])


def size_table(curve: HitCurve, c: SizingInput, device_blocks: int, host_sizes: list[int],
               disk_blocks: int = 0) -> pd.DataFrame:
    """One row per host tier size (blocks) in ``host_sizes`` under a device of ``device_blocks`` (and a disk tier
    of ``disk_blocks``): ``host_blocks``, ``host_bytes``, ``disk_bytes``, the hit rates of tokens on the device,
    from the host and from the disk, ``ttft_s`` and ``gpu_s`` per request (mean; GPU-seconds over the GPUs),
    ``usd_per_million`` with ``usd_ci_low``/``usd_ci_high``, and the savings (percent, with intervals) against the
    device alone (``saving_vs_device_pct``: the tier saving) and against no cache at all (``saving_vs_none_pct``).

    Raises:
        BadValue: a size below 0, or a disk tier with no ``restore_disk_s_per_token`` (or a host tier with no
            ``restore_host_s_per_token``).
    """
    if device_blocks < 0 or disk_blocks < 0 or any(h < 0 for h in host_sizes):
        raise BadValue("tier sizes must be 0 blocks or more")
    for tier, size in (("host", max(host_sizes, default=0)), ("disk", disk_blocks)):
        if size and c.values.get(f"restore_{tier}_s_per_token") is None:
            raise BadValue(f"the constants have no restore time from a {tier} tier "
                           f"(restore_{tier}_s_per_token): no cost for a {tier} tier of {size:,} blocks")
    k = _matrix(c)
    o_sum = float(curve.trace.output_tokens.sum())
    per_m = 1e6 / max(o_sum, 1.0) / 3600

    def usd(sums: np.ndarray, host_blocks: int, disk: int) -> np.ndarray:
        hourly = (c.gpus * c.gpu_per_hour + c.host_per_gib_hour * host_blocks * c.block_bytes / 2**30
                  + c.disk_per_gib_hour * disk * c.block_bytes / 2**30)
        return hourly * (k @ sums) * per_m

    b = c.decode_batch
    # the baselines hold no host and no disk tier, and pay for neither
    device_only = usd(feature_sums(curve, device_blocks, 0, 0, b), 0, 0)
    nothing = usd(no_cache_sums(curve, b), 0, 0)
    n = max(len(curve.trace.input_tokens), 1)
    rows = []
    for h in host_sizes:
        sums = feature_sums(curve, device_blocks, h, disk_blocks, b)
        cost = usd(sums, h, disk_blocks)
        ttft = k[0, :5] @ sums[:5] / n
        vs_dev = 100 * (1 - cost / device_only)
        vs_none = 100 * (1 - cost / nothing)
        rows.append({"host_blocks": h, "host_bytes": h * c.block_bytes, "disk_bytes": disk_blocks * c.block_bytes,
                     "hit_rate_device": _rate(curve, device_blocks), "hit_rate_host": _rate(curve, device_blocks + h)
                     - _rate(curve, device_blocks), "hit_rate_disk": _rate(curve, device_blocks + h + disk_blocks)
                     - _rate(curve, device_blocks + h), "ttft_s": float(ttft),
                     "gpu_s": float(c.gpus * (k[0] @ sums) / n), "usd_per_million": float(cost[0]),
                     **_interval("usd", cost), "saving_vs_device_pct": float(vs_dev[0]),
                     **_interval("saving_vs_device", vs_dev), "saving_vs_none_pct": float(vs_none[0]),
                     **_interval("saving_vs_none", vs_none)})
    return pd.DataFrame(rows)


def _rate(curve: HitCurve, capacity: int) -> float:
    return float(curve.rates(capacity)[1])


def _interval(name: str, values: np.ndarray) -> dict[str, float]:
    draws = values[1:][np.isfinite(values[1:])]
    if not len(draws):
        return {f"{name}_ci_low": math.nan, f"{name}_ci_high": math.nan}
    return {f"{name}_ci_low": float(np.quantile(draws, 0.025)), f"{name}_ci_high": float(np.quantile(draws, 0.975))}


def knee(table: pd.DataFrame, host_priced: bool) -> int | None:
    """The host size (row position in ``table``) past which the next GiB stops paying: with host memory priced,
    the size of the lowest USD per 1M (the first of equals); unpriced (every GiB that adds a hit then pays), the
    smallest size with at least :data:`KNEE_SHARE` of the largest saving against the device alone. None for an
    empty table or one whose savings are not numbers."""
    if table.empty or not np.isfinite(table["usd_per_million"]).all():
        return None
    if host_priced:
        return int(np.argmin(table["usd_per_million"].to_numpy()))
    saving = table["saving_vs_device_pct"].to_numpy()
    top = saving.max()
    return int(np.flatnonzero(saving >= top * KNEE_SHARE)[0]) if top > 0 else 0


def host_size_grid(curve: HitCurve, device_blocks: int, block_bytes: int, most: int = 16) -> list[int]:
    """Host tier sizes (blocks) to price: 0, then sizes growing by a power of two from the smallest power of two of
    GiB that holds ``max(a block, the device cache ÷ 4)`` up to the first that holds the whole working set beyond
    the device: by 2 when ``most`` sizes reach it, else by the smallest power of two that does (so the last size
    always holds the working set and a knee is never the edge of the grid)."""
    beyond = max(curve.distinct_blocks - device_blocks, 1)
    gib = 2.0 ** math.ceil(math.log2(max(block_bytes, device_blocks * block_bytes / 4) / 2**30))
    start = max(1, int(gib * 2**30 // block_bytes))
    doublings = max(0, math.ceil(math.log2(beyond / start))) if beyond > start else 0
    step = 2 ** max(1, math.ceil(doublings / max(most - 2, 1)))
    sizes = [0]
    while True:
        blocks = max(1, int(gib * 2**30 // block_bytes))
        sizes.append(blocks)
        if blocks >= beyond:
            break
        gib *= step
    return sorted(set(sizes))
