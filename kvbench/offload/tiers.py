"""The host and disk tiers: one layer's K or V history off the device.

- :class:`HostBuffer`: host memory, allocated once and grown geometrically (pinned on CUDA).
- :class:`DiskBuffer`: a memory-mapped file in a :class:`DiskTier` directory, grown the same way; space is
  reserved with ``posix_fallocate`` before it is written, so a full disk is an ``OSError`` (ENOSPC/EFBIG) and never
  a SIGBUS on a mapped page.
- :class:`History`: the two together, oldest tokens on disk; beyond ``host_max_tokens`` the host tier spills its
  oldest tokens to disk in whole blocks of :data:`~kvbench.offload.registry.DISK_BLOCK_TOKENS`.

All buffers are stored sequence-major, ``[capacity, batch, kv_heads, head_dim]``, so every append and every read
of a stretch of history is one contiguous block (an asynchronous copy needs a contiguous host side); the methods
take and give the transformers layout ``[batch, kv_heads, seq, head_dim]`` unless they say "block".
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path

import psutil
import torch

from kvbench.offload.registry import DISK_BLOCK_TOKENS
from kvbench.offload.transfer import Transfers

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
    """A sequence-major buffer ``buf`` (``[capacity, batch, kv_heads, head_dim]``) filled up to ``length`` tokens."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.length = 0

    @property
    def capacity(self) -> int:
        """Tokens the buffer can hold before it grows."""
        return 0 if self.buf is None else self.buf.shape[0]

    @property
    def used_bytes(self) -> int:
        """Bytes of the filled part: ``length`` tokens."""
        return 0 if self.buf is None else self.buf[: self.length].nbytes


class HostBuffer(_TokenBuffer):
    """K or V history of one layer in host memory, filled up to ``length`` tokens.

    Appends write into free capacity; when full, the buffer doubles (one copy of the history, amortised O(1) per
    token) instead of a ``torch.cat`` of the whole history every step. With ``pin=True`` (CUDA) the buffer is
    page-locked so copies can run asynchronously; if pinning fails it falls back to pageable memory and
    ``pinned`` records it.
    """

    def __init__(self, pin: bool = False):
        super().__init__()
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
        b, h, _, d = like.shape
        new = self._allocate((grown_capacity(self.capacity, need), b, h, d), like.dtype)
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

    def drop_head(self, n: int, engine: Transfers) -> None:
        """Forget the oldest ``n`` tokens (they were spilled to disk); the rest moves to the front."""
        engine.drain()
        keep = self.length - n
        if keep > 0:
            self.buf[:keep].copy_(self.buf[n : self.length].clone())
        self.length = max(0, keep)

    def truncate(self, length: int, engine: Transfers) -> None:
        """Keep the first ``length`` tokens."""
        engine.drain()
        self.length = min(self.length, length)

    def replace(self, block: torch.Tensor, engine: Transfers) -> None:
        """Replace the whole history with ``block`` (host, sequence-major), e.g. after a batch reorder."""
        engine.drain()
        self.buf, self.length = None, 0
        if len(block):
            self._reserve(block.permute(1, 2, 0, 3), len(block), engine)
            self.buf[: len(block)].copy_(block)
            self.length = len(block)


class DiskTierError(OSError):
    """The disk tier cannot be created or grown (unwritable directory, disk full, file size limit).

    ``errno`` is the system error; the message names the directory or file and the bytes asked for.
    """

    def __init__(self, errno: int | None, message: str):
        super().__init__(message)
        self.errno = errno


_DIR_PREFIX = "kvbench-kv-"


def _remove_stale(parent: Path) -> None:
    """Remove disk-tier directories left by kvbench processes that no longer exist (killed with SIGKILL)."""
    for d in parent.glob(f"{_DIR_PREFIX}*"):
        m = re.match(rf"{_DIR_PREFIX}(\d+)-", d.name)
        if m and d.is_dir() and not psutil.pid_exists(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)


class DiskTier:
    """A private directory (mode 0700) for the disk files of one cache.

    Removed by :meth:`close`, when the object is garbage-collected, and at interpreter exit (Ctrl-C included), so
    no exit path leaves it behind except SIGKILL; directories of dead kvbench processes are removed when the next
    one is created in the same place.

    Args:
        parent: where to create it (default: the system temporary directory).

    Raises:
        DiskTierError: ``parent`` does not exist or is not writable.
    """

    def __init__(self, parent: str | Path | None = None):
        where = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        try:
            self.path = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=where))
        except OSError as exc:
            raise DiskTierError(exc.errno, f"cannot create the disk tier in {where}: {exc.strerror or exc}") from None
        with contextlib.suppress(OSError):
            _remove_stale(where)
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True)
        self._files = 0

    def new_file(self) -> Path:
        """A fresh file name inside the directory."""
        self._files += 1
        return self.path / f"{self._files}.kv"

    @property
    def closed(self) -> bool:
        """Whether the directory has been removed."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Remove the directory and every file in it (idempotent)."""
        self._finalizer()


