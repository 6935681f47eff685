"""``kvbench simulate`` as a library: a trace's prefix-cache hit rates at every capacity (kvbench.traces.simulate),
in blocks, tokens and, for a model, bytes of its KV; the split over device, host and disk tiers; the text, the
table and the files (``simulation.csv``, ``simulation.json``, ``simulation.png``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.plan import DTYPE_BYTES
from kvbench.errors import BadParameter
from kvbench.report.charts import pyplot, save_figure
from kvbench.report.cost import replacing, replacing_chart, writing_into
from kvbench.report.format import finite_json, gib_or_mib
from kvbench.report.plan import model_sizes_of, size_bytes
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.safe_text import file_stem
from kvbench.traces.direct import direct_hits
from kvbench.traces.read import MAX_TRACE_BYTES, read_trace
from kvbench.traces.simulate import HitCurve, TierHits, capacity_grid, simulate, tier_hits
from kvbench.traces.trace import Trace, window

#: What the hit rates mean, said beside every output.
DEFINITIONS = ("hit rate of blocks = hit block visits ÷ all block visits; hit rate of tokens = Σ min(hit blocks × "
               "block tokens, prompt tokens) ÷ Σ prompt tokens; a request's hit is its leading run of blocks found "
               "in the cache, looked up before it touches any block (the first miss ends it); capacity = distinct "
               "blocks held")


@dataclass(frozen=True)
class Simulation:
    """A simulated trace: its curve, and the model whose KV the capacities are priced in bytes by.

    Attributes:
        curve: the hit curve (:class:`~kvbench.traces.simulate.HitCurve`; ``curve.trace`` the requests simulated).
        model: the model named (None: capacities in blocks and tokens only).
        kv_bytes_per_token: KV bytes of one token over every GPU of one copy of the model (one GPU's share ×
            ``tp``, so replicated KV heads count on every GPU); None without a model.
        tp, dtype: the tensor parallelism and KV dtype the bytes are for.
        tiers: the split over tiers per host tier size asked for (empty: no device capacity given).
    """

    curve: HitCurve
    model: str | None
    kv_bytes_per_token: int | None
    tp: int
    dtype: str
    tiers: list[TierHits]

    @property
    def trace(self) -> Trace:
        """The requests simulated."""
        return self.curve.trace

    def block_bytes(self) -> int | None:
        """KV bytes of one block (over every GPU of one copy of the model); None without a model."""
        return None if self.kv_bytes_per_token is None else self.kv_bytes_per_token * self.trace.block_tokens


def kv_bytes_per_token(model: str, tp: int = 1, dtype: str = "bf16") -> int:
    """KV bytes of one token of ``model`` over its ``tp`` GPUs (one GPU's share,
    :meth:`~kvbench.models.sizes.ModelSizes.split`, × ``tp``).

    Raises:
        kvbench.errors.BadParameter: an unknown ``dtype`` or a ``tp`` the model's heads do not split over.
        kvbench.errors.BadFile, kvbench.errors.ModelNotFound: the model cannot be found or read.
    """
    if dtype not in DTYPE_BYTES:
        raise BadParameter(f"{{dtype}} {dtype!r}: one of {', '.join(DTYPE_BYTES)}", "dtype")
    return model_sizes_of(model).split(tp).sequence_bytes_per_token(DTYPE_BYTES[dtype]) * tp


def simulate_trace(path: str | Path, fmt: str = "auto", block_tokens: int | None = None, policy: str = "lru",
                   model: str | None = None, tp: int = 1, dtype: str = "bf16", device_tokens: int | None = None,
                   host_tokens: list[int] | None = None, disk_tokens: int = 0,
                   window_args: dict[str, Any] | None = None, max_bytes: int = MAX_TRACE_BYTES) -> Simulation:
    """Read the trace at ``path`` (:func:`~kvbench.traces.read.read_trace`), cut it to ``window_args``
    (:func:`~kvbench.traces.trace.window`'s keywords), simulate it under ``policy`` and, given ``device_tokens``,
    split its hits over a device, a host tier of each of ``host_tokens`` (none: one cascade without a host tier)
    and a disk tier of ``disk_tokens`` (each rounded down to whole blocks).

    Raises:
        kvbench.errors.BadFile: the trace cannot be read (one line per faulty line).
        kvbench.errors.BadValue: a window, policy or tier size out of range.
        kvbench.errors.BadParameter, kvbench.errors.ModelNotFound: see :func:`kv_bytes_per_token`.
    """
    per_token = kv_bytes_per_token(model, tp, dtype) if model is not None else None
    trace = read_trace(path, fmt, block_tokens, max_bytes)
    if window_args:
        trace = window(trace, **window_args)
    curve = simulate(trace, policy)
    tiers: list[TierHits] = []
    if device_tokens is not None:
        b = trace.block_tokens
        tiers = [tier_hits(curve, device_tokens // b, h // b, disk_tokens // b) for h in host_tokens or [0]]
    return Simulation(curve, model, per_token, tp, dtype, tiers)


def tokens_of(size: str, kv_bytes_per_token: int | None, what: str) -> int:
    """A capacity given as tokens (a whole number: ``65536``) or as bytes of KV (a size: ``64GiB``, ``1.5TB``;
    then ``kv_bytes_per_token`` converts it, rounding down), in tokens.

    Raises:
        kvbench.errors.BadParameter: neither, a size without a model, or below 0 (``param`` is ``what``).
    """
    text = size.strip()
    if text.isascii() and text.isdigit():
        return int(text) if len(text) <= 18 else 1 << 62
    if not re.fullmatch(r"[0-9.]+\s*[A-Za-z]+", text):
        raise BadParameter(f"{{{what}}} {text[:40]!r}: give tokens (a whole number) or a size of KV such as "
                           "64GiB", what)
    if kv_bytes_per_token is None:
        raise BadParameter(f"{{{what}}} {text[:40]!r}: a size in bytes needs a model whose KV it holds (or give "
                           "tokens, a whole number)", what)
    return size_bytes(text, what) // kv_bytes_per_token


def summary_lines(sim: Simulation) -> list[str]:
    """The trace and its ceiling, in a few lines of text."""
    t, c = sim.trace, sim.curve
    span = float(t.arrival_s[-1]) if t.n_requests else 0.0
    working = c.distinct_blocks * t.block_tokens
    lines = [f"trace: {t.source} ({t.format}, {t.block_tokens} tokens per block): {t.n_requests:,} requests over "
             f"{span:,.0f} s, mean prompt {t.input_tokens.mean():,.0f} tokens, mean output "
             f"{t.output_tokens.mean():,.0f}; {t.n_visits:,} block visits, {c.distinct_blocks:,} distinct blocks "
             f"({working:,} tokens" + (f", {gib_or_mib(working * sim.kv_bytes_per_token)} of {sim.model} KV "
                                         f"at tp {sim.tp}, {sim.dtype})" if sim.kv_bytes_per_token else ")")]
    lines += [f"note: {n}" for n in t.notes]
    blocks, tokens = c.ceiling
    lines.append(f"unlimited cache ({c.policy}): hit rate of blocks {blocks:.3f}, of tokens {tokens:.3f}")
    return lines


def curve_frame(sim: Simulation, capacities: np.ndarray | None = None) -> pd.DataFrame:
    """The curve at ``capacities`` (distinct blocks; default :func:`~kvbench.traces.simulate.capacity_grid`), one
    row each: ``capacity_blocks``, ``capacity_tokens``, ``capacity_bytes`` (NaN without a model),
    ``hit_rate_blocks``, ``hit_rate_tokens``, ``hit_blocks``, ``hit_tokens``."""
    caps = capacity_grid(sim.curve) if capacities is None else np.asarray(capacities, dtype=np.int64)
    hit_b, hit_t = sim.curve.hits(caps)
    rate_b, rate_t = sim.curve.rates(caps)
    per_block = sim.block_bytes()
    return pd.DataFrame({"capacity_blocks": caps, "capacity_tokens": caps * sim.trace.block_tokens,
                         "capacity_bytes": caps * per_block if per_block else np.full(len(caps), np.nan),
                         "hit_rate_blocks": rate_b, "hit_rate_tokens": rate_t, "hit_blocks": hit_b,
                         "hit_tokens": hit_t})


def direct_frame(sim: Simulation, policies: list[str], capacities: list[int]) -> pd.DataFrame:
    """The hit rates of other ``policies`` (kvbench.traces.direct, simulated one capacity at a time) beside the
    one-pass policy's, at each of ``capacities`` (distinct blocks): one row per policy and capacity, with
    ``policy``, ``capacity_blocks``, ``capacity_tokens``, ``hit_rate_blocks``, ``hit_rate_tokens``.

    Raises:
        kvbench.errors.BadParameter: an unknown policy, or a capacity below 0.
    """
    t, c = sim.trace, sim.curve
    rows = []
    for cap in capacities:
        blocks, tokens = c.rates(cap)
        rows.append({"policy": c.policy, "capacity_blocks": cap, "capacity_tokens": cap * t.block_tokens,
                     "hit_rate_blocks": float(blocks), "hit_rate_tokens": float(tokens)})
        for policy in policies:
            hit = direct_hits(t, policy, cap)
            hit_tokens = np.minimum(hit * t.block_tokens, t.input_tokens)
            rows.append({"policy": policy, "capacity_blocks": cap, "capacity_tokens": cap * t.block_tokens,
                         "hit_rate_blocks": float(hit.sum() / max(c.total_blocks, 1)),
                         "hit_rate_tokens": float(hit_tokens.sum() / max(c.total_tokens, 1))})
    return pd.DataFrame(rows)


def table_capacities(distinct_blocks: int) -> np.ndarray:
    """The capacities (blocks) a terminal table shows: 1, 3, 10, 30, 100... below the trace's distinct blocks, then
    the distinct blocks themselves (the unlimited cache)."""
    steps = [m * 10**e for e in range(19) for m in (1, 3)]
    return np.array([c for c in steps if c < distinct_blocks] + [max(distinct_blocks, 1)], dtype=np.int64)


def curve_cells(sim: Simulation) -> pd.DataFrame:
    """The curve at :func:`table_capacities`, as text cells."""
    frame = curve_frame(sim, table_capacities(sim.curve.distinct_blocks))
    return pd.DataFrame({
        "blocks": [f"{v:,}" for v in frame["capacity_blocks"]],
        "tokens": [f"{v:,}" for v in frame["capacity_tokens"]],
        **({"KV": [gib_or_mib(v) for v in frame["capacity_bytes"]]} if sim.block_bytes() else {}),
        "hit rate of blocks": [f"{v:.3f}" for v in frame["hit_rate_blocks"]],
        "hit rate of tokens": [f"{v:.3f}" for v in frame["hit_rate_tokens"]]})


def _size(blocks: int, sim: Simulation) -> str:
    tokens = blocks * sim.trace.block_tokens
    per_block = sim.block_bytes()
    return f"{tokens:,} tokens" + (f" ({gib_or_mib(blocks * per_block)})" if per_block else "")


def tier_cells(sim: Simulation) -> pd.DataFrame:
    """Per cascade of :attr:`Simulation.tiers` (one per host tier size): the tiers' sizes and the hit rate of
    tokens (of blocks in brackets) each serves, as text."""
    rows = []
    for h in sim.tiers:
        row = {f"{n} tier": _size(size, sim) if size else "none" for n, size in h.capacity_blocks.items()}
        row.update({f"from {n}": f"{h.token_rate[n]:.3f} ({h.block_rate[n]:.3f})" for n in h.capacity_blocks
                    if h.capacity_blocks[n]})
        row["total"] = f"{sum(h.token_rate.values()):.3f} ({sum(h.block_rate.values()):.3f})"
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


def simulation_doc(sim: Simulation) -> dict[str, Any]:
    """What ``simulation.json`` holds: the trace's figures, the definitions, the ceiling, the tiers and the curve."""
    t, c = sim.trace, sim.curve
    blocks, tokens = c.ceiling
    return finite_json({
        "trace": {"source": t.source, "format": t.format, "block_tokens": t.block_tokens, "requests": t.n_requests,
                  "duration_s": float(t.arrival_s[-1]), "block_visits": t.n_visits,
                  "distinct_blocks": c.distinct_blocks, "prompt_tokens": c.total_tokens,
                  "output_tokens": int(t.output_tokens.sum()), "notes": list(t.notes)},
        "policy": c.policy, "definitions": DEFINITIONS,
        "model": sim.model, "tp": sim.tp, "dtype": sim.dtype, "kv_bytes_per_token": sim.kv_bytes_per_token,
        "ceiling": {"hit_rate_blocks": blocks, "hit_rate_tokens": tokens},
        "tiers": [{n: {"capacity_blocks": h.capacity_blocks[n], "hit_rate_blocks": h.block_rate[n],
                       "hit_rate_tokens": h.token_rate[n]} for n in h.capacity_blocks} for h in sim.tiers],
        "curve": json.loads(curve_frame(sim).to_json(orient="records", double_precision=15))})


def _plain_ticks() -> Any:
    """Tick labels of a log axis as plain numbers (``0.01``, ``1``, ``10k``, ``1M``): charts draw no math text."""
    from matplotlib.ticker import FuncFormatter

    def label(v: float, _pos: int) -> str:
        for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if v >= scale:
                return f"{v / scale:g}{suffix}"
        return f"{v:g}"

    return FuncFormatter(label)


def curve_chart(sim: Simulation, path: Path) -> Path:
    """The hit rates of tokens and of blocks against capacity in tokens (log scale; the KV's bytes on a second
    axis for a model), the unlimited cache's as dashed lines and the tiers' edges as vertical lines; saved to
    ``path``."""
    plt = pyplot()
    frame = curve_frame(sim)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.14, top=0.84 if sim.block_bytes() else 0.9)
    x = frame["capacity_tokens"]
    ax.plot(x, frame["hit_rate_tokens"], color="#1f77b4", label="hit rate of tokens")
    ax.plot(x, frame["hit_rate_blocks"], color="#ff7f0e", label="hit rate of blocks")
    blocks, tokens = sim.curve.ceiling
    ax.axhline(tokens, color="#1f77b4", linestyle="--", linewidth=0.8, label=f"unlimited: {tokens:.3f} of tokens")
    ax.axhline(blocks, color="#ff7f0e", linestyle="--", linewidth=0.8, label=f"unlimited: {blocks:.3f} of blocks")
    if sim.tiers:
        edge = 0
        for name, size in sim.tiers[-1].capacity_blocks.items():
            if size:
                edge += size
                ax.axvline(edge * sim.trace.block_tokens, color="0.4", linestyle=":", linewidth=0.9)
                ax.text(edge * sim.trace.block_tokens, 0.02, f" {name}", color="0.3", fontsize=8, rotation=90,
                        va="bottom")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(_plain_ticks())
    ax.set_ylim(0, max(0.05, min(1.0, max(blocks, tokens) * 1.15)))
    ax.set_xlabel("cache capacity (tokens of KV held)")
    ax.set_ylabel("hit rate")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    per_token = sim.kv_bytes_per_token
    if per_token:
        top = ax.secondary_xaxis("top", functions=(lambda t: t * per_token / 2**30, lambda g: g * 2**30 / per_token))
        top.xaxis.set_major_formatter(_plain_ticks())
        top.set_xlabel(f"GiB of {sim.model} KV (tp {sim.tp}, {sim.dtype})")
    ax.set_title(f"{sim.trace.source}: {sim.curve.policy} prefix cache", fontsize=10)
    return save_figure(fig, path)


