"""``kvbench plan`` as a library: :func:`plan` resolves a model (a preset, a config.json or a model directory) and a
machine (a GPU or node preset, :mod:`kvbench.analysis.plan_machine`), checks the figures and applies both analytic
models of offload: the reuse tier (:mod:`kvbench.analysis.plan_reuse`: finished KV restored when a prefix comes
back, as vLLM's and LMCache's CPU tiers do) and kvbench's own decode-time streaming (:mod:`kvbench.analysis.plan`);
the other functions word the result (summary lines, the fit check, the tables as text cells). No GPU, no
weights."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import pandas as pd

from kvbench.analysis.plan import DTYPE_BYTES, MAX_USD_PER_HOUR, ModePlan, cost_per_million, plan_modes
from kvbench.analysis.plan_break_even import Constants, assumed_constants, contexts_up_to
from kvbench.analysis.plan_machine import Machine, machine
from kvbench.analysis.plan_reuse import REUSE_SHARES, reuse_table
from kvbench.models.sizes import ModelSizes, read_model_sizes
from kvbench.arguments import count_arg, number_arg
from kvbench.errors import BadFile, BadParameter, BadValue, ModelNotFound, UserError
from kvbench.report.format import GIB, MIB, count_units, gib_or_mib, number

#: Share of device memory kept for activations, the CUDA context and the allocator.
RESERVE = 0.1


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` found. Sizes in bytes, bandwidths in GB/s (10^9 bytes per second).

    Attributes:
        model: the name given; arch: its :class:`~kvbench.models.sizes.ModelSizes` (the whole model);
            gpu_arch: one GPU's share of it under tensor parallelism (``arch`` itself at ``tp`` 1).
        prompt_tokens, batch, dtype, window: as given; dtype_bytes: bytes per element of ``dtype``.
        machine: the GPU, its figures, the tensor-parallel GPUs and the host memory, each with its source
            (:class:`~kvbench.analysis.plan_machine.Machine`).
        modes: kvbench's streaming offload, :func:`~kvbench.analysis.plan.plan_modes` (``none``, ``full``,
            ``hierarchical``) on one GPU.
        costs: USD per 1M generated tokens per mode (None without a GPU price; nan for a mode priced at no batch).
        constants: the assumed roofline constants of one GPU
            (:func:`~kvbench.analysis.plan_break_even.assumed_constants`).
        reuse: the reuse tier's TTFT per prompt length and share (:func:`~kvbench.analysis.plan_reuse.reuse_table`).
    """

    model: str
    arch: ModelSizes
    gpu_arch: ModelSizes
    prompt_tokens: int
    batch: int
    dtype: str
    dtype_bytes: int
    window: int
    machine: Machine
    modes: list[ModePlan]
    costs: list[float] | None
    constants: Constants
    reuse: pd.DataFrame

    @property
    def link_gbps(self) -> float:
        """The host link's GB/s per direction (the machine's)."""
        return self.machine.link_gbps

    @property
    def hbm_gbps(self) -> float:
        """Device memory GB/s (the machine's)."""
        return self.machine.hbm_gbps


def model_config(model: str) -> Path:
    """The config.json of ``model``: a preset name, a config.json path or a directory holding one.

    Raises:
        kvbench.errors.BadFile: a path with no config.json there, or a GGUF file.
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
        if path.suffix.lower() == ".gguf":
            raise BadFile(f"{path}: a GGUF model: plan reads a config.json (a preset name, a config.json or a "
                          "model directory holding one)")
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


def model_sizes_of(model: str) -> ModelSizes:
    """The sizes of ``model`` (a preset, a config.json or a model directory), from its config alone.

    Raises:
        kvbench.errors.BadFile, kvbench.errors.ModelNotFound: a model that cannot be read or found, or whose expert
            or latent-attention fields kvbench cannot count (the message names the field).
    """
    path = model_config(model)
    try:
        return read_model_sizes(path)
    except UserError:
        raise
    except ValueError as exc:  # analysis.plan and offload.layer_types word a config they cannot model so
        raise BadFile(str(exc)) from None
    except (OSError, KeyError) as exc:
        raise BadFile(f"{path}: not a usable model config ({exc})") from None


def device_cache_tokens(p: Plan) -> float:
    """The KV tokens the GPUs of one copy of the model hold beside its weights (0 when the weights fill them): one
    GPU's memory less :data:`RESERVE` and its share of the weights, ÷ its KV bytes per token."""
    room = p.machine.gpu_bytes * (1 - RESERVE) - p.gpu_arch.parameters * p.dtype_bytes
    return max(0.0, room / p.gpu_arch.sequence_bytes_per_token(p.dtype_bytes))


