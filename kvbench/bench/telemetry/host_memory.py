"""This process's host memory and CPU, read for the sampler (:mod:`kvbench.bench.telemetry.monitor`).

- :class:`HostReader`: the host fields of one sample (cheap: it runs on the sampler's hot path), and the peaks of a
  trial that the kernel and torch keep themselves (:meth:`HostReader.start`, :meth:`HostReader.trial_peaks`).
- :func:`read_status`: the memory lines of ``/proc/self/status``.
- :func:`host_memory_available`: the host memory this process can still take (cgroup limits included).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import psutil

#: Writing ``5`` here resets the kernel's peak RSS (``VmHWM``) to the current RSS (Linux ≥ 4.0).
CLEAR_REFS = "/proc/self/clear_refs"
#: Where ``VmHWM``, ``RssAnon``, ``RssFile`` and ``RssShmem`` are read at a trial's end.
PROC_STATUS = "/proc/self/status"
#: ``rss_peak_source`` when the peak RSS is the kernel's high-water mark.
KERNEL_PEAK_SOURCE = "kernel VmHWM"


def read_status(path: str = PROC_STATUS) -> dict[str, int]:
    """The ``kB`` lines of a ``/proc/<pid>/status`` file (``VmHWM``, ``VmRSS``, ``RssAnon``, ``RssFile``,
    ``RssShmem``, ...) in bytes, keyed by their names.

    Raises:
        OSError: the file cannot be read (no ``/proc``).
    """
    out: dict[str, int] = {}
    with open(path, "rb") as f:
        for line in f.read().decode("ascii", "replace").splitlines():
            name, _, value = line.partition(":")
            parts = value.split()
            if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                out[name] = int(parts[0]) * 1024
    return out


class HostReader:
    """Host fields of one sample: this process's RSS (all, anonymous, file-backed) and CPU %, the host's available
    memory (psutil), and on CUDA the pinned host bytes torch's caching host allocator holds
    (``torch.cuda.host_memory_stats``); and the per-trial peaks the kernel and torch record between
    :meth:`start` and :meth:`trial_peaks`.

    Every sample is paid for inside the measured trial, so the two per-sample readings avoid opening files: RSS
    is read with ``pread`` from a ``/proc/self/statm`` kept open (resident pages × page size, the figure psutil
    reports; psutil's ``memory_info`` where there is no such file). About 6 µs a sample in a warm loop instead of
    psutil's 200 µs (two files opened per call); inside a trial, after the sampler's sleep, the caches are cold and
    the same reading took about 120 µs of the sampler thread's CPU (``time.thread_time``; a 2-vCPU VM during a
    SmolLM2 decode: the pread 35 µs, ``os.times`` 15 µs). The same line gives the split: its third field,
    ``shared``, is the kernel's ``RssFile + RssShmem`` counters and resident − shared is ``RssAnon`` exactly (the
    counters ``/proc/self/status`` prints), so ``rss_anon_bytes`` and ``rss_file_bytes`` (file-backed and shared
    memory pages: the disk tier's mapped files, the model's mapped weights) cost no extra read; parsing the
    third field added 0.14 µs a sample in a warm loop (0.64 → 0.78 µs, ``timeit`` of the pread and parse).

    Two fields are refreshed less often; samples in between repeat the last value:

    - CPU %: the process's user + system CPU time from ``os.times()`` over the wall time since the previous
      refresh (psutil's ``cpu_percent`` definition: 100 = one CPU busy), at most every ``cpu_every_s`` seconds:
      ``os.times`` counts whole clock ticks (10 ms at the usual 100 Hz), so a 10 ms window could only read 0, 100
      or 200% (over 0.1 s: steps of 10%).
    - the host's available memory (parsing ``/proc/meminfo``, the costliest read), at most every
      ``available_every_s`` seconds.

    Per trial (:meth:`trial_peaks`), read once at the trial's end, never per sample:

    - the kernel's peak RSS (``VmHWM``), reset at :meth:`start` by writing ``5`` to ``clear_refs``: it sees a
      spike between samples. Where that file is absent or not writable (old kernels, some sandboxes)
      ``hwm_reason`` says why and there is no kernel peak.
    - pinned host memory the trial's blocks took, torch's figure: the peak of the caching host allocator's
      ``active_bytes`` (blocks handed out; ``allocated_bytes`` where torch has no ``active_bytes``) since
      :meth:`start` reset its peaks, minus its level at :meth:`start`. Sizes are torch's, rounded up to powers of
      two, and torch sums per-size peaks (a best-effort peak, never below the true one). Blocks held before the
      trial (the link probe's buffer, earlier trials' cached blocks) are not counted.

    Args:
        cuda: whether the model is on a CUDA device (pinned memory is read only then).
        available_every_s, cpu_every_s: refresh periods (seconds) of the two slow fields.
        pinned_stats: returns torch's host allocator stats (keys as ``torch.cuda.host_memory_stats``, bytes);
            default ``torch.cuda.host_memory_stats``. Tests inject a fake.
        reset_pinned_peak: resets those stats' peaks to their current values; default
            ``torch.cuda.reset_peak_host_memory_stats``.
        clear_refs, status: the ``/proc`` files for the kernel's peak RSS (default :data:`CLEAR_REFS`,
            :data:`PROC_STATUS`, read when the reader is made).

    Raises:
        psutil.Error, OSError: this process cannot be read at all (e.g. a container without ``/proc``).
    """

    def __init__(self, cuda: bool, available_every_s: float = 0.25, cpu_every_s: float = 0.1,
                 pinned_stats: Callable[[], Mapping[str, int]] | None = None,
                 reset_pinned_peak: Callable[[], None] | None = None,
                 clear_refs: str | None = None, status: str | None = None):
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
        self._start_cpu()
        self.clear_refs, self.status = clear_refs or CLEAR_REFS, status or PROC_STATUS
        #: why there is no kernel peak RSS (None while there is one)
        self.hwm_reason: str | None = None
        self._hwm_reset = False
        self.cuda = cuda
        #: why ``pinned_host_bytes`` is null; ``pinned_peak_reason``: why the per-trial pinned peak is
        self.pinned_reason: str | None = None
        self.pinned_peak_reason: str | None = None
        self._pinned_stats, self._reset_pinned = pinned_stats, reset_pinned_peak
        self._pinned0: tuple[str, int] | None = None
        if not cuda:
            self.pinned_reason = self.pinned_peak_reason = "no CUDA device: no pinned host memory"
            return
        if pinned_stats is None or reset_pinned_peak is None:
            import torch

            self._pinned_stats = pinned_stats or getattr(torch.cuda, "host_memory_stats", None)
            self._reset_pinned = reset_pinned_peak or getattr(torch.cuda, "reset_peak_host_memory_stats", None)
            if self._pinned_stats is None:
                self.pinned_reason = self.pinned_peak_reason = (
                    f"torch {torch.__version__} has no torch.cuda.host_memory_stats")
            elif self._reset_pinned is None:
                self.pinned_peak_reason = (f"torch {torch.__version__} has no torch.cuda.reset_peak_host_memory_stats:"
                                           " no per-trial peak")

    def _start_cpu(self) -> None:
        t = os.times()
        self._cpu = (time.monotonic(), t.user + t.system)
        self._cpu_percent: float | None = None

    def start(self) -> None:
        """Begin a trial: a new CPU % window (until it is ``cpu_every_s`` long, ``cpu_percent`` is None rather than
        a figure from before the trial), the kernel's peak RSS reset to the current RSS, and torch's host
        allocator peaks reset (their level now recorded). A ``clear_refs`` that cannot be written sets
        ``hwm_reason`` (and is not tried again); nothing here raises."""
        self._start_cpu()
        self._hwm_reset = False
        if self.hwm_reason is None:
            try:
                fd = os.open(self.clear_refs, os.O_WRONLY)
                try:
                    os.write(fd, b"5")
                finally:
                    os.close(fd)
                self._hwm_reset = True
            except OSError as exc:
                self.hwm_reason = f"cannot reset the kernel's peak RSS: {self.clear_refs}: {exc.strerror or exc}"
        self._pinned0 = None
        if self.pinned_peak_reason is None:
            try:
                self._reset_pinned()
                stats = self._pinned_stats()
            except RuntimeError as exc:  # e.g. CUDA cannot be initialised in this process
                self.pinned_peak_reason = f"torch's host allocator stats cannot be read: {exc}"
                return
            key = "active_bytes" if "active_bytes.peak" in stats else "allocated_bytes"
            if f"{key}.peak" in stats and f"{key}.current" in stats:
                self._pinned0 = (key, stats[f"{key}.current"])
            else:
                self.pinned_peak_reason = "torch.cuda.host_memory_stats has no active_bytes or allocated_bytes peak"

    def trial_peaks(self) -> dict[str, int | None]:
        """The trial's peaks since :meth:`start` (bytes): ``rss_hwm_bytes``, the kernel's ``VmHWM`` (None when it
        could not be reset or read: ``hwm_reason`` says why), and ``pinned_host_allocated_peak_bytes``, torch's
        pinned blocks of the trial at their peak (None off CUDA or when torch cannot tell:
        ``pinned_peak_reason``). Reads ``/proc/self/status`` once; call it at the trial's end, after the last
        sample."""
        hwm = None
        if self._hwm_reset:
            try:
                hwm = read_status(self.status).get("VmHWM")
            except OSError as exc:
                self.hwm_reason = f"cannot read the kernel's peak RSS: {self.status}: {exc.strerror or exc}"
            else:
                if hwm is None:
                    self.hwm_reason = f"no VmHWM line in {self.status}"
        pinned = None
        if self._pinned0 is not None:
            key, level = self._pinned0
            pinned = max(0, self._pinned_stats()[f"{key}.peak"] - level)
        return {"rss_hwm_bytes": hwm, "pinned_host_allocated_peak_bytes": pinned}

    def read(self, final: bool = False) -> dict[str, Any]:
        """One reading of :data:`kvbench.results.samples.HOST_FIELDS` (bytes; CPU in %); ``final`` (a trial's last
        reading) refreshes CPU % whatever the window's length, so a trial shorter than ``cpu_every_s`` still gets one.

        Raises:
            psutil.Error, OSError: the process cannot be read.
        """
        pinned = None
        if self.pinned_reason is None:
            pinned = self._pinned_stats().get("allocated_bytes.current")
        now = time.monotonic()
        if self._available is None or now - self._available[0] >= self.available_every_s:
            self._available = (now, psutil.virtual_memory().available)
        if self._statm is not None:
            fields = os.pread(self._statm, 128, 0).split()
            resident, shared = int(fields[1]), int(fields[2])
            rss, anon, file = resident * self._page, (resident - shared) * self._page, shared * self._page
        else:  # psutil: rss, and shared where the platform has it
            info = self.proc.memory_info()
            rss, shared_b = info.rss, getattr(info, "shared", None)
            anon, file = (rss - shared_b, shared_b) if shared_b is not None else (None, None)
        wall = now - self._cpu[0]
        if wall >= self.cpu_every_s or (final and wall > 0):
            t = os.times()
            cpu = t.user + t.system
            self._cpu_percent = 100 * (cpu - self._cpu[1]) / wall
            self._cpu = (now, cpu)
        return {"rss_bytes": rss, "rss_anon_bytes": anon, "rss_file_bytes": file, "cpu_percent": self._cpu_percent,
                "host_available_bytes": self._available[1], "pinned_host_bytes": pinned}


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
