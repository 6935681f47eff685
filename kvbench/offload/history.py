"""A layer's K or V history off the device, in its host format: one :class:`~kvbench.offload.tiers.TieredBuffer`
(host tier, then disk beyond ``host_max_tokens``) per part of the format (:mod:`kvbench.offload.host_tiers`).

Every method takes and gives the transformers layout ``[batch, kv_heads, seq, head_dim]``; a part keeps its own
last axis (an int8 payload ``head_dim``, its scales 1). All parts get the same appends, so they split between host
and disk at the same tokens and :meth:`History.parts` can pair them up.

Bytes come two ways: **physical**, what the tiers hold and the link and the disk move (the stored parts, scales
included: ``host_bytes``, ``disk_bytes`` and the copy engine's ``h2d_bytes``...), and **logical**, the same tokens
as the model's dtype (``host_logical_bytes``, ``disk_logical_bytes`` and the engine's ``*_logical_bytes``). They
are equal unless the format is smaller.
"""

from __future__ import annotations

import torch

from kvbench.offload.host_tiers import HostFormat
from kvbench.offload.tiers import DiskTier, TieredBuffer
from kvbench.offload.transfer import Transfers

__all__ = ["History"]


class History:
    """K or V history of one layer across the host tier and, beyond ``host_max_tokens``, the disk tier, held in
    ``fmt`` (default: the model's dtype, as it came).

    Args:
        pin: page-lock the host buffers (CUDA).
        host_max_tokens: cap of the host tier (None: no cap, no disk tier).
        disk: the cache's disk directory; needed with ``host_max_tokens``.
        seq_major: store the host tier sequence-major (CUDA) instead of head-major (CPU); see
            :mod:`kvbench.offload.tiers`.
        fmt: the host format (:func:`~kvbench.offload.host_tiers.host_format`).

    Raises:
        ValueError: ``host_max_tokens`` smaller than one block, or given without ``disk``.
    """

    def __init__(self, pin: bool = False, host_max_tokens: int | None = None, disk: DiskTier | None = None,
                 seq_major: bool = False, fmt: HostFormat | None = None):
        self.format = fmt if fmt is not None else HostFormat()
        self.stacks = [TieredBuffer(pin, host_max_tokens, disk, seq_major) for _ in range(self.format.parts)]
        self.host_max_tokens = host_max_tokens
        self.dtype: torch.dtype | None = None  # the model's, from the first append
        self._logical = 0  # bytes of a token (all sequences and heads of the last append) as the model's dtype
        self._physical = 0  # ... as stored, all parts: their ratio is the format's, whatever the batch

    # ------------------------------------------------------------------ sizes

    @property
    def length(self) -> int:
        """Tokens in both tiers."""
        return self.stacks[0].length

    @property
    def host_length(self) -> int:
        """Tokens in the host tier."""
        return self.stacks[0].host.length

    @property
    def disk_length(self) -> int:
        """Tokens in the disk tier."""
        return self.stacks[0].disk_length

    @property
    def pinned(self) -> bool | None:
        """Whether the host buffers are page-locked (None before the first allocation)."""
        return self.stacks[0].pinned

    @property
    def nbytes(self) -> int:
        """Bytes of host memory allocated (capacity), physical."""
        return sum(s.nbytes for s in self.stacks)

    @property
    def host_bytes(self) -> int:
        """Bytes of history held in host memory, physical (scales included)."""
        return sum(s.host_bytes for s in self.stacks)

    @property
    def disk_bytes(self) -> int:
        """Bytes of history held on disk, physical."""
        return sum(s.disk_bytes for s in self.stacks)

    @property
    def host_logical_bytes(self) -> int:
        """The host tier's tokens as the model's dtype, bytes."""
        return self.logical(self.host_bytes)

    @property
    def disk_logical_bytes(self) -> int:
        """The disk tier's tokens as the model's dtype, bytes."""
        return self.logical(self.disk_bytes)

    def logical(self, physical_bytes: int) -> int:
        """``physical_bytes`` of this history's stored tokens as the model's dtype (bytes): the two are
        proportional, whatever the batch."""
        return physical_bytes if not self._physical else physical_bytes * self._logical // self._physical

    # ------------------------------------------------------------------ changes

    def _shape(self, src: torch.Tensor, parts: tuple[torch.Tensor, ...]) -> None:
        n = src.shape[-2]
        self.dtype = src.dtype
        self._logical, self._physical = src.nbytes // n, sum(p.nbytes for p in parts) // n

    def append(self, src: torch.Tensor, engine: Transfers) -> None:
        """Add ``src`` (``[batch, kv_heads, n, head_dim]``, on the device, the model's dtype) at the end: encoded
        on the device, then D2H (and to disk beyond the host cap)."""
        n = src.shape[-2]
        if n == 0:
            return
        parts = self.format.encode(src)
        self._shape(src, parts)
        sent, written = engine.stats.d2h_bytes, engine.stats.disk_write_bytes
        for stack, part in zip(self.stacks, parts):
            stack.append(part, engine)
        engine.stats.d2h_logical_bytes += self.logical(engine.stats.d2h_bytes - sent)
        engine.stats.disk_write_logical_bytes += self.logical(engine.stats.disk_write_bytes - written)

    def parts(self, engine: Transfers) -> list[tuple[torch.Tensor, ...]]:
        """The non-empty stretches, oldest first (what was read from the disk tier, then the host tier's view),
        each the format's parts (``[batch, kv_heads, n, *]``), still encoded; :meth:`decode` makes one K or V."""
        read = engine.stats.disk_read_bytes
        out = list(zip(*(stack.parts(engine) for stack in self.stacks)))
        engine.stats.disk_read_logical_bytes += self.logical(engine.stats.disk_read_bytes - read)
        return out

    def decode(self, parts: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
        """One stretch of :meth:`parts` (on any device) as ``[batch, kv_heads, n, head_dim]`` in the model's dtype."""
        return self.format.decode(parts, self.dtype)

    def view(self, engine: Transfers) -> torch.Tensor:
        """All history decoded in host memory, ``[batch, kv_heads, length, head_dim]`` (a copy where part is on disk
        or encoded)."""
        engine.drain()
        decoded = [self.decode(p) for p in self.parts(engine)]
        return decoded[0] if len(decoded) == 1 else torch.cat(decoded, dim=-2)

    def truncate(self, length: int, engine: Transfers) -> None:
        """Keep the oldest ``length`` tokens."""
        for stack in self.stacks:
            stack.truncate(length, engine)

    def pop_tail(self, n: int, engine: Transfers) -> tuple[torch.Tensor, ...]:
        """Remove up to ``n`` of the newest tokens of the host tier and return them, still encoded (the format's
        parts, host copies of ``m ≤ n`` tokens)."""
        return tuple(stack.pop_tail(n, engine) for stack in self.stacks)

    def map_batch(self, fn, engine: Transfers) -> None:
        """Apply a batch-axis function (beam reorder, selection, repeat) to every stored part, without decoding."""
        for stack in self.stacks:
            stack.replace(fn(stack.view(engine)), engine)
