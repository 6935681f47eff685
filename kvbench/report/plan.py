"""``kvbench plan`` as a library: :func:`plan` resolves a model (a preset, a config.json or a model directory), checks
its figures and applies the analytic model of :mod:`kvbench.analysis.plan`; the other functions word the result
(summary lines, the capacity and decode-step tables as text cells, warnings). No GPU, no weights."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from kvbench.analysis.plan import DTYPE_BYTES, ModePlan, cost_per_million, plan_modes
from kvbench.models.config import read_config_file
from kvbench.offload.architecture import Architecture, architecture_of
from kvbench.arguments import count_arg, number_arg
from kvbench.errors import BadFile, BadParameter, BadValue, ModelNotFound, UserError
from kvbench.report.format import GIB, MIB, count_units, gib_or_mib, number

#: Host→device bandwidth (GB/s) plan assumes without a measurement, and how the summary says so.
DEFAULT_LINK_GBPS = 50.0
DEFAULT_LINK_SOURCE = "default; measure it with kvbench env on a GPU"
#: Share of device memory kept for activations, the CUDA context and the allocator.
RESERVE = 0.1


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` found. Sizes in bytes, bandwidths in GB/s (10^9 bytes per second).

    Attributes:
        model: the name given; arch: its :class:`~kvbench.offload.architecture.Architecture`.
        prompt_tokens, batch, dtype, window: as given; dtype_bytes: bytes per element of ``dtype``.
        gpu_bytes, host_bytes: device and host memory assumed.
        link_gbps, link_source: the host→device bandwidth and where it came from; hbm_gbps: device memory's.
        modes: :func:`~kvbench.analysis.plan.plan_modes` (``none``, ``full``, ``hierarchical``).
        costs: USD per 1M generated tokens per mode (None without a GPU price).
    """

    model: str
    arch: Architecture
    prompt_tokens: int
    batch: int
    dtype: str
    dtype_bytes: int
    window: int
    gpu_bytes: int
    host_bytes: int
    link_gbps: float
    link_source: str
    hbm_gbps: float
    modes: list[ModePlan]
    costs: list[float] | None


def model_config(model: str) -> Path:
    """The config.json of ``model``: a preset name, a config.json path or a directory holding one.

    Raises:
        kvbench.errors.BadFile: a path with no config.json there.
        kvbench.errors.ModelNotFound: neither a preset nor a path (the message suggests close preset names).
    """
    from kvbench.models.locate import presets

    shipped = presets()
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if model in shipped:
        return shipped[model]
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise BadFile(f"{path}: no such config.json")
        return path
    raise ModelNotFound(f"unknown model {model!r}: {shipped.did_you_mean(model, n=3, quote=False)}presets: "
                        f"{', '.join(shipped.names())}; or give a config.json path")


def size_bytes(value: int | str, param: str) -> int:
    """Bytes from a number of bytes or a size such as ``80GiB`` or ``512GB``.

    Raises:
        kvbench.errors.BadParameter: not a size, or not above 0 bytes (``param`` names the argument).
    """
    from pydantic import ByteSize, TypeAdapter

    from kvbench.scenario.bounds import check_size_input

    try:
        n = TypeAdapter(ByteSize).validate_python(check_size_input(value))
    except ValueError:  # what either refuses (pydantic.ValidationError is a ValueError)
        raise BadParameter(f"{{{param}}} {value!r}: give bytes or a size such as 80GiB, 512GB", param) from None
    if n <= 0:
        raise BadParameter(f"{{{param}}} {value!r}: must be more than 0 bytes", param)
    return int(n)


