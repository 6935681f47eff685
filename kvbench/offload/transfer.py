"""Copies between the device and host tiers, with byte counts.

On CUDA every copy runs on one side stream so it can overlap compute:

- device→host: the side stream first waits for the compute stream (the kernel that wrote the data), and the
  source is marked with ``record_stream`` so the allocator does not reuse it before the copy has read it;
- host→device: the copy is followed by an event; :meth:`Transfers.ready` makes the compute stream wait for it and
  marks the tensor (made on the side stream, used on the compute stream) with ``record_stream``;
- a host buffer is only rewritten (grown, reordered, cropped) after :meth:`Transfers.drain`, which waits for the
  copies still reading or writing it.

On CPU the same calls make real copies into separate buffers, synchronously, with no streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TransferStats:
    """Bytes and copies moved, per direction (H2D = host→device, D2H = device→host, disk writes and reads), and
    ``stalls``: how many times compute waited for a host→device copy that had not finished (on CPU every copy
    runs in the compute thread, so each counts). The ``*_bytes`` are physical (what moved: a quantized host
    format's parts, scales included); the ``*_logical_bytes`` the same tokens as the model's dtype, counted by
    :class:`~kvbench.offload.history.History` (equal unless the host format is smaller)."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    h2d_count: int = 0
    d2h_count: int = 0
    disk_write_bytes: int = 0
    disk_read_bytes: int = 0
    disk_write_count: int = 0
    disk_read_count: int = 0
    stalls: int = 0
    h2d_logical_bytes: int = 0
    d2h_logical_bytes: int = 0
    disk_write_logical_bytes: int = 0
    disk_read_logical_bytes: int = 0


class Transfers:
    """The copy engine of one cache. ``device`` is where the model computes."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.stats = TransferStats()

    def to_host(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy ``src`` (on the device) into ``dst`` (a host buffer view of the same shape; on CUDA a contiguous
        one, so the copy is one asynchronous block: ``src`` is made contiguous on the device first)."""
        if src.numel() == 0:
            return
        if self.cuda:
            src = src.contiguous()
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                dst.copy_(src, non_blocking=True)
            src.record_stream(self.stream)
        else:
            dst.copy_(src)
        self.stats.d2h_bytes += src.nbytes
        self.stats.d2h_count += 1

    def to_device(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Start copying a host tensor to the device; returns the new tensor and, on CUDA, its ready event.

        On CUDA the device tensor gets ``src``'s strides when ``src`` is dense (a permuted view of a contiguous
        block, as a sequence-major host buffer gives), so the copy is one asynchronous block; a ``src`` with gaps
        would be gathered on the host first. Call :meth:`ready` before the compute stream reads the tensor. On CPU
        the host *is* the compute device: the tensor comes back as it is and the caller's ``torch.cat`` makes the
        copy into a separate buffer.
        """
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the host data was written before
            with torch.cuda.stream(self.stream):
                out = torch.empty_like(src, device=self.device)  # preserve_format: same strides when dense
                out.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
        else:
            out, event = src, None
            self.stats.stalls += 1
        self.stats.h2d_bytes += src.nbytes
        self.stats.h2d_count += 1
        return out, event

    def ready(self, t: torch.Tensor, event: torch.cuda.Event | None) -> torch.Tensor:
        """Make the compute stream wait for ``t``'s copy, and tell the allocator it is used there."""
        if event is not None:
            if not event.query():
                self.stats.stalls += 1
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            t.record_stream(current)
        return t

    def to_device_now(self, src: torch.Tensor) -> torch.Tensor:
        """Copy a host tensor to the device and return it ready for compute (a separate copy on CPU too)."""
        out, event = self.to_device(src)
        return self.ready(out, event) if self.cuda else out.clone()

    def drain(self) -> None:
        """Wait for every copy in flight (before a host buffer is rewritten or read on the CPU)."""
        if self.stream is not None:
            self.stream.synchronize()
