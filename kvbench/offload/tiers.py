"""The host and disk tiers: one layer's K or V history off the device.

- :class:`HostBuffer`: host memory, allocated once and grown geometrically (pinned on CUDA).
- :class:`DiskBuffer`: a memory-mapped file in a :class:`DiskTier` directory, grown the same way; space is
  reserved with ``posix_fallocate`` before it is written, so a full disk is an ``OSError`` (ENOSPC/EFBIG) and never
  a SIGBUS on a mapped page.
- :class:`History`: the two together, oldest tokens on disk; beyond ``host_max_tokens`` the host tier spills its
  oldest tokens to disk in whole blocks of :data:`~kvbench.offload.registry.DISK_BLOCK_TOKENS`.

Every method takes and gives the transformers layout ``[batch, kv_heads, seq, head_dim]`` (often a view). How a
host buffer stores it depends on where the model computes:

- **sequence-major**, ``[capacity, batch, kv_heads, head_dim]`` (CUDA): every append and every read of a stretch of
  history is one contiguous block, which an asynchronous copy between pinned memory and the device needs;
- **head-major**, ``[batch, kv_heads, capacity, head_dim]`` (CPU): the history of each head is one contiguous run,
  as in ``DynamicCache``, so the ``torch.cat`` that brings it next to the new tokens (the only copy on CPU) reads
  whole runs instead of gathering ``head_dim``-element pieces.

The disk tier is sequence-major on every device: the file grows at its end without moving what it holds.
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
    """K or V history of one layer in a memory-mapped file (the disk tier), filled up to ``length`` tokens and
    stored sequence-major.

    The file grows geometrically like :class:`HostBuffer`; each growth reserves the space first
    (``posix_fallocate``), then maps the whole file again (the data stays in the file, nothing is copied).
    Bytes written and read are counted in the copy engine's ``stats`` (``disk_write_bytes``/``disk_read_bytes``).
    """

    def __init__(self, path: Path):
        super().__init__(seq_major=True)
        self.path = path

    def _reserve(self, like: torch.Tensor, extra: int) -> None:
        need = self.length + extra
        if self.buf is not None and self.buf.shape[1:] != self._shape(0, like)[1:]:
            if self.length:  # only an emptied buffer may change its batch (History.replace empties it first)
                raise ValueError(f"disk tier: {self.path} holds a batch of {self.buf.shape[1]}, got {like.shape[0]}")
            self.buf = None  # a new batch size: map the file again with the new shape
        if self.buf is not None and need <= self.capacity:
            return
        shape = self._shape(grown_capacity(self.capacity, need, DISK_BLOCK_TOKENS), like)
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        nbytes = numel * like.element_size()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            raise DiskTierError(exc.errno, f"disk tier: cannot grow {self.path} to {nbytes} bytes: "
                                           f"{exc.strerror or exc}") from None
        finally:
            os.close(fd)
        self.buf = torch.from_file(str(self.path), shared=True, size=numel, dtype=like.dtype).view(shape)

    def append(self, src: torch.Tensor, engine: Transfers) -> None:
        """Write ``src`` (``[batch, kv_heads, n, head_dim]``, host or device) after the history."""
        n = src.shape[-2]
        if n == 0:
            return
        self._reserve(src, n)
        dst = self._span(self.length, self.length + n)
        if src.device.type == "cpu":
            dst.copy_(self._stored(src))
        else:  # straight from the device into the mapped file
            engine.to_host(self._stored(src), dst)
            engine.drain()
        engine.stats.disk_write_bytes += src.nbytes
        engine.stats.disk_write_count += 1
        self.length += n

    def read(self, engine: Transfers) -> torch.Tensor:
        """The filled part, ``[batch, kv_heads, length, head_dim]`` (a view of the mapping); counted as read."""
        out = self.view()
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
            self.disk = DiskBuffer(self._disk_tier.new_file())
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
        """The non-empty parts, oldest first, each ``[batch, kv_heads, n, head_dim]``: views of the disk mapping
        and of the host buffer, dense (a permuted contiguous block) when stored sequence-major."""
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
