"""The caches of each mode, and measuring the KV bytes a cache holds per tier."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from kvbench.offload.layers import OffloadedLayer
from kvbench.offload.registry import MODES
from kvbench.offload.transfer import Transfers


class ModeUnavailable(RuntimeError):
    """The mode cannot run here (e.g. it needs CUDA); the trial is recorded as ``skipped`` with this reason."""


class OffloadedCache(Cache):
    """KV cache keeping each full-attention layer's history in host memory except its last ``window`` tokens.

    ``window=0`` is the ``full`` mode: the host holds all history, each layer's history is brought to the device
    just before its attention and the next layer's is prefetched meanwhile (on a side stream on CUDA; wrapping
    from the last layer to the first and skipping layers with nothing offloaded), so at most two layers of
    history are on the device besides the new tokens. ``window=W`` is the ``hierarchical`` mode. Attention sees
    every token in both. Sliding-window layers (Gemma-2, Mistral) stay on the device: they are capped anyway.

    Accounting (bytes): ``device_bytes``/``host_bytes`` now, ``device_peak_bytes``/``host_peak_bytes`` at peak
    (device counts the windows, prefetched history and the K/V handed to the layer being computed), and the
    copy engine's ``stats`` (H2D/D2H bytes and counts).

    Args:
        config: the model's transformers config (number and types of layers, sliding window).
        device: the compute device.
        window: tokens per layer kept on the device (>= 0).
        pin: page-lock host buffers; default: on CUDA.

    Raises:
        ValueError: a negative window.
    """

    def __init__(self, config: Any, device: torch.device, window: int = 0, pin: bool | None = None):
        if window < 0:
            raise ValueError(f"window must be >= 0 tokens, got {window}")
        self.engine = Transfers(device)
        pin = device.type == "cuda" if pin is None else pin
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        sliding = getattr(text, "sliding_window", None)
        layers: list[Any] = [
            DynamicSlidingWindowLayer(sliding_window=sliding) if t == "sliding_attention" and sliding
            else OffloadedLayer(window, self.engine, pin)
            for t in types
        ]
        super().__init__(layers=layers)
        self.window = window
        self._offloaded = [i for i, layer in enumerate(layers) if isinstance(layer, OffloadedLayer)]
        # position in _offloaded of the first offloaded layer after each layer (computed once, not per update)
        self._next_pos = [next((k for k, j in enumerate(self._offloaded) if j > i), len(self._offloaded))
                          for i in range(len(layers))]
        self._dev = [0] * len(layers)
        self._host = [0] * len(layers)
        self.device_bytes = self.host_bytes = 0
        self.device_peak_bytes = self.host_peak_bytes = 0

    @staticmethod
    def _layer_bytes(layer: Any) -> tuple[int, int]:
        if isinstance(layer, OffloadedLayer):
            return layer.device_bytes, layer.host_bytes
        if getattr(layer, "is_initialized", False):
            return layer.keys.nbytes + layer.values.nbytes, 0
        return 0, 0

    def _recount(self, i: int) -> None:
        d, h = self._layer_bytes(self.layers[i])
        self.device_bytes += d - self._dev[i]
        self.host_bytes += h - self._host[i]
        self._dev[i], self._host[i] = d, h
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)

    def _prefetch_after(self, layer_idx: int) -> None:
        """Prefetch the next offloaded layer that has host history, wrapping around to the first."""
        n = len(self._offloaded)
        if not n:
            return
        pos = self._next_pos[layer_idx]
        for step in range(n):
            i = self._offloaded[(pos + step) % n]
            if i == layer_idx:
                continue
            if self.layers[i].host_keys.length:
                self.layers[i].prefetch()
                self._recount(i)
                return

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Store new K/V (``[batch, kv_heads, n, head_dim]``) of a layer; return that layer's full K/V."""
        layer = self.layers[layer_idx]
        keys, values = layer.update(key_states, value_states, *args, **kwargs)
        self._recount(layer_idx)
        self._prefetch_after(layer_idx)
        in_use = 0 if keys is layer.keys else keys.nbytes + values.nbytes  # the concatenation handed to attention
        self.device_peak_bytes = max(self.device_peak_bytes, self.device_bytes + in_use)
        return keys, values

    def _recount_all(self) -> None:
        for i in range(len(self.layers)):
            self._recount(i)

    def crop(self, max_length: int) -> None:
        """Crop to ``max_length`` tokens (negative: remove that many), as ``DynamicCache.crop``."""
        super().crop(max_length)
        self._recount_all()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch for beam search, in every tier."""
        super().reorder_cache(beam_idx)
        self._recount_all()

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each sequence ``repeats`` times in every tier."""
        super().batch_repeat_interleave(repeats)
        self._recount_all()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at ``indices``, in every tier."""
        super().batch_select_indices(indices)
        self._recount_all()

    @property
    def pinned(self) -> bool | None:
        """Whether host buffers are page-locked (None until something was offloaded)."""
        flags = {self.layers[i].host_keys.pinned for i in self._offloaded} - {None}
        return None if not flags else all(flags)


class FullOffloadCache(OffloadedCache):
    """The ``full`` mode: all history in the host tier (an :class:`OffloadedCache` with ``window=0``)."""

    def __init__(self, config: Any, device: torch.device, pin: bool | None = None):
        super().__init__(config, device, window=0, pin=pin)


class HierarchicalCache(OffloadedCache):
    """The ``hierarchical`` mode: the last ``window`` tokens of every layer on the device, older ones on the host;
    attention still covers all tokens (an :class:`OffloadedCache` with that window)."""


def make_cache(kind: str, config: Any, device: torch.device, **options: Any) -> Any:
    """A fresh, empty cache for one generation.

    Args:
        kind: a registered mode name (see :data:`kvbench.offload.registry.MODES`).
        config: the model's transformers config (gives layer types, e.g. sliding-window layers).
        device: the device the model runs on.
        **options: the mode's options (``window`` for hierarchical).

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
    if kind == "full":
        return FullOffloadCache(config, device)
    if kind == "hierarchical":
        return HierarchicalCache(config, device, window=options["window"])
    raise KeyError(kind)


def kv_bytes(cache: Any, device: torch.device) -> tuple[int, int]:
    """Bytes of key and value tensors a cache holds now, split into (on ``device``, elsewhere).

    kvbench's offload caches report their own accounting; for others every layer's ``keys`` and ``values``
    (``[batch, kv_heads, seq, head_dim]`` each) are summed by ``nbytes``. On a CPU run the compute device is the
    host, so a transformers cache counts entirely as on the device.
    """
    if isinstance(cache, OffloadedCache):
        return cache.device_bytes, cache.host_bytes
    on_device = elsewhere = 0
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and t.numel():
                if t.device == device or (t.device.type == device.type and device.index is None):
                    on_device += t.nbytes
                else:
                    elsewhere += t.nbytes
    return on_device, elsewhere


__all__ = ["FullOffloadCache", "HierarchicalCache", "ModeUnavailable", "OffloadedCache",
           "kv_bytes", "make_cache"]