def plan(model: str, prompt_tokens: int = 4096, batch: int = 1, dtype: str = "bf16",
         gpu_mem: int | str | None = None, host_mem: int | str | None = None, window: int = 512,
         link_gbps: float | None = None, hbm_gbps: float | None = None, gpu_price: float | None = None,
         link_source: str = "given", link_probe: Callable[[], tuple[float, str] | None] | None = None,
         gpu: str = "h100", tp: int = 1, tflops: float | None = None) -> Plan:
    """Both kinds of offload for ``model`` on ``tp`` GPUs of preset ``gpu``: the reuse tier's TTFT (restoring
    finished KV against recomputing it) and kvbench's streaming offload (KV per sequence, the largest batch per
    mode, a decode-step roofline).

    Args:
        model: a preset (``kvbench list presets``), a config.json or a model directory.
        prompt_tokens: context per sequence (tokens); batch: sequences decoded together.
        dtype: KV and weights dtype, a key of :data:`~kvbench.analysis.plan.DTYPE_BYTES`.
        gpu: a GPU or node preset of :data:`kvbench.models.gpus.GPUS`; tp: GPUs the model is split over.
        gpu_mem, hbm_gbps, tflops, link_gbps: one GPU's memory (bytes or a size such as ``80GiB``), memory GB/s,
            dense TFLOP/s and host link GB/s per direction, replacing the preset's. Without ``link_gbps``,
            ``link_probe()`` (the last measured) when it measured this kind of GPU. link_source: how the summary
            names a given ``link_gbps``.
        host_mem: host memory for the model's KV (bytes or a size); default: the node preset's, else not given
            (never this machine's).
        window: ``hierarchical``'s window (tokens on the device per layer); gpu_price: USD per GPU-hour, for the
            cost per 1M tokens.

    Raises:
        kvbench.errors.BadParameter: a dtype, count, preset, bandwidth or size out of range or of another type, or
            a ``tp`` the model's heads do not split over (``param`` names it).
        kvbench.errors.BadFile, kvbench.errors.ModelNotFound: a model that cannot be read or found, or whose
            expert or latent-attention fields kvbench cannot count (the message names the field).
        kvbench.errors.BadValue: figures past the analytic model's bounds, or a price out of range.
    """
    if isinstance(model, Path):
        model = str(model)
    if not isinstance(model, str):
        raise BadParameter(f"{{model}} must be a preset name or a path, not {type(model).__name__}", "model")
    prompt_tokens, batch, window = (count_arg(v, n) for v, n in ((prompt_tokens, "prompt_tokens"), (batch, "batch"),
                                                                 (window, "window")))
    link_gbps, gpu_price = number_arg(link_gbps, "link_gbps", optional=True), number_arg(gpu_price, "gpu_price",
                                                                                          optional=True)
    hbm_gbps, tflops = number_arg(hbm_gbps, "hbm_gbps", optional=True), number_arg(tflops, "tflops", optional=True)
    if gpu_price is not None and not (math.isfinite(gpu_price) and 0 < gpu_price <= MAX_USD_PER_HOUR):
        raise BadParameter(f"{{gpu_price}} must be more than 0 and at most {MAX_USD_PER_HOUR:,.0f} USD per GPU-hour, "
                           f"not {gpu_price:g}", "gpu_price")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise BadParameter(f"{{dtype}} {dtype!r}: one of {', '.join(DTYPE_BYTES)}", "dtype")
    bad = [(n, v) for n, v, least in (("prompt_tokens", prompt_tokens, 1), ("batch", batch, 1), ("window", window, 0))
           if v < least]
    if bad:
        raise BadParameter(f"{', '.join(f'{{{n}}} {v}' for n, v in bad)}: {{prompt_tokens}} and {{batch}} must be "
                           "more than 0, {window} 0 or more", bad[0][0],
                           *(n for n in ("prompt_tokens", "batch", "window") if n != bad[0][0]))
    arch = model_sizes_of(model)
    m = machine(gpu, tp, None if gpu_mem is None else size_bytes(gpu_mem, "gpu_mem"), hbm_gbps, tflops, link_gbps,
                None if host_mem is None else size_bytes(host_mem, "host_mem"),
                None if link_gbps is not None or link_probe is None else link_probe())
    if link_gbps is not None:
        m.sources["link_gbps"] = link_source
    share = arch.split(m.tp)
    nbytes = DTYPE_BYTES[dtype]
    try:
        modes = plan_modes(share, prompt_tokens, batch, nbytes, m.gpu_bytes, m.host_bytes, m.link_gbps * 1e9,
                           m.hbm_gbps * 1e9, window, RESERVE, m.tp)
        costs = ([cost_per_million(gpu_price, x.tokens_per_s / m.tp) if x.batch else math.nan for x in modes]
                 if gpu_price is not None else None)
        constants = assumed_constants(share, nbytes, m.tflops, m.link_gbps * 1e9, m.hbm_gbps * 1e9)
    except UserError:
        raise
    except ValueError as exc:  # analysis.plan names the figure and its bound
        raise BadValue(str(exc)) from None
    return Plan(model, arch, share, prompt_tokens, batch, dtype, nbytes, window, m, modes, costs, constants,
                reuse_table(constants, contexts_up_to(prompt_tokens)))


