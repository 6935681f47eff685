"""How busy the machine was during a trial with work that is not the trial's: other processes' CPU time, the
hypervisor's steal time and, on CUDA, other processes on the GPU.

A trial measured while something else competed for the CPU or the GPU cannot carry a verdict (the report and
``kvbench cost`` say "inconclusive" instead): on a shared machine a competing process alone can make one mode look
64% cheaper than another.

Figures (Linux ``/proc/stat`` through psutil, in units of one CPU: 100% = one CPU busy for the whole window):

- ``others_cpu_percent`` = 100 × (Δ busy CPU time of the machine − Δ CPU time of this process) ÷ Δ wall time,
  where busy = user + nice + system + irq + softirq + steal (``psutil.cpu_times()``; guest time is already in user)
  and this process's time is ``time.process_time()`` (all its threads: torch's, the sampler's; nanoseconds);
- ``steal_cpu_percent`` = 100 × Δ steal ÷ Δ wall: time a virtual machine's CPUs were runnable but the hypervisor ran
  something else (already inside ``others_cpu_percent``);
- ``load_resolution_percent``: the machine's counters tick (``SC_CLK_TCK``, 100 Hz: 10 ms), so each CPU's delta is
  known to ± one tick: ± 100 × CPUs × tick ÷ wall. A trial shorter than :data:`MIN_WINDOW_S` is measured over a
  window widened back over the readings of the trials just before it (up to :data:`LOOKBACK_S`; what this process
  did between them is subtracted like the rest), or, with none (a run's first trial), forward by waiting out the
  rest after the trial's last clock reading; ``load_window_s`` says how long;
- ``machine_busy``: True when others' CPU is at or above :func:`busy_threshold_percent` by more than the resolution
  (or another process is on the GPU), False when it is below it by more than the resolution, None when the window
  is too short to tell.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import psutil

#: Another process's CPU use that makes a trial "busy", in percent of one CPU (on a small machine).
BUSY_OTHERS_MIN_PERCENT = 25.0
#: ... and as a share of all the machine's CPUs (on a large one): whichever is higher.
BUSY_OTHERS_SHARE = 0.10
#: A load window shorter than this (seconds) is widened back over earlier readings.
MIN_WINDOW_S = 0.5
#: How far back (seconds) a short window may be widened.
LOOKBACK_S = 5.0


class _Reading(NamedTuple):
    t: float  # time.monotonic()
    busy: float  # busy CPU seconds of the whole machine since boot
    steal: float  # of which steal
    own: float  # this process's CPU seconds


#: Readings of recent windows (this process's), for widening a short one.
_recent: deque[_Reading] = deque(maxlen=256)


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


def _tick_s() -> float:
    """Seconds per tick of the kernel's CPU time counters (10 ms at the usual 100 Hz)."""
    try:
        return 1.0 / os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 0.01


def _read() -> _Reading:
    busy, steal = _machine_busy_s()
    return _Reading(time.monotonic(), busy, steal, time.process_time())


def _read_with(also_own: Callable[[], float] | None) -> _Reading:
    """A reading whose ``own`` adds the CPU seconds ``also_own`` gives (a server kvbench started)."""
    r = _read()
    return r if also_own is None else r._replace(own=r.own + also_own())


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
        cpu_count: the machine's CPUs (for the busy threshold and the resolution); default psutil's logical count.
        also_own: CPU seconds of processes that count as kvbench's own (a server it started and its children), so
            far; their load is the trial's, not others'. A window with it is never widened (:meth:`stop` never
            sleeps: it runs beside other requests in flight), so a short one has a coarser resolution.
    """

    def __init__(self, cpu_count: int | None = None, also_own: Callable[[], float] | None = None):
        self.cpus = cpu_count or psutil.cpu_count(logical=True) or 1
        self.threshold = busy_threshold_percent(self.cpus)
        self.also_own = also_own
        self._start = _read_with(also_own)
        if also_own is None:
            _recent.append(self._start)

    def stop(self, gpu_others: int | None = None) -> dict[str, Any]:
        """The trial row's load fields: ``others_cpu_percent``, ``steal_cpu_percent``, ``load_resolution_percent``,
        ``load_window_s``, ``gpu_other_processes`` (``gpu_others``, see :func:`other_gpu_processes`; None on CPU
        or when it cannot be told), ``busy_threshold_percent`` and ``machine_busy`` (see the module docstring)."""
        end = _read_with(self.also_own)
        start = self._start
        if end.t - start.t < MIN_WINDOW_S and self.also_own is None:  # too short for 10 ms ticks: widen it back
            earlier = [r for r in _recent if end.t - LOOKBACK_S <= r.t <= end.t - MIN_WINDOW_S]
            if earlier:
                start = earlier[-1]
            else:  # nothing earlier (a run's first trial): widen it forward, after the trial's last clock reading
                time.sleep(MIN_WINDOW_S - (end.t - start.t))
                end = _read_with(self.also_own)
        if self.also_own is None:
            _recent.append(end)
        wall = end.t - start.t
        if wall <= 0:
            others = steal_pct = resolution = None
        else:
            # the machine's counters are whole ticks: clamp a rounding below 0
            others = max(0.0, 100 * ((end.busy - start.busy) - (end.own - start.own)) / wall)
            steal_pct = max(0.0, 100 * (end.steal - start.steal) / wall)
            resolution = 100 * self.cpus * _tick_s() / wall
        if (gpu_others or 0) > 0:
            machine_busy: bool | None = True
        elif others is None:
            machine_busy = None
        elif others - resolution >= self.threshold:
            machine_busy = True
        elif others + resolution < self.threshold:
            machine_busy = False
        else:
            machine_busy = None  # the window cannot tell: its resolution straddles the threshold
        return {"others_cpu_percent": others, "steal_cpu_percent": steal_pct, "load_resolution_percent": resolution,
                "load_window_s": wall if wall > 0 else None, "gpu_other_processes": gpu_others,
                "busy_threshold_percent": self.threshold, "machine_busy": machine_busy}


__all__ = ["BUSY_OTHERS_MIN_PERCENT", "BUSY_OTHERS_SHARE", "LOOKBACK_S", "LoadWindow", "MIN_WINDOW_S",
           "busy_threshold_percent", "other_gpu_processes"]
