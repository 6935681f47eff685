"""A cache layer whose K/V history is split between the disk and host tiers (oldest tokens) and the device (the
last ``window`` tokens), and whose attention still sees every token."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from kvbench.offload.history import History
from kvbench.offload.host_tiers import HostFormat
from kvbench.offload.tiers import DiskTier
from kvbench.offload.transfer import Transfers


class OffloadedLayer(DynamicLayer):
    """K/V of one full-attention layer across the device, host and disk tiers.

    Layout along the sequence axis: ``history`` (oldest; on disk beyond ``host_max_tokens``, then in host memory)
    then ``keys``/``values`` (the device window, the last ``window`` tokens, ``[batch, kv_heads, ≤window,
    head_dim]``). ``update`` returns the concatenation of the history (brought to the device, prefetched when
    possible), the window and the new tokens, so attention covers all tokens exactly as with ``DynamicLayer``.
    Tokens that leave the window are copied to the host once (D2H); with ``window=0`` only the new tokens go D2H
    each step. K and V leave the device in their host formats (``k_format``, ``v_format``: encoded on the device
    before the copy, decoded on it after the copy back; the window stays in the model's dtype).

    Args:
        window: tokens kept on the device (0 = everything off the device: the ``full`` mode).
        engine: the cache's copy engine (shared by all its layers).
        pin: page-lock host buffers (CUDA).
        host_max_tokens: cap of the host tier; older tokens spill to ``disk``.
        disk: the cache's disk tier (needed with ``host_max_tokens``).
        k_format, v_format: the host formats of K and V (default: the model's dtype); see
            :mod:`kvbench.offload.host_tiers`.

    Raises:
        ValueError: a negative window; see :class:`~kvbench.offload.history.History` for the host cap.
    """

    def __init__(self, window: int, engine: Transfers, pin: bool = False, host_max_tokens: int | None = None,
                 disk: DiskTier | None = None, k_format: HostFormat | None = None,
                 v_format: HostFormat | None = None):
        super().__init__()
        if window < 0:
            raise ValueError(f"window must be >= 0 tokens, got {window}")
        self.window = window
        self.engine = engine
        self.keys_history = History(pin, host_max_tokens, disk, seq_major=engine.cuda, fmt=k_format)
        self.values_history = History(pin, host_max_tokens, disk, seq_major=engine.cuda, fmt=v_format)
        #: (history length, K stretches, V stretches): each stretch the format's parts on their way to the device
        self._fetched: tuple[int, list[list[tuple[torch.Tensor, object]]], list[list[tuple[torch.Tensor, object]]]] \
            | None = None

    # ------------------------------------------------------------------ transfers

    def prefetch(self) -> None:
        """Start bringing the history to the device (no-op if there is none or it is already on its way)."""
        n = self.keys_history.length
        if n == 0 or (self._fetched is not None and self._fetched[0] == n):
            return
        self._fetched = (n, self._send(self.keys_history), self._send(self.values_history))

    def _send(self, history: History) -> list[list[tuple[torch.Tensor, object]]]:
        """Start copying ``history``'s stretches to the device, still encoded (H2D counted physical and logical)."""
        out = []
        for stretch in history.parts(self.engine):
            out.append([self.engine.to_device(p) for p in stretch])
            self.engine.stats.h2d_logical_bytes += history.logical(sum(p.nbytes for p in stretch))
        return out

    def _history_on_device(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The history's stretches on the device, decoded, oldest first, ``[batch, kv_heads, n, head_dim]``."""
        if self.keys_history.length == 0:
            return [], []
        self.prefetch()
        _, k, v = self._fetched
        self._fetched = None  # used once: the next step's history includes this step's tokens
        return self._decoded(self.keys_history, k), self._decoded(self.values_history, v)

    def _decoded(self, history: History, sent: list[list[tuple[torch.Tensor, object]]]) -> list[torch.Tensor]:
        return [history.decode([self.engine.ready(t, e) for t, e in stretch]) for stretch in sent]

    def offload(self) -> None:  # transformers' Cache may call this; the tiers are managed in update()
        """No-op: tokens move to the host in :meth:`update`."""

    def _spill(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Move the tokens of ``keys``/``values`` beyond the window (the oldest) off the device; return the rest."""
        spill = keys.shape[-2] - self.window
        if spill <= 0:
            return keys, values
        self.keys_history.append(keys[:, :, :spill], self.engine)
        self.values_history.append(values[:, :, :spill], self.engine)
        # a separate tensor, so the device keeps only the window, not the whole concatenation
        return keys[:, :, spill:].clone(), values[:, :, spill:].clone()

    def set_window(self, window: int) -> None:
        """Change the window now: a smaller one sends its oldest tokens off the device, a larger one brings the
        newest tokens of the host tier back (never from disk)."""
        if window < 0:
            raise ValueError(f"window must be >= 0 tokens, got {window}")
        self.window = window
        if not self.is_initialized:
            return
        self._fetched = None
        held = self.keys.shape[-2]
        if held > window:
            self.keys, self.values = self._spill(self.keys, self.values)
        elif held < window and self.keys_history.host_length:
            k = self._back(self.keys_history, window - held)
            v = self._back(self.values_history, window - held)
            self.keys = torch.cat([k, self.keys], dim=-2)
            self.values = torch.cat([v, self.values], dim=-2)

    def _back(self, history: History, n: int) -> torch.Tensor:
        """The newest ``n`` tokens of ``history``'s host tier, removed from it, on the device and decoded."""
        parts = history.pop_tail(n, self.engine)
        self.engine.stats.h2d_logical_bytes += history.logical(sum(p.nbytes for p in parts))
        return history.decode([self.engine.to_device_now(p) for p in parts])

    # ------------------------------------------------------------------ CacheLayerMixin

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """An empty window shaped ``[batch, kv_heads, 0, head_dim]`` on the device of the first K/V."""
        super().lazy_initialization(key_states, value_states)
        b, h, _, d = key_states.shape
        self.keys = key_states.new_empty((b, h, 0, d))
        self.values = value_states.new_empty((b, h, 0, value_states.shape[-1]))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Add ``[batch, kv_heads, n, head_dim]`` new K/V; return K/V of every cached token plus the new ones."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        hist_k, hist_v = self._history_on_device()
        n = self.keys.shape[-2] + key_states.shape[-2]  # window + new tokens
        full_k = torch.cat([*hist_k, self.keys, key_states], dim=-2)
        full_v = torch.cat([*hist_v, self.values, value_states], dim=-2)
        if hist_k:
            keys, values = self._spill(full_k[:, :, -n:], full_v[:, :, -n:])
        else:  # the concatenation is the window itself
            keys, values = self._spill(full_k, full_v)
        if hist_k and keys.shape[-2] == n:  # nothing spilled: keep the window apart from the concatenation
            keys, values = keys.clone(), values.clone()
        self.keys, self.values = keys, values
        return full_k, full_v

    def get_seq_length(self) -> int:
        """Tokens cached in all tiers (not just the window)."""
        if not self.is_initialized:
            return 0
        return self.keys_history.length + self.keys.shape[-2]

    def reset(self) -> None:
        """Drop everything (device window, host and disk history, prefetched copies)."""
        self.engine.drain()
        for h in (self.keys_history, self.values_history):
            h.truncate(0, self.engine)
        self._fetched = None
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        """Remove ``-tokens_to_remove`` tokens from the end (window first, then host, then disk). Positive values
        are an absolute length, as in transformers' legacy API: not supported, raises ValueError."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        keep = max(0, self.get_seq_length() + tokens_to_remove)
        self._fetched = None
        n_hist = self.keys_history.length
        if keep >= n_hist:
            self.keys = self.keys[:, :, : keep - n_hist]
            self.values = self.values[:, :, : keep - n_hist]
        else:
            self.keys, self.values = self.keys[:, :, :0], self.values[:, :, :0]
            self.keys_history.truncate(keep, self.engine)
            self.values_history.truncate(keep, self.engine)

    def _map_batch(self, fn) -> None:
        """Apply a batch-axis function to every tier (beam search reorder, selection, repeat)."""
        self._fetched = None
        self.keys, self.values = fn(self.keys), fn(self.values)
        if self.keys_history.length:
            for h in (self.keys_history, self.values_history):
                h.map_batch(fn, self.engine)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch (beam search) in every tier."""
        if self.get_seq_length() > 0:
            self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every sequence ``repeats`` times (beam search expansion) in every tier."""
        if self.get_seq_length() > 0:
            self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the sequences at ``indices`` in every tier."""
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
            n += sum(t.nbytes for stretch in self._fetched[1] + self._fetched[2] for t, _ in stretch)
        return n

    @property
    def host_bytes(self) -> int:
        """Bytes of K/V history this layer holds in host memory (the filled part; capacity is up to 2× more),
        physical: as the host formats store it, scales included."""
        return self.keys_history.host_bytes + self.values_history.host_bytes

    @property
    def disk_bytes(self) -> int:
        """Bytes of K/V history this layer holds on disk, physical."""
        return self.keys_history.disk_bytes + self.values_history.disk_bytes

    @property
    def host_logical_bytes(self) -> int:
        """:attr:`host_bytes` as the model's dtype (equal unless a host format is smaller)."""
        return self.keys_history.host_logical_bytes + self.values_history.host_logical_bytes

    @property
    def disk_logical_bytes(self) -> int:
        """:attr:`disk_bytes` as the model's dtype."""
        return self.keys_history.disk_logical_bytes + self.values_history.disk_logical_bytes