def _parameters_line(p: Plan) -> str:
    """Total (and, for a mixture of experts, active) parameters and the weights' bytes."""
    a, n = p.arch, p.dtype_bytes
    text = f"parameters: {count_units(a.parameters)} = weights {gib_or_mib(a.parameters * n)}"
    if a.routed_experts:
        text += (f"; {count_units(a.active_parameters)} active per token ({a.experts_per_token} of "
                 f"{a.routed_experts} routed experts in {a.moe_layers} layers)")
    return text


def _group(m: Machine) -> str:
    """How many GPUs the model takes (tensor parallel), of the node's when the preset is a node."""
    if m.gpu.gpus_per_node > 1:
        return (f", {m.tp} of its {m.gpu.gpus_per_node} GPUs per copy of the model"
                + (" (tensor parallel)" if m.tp > 1 else ""))
    return f" × {m.tp} (tensor parallel)" if m.tp > 1 else ""


def summary_lines(p: Plan) -> list[str]:
    """Which kinds of offload the tables model, the model's sizes with their formulas, and the machine's figures
    with their sources (one GPU's share under tensor parallelism)."""
    a, n, m, g = p.arch, p.dtype_bytes, p.machine, p.machine.gpu
    per_seq = a.kv_bytes(p.prompt_tokens, n)
    attention = (f"latent attention (kv_lora_rank {a.kv_lora_rank} + qk_rope_head_dim {a.qk_rope_head_dim})"
                 if a.latent_kv else f"{a.kv_heads} kv heads × {a.head_dim}")
    kv = f"KV: {a.sequence_bytes_per_token(n):,} bytes per token = {a.kv_formula(n)}"
    if a.full_layers < a.layers:
        kv += f" ({per_seq / p.prompt_tokens:,.0f} at {p.prompt_tokens:,} tokens: sliding layers hold their window)"
    lines = [f"{p.model}: {a.layers} layers ({a.layers - a.full_layers} with a sliding window), {attention}, "
             f"{p.dtype}", _parameters_line(p),
             f"{kv}; {gib_or_mib(per_seq)} per sequence of {p.prompt_tokens:,} tokens, "
             f"{gib_or_mib(per_seq * p.batch)} for batch {p.batch}",
             f"GPU: {g.label}{_group(m)}; per GPU "
             f"{gib_or_mib(m.gpu_bytes)} ({m.sources['gpu_mem']}; {RESERVE:.0%} reserved), "
             f"{m.hbm_gbps:,.0f} GB/s ({m.sources['hbm_gbps']}), {m.tflops:,.0f} TFLOP/s dense bf16 "
             f"({m.sources['tflops']}), link {m.link_gbps:g} GB/s per direction ({m.sources['link_gbps']})",
             f"preset figures: {g.source}"]
    if m.tp > 1:
        s = p.gpu_arch
        how = ("the latent, whole on every GPU" if a.latent_kv else f"{s.kv_heads} of {a.kv_heads} KV heads"
               + (" (repeated)" if a.kv_heads < m.tp else ""))
        lines.append(f"per GPU of {m.tp}: weights {gib_or_mib(s.parameters * n)}, KV "
                     f"{s.sequence_bytes_per_token(n):,} bytes per token ({how})")
    lines.append(f"host memory for KV: {m.sources['host_mem']}" if m.host_bytes is None
                 else f"host memory for KV: {gib_or_mib(m.host_bytes)} ({m.sources['host_mem']})")
    lines.append(_device_cache_line(p))
    return lines


