"""A cache layer whose K/V history is split between the host tier (oldest tokens) and the device (the last
``window`` tokens), and whose attention still sees every token."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from kvbench.offload.tiers import HostBuffer
from kvbench.offload.transfer import Transfers


class OffloadedLayer(DynamicLayer):
    """K/V of one full-attention layer across two tiers.

    Layout along the sequence axis: ``host history`` (oldest) then ``keys``/``values`` (the device window, the
    last ``window`` tokens, ``[batch, kv_heads, ≤window, head_dim]``). ``update`` returns the concatenation of
    host history (brought to the device, prefetched when possible), the window and the new tokens, so attention
    covers all tokens exactly as with ``DynamicLayer``. Tokens that leave the window are copied to the host once
    (D2H); with ``window=0`` only the new tokens go D2H each step.

    Args:
        window: tokens kept on the device (0 = everything on the host: the ``full`` mode).
        engine: the cache's copy engine (shared by all its layers).
        pin: page-lock host buffers (CUDA).
    """

    def __init__(self, window: int, engine: Transfers, pin: bool = False):
        super().__init__()
        if window < 0:
            raise ValueError(f"window must be >= 0 tokens, got {window}")
        self.window = window
        self.engine = engine
        self.host_keys = HostBuffer(pin)
        self.host_values = HostBuffer(pin)
        self._fetched: tuple[int, torch.Tensor, torch.Tensor, object, object] | None = None

    # ------------------------------------------------------------------ transfers

    def prefetch(self) -> None:
        """Start bringing the host history to the device (no-op if there is none or it is already on its way)."""
        n = self.host_keys.length
        if n == 0 or (self._fetched is not None and self._fetched[0] == n):
            return
        k, ek = self.engine.to_device(self.host_keys.block())
        v, ev = self.engine.to_device(self.host_values.block())
        self._fetched = (n, k, v, ek, ev)

    def _history_on_device(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.host_keys.length == 0:
            return None
        self.prefetch()
        _, k, v, ek, ev = self._fetched
        self._fetched = None  # used once: the next step's history includes this step's tokens
        # [seq, batch, heads, dim] → [batch, heads, seq, dim] views; the caller's torch.cat materialises them
        return self.engine.ready(k, ek).permute(1, 2, 0, 3), self.engine.ready(v, ev).permute(1, 2, 0, 3)

    def offload(self) -> None:  # transformers' Cache may call this; the tiers are managed in update()
        """No-op: tokens move to the host in :meth:`update`."""

    # ------------------------------------------------------------------ CacheLayerMixin

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Add ``[batch, kv_heads, n, head_dim]`` new K/V; return K/V of every cached token plus the new ones."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        history = self._history_on_device()
        window_k = torch.cat([self.keys, key_states], dim=-2)
        window_v = torch.cat([self.values, value_states], dim=-2)
        if history is None:
            full_k, full_v = window_k, window_v
        else:
            full_k = torch.cat([history[0], window_k], dim=-2)
            full_v = torch.cat([history[1], window_v], dim=-2)
        spill = window_k.shape[-2] - self.window
        if spill > 0:
            self.host_keys.append(window_k[:, :, :spill], self.engine)
            self.host_values.append(window_v[:, :, :spill], self.engine)
            # a separate tensor, so the device keeps only the window, not the whole concatenation
            window_k = window_k[:, :, spill:].clone()
            window_v = window_v[:, :, spill:].clone()
        self.keys, self.values = window_k, window_v
        return full_k, full_v

    def get_seq_length(self) -> int:
        """Tokens cached in all tiers (not just the window)."""
        if not self.is_initialized:
            return 0
        return self.host_keys.length + self.keys.shape[-2]

    def reset(self) -> None:
        """Drop everything (device window, host history, prefetched copies)."""
        self.engine.drain()
        self.host_keys = HostBuffer(self.host_keys.pin)
        self.host_values = HostBuffer(self.host_values.pin)
        self._fetched = None
        super().reset()

    def _host_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.engine.drain()
        return self.host_keys.view(), self.host_values.view()

    def crop(self, tokens_to_remove: int) -> None:
        """Remove ``-tokens_to_remove`` tokens from the end (window first, then host). Positive values are an
        absolute length, as in transformers' legacy API: not supported, raises ValueError."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        keep = max(0, self.get_seq_length() + tokens_to_remove)
        self._fetched = None
        n_host = self.host_keys.length
        if keep >= n_host:
            self.keys = self.keys[:, :, : keep - n_host]
            self.values = self.values[:, :, : keep - n_host]
        else:
            self.keys, self.values = self.keys[:, :, :0], self.values[:, :, :0]
            self.host_keys.truncate(keep, self.engine)
            self.host_values.truncate(keep, self.engine)

    def _map_batch(self, fn) -> None:
        """Apply a batch-axis function to every tier (beam search reorder, selection, repeat)."""
        self._fetched = None
        self.keys, self.values = fn(self.keys), fn(self.values)
        if self.host_keys.length:
            hk, hv = self._host_tensors()
            self.host_keys.replace(fn(hk), self.engine)
            self.host_values.replace(fn(hv), self.engine)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch (beam search) in both tiers."""
        if self.get_seq_length() > 0:
            self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every sequence ``repeats`` times (beam search expansion) in both tiers."""
        if self.get_seq_length() > 0:
            self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at ``indices`` in both tiers."""
        if self.get_seq_length() > 0:
            self._map_batch(lambda t: t[indices.to(t.device) if isinstance(indices, torch.Tensor) else indices])

    # ------------------------------------------------------------------ accounting

    @property
    def device_bytes(self) -> int:
        """Bytes of K/V this layer holds on the device: the window plus any prefetched history."""
        if not self.is_initialized:
            return 0
        n = self.keys.nbytes + self.values.nbytes
        if self._fetched is not None and self.engine.cuda:
            n += self._fetched[1].nbytes + self._fetched[2].nbytes
        return n

    @property
    def host_bytes(self) -> int:
        """Bytes of K/V history this layer holds in host memory (the filled part; capacity is up to 2× more)."""
        return self.host_keys.used_bytes + self.host_values.used_bytes
