"""The caches of each mode, and measuring the KV bytes a cache holds per tier."""

from __future__ import annotations

from typing import Any

import psutil
import torch
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from kvbench.offload.host_tiers import HostFormat
from kvbench.offload.layer_types import layer_windows, tokens_held
from kvbench.offload.layers import OffloadedLayer
from kvbench.offload.policy import MIN_WINDOW, WindowPolicy
from kvbench.offload.disk import DISK_BLOCK_TOKENS
from kvbench.offload.tiers import DiskTier, DiskTierError
from kvbench.offload.transfer import Transfers


class OffloadedCache(Cache):
    """KV cache keeping each full-attention layer's history off the device except its last ``window`` tokens.

    ``window=0`` is the ``full`` mode: the host holds all history, each layer's history is brought to the device
    just before its attention and the next layer's is prefetched meanwhile (on a side stream on CUDA; wrapping
    from the last layer to the first and skipping layers with nothing offloaded), so at most two layers of
    history are on the device besides the new tokens. ``window=W`` is the ``hierarchical`` mode. Attention sees
    every token in both. Sliding-window (and chunked) layers, as :func:`~kvbench.offload.layer_types.layer_windows`
    resolves them (Gemma-2's alternate layers, every layer of Mistral v0.1), are transformers'
    ``DynamicSlidingWindowLayer`` as in ``DynamicCache``: they stay on the device (``window - 1`` tokens) and never
    cross the link, in every mode and with or without the disk tier. With ``host_max_tokens`` the oldest tokens of
    each layer beyond that many spill to files (memory-mapped with ``disk_page_cache``) in a private directory (the
    disk tier), removed by :meth:`close` (or ``with cache:``), at garbage collection and at interpreter exit. Its writes
    are synced to the device and its writes and reads dropped from the page cache, so disk timings are the device's,
    unless ``disk_page_cache`` keeps them in RAM.

    Accounting (bytes): ``device_bytes``/``host_bytes``/``disk_bytes`` now and ``*_peak_bytes`` at peak (device
    counts the windows, the sliding layers, the prefetched history on CUDA and the staging: the K/V an offloaded
    layer being computed hands to attention, all its cached tokens + the new ones, made apart from its window);
    ``stored_bytes`` /
    ``stored_peak_bytes``: the KV held over all tiers with each token counted once (windows + history: the figure
    that equals Σ over layers of 2 × kv_heads × head_dim × dtype bytes × tokens held × batch, tokens held = all
    cached tokens, or the last ``window - 1`` of a sliding layer:
    :meth:`kvbench.offload.architecture.Architecture.cached_kv_bytes`, which does not import this module); and the copy
    engine's ``stats`` (H2D/D2H/disk bytes and counts). ``host_allocated_bytes`` / ``host_allocated_peak_bytes``: the
    capacity of the host buffers (allocated, not just filled: they grow by doubling) after each update, now and at peak;
    ``pinned_host_bytes`` / ``pinned_host_peak_bytes``: the same for the page-locked ones. A buffer's doubling briefly
    holds the old one too, which these do not count.

    Device peak against ``none`` (``DynamicCache``, read after every step): a sliding layer's update hands
    attention its held tokens + the new ones (in a prefill, the whole prompt's K/V of that layer) exactly as
    ``DynamicCache`` does, and ``none``'s reading does not see that concatenation, so it is not counted here
    either: a model whose layers all slide (Mistral v0.1) has ``none``'s device peak in every mode. The one
    staging cost beyond ``none``'s peak is the window of the offloaded layer being computed, held twice while its
    concatenation exists: ``device_peak_bytes <= none's peak + window × token bytes`` (token bytes = 2 × batch ×
    kv_heads × head_dim × dtype bytes). On CUDA the prefetched next layer's history adds no more than that layer's
    tokens beyond its window, which ``none`` holds too. ``full`` (window 0) and a window holding every token
    (nothing offloaded, nothing concatenated) never pass ``none``'s peak; a window over half a layer's tokens can
    (2 full-attention layers of ``T`` tokens each, on CPU: by ``2 × window − T`` tokens).

    Args:
        config: the model's transformers config (number and types of layers, sliding window).
        device: the compute device.
        window: tokens per layer kept on the device (>= 0).
        pin: page-lock host buffers; default: on CUDA.
        host_max_tokens: tokens per layer kept in host memory; older ones go to the disk tier (None: no disk).
        disk_dir: where the disk tier makes its private directory (default: the system temporary directory).
        disk_page_cache: let the disk tier's pages stay in the page cache (no sync, no drop: faster, but disk reads
            and writes then time RAM); see :class:`~kvbench.offload.disk.DiskTier`.
        host_formats: the host formats of K and V (:func:`~kvbench.offload.host_tiers.host_format`; default: the
            model's dtype). ``host_bytes``, ``disk_bytes`` and the engine's ``*_bytes`` are then physical (what the
            tiers hold and the link moves, scales included), ``host_logical_bytes``/``disk_logical_bytes`` (and
            peaks) and the engine's ``*_logical_bytes`` the same tokens as the model's dtype; ``stored_bytes``
            counts logical bytes, so that it still equals the analytic KV.

    Raises:
        ValueError: a negative window, ``host_max_tokens`` under one disk block, layer types kvbench cannot cache
            (see :func:`~kvbench.offload.layer_types.layer_windows`).
        DiskTierError: the disk tier cannot be created in ``disk_dir``.
    """

    def __init__(self, config: Any, device: torch.device, window: int = 0, pin: bool | None = None,
                 host_max_tokens: int | None = None, disk_dir: str | None = None, disk_page_cache: bool = False,
                 host_formats: tuple[HostFormat, HostFormat] | None = None):
        if window < 0:
            raise ValueError(f"window must be >= 0 tokens, got {window}")
        if host_max_tokens is not None and host_max_tokens < DISK_BLOCK_TOKENS:
            raise ValueError(f"host_max_tokens must hold at least one disk block of {DISK_BLOCK_TOKENS} "
                             f"tokens, got {host_max_tokens}")
        windows = layer_windows(config)  # before the disk tier is made: a config it refuses leaves no directory
        self.engine = Transfers(device)
        self.disk = DiskTier(disk_dir, page_cache=disk_page_cache) if host_max_tokens is not None else None
        pin = device.type == "cuda" if pin is None else pin
        layers: list[Any] = [
            DynamicSlidingWindowLayer(sliding_window=w) if w is not None
            else OffloadedLayer(window, self.engine, pin, host_max_tokens, self.disk, *(host_formats or ()))
            for w in windows
        ]
        super().__init__(layers=layers)
        self.window = window
        self._windows = windows
        self._offloaded = [i for i, layer in enumerate(layers) if isinstance(layer, OffloadedLayer)]
        # position in _offloaded of the first offloaded layer after each layer (computed once, not per update)
        self._next_pos = [next((k for k, j in enumerate(self._offloaded) if j > i), len(self._offloaded))
                          for i in range(len(layers))]
        self._dev = [0] * len(layers)
        self._host = [0] * len(layers)
        self._disk = [0] * len(layers)
        self._stored = [0] * len(layers)
        self._logical = [(0, 0)] * len(layers)
        self.host_logical_bytes = self.disk_logical_bytes = self.host_logical_peak_bytes = 0
        self.disk_logical_peak_bytes = 0
        self._pinned = [0] * len(layers)
        self.pinned_host_bytes = self.pinned_host_peak_bytes = 0
        self.host_allocated_bytes = self.host_allocated_peak_bytes = 0
        self._allocated = [0] * len(layers)
        self.device_bytes = self.host_bytes = self.disk_bytes = self.stored_bytes = 0
        self.device_peak_bytes = self.host_peak_bytes = self.disk_peak_bytes = self.stored_peak_bytes = 0

    def close(self) -> None:
        """Remove the disk tier's files (idempotent; the cache cannot hold tokens on disk afterwards)."""
        if self.disk is not None:
            self.disk.close()

    def __enter__(self) -> OffloadedCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _layer_bytes(layer: Any) -> tuple[int, int, int, int]:
        """(device, host, disk, stored) bytes of one layer; stored counts each token once (window + history)."""
        if isinstance(layer, OffloadedLayer):
            window = layer.keys.nbytes + layer.values.nbytes if layer.is_initialized else 0
            return (layer.device_bytes, layer.host_bytes, layer.disk_bytes,
                    window + layer.host_logical_bytes + layer.disk_logical_bytes)
        if getattr(layer, "is_initialized", False):
            n = layer.keys.nbytes + layer.values.nbytes
            return n, 0, 0, n
        return 0, 0, 0, 0

    def _recount(self, i: int) -> None:
        d, h, k, s = self._layer_bytes(self.layers[i])
        self.device_bytes += d - self._dev[i]
        self.host_bytes += h - self._host[i]
        self.disk_bytes += k - self._disk[i]
        self.stored_bytes += s - self._stored[i]
        self._dev[i], self._host[i], self._disk[i], self._stored[i] = d, h, k, s
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)
        self.disk_peak_bytes = max(self.disk_peak_bytes, self.disk_bytes)
        self.stored_peak_bytes = max(self.stored_peak_bytes, self.stored_bytes)
        layer = self.layers[i]
        if isinstance(layer, OffloadedLayer):
            (h0, k0), self._logical[i] = self._logical[i], (layer.host_logical_bytes, layer.disk_logical_bytes)
            self.host_logical_bytes += self._logical[i][0] - h0
            self.disk_logical_bytes += self._logical[i][1] - k0
            self.host_logical_peak_bytes = max(self.host_logical_peak_bytes, self.host_logical_bytes)
            self.disk_logical_peak_bytes = max(self.disk_logical_peak_bytes, self.disk_logical_bytes)
            keys, values = layer.keys_history, layer.values_history
            a = keys.nbytes + values.nbytes
            p = (keys.nbytes if keys.pinned else 0) + (values.nbytes if values.pinned else 0)
            self.host_allocated_bytes += a - self._allocated[i]
            self.pinned_host_bytes += p - self._pinned[i]
            self._allocated[i], self._pinned[i] = a, p
            self.host_allocated_peak_bytes = max(self.host_allocated_peak_bytes, self.host_allocated_bytes)
            self.pinned_host_peak_bytes = max(self.pinned_host_peak_bytes, self.pinned_host_bytes)

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
            if self.layers[i].keys_history.length:
                self.layers[i].prefetch()
                self._recount(i)
                return

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Store new K/V (``[batch, kv_heads, n, head_dim]``) of a layer; return that layer's full K/V.

        Raises:
            DiskTierError: the cache was closed (its disk tier removed) and cannot be used any more.
        """
        if self.disk is not None and self.disk.closed:
            raise DiskTierError(None, f"this {type(self).__name__} was closed (its disk tier {self.disk.path} is "
                                      "removed): make a new cache")
        layer = self.layers[layer_idx]
        keys, values = layer.update(key_states, value_states, *args, **kwargs)
        self._recount(layer_idx)
        self._prefetch_after(layer_idx)
        # the concatenation an offloaded layer hands to attention (history + window + new tokens): staging that only
        # offloading makes. A sliding layer's own concatenation (its held tokens + the new ones, the whole prompt in
        # a prefill) is not counted: DynamicCache makes the same one, and `none`'s per-step reading never sees it
        offloaded = isinstance(layer, OffloadedLayer) and keys is not layer.keys
        in_use = keys.nbytes + values.nbytes if offloaded else 0
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
        flags = {self.layers[i].keys_history.pinned for i in self._offloaded} - {None}
        return None if not flags else all(flags)


class FullOffloadCache(OffloadedCache):
    """The ``full`` mode: all history off the device (an :class:`OffloadedCache` with ``window=0``)."""

    def __init__(self, config: Any, device: torch.device, pin: bool | None = None,
                 host_max_tokens: int | None = None, disk_dir: str | None = None, disk_page_cache: bool = False,
                 host_formats: tuple[HostFormat, HostFormat] | None = None):
        super().__init__(config, device, window=0, pin=pin, host_max_tokens=host_max_tokens, disk_dir=disk_dir,
                         disk_page_cache=disk_page_cache, host_formats=host_formats)


class HierarchicalCache(OffloadedCache):
    """The ``hierarchical`` mode: the last ``window`` tokens of every layer on the device, older ones on the host;
    attention still covers all tokens (an :class:`OffloadedCache` with that window)."""


class DynamicOffloadCache(OffloadedCache):
    """The ``dynamic`` mode: an :class:`OffloadedCache` whose window a :class:`~kvbench.offload.policy.WindowPolicy`
    chooses at the start of every step (the first layer's update; step 0 is the prefill).

    The policy gets the largest window whose device KV stays within the room this step, computed from the
    accounting: every offloaded layer's window (``W × token bytes`` each) + the K/V handed to attention
    (``(cached + new tokens) × token bytes``; twice on CUDA, for the prefetched next layer) + what the
    sliding-window layers hold after the step (their last ``window - 1`` tokens at most), where token bytes = 2
    (K and V) × batch × kv_heads × head_dim × dtype bytes. The room is
    ``budget_bytes`` or, without a budget, the free memory of the device (CUDA: ``torch.cuda.mem_get_info``; CPU:
    psutil's available memory) plus what the cache holds on it, less ``reserve_bytes`` (default: 10% of the
    device's memory). A change is applied at once (a smaller window sends tokens off the device, a larger one
    brings the newest host tokens back) and recorded in :attr:`events`.

    Args:
        config, device, pin, host_max_tokens, disk_dir, disk_page_cache, host_formats: as :class:`OffloadedCache`.
        min_window, max_window: the policy's bounds (tokens).
        budget_bytes: device KV budget (bytes); None = free memory less the reserve.
        reserve_bytes: memory left to activations and others when there is no budget.

    Raises:
        ValueError: budget_bytes <= 0, reserve_bytes < 0, bad policy bounds (see WindowPolicy), as OffloadedCache.
    """

    def __init__(self, config: Any, device: torch.device, min_window: int = MIN_WINDOW, max_window: int | None = None,
                 budget_bytes: int | None = None, reserve_bytes: int | None = None, pin: bool | None = None,
                 host_max_tokens: int | None = None, disk_dir: str | None = None, disk_page_cache: bool = False,
                 host_formats: tuple[HostFormat, HostFormat] | None = None):
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be > 0 bytes, got {budget_bytes}")
        if reserve_bytes is not None and reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0 bytes, got {reserve_bytes}")
        self.policy = WindowPolicy(min_window, max_window)
        super().__init__(config, device, window=self.policy.window, pin=pin, host_max_tokens=host_max_tokens,
                         disk_dir=disk_dir, disk_page_cache=disk_page_cache, host_formats=host_formats)
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.max_positions = getattr(text, "max_position_embeddings", None) or 2**31
        offloaded = set(self._offloaded)
        self._on_device = [i for i in range(len(self.layers)) if i not in offloaded]  # sliding-window layers
        self.step = -1
        self._stalls_seen = 0

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every window change: ``{"step", "old", "new", "reason"}``."""
        return [e.as_dict() for e in self.policy.events]

    def room_bytes(self) -> int:
        """Device bytes the KV may take at this step (see the class docstring)."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        if self.engine.cuda:
            free, total = torch.cuda.mem_get_info(self.engine.device)
        else:
            vm = psutil.virtual_memory()
            free, total = vm.available, vm.total
        reserve = self.reserve_bytes if self.reserve_bytes is not None else total // 10
        return free + self.device_bytes - reserve

    def window_limit(self, cached: int, new: int, token_bytes: int) -> int:
        """Largest window (tokens per layer) whose device KV stays within :meth:`room_bytes` during a step that
        adds ``new`` tokens to ``cached`` ones, ``token_bytes`` per token and layer (K and V, whole batch)."""
        n_off = len(self._offloaded)
        # what the sliding layers hold after this step (their transient concatenation is not counted, as in
        # OffloadedCache's accounting)
        sliding = sum(tokens_held(cached + new, self._windows[i]) for i in self._on_device) * token_bytes
        in_use = (2 if self.engine.cuda else 1) * (cached + new) * token_bytes
        room = self.room_bytes() - sliding - in_use
        if not n_off:
            return self.window
        # a window past the model's context holds everything: no larger one is needed
        return max(0, min(room // (n_off * token_bytes), self.max_positions))

    def _new_step(self, key_states: torch.Tensor) -> None:
        self.step += 1
        b, h, n, d = key_states.shape
        token_bytes = 2 * b * h * d * key_states.element_size()
        cached = self.layers[self._offloaded[0]].get_seq_length() if self._offloaded else 0
        stalls = self.engine.stats.stalls
        stalled, self._stalls_seen = stalls > self._stalls_seen, stalls
        w = self.policy.decide(self.step, self.window_limit(cached, n, token_bytes), stalled)
        if w != self.window:
            self.window = w
            for i in self._offloaded:
                self.layers[i].set_window(w)
                self._recount(i)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """As :meth:`OffloadedCache.update`; the first layer's update starts a step and chooses its window."""
        if layer_idx == 0:
            self._new_step(key_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)



def kv_bytes(cache: Any, device: torch.device) -> tuple[int, int]:
    """Bytes of key and value tensors a cache holds now, split into (on ``device``, elsewhere).

    kvbench's offload caches report their own accounting; for others every layer's ``keys`` and ``values``
    (``[batch, kv_heads, seq, head_dim]`` each) are summed by ``nbytes``. On a CPU run the compute device is the
    host, so a transformers cache counts entirely as on the device.
    """
    if isinstance(cache, OffloadedCache):
        return cache.device_bytes, cache.host_bytes + cache.disk_bytes
    on_device = elsewhere = 0
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and t.numel():
                if t.device == device or (t.device.type == device.type and device.index is None):
                    on_device += t.nbytes
                else:
                    elsewhere += t.nbytes
    return on_device, elsewhere


__all__ = ["DynamicOffloadCache", "FullOffloadCache", "HierarchicalCache", "OffloadedCache", "kv_bytes"]
