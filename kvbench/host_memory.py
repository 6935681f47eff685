"""This process's host memory and CPU, read for the sampler (:mod:`kvbench.monitor`).

- :class:`HostReader`: the host fields of one sample (cheap: it runs on the sampler's hot path).
- :func:`host_memory_available`: the host memory this process can still take (cgroup limits included).
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

import psutil

HOST_FIELDS = ("rss_bytes", "cpu_percent", "host_available_bytes", "pinned_host_bytes")


class HostReader:
    """Host fields of one sample: this process's RSS and CPU %, the host's available memory (psutil), and on CUDA
    the pinned host bytes torch's caching host allocator holds (``torch.cuda.host_memory_stats``).

    Every sample is paid for inside the measured trial, so the two per-sample readings avoid opening files: RSS
    is read with ``pread`` from a ``/proc/self/statm`` kept open (resident pages × page size, the figure psutil
    reports; psutil's ``memory_info`` where there is no such file). About 6 µs a sample in a warm loop instead of
    psutil's 200 µs (two files opened per call); inside a trial, after the sampler's sleep, the caches are cold and
    the same reading took about 120 µs of the sampler thread's CPU (``time.thread_time``; a 2-vCPU VM during a
    SmolLM2 decode: the pread 35 µs, ``os.times`` 15 µs).

    Two fields are refreshed less often; samples in between repeat the last value:

    - CPU %: the process's user + system CPU time from ``os.times()`` over the wall time since the previous
      refresh (psutil's ``cpu_percent`` definition: 100 = one CPU busy), at most every ``cpu_every_s`` seconds:
      ``os.times`` counts whole clock ticks (10 ms at the usual 100 Hz), so a 10 ms window could only read 0, 100
      or 200% (over 0.1 s: steps of 10%).
    - the host's available memory (parsing ``/proc/meminfo``, the costliest read), at most every
      ``available_every_s`` seconds.

    Raises:
        psutil.Error, OSError: this process cannot be read at all (e.g. a container without ``/proc``).
    """

    def __init__(self, cuda: bool, available_every_s: float = 0.25, cpu_every_s: float = 0.1):
        self.available_every_s = available_every_s
        self.cpu_every_s = cpu_every_s
        self._available: tuple[float, int] | None = None
        self.proc = psutil.Process()
        self._page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._statm: int | None = os.open("/proc/self/statm", os.O_RDONLY)
            weakref.finalize(self, os.close, self._statm)
        except OSError:
            self._statm = None
            self.proc.memory_info()  # raises here, at setup, if this process cannot be read either
        self.start()
        self.cuda = cuda
        self.pinned_reason: str | None = None
        if not cuda:
            self.pinned_reason = "no CUDA device: no pinned host memory"
        else:
            import torch

            if not hasattr(torch.cuda, "host_memory_stats"):
                self.pinned_reason = f"torch {torch.__version__} has no torch.cuda.host_memory_stats"

    def start(self) -> None:
        """Begin a new CPU % window (a trial's start): until it is ``cpu_every_s`` long, ``cpu_percent`` is None
        rather than a figure from before the trial."""
        t = os.times()
        self._cpu = (time.monotonic(), t.user + t.system)
        self._cpu_percent: float | None = None

    def read(self, final: bool = False) -> dict[str, Any]:
        """One reading of :data:`HOST_FIELDS`; ``final`` (a trial's last reading) refreshes CPU % whatever the
        window's length, so a trial shorter than ``cpu_every_s`` still gets one."""
        pinned = None
        if self.pinned_reason is None:
            import torch

            pinned = torch.cuda.host_memory_stats().get("allocated_bytes.current")
        now = time.monotonic()
        if self._available is None or now - self._available[0] >= self.available_every_s:
            self._available = (now, psutil.virtual_memory().available)
        if self._statm is not None:
            rss = int(os.pread(self._statm, 128, 0).split()[1]) * self._page
        else:
            rss = self.proc.memory_info().rss
        wall = now - self._cpu[0]
        if wall >= self.cpu_every_s or (final and wall > 0):
            t = os.times()
            cpu = t.user + t.system
            self._cpu_percent = 100 * (cpu - self._cpu[1]) / wall
            self._cpu = (now, cpu)
        return {"rss_bytes": rss, "cpu_percent": self._cpu_percent, "host_available_bytes": self._available[1],
                "pinned_host_bytes": pinned}


#: cgroup files holding a container's memory limit and usage: v2, then v1.
_CGROUP_MEMORY = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def host_memory_available() -> tuple[int, str]:
    """Bytes of host memory this process can still take, and where that figure comes from.

    psutil's available memory, or less when the container's cgroup limit (v2 ``memory.max`` or v1
    ``memory.limit_in_bytes``) minus its usage is closer: pinned (page-locked) pages count fully against that
    limit and cannot be swapped or reclaimed.
    """
    avail, source = psutil.virtual_memory().available, "available host memory"
    for limit_file, usage_file in _CGROUP_MEMORY:
        try:
            with open(limit_file) as f:
                text = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if text.isdigit() and int(text) - usage < avail:
            avail, source = max(0, int(text) - usage), f"container memory limit ({limit_file})"
        break
    return avail, source
