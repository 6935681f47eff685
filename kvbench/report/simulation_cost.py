"""``kvbench simulate``'s cost: per host tier size, what a simulated trace costs per 1M generated tokens against
the device's prefix cache alone and against no cache (kvbench.analysis.tier_sizing), with constants measured (a
``map.json`` of ``kvbench map``) or assumed (``kvbench plan``'s GPU preset), each labelled; the knee; and the
paragraph that says what to buy."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.analysis.plan_break_even import Constants, extrapolation_warning, measured_constants
from kvbench.analysis.tier_sizing import KNEE_SHARE, SizingInput, host_size_grid, knee, size_table
from kvbench.errors import BadParameter
from kvbench.report.format import gib_or_mib
from kvbench.report.plan import device_cache_tokens, plan
from kvbench.report.simulation import Simulation


@dataclass(frozen=True)
class Sizing:
    """The cost of each host tier size for a simulation.

    Attributes:
        table: :func:`~kvbench.analysis.tier_sizing.size_table`'s rows.
        knee: the row past which the next GiB stops paying (:func:`~kvbench.analysis.tier_sizing.knee`), or None.
        device_blocks, disk_blocks: the device cache and the disk tier (blocks).
        device_source: where the device cache's size comes from.
        constants: the roofline constants and their sources (``measured: …`` or ``assumed: …``).
        gpu: the GPU preset (assumed constants) or None (measured); gpus: GPUs of one copy of the model.
        gpu_per_hour, host_per_gib_hour, disk_per_gib_hour: the prices (USD); decode_batch: sequences decoded
            together.
    """

    table: pd.DataFrame
    knee: int | None
    device_blocks: int
    disk_blocks: int
    device_source: str
    constants: Constants
    gpu: str | None
    gpus: int
    gpu_per_hour: float
    host_per_gib_hour: float
    disk_per_gib_hour: float
    decode_batch: int = 1


def check_prices(gpu_price: float, host_price: float = 0.0, disk_price: float = 0.0) -> None:
    """The prices :func:`size_tiers` takes, checked: USD per GPU-hour above 0, per GiB-hour 0 or more, each finite
    and at most 10,000.

    Raises:
        kvbench.errors.BadParameter: a price out of range (``param`` names it).
    """
    for name, v, strict in (("gpu_price", gpu_price, True), ("host_price", host_price, False),
                            ("disk_price", disk_price, False)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 if strict else v >= 0) and v <= 1e4):
            raise BadParameter(f"{{{name}}} must be a finite number {'above 0' if strict else '0 or more'} and at "
                               f"most 10,000 USD, not {v!r}", name)


@dataclass(frozen=True)
class Basis:
    """What prices a simulation, settled before it runs: the roofline ``constants``, the device prefix cache
    (``device_tokens``) and where it comes from (``device_source``), the GPU preset of assumed constants (``gpu``;
    None: measured)."""

    constants: Constants
    device_tokens: int
    device_source: str
    gpu: str | None


def sizing_basis(model: str, tp: int = 1, dtype: str = "bf16", gpu: str = "h100",
                 constants_path: str | Path | None = None, device_tokens: int | None = None,
                 allow_busy: bool = False) -> Basis:
    """The constants and the device cache that :func:`size_tiers` prices with: measured (``constants_path``, a
    ``map.json`` of ``kvbench map``; ``device_tokens`` must then be given: kvbench cannot know the measured engine's
    cache) or assumed from ``tp`` GPUs of preset ``gpu`` (:func:`~kvbench.report.plan.plan`), whose memory beside
    the weights is the device cache unless ``device_tokens`` says otherwise.

    Raises:
        kvbench.errors.BadParameter: measured constants without ``device_tokens``, a busy fit without
            ``allow_busy``, an unknown preset or a ``tp`` the model does not split over, or weights that fill the
            GPUs (no device cache) with no ``device_tokens`` (``param`` names the argument).
        kvbench.errors.BadValue: a constants file that cannot be read.
    """
    if constants_path is not None:
        if device_tokens is None:
            raise BadParameter("measured constants ({constants_path}) need {device_tokens}: the KV tokens the "
                               "measured engine keeps on its device", "device_tokens", "constants_path")
        return Basis(measured_constants(constants_path, allow_busy=allow_busy), device_tokens, "given", None)
    p = plan(model, dtype=dtype, gpu=gpu, tp=tp)
    if device_tokens is not None:
        return Basis(p.constants, device_tokens, "given", gpu)
    room = int(device_cache_tokens(p))
    if room <= 0:
        raise BadParameter(f"{model}'s weights fill {tp}× {gpu} (no room for a KV cache): give more GPUs ({{tp}}) "
                           "or the device cache ({device_tokens})", "tp", "device_tokens")
    return Basis(p.constants, room, f"{tp}× {gpu}'s memory less 10% and the weights", gpu)


def size_tiers(sim: Simulation, gpu_price: float, host_price: float = 0.0, disk_price: float = 0.0,
               basis: Basis | None = None, host_tokens: list[int] | None = None, disk_tokens: int = 0,
               decode_batch: int = 1) -> Sizing:
    """Price every host tier size for ``sim`` (which must name a model).

    Args:
        gpu_price, host_price, disk_price: USD per GPU-hour and per GiB-hour of host memory and of disk held.
        basis: the constants and the device cache (:func:`sizing_basis`; default: assumed on one preset H100 at
            ``sim``'s tp and dtype).
        host_tokens: host tier sizes (tokens) to price, besides none (sorted, each once); default
            :func:`~kvbench.analysis.tier_sizing.host_size_grid`.
        disk_tokens: a disk tier under every host size (tokens).
        decode_batch: sequences decoded together (1: one request at a time).

    Raises:
        kvbench.errors.BadParameter: no model, a price or ``decode_batch`` out of range (``param`` names it); as
            :func:`sizing_basis`.
        kvbench.errors.BadValue: a tier the constants cannot price.
    """
    if sim.kv_bytes_per_token is None or sim.model is None:
        raise BadParameter("the cost needs {model}: its KV bytes price the host memory and its sizes the time",
                           "model")
    check_prices(gpu_price, host_price, disk_price)
    if type(decode_batch) is not int or not 1 <= decode_batch <= 4096:
        raise BadParameter(f"{{decode_batch}} must be a whole number from 1 to 4,096, not {decode_batch!r}",
                           "decode_batch")
    basis = basis or sizing_basis(sim.model, sim.tp, sim.dtype)
    b = sim.trace.block_tokens
    block_bytes = sim.block_bytes() or 0
    device_blocks = basis.device_tokens // b
    hosts = (sorted({0, *(t // b for t in host_tokens)}) if host_tokens
             else host_size_grid(sim.curve, device_blocks, block_bytes))
    values: dict[str, float | None] = dict(basis.constants.values)
    values.setdefault("restore_disk_s_per_token", None)
    cin = SizingInput(values, basis.constants.draws, sim.tp, gpu_price, host_price, disk_price, block_bytes,
                      decode_batch)
    table = size_table(sim.curve, cin, device_blocks, hosts, disk_tokens // b)
    return Sizing(table, knee(table, host_price > 0), device_blocks, disk_tokens // b, basis.device_source,
                  basis.constants, basis.gpu, sim.tp, gpu_price, host_price, disk_price, decode_batch)


def _ci(low: float, high: float, digits: int, unit: str = "", fmt: str = "f") -> str:
    return "" if not (math.isfinite(low) and math.isfinite(high)) else (
        f" [{low:.{digits}{fmt}}, {high:.{digits}{fmt}}{unit}]")


def sizing_cells(sim: Simulation, s: Sizing) -> pd.DataFrame:
    """:attr:`Sizing.table` as text cells, the knee's row marked."""
    b = sim.trace.block_tokens
    rows = []
    for i, r in enumerate(s.table.to_dict("records")):
        rows.append({
            "host tier": "none" if not r["host_blocks"] else gib_or_mib(r["host_bytes"]),
            "tokens": f"{r['host_blocks'] * b:,}",
            "hit rate of tokens: device + host": f"{r['hit_rate_device']:.3f} + {r['hit_rate_host']:.3f}",
            "TTFT": f"{r['ttft_s'] * 1e3:,.1f} ms",
            "USD per 1M": f"{r['usd_per_million']:.4g}" + _ci(r["usd_ci_low"], r["usd_ci_high"], 4, fmt="g"),
            "saving vs device alone": f"{r['saving_vs_device_pct']:.1f}%" + _ci(
                r["saving_vs_device_ci_low"], r["saving_vs_device_ci_high"], 1, "%"),
            "saving vs no cache": f"{r['saving_vs_none_pct']:.1f}%" + _ci(
                r["saving_vs_none_ci_low"], r["saving_vs_none_ci_high"], 1, "%"),
            "": "knee" if i == s.knee else ""})
    return pd.DataFrame(rows)


def extrapolation(sim: Simulation, s: Sizing) -> str:
    """Why measured constants are extrapolated on this trace (its prompts beyond 2x of the lengths they were fitted
    to: :func:`~kvbench.analysis.plan_break_even.extrapolation_warning`), or ``""``."""
    lengths = sim.trace.input_tokens
    return extrapolation_warning(s.constants, sorted({int(lengths.min()), int(lengths.max())}))


def constant_lines(s: Sizing) -> list[str]:
    """One line per constant: its value and where it comes from (measured or assumed)."""
    return [f"{k}: {v:.4g} s ({s.constants.source.get(k, '?')})" for k, v in s.constants.values.items()
            if v is not None and math.isfinite(v)]


def advice(sim: Simulation, s: Sizing) -> str:
    """The paragraph of what to buy and why: the knee's host size, its hit rates, cost and savings with their
    intervals, against what, and on which constants."""
    t = s.table
    if s.knee is None or t.empty:
        return "No advice: the cost could not be computed for these constants (see the table)."
    r = t.iloc[s.knee]
    measured = any(v.startswith("measured") for v in s.constants.source.values())
    where = (f"{s.gpus}× {s.gpu}" if s.gpu else f"the engine the constants were measured on ({s.gpus} GPU"
             f"{'s' if s.gpus > 1 else ''} priced)")
    device = (f"a device prefix cache of {s.device_blocks * sim.trace.block_tokens:,} tokens ({s.device_source}; "
              f"hit rate of tokens {r['hit_rate_device']:.3f})")
    if not r["host_blocks"]:
        head = (f"Buy no host tier: on {sim.trace.source} ({sim.trace.n_requests:,} requests), {sim.model} on "
                f"{where} with {device} gains nothing worth its price from a host tier")
    else:
        priced = (f"at {s.host_per_gib_hour:g} USD per GiB-hour the next GiB costs more than it saves"
                  if s.host_per_gib_hour > 0 else
                  f"a larger one adds under {1 - KNEE_SHARE:.0%} of the largest size's saving (host memory "
                  "unpriced)")
        head = (f"Buy a host tier of about {gib_or_mib(r['host_bytes'])} per copy of the model: on "
                f"{sim.trace.source} ({sim.trace.n_requests:,} requests), {sim.model} on {where} with {device}, it "
                f"serves {r['hit_rate_host']:.3f} of prompt tokens from host memory, brings TTFT to "
                f"{r['ttft_s'] * 1e3:,.1f} ms and costs {r['usd_per_million']:.4g} USD per 1M generated tokens"
                f"{_ci(r['usd_ci_low'], r['usd_ci_high'], 4, fmt='g')}: {r['saving_vs_device_pct']:.1f}%"
                f"{_ci(r['saving_vs_device_ci_low'], r['saving_vs_device_ci_high'], 1, '%')} less than the device's "
                f"prefix cache alone (the tier saving) and {r['saving_vs_none_pct']:.1f}%"
                f"{_ci(r['saving_vs_none_ci_low'], r['saving_vs_none_ci_high'], 1, '%')} less than no cache; "
                f"past it {priced}")
    basis = ("Measured constants (intervals: 95% over their bootstrap draws)" if measured and s.constants.draws else
             "Measured constants without draws (no interval)" if measured else
             "Assumed constants (no interval: nothing was measured)")
    served = ("requests served one at a time" if s.decode_batch == 1 else
              f"prefills one at a time, decodes in batches of {s.decode_batch}")
    return (f"{head}. {basis}; {served} at {s.gpu_per_hour:g} USD per GPU-hour; the hits are a "
            f"{sim.curve.policy} simulation of the trace, exact for that policy.")


def sizing_doc(s: Sizing, advice_text: str) -> dict[str, Any]:
    """What ``simulation.json`` adds for the cost: the prices, the device cache, the constants with their sources,
    the table's rows, the knee's host size and the advice."""
    return {"cost": {"gpu_per_hour": s.gpu_per_hour, "host_per_gib_hour": s.host_per_gib_hour,
                     "disk_per_gib_hour": s.disk_per_gib_hour, "gpu": s.gpu, "gpus": s.gpus,
                     "decode_batch": s.decode_batch, "device_blocks": s.device_blocks,
                     "device_source": s.device_source, "disk_blocks": s.disk_blocks,
                     "constants": {k: {"value": v, "source": s.constants.source.get(k)}
                                   for k, v in s.constants.values.items()},
                     "rows": json.loads(s.table.to_json(orient="records")),
                     "knee_host_bytes": None if s.knee is None else int(s.table.iloc[s.knee]["host_bytes"]),
                     "advice": advice_text}}