def plan(model: str, prompt_tokens: int = 4096, batch: int = 1, dtype: str = "bf16", gpu_mem: int | str = "80GiB",
         host_mem: int | str | None = None, window: int = 512, link_gbps: float | None = None,
         hbm_gbps: float = 2000.0, gpu_price: float | None = None, link_source: str = "given",
         link_probe: Callable[[], tuple[float, str] | None] | None = None) -> Plan:
    """The KV footprint of ``model``, the largest batch per mode and a decode-step roofline.

    Args:
        model: a preset (``kvbench list presets``), a config.json or a model directory.
        prompt_tokens: context per sequence (tokens); batch: sequences decoded together.
        dtype: KV and weights dtype, a key of :data:`~kvbench.analysis.plan.DTYPE_BYTES`.
        gpu_mem, host_mem: device memory and host memory for KV, bytes or sizes (``80GiB``); host default: this
            machine's.
        window: ``hierarchical``'s window (tokens on the device per layer).
        link_gbps: host→device GB/s; without it, ``link_probe()`` (e.g. the last measured), else
            :data:`DEFAULT_LINK_GBPS`. link_source: how the summary names a given ``link_gbps``.
        hbm_gbps: device memory GB/s; gpu_price: USD per GPU-hour, for the cost per 1M tokens.

    Raises:
        kvbench.errors.BadParameter: a dtype, count, bandwidth or size out of range or of another type (``param``
            names it).
        kvbench.errors.BadFile, kvbench.errors.ModelNotFound: a model that cannot be read or found.
        kvbench.errors.BadValue: figures past the analytic model's bounds, or a price out of range.
    """
    import psutil

    if isinstance(model, Path):
        model = str(model)
    if not isinstance(model, str):
        raise BadParameter(f"{{model}} must be a preset name or a path, not {type(model).__name__}", "model")
    prompt_tokens, batch, window = (count_arg(v, n) for v, n in ((prompt_tokens, "prompt_tokens"), (batch, "batch"),
                                                                 (window, "window")))
    link_gbps, gpu_price = number_arg(link_gbps, "link_gbps", optional=True), number_arg(gpu_price, "gpu_price",
                                                                                          optional=True)
    hbm_gbps = number_arg(hbm_gbps, "hbm_gbps")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise BadParameter(f"{{dtype}} {dtype!r}: one of {', '.join(DTYPE_BYTES)}", "dtype")
    bad = [(n, v) for n, v, least in (("prompt_tokens", prompt_tokens, 1), ("batch", batch, 1), ("window", window, 0))
           if v < least]
    if bad:
        raise BadParameter(f"{', '.join(f'{{{n}}} {v}' for n, v in bad)}: {{prompt_tokens}} and {{batch}} must be "
                           "more than 0, {window} 0 or more", bad[0][0],
                           *(n for n in ("prompt_tokens", "batch", "window") if n != bad[0][0]))
    path = model_config(model)
    try:
        arch = architecture_of(read_config_file(path))
    except UserError:
        raise
    except ValueError as exc:  # analysis.plan and offload.layer_types word a config they cannot model so
        raise BadFile(str(exc)) from None
    except (OSError, KeyError) as exc:
        raise BadFile(f"{path}: not a usable model config ({exc})") from None
    if link_gbps is None:
        probe = link_probe() if link_probe else None
        link_gbps, link_source = probe if probe else (DEFAULT_LINK_GBPS, DEFAULT_LINK_SOURCE)
    for name, v in (("link_gbps", link_gbps), ("hbm_gbps", hbm_gbps)):
        if not (v > 0 and math.isfinite(v)):
            raise BadParameter(f"{{{name}}} must be a finite number of GB/s above 0, not {v}", name)
    gpu = size_bytes(gpu_mem, "gpu_mem")
    host = size_bytes(host_mem, "host_mem") if host_mem is not None else psutil.virtual_memory().total
    nbytes = DTYPE_BYTES[dtype]
    try:
        modes = plan_modes(arch, prompt_tokens, batch, nbytes, gpu, host, link_gbps * 1e9, hbm_gbps * 1e9, window,
                           RESERVE)
        costs = [cost_per_million(gpu_price, m.tokens_per_s) for m in modes] if gpu_price is not None else None
    except UserError:
        raise
    except ValueError as exc:  # analysis.plan names the figure and its bound
        raise BadValue(str(exc)) from None
    return Plan(model, arch, prompt_tokens, batch, dtype, nbytes, window, gpu, host, link_gbps, link_source, hbm_gbps,
                modes, costs)


def summary_lines(p: Plan) -> list[str]:
    """The model, the KV per token and per sequence, and what was assumed."""
    a, n = p.arch, p.dtype_bytes
    per_seq = a.kv_bytes(p.prompt_tokens, n)
    return [f"{p.model}: {a.layers} layers ({a.layers - a.full_layers} with a sliding window), {a.kv_heads} kv "
            f"heads × {a.head_dim}, {p.dtype}; {count_units(a.parameters)} parameters = weights "
            f"{gib_or_mib(a.parameters * n)}",
            f"KV: {per_seq / p.prompt_tokens:,.0f} bytes per token at {p.prompt_tokens:,} tokens "
            f"({2 * a.kv_heads * a.head_dim * n * a.layers:,} for full attention in every layer); "
            f"{gib_or_mib(per_seq)} per sequence, {gib_or_mib(per_seq * p.batch)} for batch {p.batch}",
            f"assumed: GPU {gib_or_mib(p.gpu_bytes)} ({RESERVE:.0%} reserved), host {gib_or_mib(p.host_bytes)}, link "
            f"{p.link_gbps:g} GB/s ({p.link_source}), device memory {p.hbm_gbps:g} GB/s"]