def _device_cache_line(p: Plan) -> str:
    """The KV tokens the GPUs of one copy of the model hold beside its weights: what a prefix cache keeps before it
    evicts, so the working set a host or disk tier needs before it is ever read (and, with host memory given,
    the tokens that memory holds)."""
    n, per_gpu = p.dtype_bytes, p.gpu_arch.sequence_bytes_per_token(p.dtype_bytes)
    tokens = device_cache_tokens(p)
    if tokens <= 0:
        return "device KV cache: none (the weights fill the GPU)"
    text = (f"device KV cache: {tokens:,.0f} tokens = ({gib_or_mib(p.machine.gpu_bytes)} less {RESERVE:.0%} "
            f"and the weights) ÷ {per_gpu:,} bytes per token per GPU: a host or disk tier is read only for a "
            "working set beyond it")
    if p.machine.host_bytes:
        text += f"; the host memory holds {p.machine.host_bytes / p.arch.sequence_bytes_per_token(n):,.0f} tokens"
    return text


def _unit(p: Plan) -> tuple[str, int]:
    """MiB, or GiB when a sequence's KV reaches 1 GiB."""
    return ("GiB", GIB) if p.arch.kv_bytes(p.prompt_tokens, p.dtype_bytes) >= GIB else ("MiB", MIB)


def capacity_cells(p: Plan) -> pd.DataFrame:
    """Per mode, on one GPU: KV per sequence on the device and in host memory, the largest batch each memory
    allows (host ``not given`` without host memory) and the largest that fits."""
    name, unit = _unit(p)
    rows = []
    for m in p.modes:
        host = ("-" if m.host_bytes_per_seq == 0 else "not given" if m.host_max_batch is None
                else f"{m.host_max_batch:,}")
        rows.append([m.mode, f"{m.device_bytes_per_seq / unit:,.2f}", f"{m.host_bytes_per_seq / unit:,.2f}",
                     f"{m.device_max_batch:,}", host, f"{m.max_batch:,}"])
    return pd.DataFrame(rows, columns=["mode", f"device KV/seq ({name})", f"host KV/seq ({name})", "device fits",
                                       "host fits", "max batch"], dtype=object)