class DiskBuffer(_TokenBuffer):
    """K or V history of one layer in a memory-mapped file (the disk tier), filled up to ``length`` tokens.

    The file grows geometrically like :class:`HostBuffer`; each growth reserves the space first
    (``posix_fallocate``), then maps the whole file again (the data stays in the file, nothing is copied).
    Bytes written and read are counted in the copy engine's ``stats`` (``disk_write_bytes``/``disk_read_bytes``).
    """

    def __init__(self, path: Path):
        super().__init__()
        self.path = path

    def _reserve(self, block: torch.Tensor, extra: int) -> None:
        need = self.length + extra
        if self.buf is not None and need <= self.capacity:
            return
        cap = grown_capacity(self.capacity, need, DISK_BLOCK_TOKENS)
        per_token = block[0].numel()
        nbytes = cap * per_token * block.element_size()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            raise DiskTierError(exc.errno, f"disk tier: cannot grow {self.path} to {nbytes} bytes: "
                                           f"{exc.strerror or exc}") from None
        finally:
            os.close(fd)
        self.buf = torch.from_file(str(self.path), shared=True, size=cap * per_token,
                                   dtype=block.dtype).view(cap, *block.shape[1:])

    def append(self, block: torch.Tensor, engine: Transfers) -> None:
        """Write ``block`` (``[n, batch, kv_heads, head_dim]``, host or device) after the history."""
        n = len(block)
        if n == 0:
            return
        self._reserve(block, n)
        if block.device.type == "cpu":
            self.buf[self.length : self.length + n].copy_(block)
        else:  # straight from the device into the mapped file
            engine.to_host(block.contiguous(), self.buf[self.length : self.length + n])
            engine.drain()
        engine.stats.disk_write_bytes += block.nbytes
        engine.stats.disk_write_count += 1
        self.length += n

    def block(self, engine: Transfers) -> torch.Tensor:
        """The filled part, ``[length, batch, kv_heads, head_dim]`` (a view of the mapping); counted as read."""
        out = self.buf[: self.length]
        engine.stats.disk_read_bytes += out.nbytes
        engine.stats.disk_read_count += 1
        return out

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens."""
        self.length = min(self.length, length)


class History:
    """K or V history of one layer across the host tier and, beyond ``host_max_tokens``, the disk tier.

    Oldest tokens are on disk, newer ones in host memory. When an append would take the host tier over
    ``host_max_tokens``, the oldest tokens (of the host tier, then of the incoming ones) go to disk in whole blocks
    of ``DISK_BLOCK_TOKENS``, so the host tier never holds more than ``host_max_tokens``.

    Args:
        pin: page-lock the host buffer (CUDA).
        host_max_tokens: cap of the host tier (None: no cap, no disk tier).
        disk: the cache's disk directory; needed with ``host_max_tokens``.

    Raises:
        ValueError: ``host_max_tokens`` smaller than one block, or given without ``disk``.
    """

    def __init__(self, pin: bool = False, host_max_tokens: int | None = None, disk: DiskTier | None = None):
        if host_max_tokens is not None:
            if host_max_tokens < DISK_BLOCK_TOKENS:
                raise ValueError(f"host_max_tokens must hold at least one disk block of {DISK_BLOCK_TOKENS} "
                                 f"tokens, got {host_max_tokens}")
            if disk is None:
                raise ValueError("host_max_tokens needs a disk tier")
        self.host = HostBuffer(pin)
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

    def _to_disk(self, block: torch.Tensor, engine: Transfers) -> None:
        if self.disk is None:
            self.disk = DiskBuffer(self._disk_tier.new_file())
        self.disk.append(block, engine)

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
                self._to_disk(self.host.block()[:from_host], engine)
                self.host.drop_head(from_host, engine)
            if spill > from_host:
                self._to_disk(src[:, :, : spill - from_host].permute(2, 0, 1, 3), engine)
                src = src[:, :, spill - from_host :]
        self.host.append(src, engine)

    def blocks(self, engine: Transfers) -> list[torch.Tensor]:
        """The non-empty parts, oldest first, each ``[n, batch, kv_heads, head_dim]`` and contiguous."""
        out = []
        if self.disk_length:
            out.append(self.disk.block(engine))
        if self.host.length:
            out.append(self.host.block())
        return out

    def view(self, engine: Transfers) -> torch.Tensor:
        """All history in host memory, ``[batch, kv_heads, length, head_dim]`` (a copy if part is on disk)."""
        engine.drain()
        parts = self.blocks(engine)
        block = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return block.permute(1, 2, 0, 3)

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
        tail = self.host.block()[self.host.length - m :].clone()
        self.host.truncate(self.host.length - m, engine)
        return tail.permute(1, 2, 0, 3)

    def replace(self, history: torch.Tensor, engine: Transfers) -> None:
        """Replace the whole history with ``history`` (``[batch, kv_heads, n, head_dim]``, host)."""
        block = history.permute(2, 0, 1, 3)
        if self.disk is not None:
            self.disk.truncate(0)
        n_disk = 0
        if self.host_max_tokens is not None and len(block) > self.host_max_tokens:
            over = len(block) - self.host_max_tokens
            n_disk = -(-over // DISK_BLOCK_TOKENS) * DISK_BLOCK_TOKENS
            self._to_disk(block[:n_disk].contiguous(), engine)
        self.host.replace(block[n_disk:], engine)
