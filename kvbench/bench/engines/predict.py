"""What a trial should measure, predicted from the model's shape before it runs: the KV bytes its cache holds at
the end, ``kvbench plan``'s device KV, link bytes and step time for it, and the host memory its host tier may
allocate. The sweep writes them into every row beside the measured figures."""

from __future__ import annotations

from typing import Any

from kvbench.bench.trial import TrialSpec
from kvbench.offload.architecture import Architecture
from kvbench.offload.modes import MODES
from kvbench.offload.tiers import grown_capacity
from kvbench.scenario import Scenario

#: The row fields :meth:`Predictor.plan_prediction` fills.
PLAN_KEYS = ("plan_kv_device_bytes", "plan_link_bytes_per_step", "plan_tpot_s")


def roofline_bandwidths(environment: dict[str, Any], device: Any) -> tuple[float, float] | None:
    """``(memory, link)`` bandwidths in bytes/s for the decode-step roofline, from a run's environment
    (:func:`kvbench.bench.telemetry.machine.environment`): device memory = ``memory_bandwidth.memory_gbps``; the link =
    the pinned host→device rate on CUDA (``link_bandwidth.h2d_pinned_gbps``), on CPU the copy rate between host
    buffers (``memory_bandwidth.copy_gbps``). None when a figure was not measured. ``device``: a torch device."""
    mem = environment.get("memory_bandwidth") or {}
    if not mem.get("memory_gbps"):
        return None
    if device.type == "cuda":
        link = (environment.get("link_bandwidth") or {}).get("h2d_pinned_gbps")
    else:
        link = mem.get("copy_gbps")
    return (mem["memory_gbps"] * 1e9, link * 1e9) if link else None


class Predictor:
    """The predictions of one scenario's trials on one model.

    Args:
        arch: the model's architecture (layers, kv heads, head_dim, layer types with windows).
        itemsize: bytes of one KV element (the model's dtype).
        weights_bytes: bytes of the model's weights (the roofline reads them every decode step).
        device: the torch device the model runs on.
        environment: the run's (:func:`kvbench.bench.telemetry.machine.environment`), with its measured bandwidths.
    """

    def __init__(self, scenario: Scenario, arch: Architecture, itemsize: int, weights_bytes: int, device: Any,
                 environment: dict[str, Any] | None = None):
        self.s, self.arch, self.itemsize, self.weights_bytes, self.device = (scenario, arch, itemsize,
                                                                             weights_bytes, device)
        self.bandwidths = roofline_bandwidths(environment or {}, device)

    def kv_bytes_predicted(self, t: TrialSpec) -> int:
        """KV bytes the trial's cache holds at its end, over all tiers (each token once): Σ over layers of
        2 × kv_heads × head_dim × dtype bytes × tokens held × batch, tokens held = tokens cached in a
        full-attention layer, min(tokens cached, window − 1) in a sliding-window one
        (:meth:`kvbench.offload.architecture.Architecture.cached_kv_bytes`); tokens cached = prompt + new − 1 (the last
        generated token is never fed back)."""
        return self.arch.cached_kv_bytes(t.prompt_tokens + self.s.max_new_tokens - 1, self.itemsize) * t.batch_size

    def plan_prediction(self, t: TrialSpec) -> dict[str, Any]:
        """What ``kvbench plan`` predicts for this trial (:mod:`kvbench.analysis.plan`): ``plan_kv_device_bytes``
        (device KV of the batch under the mode's placement at the tokens cached at the end, as the measured peak),
        ``plan_link_bytes_per_step`` (host KV the batch copies to the device per decode step, the mean over the
        trial's steps, as the measured ``h2d_bytes`` ÷ steps) and, where the run measured the bandwidths (see
        :func:`roofline_bandwidths`), ``plan_tpot_s``: the roofline's step time averaged over the same decode
        steps TPOT averages (:func:`kvbench.analysis.plan.mean_decode_step`; copies overlapped on CUDA, none on a
        CPU). None for modes plan does not model (``dynamic``, ``hf-offloaded``, a disk tier) and for a model whose
        config gives no intermediate size (plan cannot count its parameters)."""
        from kvbench.analysis.plan import mean_decode_step, placement

        kind, opts, arch = t.mode.kind, t.mode.options, self.arch
        if arch.intermediate is None or MODES[kind].placement is None or opts.get("host_max_tokens"):
            return dict.fromkeys(PLAN_KEYS)
        tokens, itemsize = t.prompt_tokens + self.s.max_new_tokens - 1, self.itemsize
        window = opts.get("window") or 0
        dev, host = placement(arch, kind, tokens, itemsize, window)
        out = dict.fromkeys(PLAN_KEYS)
        out["plan_kv_device_bytes"] = dev * t.batch_size
        # without measured bandwidths the mean H2D bytes per step (which need none) are still predicted: any memory
        # bandwidth will do for them, and the step time is not kept
        memory, link = self.bandwidths if self.bandwidths is not None else (1.0, None)
        cuda = self.device.type == "cuda"
        step_s, link_bytes = mean_decode_step(arch, kind, t.prompt_tokens, self.s.max_new_tokens, itemsize,
                                              self.weights_bytes, t.batch_size, memory, link if cuda else None,
                                              window)
        out["plan_link_bytes_per_step"] = link_bytes if link_bytes == link_bytes else host * t.batch_size
        if self.bandwidths is not None and step_s == step_s:
            out["plan_tpot_s"] = step_s
        return out

    def host_tier_bytes(self, t: TrialSpec) -> int:
        """Host memory the trial's host tier may allocate (bytes): per full-attention layer, the tokens it can hold
        (all cached tokens less the window, at most ``host_max_tokens``) rounded up to the buffers' geometric
        capacity (:func:`~kvbench.offload.tiers.grown_capacity`), × full layers × 2 × kv_heads × head_dim × dtype
        bytes × batch (:meth:`kvbench.offload.architecture.Architecture.host_bytes_per_token`: sliding-window layers
        never leave the device). 0 for modes without a host tier or models without a full-attention layer."""
        if not MODES[t.mode.kind].host_tier:
            return 0
        opts = t.mode.options
        tokens = max(0, t.prompt_tokens + self.s.max_new_tokens - 1 - (opts.get("window") or 0))
        if opts.get("host_max_tokens"):
            tokens = min(tokens, opts["host_max_tokens"])
        per_token = self.arch.host_bytes_per_token(self.itemsize)
        return grown_capacity(0, tokens) * per_token * t.batch_size if tokens else 0
