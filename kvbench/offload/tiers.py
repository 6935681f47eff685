"""The host and disk tiers: one layer's K or V history off the device.

- :class:`HostBuffer`: host memory, allocated once and grown geometrically (pinned on CUDA).
- :class:`DiskBuffer`: a file in a :class:`~kvbench.offload.disk.DiskTier` directory, grown the same way; space is
  reserved with ``posix_fallocate`` before it is written, so a full disk is an ``OSError`` (ENOSPC/EFBIG). It is
  written and read with explicit I/O that, by default, syncs writes and keeps neither from the page cache (see
  :mod:`kvbench.offload.disk`).
- :class:`TieredBuffer`: the two together, oldest tokens on disk; beyond ``host_max_tokens`` the host tier spills
  its oldest tokens to disk in whole blocks of :data:`~kvbench.offload.disk.DISK_BLOCK_TOKENS`. A layer's K or V
  history (:class:`~kvbench.offload.history.History`) is one per part of its host format.

Every method takes and gives the transformers layout ``[batch, kv_heads, seq, head_dim]`` (often a view). How a
host buffer stores it depends on where the model computes:

- **sequence-major**, ``[capacity, batch, kv_heads, head_dim]`` (CUDA): every append and every read of a stretch of
  history is one contiguous block, which an asynchronous copy between pinned memory and the device needs;
- **head-major**, ``[batch, kv_heads, capacity, head_dim]`` (CPU): the history of each head is one contiguous run,
  as in ``DynamicCache``, so the ``torch.cat`` that brings it next to the new tokens (the only copy on CPU) reads
  whole runs instead of gathering ``head_dim``-element pieces.

The disk tier is sequence-major on every device: the file grows at its end without moving what it holds.
``DiskTier`` and ``DiskTierError`` live in :mod:`kvbench.offload.disk` and are importable from here too.
"""

from __future__ import annotations

import torch

from kvbench.offload.disk import DISK_BLOCK_TOKENS, DiskTier, DiskTierError
from kvbench.offload.transfer import Transfers

__all__ = ["DiskBuffer", "DiskTier", "DiskTierError", "HostBuffer", "MIN_CAPACITY", "TieredBuffer", "grown_capacity"]

#: Smallest capacity (tokens) of a host buffer; growth doubles it.
MIN_CAPACITY = 256


def grown_capacity(current: int, need: int, minimum: int = MIN_CAPACITY) -> int:
    """The capacity (tokens) a buffer of ``current`` capacity grows to so that it holds ``need`` tokens:
    ``minimum``, doubled until it is enough."""
    cap = max(minimum, current)
    while cap < need:
        cap *= 2
    return cap


