"""GPU readings through NVML (``nvidia-ml-py``) for the samplers: :class:`NvmlReader` takes raw readings of one
GPU, :func:`gpu_fields` turns one into sample fields (:data:`kvbench.results.samples.GPU_FIELDS`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from kvbench.errors import NvmlUnavailable

def gpu_fields(raw: dict[str, Any], pid: int) -> dict[str, Any]:
    """Sample fields from one raw NVML reading, as :meth:`NvmlReader.raw` returns it.

    ``raw`` keys (each may be None when NVML could not read it): ``memory`` = (used, total) bytes, ``processes`` =
    [(pid, used bytes or None)], ``util`` = GPU utilisation %, ``pcie_kbps`` = (TX, RX) in KB/s, ``power_mw``.
    ``gpu_process_bytes`` sums this ``pid``'s entries; None when the pid is not listed (e.g. a container's PID
    namespace hides it, or NVML does not report per-process memory).
    """
    mem = raw.get("memory")
    procs = raw.get("processes")
    mine = [used for p, used in procs or () if p == pid and used is not None]
    pcie = raw.get("pcie_kbps")
    power = raw.get("power_mw")
    return {
        "gpu_used_bytes": mem[0] if mem else None,
        "gpu_total_bytes": mem[1] if mem else None,
        "gpu_process_bytes": sum(mine) if mine else None,
        "gpu_util_percent": raw.get("util"),
        "pcie_tx_bytes_per_s": pcie[0] * 1000 if pcie and pcie[0] is not None else None,
        "pcie_rx_bytes_per_s": pcie[1] * 1000 if pcie and pcie[1] is not None else None,
        "power_w": power / 1000 if power is not None else None,
    }


class NvmlReader:
    """Raw readings of one GPU through NVML (``nvidia-ml-py``).

    Args:
        device: the torch CUDA device the model is on; found in NVML by its PCI bus id (so ``CUDA_VISIBLE_DEVICES``
            renumbering does not pick the wrong GPU), else by index.

    Raises:
        NvmlUnavailable: with the reason.
    """

    def __init__(self, device: Any):
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from None
        self.nvml = pynvml
        try:
            self.handle = self._handle(device)
        except Exception as exc:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable(f"NVML has no handle for {device}: {exc}") from None
        self.failed: dict[str, str] = {}  # raw key → first NVML error

    def _handle(self, device: Any) -> Any:
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(index)
        if hasattr(p, "pci_bus_id"):
            bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            with contextlib.suppress(Exception):  # not found by bus id: fall back to the index
                return self.nvml.nvmlDeviceGetHandleByPciBusId(bus)
        return self.nvml.nvmlDeviceGetHandleByIndex(index)

    def _try(self, key: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            self.failed.setdefault(key, str(exc))
            return None

    def raw(self) -> dict[str, Any]:
        """One reading: see :func:`gpu_fields` for the keys."""
        n, h = self.nvml, self.handle

        def memory() -> tuple[int, int]:
            m = n.nvmlDeviceGetMemoryInfo(h)
            return m.used, m.total

        return {
            "memory": self._try("memory", memory),
            "processes": self._try("processes", lambda: [(p.pid, p.usedGpuMemory)
                                                        for p in n.nvmlDeviceGetComputeRunningProcesses(h)]),
            "util": self._try("util", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu),
            "pcie_kbps": self._try("pcie", lambda: (n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES),
                                                    n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES))),
            "power_mw": self._try("power", lambda: n.nvmlDeviceGetPowerUsage(h)),
        }

    def close(self) -> None:
        """Release NVML."""
        self.nvml.nvmlShutdown()
