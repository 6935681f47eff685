"""``kvbench plan``, kvbench's own offload: decode-time streaming, where the whole history of every full-attention
layer lives in host memory and crosses the link at every decode step. What a model's KV cache needs, how large a
batch each mode fits, and a decode-step roofline, from the model's config alone (no GPU, no weights). The other
kind, a reuse tier that restores finished KV when a prompt comes back (vLLM's and LMCache's CPU tiers), is
:mod:`kvbench.analysis.plan_reuse`.

Formulas (bytes, seconds, tokens), for one GPU of a tensor-parallel group of N (its share:
:meth:`kvbench.models.sizes.ModelSizes.split`):

- KV bytes of one sequence of T tokens = Σ over layers of KV elements per token and layer (2 × kv_heads ×
  head_dim; kv_lora_rank + qk_rope_head_dim for latent attention: :mod:`kvbench.models.sizes`) × dtype bytes ×
  min(T, window), window = the layer's sliding window (Mistral, Gemma-2's alternate layers; resolved as
  transformers does, :func:`kvbench.offload.layer_types.layer_windows`) or T. That is what a decode step's attention
  reads; the cache itself holds ``window - 1`` tokens of a sliding layer between steps
  (:meth:`~kvbench.offload.architecture.Architecture.cached_kv_bytes`, the run-time prediction).
- Weights bytes = parameters × dtype bytes, parameters counted from the config (:mod:`kvbench.models.sizes`:
  embeddings, untied LM head, attention, gated MLP or experts, norms): within a fraction of a percent of the
  published counts. The device holds all of them (every expert); a decode step reads those its batch reaches.
- Host memory: the N GPUs' host KV together within the node's host memory for the model.
- Placement per mode (kvbench's caches; sliding-window layers always stay on the device): ``none`` keeps all KV
  on the device; ``full`` keeps two layers' history there (the one computing, the one prefetched) and all
  history in host memory; ``hierarchical`` keeps the last W tokens of every layer there plus two layers of the
  older history, the rest in host memory.
- Decode step, the memory-bound roofline (S. Williams, A. Waterman, D. Patterson, "Roofline: an insightful visual
  performance model", CACM 52(4), 2009): each step reads the weights once and makes :data:`KV_PASSES` = 3 passes
  over every sequence's KV in device memory (the cache's ``torch.cat`` reads the history and writes the
  concatenation, as transformers' ``DynamicLayer.update`` and kvbench's ``OffloadedLayer.update`` both do, then
  attention reads it), t_mem = (weights read + 3 × batch × KV per sequence) / memory bandwidth; an offload mode on
  CUDA also copies its host history over the link, t_link = batch × host KV per sequence / link bandwidth, on a
  side stream: t_step = max(t_mem, t_link). On a CPU there is no link (the host tier *is* the compute device's
  memory, and the ``torch.cat`` already reads it) and nothing overlaps: t_step = t_mem + t_link with t_link = 0
  (:func:`step_time`). TPOT (vLLM's definition: time per output token after the first) = t_step; throughput =
  batch / t_step tokens/s. A measured TPOT averages steps over a growing context: compare it with the mean step
  time over the same steps (:func:`mean_decode_step`), not the step at the final length.
- Cost per 1M generated tokens = GPU price per hour × N ÷ (tokens/s × 3600) × 10^6. Tensor parallelism's
  all-reduces are not timed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable

from kvbench.errors import BadValue
from kvbench.models.sizes import ModelSizes
from kvbench.offload import modes
from kvbench.offload.architecture import Architecture

#: Bytes per element of the dtypes plan accepts.
DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}

#: The largest context (tokens), batch and window plan_modes takes; memories in bytes, bandwidths in bytes/s.
MAX_TOKENS, MAX_BATCH = 2**32, 2**24
MAX_MEMORY_BYTES, MAX_BYTES_PER_S = 2**60, 1e15
#: The largest price per GPU-hour (USD) costs are computed for.
MAX_USD_PER_HOUR = 1e6


@dataclass(frozen=True)
class ModePlan:
    """One mode at the planned context on one GPU of the model's tensor-parallel group: KV bytes per sequence on
    the device and in host memory, the largest batch that fits, and the roofline of a decode step at the batch it
    is priced at.

    Attributes:
        max_batch: the largest batch that fits (device and, when given, host memory); device_max_batch,
            host_max_batch: what each memory alone allows (host None when no host memory was given).
        batch: the batch the step is priced at: the batch asked for, or ``max_batch`` when fewer fit (0: nothing
            fits, and the step's figures are nan).
        link_bytes_per_step, link_s, memory_s, step_s, tokens_per_s, bound: the step at ``batch`` (one GPU's link
            and memory; tokens/s of the whole group).
        link_bound_batch: the smallest batch from which the link, not device memory, sets the step time (None:
            no batch up to :data:`MAX_BATCH`).
    """

    mode: str
    device_bytes_per_seq: int
    host_bytes_per_seq: int
    max_batch: int
    device_max_batch: int
    host_max_batch: int | None
    batch: int
    link_bytes_per_step: float
    link_s: float
    memory_s: float
    step_s: float
    tokens_per_s: float
    bound: str
    link_bound_batch: int | None


def placement(arch: Architecture, mode: str, tokens: int, dtype_bytes: int, window: int = 0) -> tuple[int, int]:
    """``(device bytes, host bytes)`` of one sequence's KV at ``tokens`` under kvbench's ``none``, ``full`` or
    ``hierarchical`` (last ``window`` tokens of each layer on the device) placement (see the module docstring):
    the mode's rule in :data:`kvbench.offload.modes.MODES`.

    Raises:
        ValueError: another mode (``dynamic`` moves its window, ``hf-offloaded`` is transformers' own).
    """
    return modes.placement(arch, mode, tokens, dtype_bytes, window)


#: Passes over the cached K/V one decode step makes in device memory (see the module docstring).
KV_PASSES = 3


def decode_step(weights_bytes: float, batch: int, kv_bytes_per_seq: float, host_bytes_per_seq: float,
                link_bytes_per_s: float, memory_bytes_per_s: float) -> tuple[float, float]:
    """The roofline of one decode step: ``(t_mem, t_link)`` in seconds, t_mem = (weights + :data:`KV_PASSES` ×
    batch × KV per sequence) ÷ device memory bandwidth, t_link = batch × host KV per sequence ÷ link bandwidth;
    :func:`step_time` combines them (see the module docstring)."""
    return ((weights_bytes + KV_PASSES * batch * kv_bytes_per_seq) / memory_bytes_per_s,
            batch * host_bytes_per_seq / link_bytes_per_s)


def step_time(t_mem: float, t_link: float, overlapped: bool = True) -> float:
    """A decode step's time (seconds): max(t_mem, t_link) when the copies overlap compute (CUDA: a side stream),
    t_mem + t_link when they do not (CPU: copies are synchronous)."""
    return max(t_mem, t_link) if overlapped else t_mem + t_link


def mean_decode_step(arch: Architecture, mode: str, prompt_tokens: int, new_tokens: int, dtype_bytes: int,
                     weights_bytes: float, batch: int, memory_bytes_per_s: float, link_bytes_per_s: float | None,
                     window: int = 0) -> tuple[float, float]:
    """What a trial's TPOT and H2D bytes per step should be under the roofline: the mean over its decode steps
    k = 1 … ``new_tokens`` − 1 (the steps TPOT averages) of :func:`step_time`, with the KV passes over the
    ``prompt_tokens`` + k tokens attention sees at step k, and of the host KV the batch copies to the device then:
    the history held before the step's token, ``prompt_tokens`` + k − 1 tokens under the mode's placement.

    Args:
        link_bytes_per_s: the link bandwidth on CUDA (copies overlapped); None on a CPU: no link, no overlap.

    Returns:
        (mean step seconds, mean host→device bytes per step); (nan, nan) for a trial with one generated token.

    Raises:
        ValueError: a mode :func:`placement` does not model.
    """
    steps = range(1, new_tokens)
    if not steps:
        return math.nan, math.nan
    times, link_bytes = [], []
    for k in steps:
        tokens = prompt_tokens + k
        _, host = placement(arch, mode, tokens - 1, dtype_bytes, window)
        t_mem, t_link = decode_step(weights_bytes, batch, arch.kv_bytes(tokens, dtype_bytes), host,
                                    link_bytes_per_s or math.inf, memory_bytes_per_s)
        times.append(step_time(t_mem, t_link, overlapped=link_bytes_per_s is not None))
        link_bytes.append(batch * host)
    return sum(times) / len(times), sum(link_bytes) / len(link_bytes)


def _link_bound_from(weights_read: Callable[[int], float], kv_bytes_per_seq: int, host_bytes_per_seq: int,
                     link_bytes_per_s: float, memory_bytes_per_s: float) -> int | None:
    """The smallest batch b at which t_link(b) > t_mem(b) (:func:`decode_step`), by bisection: t_link − t_mem =
    b × (host ÷ L − 3 × KV ÷ M) − weights_read(b) ÷ M is convex in b (the weights a batch reads grow ever more
    slowly) and below 0 at b = 0, so it crosses 0 once. None when it does not by :data:`MAX_BATCH`."""
    def link_wins(b: int) -> bool:
        t_mem, t_link = decode_step(weights_read(b), b, kv_bytes_per_seq, host_bytes_per_seq, link_bytes_per_s,
                                    memory_bytes_per_s)
        return t_link > t_mem

    if host_bytes_per_seq == 0 or not link_wins(MAX_BATCH):
        return None
    lo, hi = 0, MAX_BATCH  # link_wins(hi), not link_wins(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if link_wins(mid) else (mid, hi)
    return hi


def plan_modes(shape: ModelSizes, tokens: int, batch: int, dtype_bytes: int, gpu_bytes: float,
               host_bytes: float | None, link_bytes_per_s: float, hbm_bytes_per_s: float, window: int,
               reserve: float = 0.1, gpus: int = 1) -> list[ModePlan]:
    """``none``, ``full`` and ``hierarchical`` (``window`` tokens) at ``tokens`` of context, for one of ``gpus``
    GPUs holding the model's ``shape`` share (:meth:`~kvbench.models.sizes.ModelSizes.split`).

    ``device_max_batch`` = the largest batch whose device KV fits ``gpu_bytes × (1 − reserve)`` less the weights
    (the reserve is for activations, the CUDA context and the allocator); ``host_max_batch`` = the largest whose
    host KV, on all ``gpus`` GPUs together, fits ``host_bytes`` (the node's host memory for this model); 0 when
    not even one sequence fits. Each mode's step is priced at ``batch`` or, when fewer fit, at its
    ``max_batch``: never at a batch it cannot hold. The step reads the weights a batch reaches
    (:meth:`~kvbench.models.sizes.ModelSizes.weights_read`: all of a dense model's).

    Raises:
        BadValue: a context, batch, bandwidth or memory that is not above 0 and at most its bound
            (:data:`MAX_TOKENS`, :data:`MAX_BATCH`, :data:`MAX_BYTES_PER_S`, :data:`MAX_MEMORY_BYTES`), or a
            window above :data:`MAX_TOKENS` (the message names the bound).
    """
    for what, v, most in (("context tokens", tokens, MAX_TOKENS), ("batch", batch, MAX_BATCH),
                          ("link bandwidth (bytes/s)", link_bytes_per_s, MAX_BYTES_PER_S),
                          ("HBM bandwidth (bytes/s)", hbm_bytes_per_s, MAX_BYTES_PER_S),
                          ("GPU memory (bytes)", gpu_bytes, MAX_MEMORY_BYTES),
                          ("host memory (bytes)", 1 if host_bytes is None else host_bytes, MAX_MEMORY_BYTES)):
        if not (v > 0 and math.isfinite(v) and v <= most):
            raise BadValue(f"{what} must be a finite number above 0 and at most {most:,.0f}, not {v:,}")
    if not 0 <= window <= MAX_TOKENS:
        raise BadValue(f"the window must be 0 to {MAX_TOKENS:,} tokens, not {window:,}")

    def weights_read(b: int) -> float:
        return shape.weights_read(b) * dtype_bytes

    room = gpu_bytes * (1 - reserve) - shape.parameters * dtype_bytes
    total = shape.kv_bytes(tokens, dtype_bytes)
    out = []
    for mode, label in (("none", "none"), ("full", "full"), ("hierarchical", f"hierarchical(window={window})")):
        dev, host = placement(shape, mode, tokens, dtype_bytes, window)
        on_device = min(math.floor(room / dev), MAX_BATCH) if dev > 0 and room > 0 else 0
        on_host = None if host == 0 or host_bytes is None else math.floor(host_bytes / (gpus * host))
        fits = on_device if on_host is None else min(on_device, on_host)
        b = min(batch, fits)
        if b:
            mem_s, link_s = decode_step(weights_read(b), b, total, host, link_bytes_per_s, hbm_bytes_per_s)
            step = step_time(mem_s, link_s)
            figures = (b * host, link_s, mem_s, step, b / step, "link" if link_s > mem_s else "device memory")
        else:
            figures = (math.nan, math.nan, math.nan, math.nan, math.nan, "does not fit")
        out.append(ModePlan(label, dev, host, fits, on_device, on_host, b, *figures,
                            _link_bound_from(weights_read, total, host, link_bytes_per_s, hbm_bytes_per_s)))
    return out


def cost_per_million(price_per_hour: float, tokens_per_s: float) -> float:
    """USD per 1M generated tokens = price per hour ÷ (tokens/s × 3600) × 10^6.

    Raises:
        BadValue: a price not above 0 and at most :data:`MAX_USD_PER_HOUR`, or a throughput not above 0 (and
            finite).
    """
    if not (price_per_hour > 0 and math.isfinite(price_per_hour) and price_per_hour <= MAX_USD_PER_HOUR):
        raise BadValue(f"the price must be more than 0 and at most {MAX_USD_PER_HOUR:,.0f} USD per hour, "
                         f"not {price_per_hour:g}")
    if not (tokens_per_s > 0 and math.isfinite(tokens_per_s)):
        raise BadValue(f"the throughput must be more than 0 tokens/s (and finite), not {tokens_per_s}")
    return price_per_hour / (tokens_per_s * 3600) * 1e6


__all__ = ["DTYPE_BYTES", "KV_PASSES", "MAX_BATCH", "MAX_BYTES_PER_S", "MAX_MEMORY_BYTES", "MAX_TOKENS",
           "MAX_USD_PER_HOUR", "ModePlan", "cost_per_million", "decode_step", "mean_decode_step", "placement",
           "plan_modes", "step_time"]