def roofline_cells(p: Plan) -> pd.DataFrame:
    """Per mode at the batch it is priced at (the batch asked for, or its max batch when fewer fit): link bytes per
    step, link and memory time, TPOT, tokens/s, what bounds the step, the batch from which the link does, and (with
    a price) USD per 1M tokens; a mode no batch fits is named and not priced."""
    name, unit = _unit(p)
    rows = []
    for i, m in enumerate(p.modes):
        cross = "-" if m.link_bound_batch is None else f"batch {m.link_bound_batch:,}"
        if not m.batch:
            rows.append([m.mode, "0", *["-"] * 5, "does not fit", cross, *(["-"] if p.costs else [])])
            continue
        rows.append([m.mode, f"{m.batch:,}", f"{m.link_bytes_per_step / unit:,.2f}", f"{m.link_s * 1e3:,.1f}",
                     f"{m.memory_s * 1e3:,.1f}", f"{m.step_s * 1e3:,.1f}", f"{m.tokens_per_s:,.1f}",
                     "link" if m.bound == "link" else "memory", cross, *([f"{p.costs[i]:,.2f}"] if p.costs else [])])
    cols = ["mode", "batch", f"link {name}", "link ms", "memory ms", "TPOT ms", "tok/s", "bound", "link-bound from"]
    return pd.DataFrame(rows, columns=cols + (["USD/1M tok"] if p.costs else []), dtype=object)


def reuse_cells(p: Plan) -> pd.DataFrame:
    """The reuse tier as text: a row per prompt length, its TTFT recomputed, its TTFT with each share of the prompt
    restored (ms, and how many times faster), and the break-even share (``-`` where restoring never pays)."""
    rows = []
    for n, part in p.reuse.groupby("prompt_tokens", sort=True):
        by = part.set_index("shared_pct")
        even = part["break_even_share"].iloc[0]
        rows.append([f"{int(n):,}", f"{part['recompute_s'].iloc[0] * 1e3:,.1f}"]
                    + [f"{by.at[pct, 'restore_s'] * 1e3:,.1f} ({by.at[pct, 'speedup']:,.1f}×)" for pct in REUSE_SHARES]
                    + ["-" if even != even else "any" if even == 0 else f"{even:.0%}"])
    return pd.DataFrame(rows, columns=["prompt tokens", "recompute ms"] + [f"{pct}% restored ms" for pct in
                                                                          REUSE_SHARES] + ["break-even share"],
                        dtype=object)


def plan_warnings(p: Plan) -> dict[str, str]:
    """The fit check, by kind, for before the tables: ``weights`` (one GPU's share of them does not fit: nothing is
    priced), ``batch`` (modes priced at a smaller batch than asked, the most that fits), ``host`` (no host memory
    given: offload modes' max batch counts the device alone), ``positions`` (the context is beyond the model's)."""
    out = {}
    weights, room = p.gpu_arch.parameters * p.dtype_bytes, p.machine.gpu_bytes * (1 - RESERVE)
    if weights > room:
        split = f", 1/{p.machine.tp} of the model on each GPU" if p.machine.tp > 1 else ""
        out["weights"] = (f"the weights ({gib_or_mib(weights)}{split}) do not fit in {gib_or_mib(room)} of the GPU "
                          f"({RESERVE:.0%} reserved): no batch fits in any mode, so nothing is priced")
    over = [f"{m.mode} at {m.max_batch:,}" for m in p.modes if 0 < m.max_batch < p.batch]
    none = [m.mode for m in p.modes if m.max_batch == 0]
    if (over or none) and weights <= room:
        out["batch"] = (f"batch {p.batch:,} does not fit every mode: " + "; ".join(
            ([f"priced at the most that fits: {', '.join(over)}"] if over else [])
            + ([f"not one sequence fits: {', '.join(none)}"] if none else [])))
    if p.machine.host_bytes is None and any(m.host_bytes_per_seq for m in p.modes) and weights <= room:
        out["host"] = "host memory not given: the offload modes' max batch counts the device alone"
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


__all__ = ["RESERVE", "Plan", "break_even_cells", "capacity_cells", "device_cache_tokens", "model_config",
           "model_sizes_of", "plan", "plan_note",
           "plan_warnings", "reuse_cells", "roofline_cells", "size_bytes", "summary_lines"]