def _unit(p: Plan) -> tuple[str, int]:
    """MiB, or GiB when a sequence's KV reaches 1 GiB."""
    return ("GiB", GIB) if p.arch.kv_bytes(p.prompt_tokens, p.dtype_bytes) >= GIB else ("MiB", MIB)


def capacity_cells(p: Plan) -> pd.DataFrame:
    """Per mode: KV per sequence on the device and in host memory, and the largest batch that fits."""
    name, unit = _unit(p)
    return pd.DataFrame([[m.mode, f"{m.device_bytes_per_seq / unit:,.2f}", f"{m.host_bytes_per_seq / unit:,.2f}",
                          f"{m.max_batch:,}"] for m in p.modes],
                        columns=["mode", f"device KV/seq ({name})", f"host KV/seq ({name})", "max batch"], dtype=object)


def roofline_cells(p: Plan) -> pd.DataFrame:
    """Per mode at the batch: link bytes per step, link and memory time, TPOT, tokens/s, what bounds the step, the
    batch from which the link does, and (with a price) USD per 1M tokens."""
    name, unit = _unit(p)
    rows = []
    for i, m in enumerate(p.modes):
        cross = ("-" if m.link_bound_batch is None else "batch 1" if m.link_bound_batch < 1
                 else f"batch {math.floor(m.link_bound_batch) + 1:,}")
        rows.append([m.mode, f"{m.link_bytes_per_step / unit:,.2f}", f"{m.link_s * 1e3:,.1f}",
                     f"{m.memory_s * 1e3:,.1f}", f"{m.step_s * 1e3:,.1f}", f"{m.tokens_per_s:,.1f}", "link" if m.bound == "link" else "memory",
                     cross, *([f"{p.costs[i]:,.2f}"] if p.costs else [])])
    cols = ["mode", f"link {name}", "link ms", "memory ms", "TPOT ms", "tok/s", "bound", "link-bound from"]
    return pd.DataFrame(rows, columns=cols + (["USD/1M tok"] if p.costs else []), dtype=object)


def plan_warnings(p: Plan) -> dict[str, str]:
    """What the tables assume that does not hold, by kind: ``weights`` (they do not fit the GPU), ``batch`` (the batch
    does not fit every mode), ``positions`` (the context is beyond the model's)."""
    out = {}
    weights, room = p.arch.parameters * p.dtype_bytes, p.gpu_bytes * (1 - RESERVE)
    if weights > room:
        out["weights"] = (f"the weights ({gib_or_mib(weights)}) do not fit in {gib_or_mib(room)} of the GPU "
                          f"({RESERVE:.0%} reserved): no batch fits in any mode; the decode step above assumes they "
                          "did")
    over = [f"{m.mode} ({m.max_batch})" for m in p.modes if 0 < m.max_batch < p.batch]
    if over and weights <= room:
        out["batch"] = (f"batch {p.batch} does not fit every mode (max batch: {', '.join(over)}); the decode step "
                        f"above is for batch {p.batch} anyway")
    if p.arch.max_positions and p.prompt_tokens > p.arch.max_positions:
        out["positions"] = (f"{p.prompt_tokens:,} tokens is beyond the model's max_position_embeddings "
                            f"({p.arch.max_positions:,})")
    return out


def plan_note(p: Plan) -> str | None:
    """A closing remark where offload has nothing to move (every layer slides)."""
    if p.arch.full_layers == 0:
        return "every layer has a sliding window: its KV is capped and stays on the device; offload moves nothing"
    return None


def break_even_cells(grid: pd.DataFrame) -> pd.DataFrame:
    """:func:`kvbench.analysis.plan_break_even.plan_break_even`'s grid as text: a row per prompt length, a column
    per shared share, each cell the saving in percent (``−`` when restoring loses)."""
    shares = sorted(grid["shared_pct"].unique())
    rows = []
    for n, part in grid.groupby("prompt_tokens", sort=True):
        by = dict(zip(part["shared_pct"], part["saving_pct"]))
        rows.append([f"{int(n):,}"] + [number(by.get(pct), "+.1f") + "%" for pct in shares])
    return pd.DataFrame(rows, columns=["prompt tokens"] + [f"{int(p)}% shared" for p in shares], dtype=object)


__all__ = ["DEFAULT_LINK_GBPS", "DEFAULT_LINK_SOURCE", "RESERVE", "Plan", "break_even_cells", "capacity_cells",
           "model_config", "plan",
           "plan_note", "plan_warnings", "roofline_cells", "size_bytes", "summary_lines"]
