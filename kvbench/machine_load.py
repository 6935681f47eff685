"""How busy the machine was during a trial with work that is not the trial's: other processes' CPU time, the
hypervisor's steal time and, on CUDA, other processes on the GPU.

A trial measured while something else competed for the CPU or the GPU cannot carry a verdict (the report and
``kvbench cost`` say "inconclusive" instead): on a shared machine a competing process alone can make one mode look
64% cheaper than another.

Figures (Linux ``/proc/stat`` through psutil, in units of one CPU: 100% = one CPU busy for the whole trial):

- ``others_cpu_percent`` = 100 × (Δ busy CPU time of the machine − Δ CPU time of this process) ÷ Δ wall time,
  where busy = user + nice + system + irq + softirq + steal (``psutil.cpu_times()``; guest time is already in user)
  and this process's time is ``os.times()`` user + system (all its threads: torch's, the sampler's);
- ``steal_cpu_percent`` = 100 × Δ steal ÷ Δ wall: time a virtual machine's CPUs were runnable but the hypervisor ran
  something else (already inside ``others_cpu_percent``);
- ``machine_busy``: ``others_cpu_percent`` ≥ :func:`busy_threshold_percent`, or another process on the GPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import psutil

#: Another process's CPU use that makes a trial "busy", in percent of one CPU (on a small machine).
BUSY_OTHERS_MIN_PERCENT = 25.0
#: ... and as a share of all the machine's CPUs (on a large one): whichever is higher.
BUSY_OTHERS_SHARE = 0.10


def busy_threshold_percent(cpu_count: int | None = None) -> float:
    """Other processes' CPU (percent of one CPU) from which a trial counts as measured on a busy machine:
    max(:data:`BUSY_OTHERS_MIN_PERCENT`, :data:`BUSY_OTHERS_SHARE` × 100 × CPUs). 25% on 2 CPUs, 160% on 16."""
    n = cpu_count or psutil.cpu_count(logical=True) or 1
    return max(BUSY_OTHERS_MIN_PERCENT, BUSY_OTHERS_SHARE * 100 * n)


def _machine_busy_s() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine since boot, of which steal)."""
    t = psutil.cpu_times()
    steal = getattr(t, "steal", 0.0)
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + steal
    return busy, steal


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def other_gpu_processes(processes: Iterable[tuple[int, Any]] | None, pid: int) -> int | None:
    """How many processes other than ``pid`` NVML lists on the GPU; None when that cannot be told: no list, or this
    process is not in it while others are (a container's PID namespace hides the host PIDs NVML reports)."""
    if processes is None:
        return None
    pids = {p for p, _ in processes}
    if pids and pid not in pids:
        return None
    return len(pids - {pid})


class LoadWindow:
    """Measures other processes' load over a window (a trial): make it at the start, call :meth:`stop` at the end.
    Both readings happen outside the trial's clock readings (a psutil read of ``/proc/stat``: tens of µs).

    Args:
        cpu_count: the machine's CPUs (for the busy threshold); default psutil's logical count.
    """

    def __init__(self, cpu_count: int | None = None):
        self.threshold = busy_threshold_percent(cpu_count)
        self._t0 = time.monotonic()
        self._busy0, self._steal0 = _machine_busy_s()
        self._own0 = _own_cpu_s()

    def stop(self, gpu_others: int | None = None) -> dict[str, Any]:
        """The trial row's load fields: ``others_cpu_percent``, ``steal_cpu_percent``, ``gpu_other_processes``
        (``gpu_others``, see :func:`other_gpu_processes`; None on CPU or when it cannot be told),
        ``busy_threshold_percent`` and ``machine_busy``. Percentages are None for a window shorter than the
        kernel's 10 ms tick (no figure can be read from it)."""
        wall = time.monotonic() - self._t0
        busy, steal = _machine_busy_s()
        own = _own_cpu_s()
        if wall < 0.01:
            others = steal_pct = None
        else:
            # clock ticks are counted separately for the machine and the process: clamp the rounding below 0
            others = max(0.0, 100 * ((busy - self._busy0) - (own - self._own0)) / wall)
            steal_pct = max(0.0, 100 * (steal - self._steal0) / wall)
        machine_busy = None if others is None else bool(others >= self.threshold or (gpu_others or 0) > 0)
        return {"others_cpu_percent": others, "steal_cpu_percent": steal_pct, "gpu_other_processes": gpu_others,
                "busy_threshold_percent": self.threshold, "machine_busy": machine_busy}


__all__ = ["BUSY_OTHERS_MIN_PERCENT", "BUSY_OTHERS_SHARE", "LoadWindow", "busy_threshold_percent",
           "other_gpu_processes"]
