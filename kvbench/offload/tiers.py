"""The host tier: one layer's K or V history in host memory, allocated once and grown geometrically."""

from __future__ import annotations

import torch

from kvbench.offload.transfer import Transfers

#: Smallest capacity (tokens) of a host buffer; growth doubles it.
MIN_CAPACITY = 256


class HostBuffer:
    """K or V history of one layer in host memory, filled up to ``length`` tokens.

    Stored sequence-major, ``[capacity, batch, kv_heads, head_dim]``, so that every append and every read of the
    history is one contiguous block (an asynchronous copy needs a contiguous host side); the methods take and
    give the transformers layout ``[batch, kv_heads, seq, head_dim]``. Appends write into free capacity; when full, the buffer doubles (one copy of the history, amortised O(1) per
    token) instead of a ``torch.cat`` of the whole history every step. With ``pin=True`` (CUDA) the buffer is
    page-locked so copies can run asynchronously; if pinning fails it falls back to pageable memory and
    ``pinned`` records it.
    """

    def __init__(self, pin: bool = False):
        self.pin = pin
        self.pinned: bool | None = None
        self.buf: torch.Tensor | None = None
        self.length = 0

    @property
    def capacity(self) -> int:
        """Tokens the buffer can hold before it grows."""
        return 0 if self.buf is None else self.buf.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of host memory allocated (capacity, not just the filled part)."""
        return 0 if self.buf is None else self.buf.nbytes

    @property
    def used_bytes(self) -> int:
        """Bytes of the filled part: ``length`` tokens."""
        return 0 if self.buf is None else self.buf[: self.length].nbytes

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.pin:
            try:
                t = torch.empty(shape, dtype=dtype, pin_memory=True)
                self.pinned = True
                return t
            except RuntimeError:
                self.pin = False
        self.pinned = False
        return torch.empty(shape, dtype=dtype)

    def _reserve(self, like: torch.Tensor, extra: int, engine: Transfers) -> None:
        need = self.length + extra
        if self.buf is not None and need <= self.capacity:
            return
        cap = max(MIN_CAPACITY, self.capacity)
        while cap < need:
            cap *= 2
        b, h, _, d = like.shape
        new = self._allocate((cap, b, h, d), like.dtype)
        if self.buf is not None and self.length:
            engine.drain()  # copies into the old buffer must land before it is read
            new[: self.length].copy_(self.buf[: self.length])
        self.buf = new

    def append(self, src: torch.Tensor, engine: Transfers) -> None:
        """Copy ``src`` (``[batch, kv_heads, n, head_dim]``, on the device) to the end of the history (D2H)."""
        n = src.shape[-2]
        if n == 0:
            return
        self._reserve(src, n, engine)
        # the n new tokens, sequence-major on the device (a small copy), then one contiguous block to the host
        engine.to_host(src.permute(2, 0, 1, 3).contiguous(), self.buf[self.length : self.length + n])
        self.length += n

    def block(self) -> torch.Tensor:
        """The filled part as stored, ``[length, batch, kv_heads, head_dim]``, contiguous (for H2D copies)."""
        return self.buf[: self.length]

    def view(self) -> torch.Tensor:
        """The filled part, ``[batch, kv_heads, length, head_dim]`` (a view: do not keep it across appends)."""
        return self.block().permute(1, 2, 0, 3)

    def truncate(self, length: int, engine: Transfers) -> None:
        """Keep the first ``length`` tokens."""
        engine.drain()
        self.length = min(self.length, length)

    def replace(self, history: torch.Tensor, engine: Transfers) -> None:
        """Replace the whole history with ``history`` (a host tensor), e.g. after a batch reorder."""
        engine.drain()
        self.buf, self.length = None, 0
        self._reserve(history, history.shape[-2], engine)
        self.buf[: history.shape[-2]].copy_(history.permute(2, 0, 1, 3))
        self.length = history.shape[-2]