def trace_stem(path: str | Path) -> str:
    """A trace file's name without its suffix, made safe for a folder name (:func:`kvbench.safe_text.file_stem`)."""
    return file_stem(Path(path).stem or "trace")


def write_simulation(sim: Simulation, out_dir: str | Path, extra: dict[str, Any] | None = None) -> list[Path]:
    """``simulation.csv`` (:func:`curve_frame`), ``simulation.json`` (:func:`simulation_doc`, with ``extra``'s keys
    added: the cost) and ``simulation.png`` (:func:`curve_chart`) in ``out_dir`` (created), each written beside
    its place and moved onto it; returns their paths (a chart that cannot be drawn is left out with a warning).

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written.
    """
    out = Path(out_dir)
    refuse_symlink_dir(out)
    with writing_into(out):
        out.mkdir(parents=True, exist_ok=True)
        frame = curve_frame(sim)
        paths = [replacing(out / "simulation.csv", lambda tmp: frame.to_csv(tmp, index=False) or tmp),
                 replacing(out / "simulation.json", lambda tmp: tmp.write_text(
                     json.dumps(finite_json({**simulation_doc(sim), **(extra or {})}), indent=1, allow_nan=False)
                     + "\n")),
                 replacing_chart(out / "simulation.png", lambda tmp: curve_chart(sim, tmp), "the hit-rate curve")]
    return [p for p in paths if p is not None]


def write_csv(frame: pd.DataFrame, out_dir: str | Path, name: str) -> list[Path]:
    """``frame`` as the CSV file ``name`` in ``out_dir`` (created), written beside its place and moved onto it
    (``kvbench trace sweep``'s ``sweep.csv``, ``kvbench trace validate``'s ``replay_check.csv``).

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: the file cannot be written.
    """
    out = Path(out_dir)
    refuse_symlink_dir(out)
    with writing_into(out):
        out.mkdir(parents=True, exist_ok=True)
        path = replacing(out / name, lambda tmp: frame.to_csv(tmp, index=False) or tmp)
    return [path] if path is not None else []
