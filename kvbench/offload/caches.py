"""Building a mode's cache, and measuring the KV bytes a cache holds per tier."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from kvbench.offload.registry import MODES


class ModeUnavailable(RuntimeError):
    """The mode cannot run here (e.g. it needs CUDA); the trial is recorded as ``skipped`` with this reason."""


def make_cache(kind: str, config: Any, device: torch.device, **options: Any) -> Any:
    """A fresh, empty cache for one generation.

    Args:
        kind: a registered mode name (see :data:`kvbench.offload.registry.MODES`).
        config: the model's transformers config (gives layer types, e.g. sliding-window layers).
        device: the device the model runs on.
        **options: the mode's options.

    Raises:
        KeyError: unknown mode. ModeUnavailable: the mode needs CUDA and ``device`` is not CUDA.
    """
    info = MODES[kind]
    if info.needs_cuda and device.type != "cuda":
        raise ModeUnavailable(info.skip_reason)
    if kind == "none":
        return DynamicCache(config=config)
    if kind == "hf-offloaded":
        return DynamicCache(config=config, offloading=True)
    raise KeyError(kind)


def kv_bytes(cache: Any, device: torch.device) -> tuple[int, int]:
    """Bytes of key and value tensors a cache holds, split into (on ``device``, elsewhere).

    Counts every layer's ``keys`` and ``values`` (``[batch, kv_heads, seq, head_dim]`` each) by ``nbytes``.
    On a CPU run the compute device is the host, so everything counts as on the device.
    """
    on_device = elsewhere = 0
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and t.numel():
                if t.device == device or (t.device.type == device.type and device.index is None):
                    on_device += t.nbytes
                else:
                    elsewhere += t.nbytes
    return on_device, elsewhere