class _TokenBuffer:
    """A buffer ``buf`` filled up to ``length`` tokens along axis ``seq_dim`` (0: sequence-major
    ``[capacity, batch, kv_heads, head_dim]``; 2: head-major ``[batch, kv_heads, capacity, head_dim]``)."""

    def __init__(self, seq_major: bool) -> None:
        self.buf: torch.Tensor | None = None
        self.length = 0
        self.seq_dim = 0 if seq_major else 2

    @property
    def capacity(self) -> int:
        """Tokens the buffer can hold before it grows."""
        return 0 if self.buf is None else self.buf.shape[self.seq_dim]

    @property
    def used_bytes(self) -> int:
        """Bytes of the filled part: ``length`` tokens."""
        return 0 if self.buf is None else self._span(0, self.length).nbytes

    def _span(self, start: int, stop: int) -> torch.Tensor:
        """Tokens ``start:stop`` of ``buf`` as stored (a view)."""
        return self.buf.narrow(self.seq_dim, start, stop - start)

    def _stored(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (``[batch, kv_heads, n, head_dim]``) in the buffer's axis order (a view)."""
        return t.permute(2, 0, 1, 3) if self.seq_dim == 0 else t

    def _bhsd(self, t: torch.Tensor) -> torch.Tensor:
        """A stretch of ``buf`` as stored → ``[batch, kv_heads, n, head_dim]`` (a view)."""
        return t.permute(1, 2, 0, 3) if self.seq_dim == 0 else t

    def _shape(self, capacity: int, like: torch.Tensor) -> tuple[int, ...]:
        """The stored shape of ``capacity`` tokens shaped like ``like`` (``[batch, kv_heads, n, head_dim]``)."""
        b, h, _, d = like.shape
        return (capacity, b, h, d) if self.seq_dim == 0 else (b, h, capacity, d)

    def view(self) -> torch.Tensor:
        """The filled part, ``[batch, kv_heads, length, head_dim]`` (a view of ``buf``)."""
        return self._bhsd(self._span(0, self.length))


class HostBuffer(_TokenBuffer):
    """K or V history of one layer in host memory, filled up to ``length`` tokens.

    Appends write into free capacity; when full, the buffer doubles (one copy of the history, amortised O(1) per
    token) instead of a ``torch.cat`` of the whole history every step. With ``pin=True`` (CUDA) the buffer is
    page-locked so copies can run asynchronously; if pinning fails it falls back to pageable memory and
    ``pinned`` records it.

    Args:
        pin: page-lock the buffer.
        seq_major: store sequence-major (CUDA) instead of head-major (CPU); see the module docstring.
    """

    def __init__(self, pin: bool = False, seq_major: bool = False):
        super().__init__(seq_major)
        self.pin = pin
        self.pinned: bool | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of host memory allocated (capacity, not just the filled part)."""
        return 0 if self.buf is None else self.buf.nbytes

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
        """Make room for ``extra`` more tokens shaped like ``like`` (``[batch, kv_heads, n, head_dim]``)."""
        need = self.length + extra
        if self.buf is not None and need <= self.capacity:
            return
        old = self.buf
        self.buf = self._allocate(self._shape(grown_capacity(self.capacity, need), like), like.dtype)
        if old is not None and self.length:
            engine.drain()  # copies into the old buffer must land before it is read
            self._span(0, self.length).copy_(old.narrow(self.seq_dim, 0, self.length))

    def append(self, src: torch.Tensor, engine: Transfers) -> None:
        """Copy ``src`` (``[batch, kv_heads, n, head_dim]``, on the device) to the end of the history (D2H)."""
        n = src.shape[-2]
        if n == 0:
            return
        self._reserve(src, n, engine)
        engine.to_host(self._stored(src), self._span(self.length, self.length + n))
        self.length += n

    def drop_head(self, n: int, engine: Transfers) -> None:
        """Forget the oldest ``n`` tokens (they were spilled to disk); the rest moves to the front."""
        engine.drain()
        keep = self.length - n
        if keep > 0:
            self._span(0, keep).copy_(self._span(n, self.length).clone())
        self.length = max(0, keep)

    def truncate(self, length: int, engine: Transfers) -> None:
        """Keep the first ``length`` tokens."""
        engine.drain()
        self.length = min(self.length, length)

    def replace(self, history: torch.Tensor, engine: Transfers) -> None:
        """Replace the whole history with ``history`` (``[batch, kv_heads, n, head_dim]``, host), e.g. after a
        batch reorder."""
        engine.drain()
        self.buf, self.length = None, 0
        n = history.shape[-2]
        if n:
            self._reserve(history, n, engine)
            self._span(0, n).copy_(self._stored(history))
            self.length = n


class DiskBuffer:
    """K or V history of one layer in a file of the disk tier, filled up to ``length`` tokens and stored
    sequence-major: ``[capacity, batch, kv_heads, head_dim]`` from the file's first byte.

    The file grows geometrically like :class:`HostBuffer`; each growth reserves the space first
    (``posix_fallocate``). By default appends and reads go through the tier (:meth:`DiskTier.write`,
    :meth:`DiskTier.read`): a write is synced to the device, a read copies the file into a new host tensor, and
    both are dropped from the page cache, so a read really comes from the device. A tier that keeps the page cache
    (``page_cache=True``) maps the whole file instead (mapped again at each growth; the data stays in the file):
    appends copy into the mapping and a read is a view of it, served from RAM. Bytes written and read are counted
    in the copy engine's ``stats`` (``disk_write_bytes``/``disk_read_bytes``).

    Args:
        tier: the cache's disk directory, which names the file and does its I/O.
    """

    def __init__(self, tier: DiskTier):
        self.tier = tier
        self.path = tier.new_file()
        self.length = 0
        self.capacity = 0  # tokens the file holds room for
        self._fd: int | None = None
        self._map: torch.Tensor | None = None  # page_cache: the file mapped, [capacity, batch, kv_heads, head_dim]
        self._token: tuple[int, int, int] = (0, 0, 0)  # (batch, kv_heads, head_dim)
        self._dtype = torch.float32

    @property
    def token_bytes(self) -> int:
        """Bytes of one token (all sequences and heads) in the file."""
        b, h, d = self._token
        return b * h * d * self._dtype.itemsize

    @property
    def used_bytes(self) -> int:
        """Bytes of the filled part: ``length`` tokens."""
        return self.length * self.token_bytes

    def _reserve(self, like: torch.Tensor, extra: int) -> None:
        b, h, _, d = like.shape
        if self.capacity and ((b, h, d), like.dtype) != (self._token, self._dtype):
            if self.length:  # only an emptied buffer may change its batch (TieredBuffer.replace empties it first)
                raise ValueError(f"disk tier: {self.path} holds a batch of {self._token[0]}, got {b}")
            self.capacity = 0  # a new batch size: the file is laid out again from its start
        self._token, self._dtype = (b, h, d), like.dtype
        need = self.length + extra
        if need <= self.capacity:
            return
        capacity = grown_capacity(self.capacity, need, DISK_BLOCK_TOKENS)
        if self._fd is None:
            self._fd = self.tier.open(self.path)
        self.tier.reserve(self._fd, self.path, capacity * self.token_bytes)
        self.capacity = capacity
        if self.tier.page_cache:
            self._map = torch.from_file(str(self.path), shared=True, size=capacity * b * h * d,
                                        dtype=like.dtype).view(capacity, b, h, d)

    def append(self, src: torch.Tensor, engine: Transfers) -> None:
        """Write ``src`` (``[batch, kv_heads, n, head_dim]``, host or device) after the history.

        Raises:
            DiskTierError: the file cannot grow (disk full, file size limit) or the tier is closed.
            ValueError: a batch of another size while the buffer holds tokens.
        """
        n = src.shape[-2]
        if n == 0:
            return
        self._reserve(src, n)
        stored = src.permute(2, 0, 1, 3)
        if self._map is not None:  # into the mapping: it stays in the page cache
            block = self._map[self.length : self.length + n]
        else:
            block = stored.contiguous() if src.device.type == "cpu" else torch.empty(stored.shape, dtype=src.dtype)
        if src.device.type != "cpu":  # device → host (the mapping or a host block)
            engine.to_host(stored, block)
            engine.drain()
        elif self._map is not None:
            block.copy_(stored)
        if self._map is None:
            self.tier.write(self._fd, block, self.length * self.token_bytes)
        engine.stats.disk_write_bytes += src.nbytes
        engine.stats.disk_write_count += 1
        self.length += n

    def read(self, engine: Transfers) -> torch.Tensor:
        """The filled part, ``[batch, kv_heads, length, head_dim]``: a permuted view of a new, dense host tensor
        read from the file (of the mapping with ``page_cache``); counted as read.

        Raises:
            DiskTierError: the tier is closed or the file is shorter than it should be.
        """
        b, h, d = self._token
        if self._map is not None:
            out = self._map[: self.length]
        else:
            out = torch.empty((self.length, b, h, d), dtype=self._dtype)
        if self.length and self._map is None:
            self.tier.read(self._fd, out, 0)
        engine.stats.disk_read_bytes += out.nbytes
        engine.stats.disk_read_count += 1
        return out.permute(1, 2, 0, 3)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens."""
        self.length = min(self.length, length)


class TieredBuffer:
    """One tensor's history (a layer's K or V, or one part of their host format) across the host tier and, beyond
    ``host_max_tokens``, the disk tier.

    Oldest tokens are on disk, newer ones in host memory. When an append would take the host tier over
    ``host_max_tokens``, the oldest tokens (of the host tier, then of the incoming ones) go to disk in whole blocks
    of ``DISK_BLOCK_TOKENS``, so the host tier never holds more than ``host_max_tokens``.

    Args:
        pin: page-lock the host buffer (CUDA).
        host_max_tokens: cap of the host tier (None: no cap, no disk tier).
        disk: the cache's disk directory; needed with ``host_max_tokens``.
        seq_major: store the host tier sequence-major (CUDA) instead of head-major (CPU); see the module docstring.

    Raises:
        ValueError: ``host_max_tokens`` smaller than one block, or given without ``disk``.
    """

    def __init__(self, pin: bool = False, host_max_tokens: int | None = None, disk: DiskTier | None = None,
                 seq_major: bool = False):
        if host_max_tokens is not None:
            if host_max_tokens < DISK_BLOCK_TOKENS:
                raise ValueError(f"host_max_tokens must hold at least one disk block of {DISK_BLOCK_TOKENS} "
                                 f"tokens, got {host_max_tokens}")
            if disk is None:
                raise ValueError("host_max_tokens needs a disk tier")
        self.host = HostBuffer(pin, seq_major)
        self.host_max_tokens = host_max_tokens
        self._disk_tier = disk
        self.disk: DiskBuffer | None = None

    @property
    def length(self) -> int:
        """Tokens in both tiers."""
        return self.host.length + self.disk_length

    @property
    def disk_length(self) -> int:
        """Tokens in the disk tier."""
        return 0 if self.disk is None else self.disk.length

    @property
    def pinned(self) -> bool | None:
        """Whether the host buffer is page-locked (None before the first allocation)."""
        return self.host.pinned

    @property
    def nbytes(self) -> int:
        """Bytes of host memory allocated."""
        return self.host.nbytes

    @property
    def host_bytes(self) -> int:
        """Bytes of history held in host memory."""
        return self.host.used_bytes

    @property
    def disk_bytes(self) -> int:
        """Bytes of history held on disk."""
        return 0 if self.disk is None else self.disk.used_bytes

    def _to_disk(self, src: torch.Tensor, engine: Transfers) -> None:
        if self.disk is None:
            self.disk = DiskBuffer(self._disk_tier)
        self.disk.append(src, engine)

    def append(self, src: torch.Tensor, engine: Transfers) -> None:
        """Add ``src`` (``[batch, kv_heads, n, head_dim]``, on the device) at the end: D2H, spilling to disk."""
        n = src.shape[-2]
        cap = self.host_max_tokens
        if cap is not None and self.host.length + n > cap:
            over = self.host.length + n - cap
            spill = min(self.host.length + n, -(-over // DISK_BLOCK_TOKENS) * DISK_BLOCK_TOKENS)
            from_host = min(spill, self.host.length)
            if from_host:
                engine.drain()  # the host tier's last D2H copies must land before they are read
                self._to_disk(self.host.view()[:, :, :from_host], engine)
                self.host.drop_head(from_host, engine)
            if spill > from_host:
                self._to_disk(src[:, :, : spill - from_host], engine)
                src = src[:, :, spill - from_host :]
        self.host.append(src, engine)

    def parts(self, engine: Transfers) -> list[torch.Tensor]:
        """The non-empty parts, oldest first, each ``[batch, kv_heads, n, head_dim]``: what was read from the disk
        tier (a new host tensor) and a view of the host buffer, dense (a permuted contiguous block) when stored
        sequence-major."""
        out = []
        if self.disk_length:
            out.append(self.disk.read(engine))
        if self.host.length:
            out.append(self.host.view())
        return out

    def view(self, engine: Transfers) -> torch.Tensor:
        """All history in host memory, ``[batch, kv_heads, length, head_dim]`` (a copy if part is on disk)."""
        engine.drain()
        parts = self.parts(engine)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)

    def truncate(self, length: int, engine: Transfers) -> None:
        """Keep the oldest ``length`` tokens."""
        if length <= self.disk_length:
            self.disk.truncate(length)
            self.host.truncate(0, engine)
        else:
            self.host.truncate(length - self.disk_length, engine)

    def pop_tail(self, n: int, engine: Transfers) -> torch.Tensor:
        """Remove up to ``n`` of the newest tokens of the host tier and return them, ``[batch, kv_heads, m,
        head_dim]`` (a copy in host memory; m ≤ n, fewer when the host tier holds fewer)."""
        m = min(n, self.host.length)
        engine.drain()
        tail = self.host.view()[:, :, self.host.length - m :].clone()
        self.host.truncate(self.host.length - m, engine)
        return tail

    def replace(self, history: torch.Tensor, engine: Transfers) -> None:
        """Replace the whole history with ``history`` (``[batch, kv_heads, n, head_dim]``, host)."""
        if self.disk is not None:
            self.disk.truncate(0)
        n, n_disk = history.shape[-2], 0
        if self.host_max_tokens is not None and n > self.host_max_tokens:
            over = n - self.host_max_tokens
            n_disk = -(-over // DISK_BLOCK_TOKENS) * DISK_BLOCK_TOKENS
            self._to_disk(history[:, :, :n_disk], engine)
        self.host.replace(history[:, :, n_disk:], engine)
