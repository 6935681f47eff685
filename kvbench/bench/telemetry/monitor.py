"""Background samplers and host measurements.

- :class:`Sampler`: a timeline per trial on a daemon thread: the process's RSS (all, anonymous, file-backed) and
  CPU %, the host's available memory and (CUDA) pinned host bytes
  (:class:`~kvbench.bench.telemetry.host_memory.HostReader`); device memory (total and this process's, by PID),
  utilisation, PCIe TX/RX and power through NVML for the device the model is on. Every sample carries the trial id and
  the phase (``prefill``/``decode``) the engine marks. At the trial's end it reads the peaks the kernel and torch kept
  (peak RSS, pinned blocks). Fields that cannot be read are ``None`` (never 0) with one warning naming the reason.
- :func:`summarise`: per-trial peaks and means of a timeline.

NVML is read by :mod:`kvbench.bench.telemetry.nvml`, this process's memory and CPU by
:mod:`kvbench.bench.telemetry.host_memory`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psutil

from kvbench.bench.telemetry.host_memory import KERNEL_PEAK_SOURCE, HostReader
from kvbench.bench.telemetry.nvml import NvmlReader, gpu_fields
from kvbench.errors import NvmlUnavailable
from kvbench.results.samples import GPU_FIELDS, HOST_FIELDS, KV_FIELDS

#: Longest sleep of the sampler thread (seconds): a trial's end waits at most this long for the thread to stop.
STOP_CHECK_S = 0.1
#: Niceness of the sampler thread (Linux: per thread). A waking sampler then seldom preempts the trial's threads
#: and runs in their gaps instead: on a 2-vCPU VM whose two cores a SmolLM2 decode keeps busy, decode steps with the
#: sampler at 10 ms took 1.019× those without at nice 0 and 1.005× at nice 10, in the same trials (steps paired as
#: in ``benchmarks/sampler_overhead.py``), with samples 11.4 ms apart at the median and 16 ms at p99 (10.2 and 14.4
#: at nice 0). Nice 19 cut the cost as far but spread samples to 36 ms at p90. With a core to spare nothing changes.
SAMPLER_NICE = 10


class MonitorWarning(UserWarning):
    """A measurement that cannot be taken here (its fields are recorded as null)."""


def _lower_priority(nice: int) -> None:
    """Give the calling thread at least niceness ``nice`` (Linux, where ``setpriority`` on a thread id applies to
    that thread alone); where the platform does not allow it, leave it as it is."""
    with contextlib.suppress(AttributeError, OSError):  # no per-thread priority (e.g. macOS thread ids, Windows)
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)


@dataclass
class TrialTimeline:
    """The samples of one trial (dicts with :data:`kvbench.results.samples.SAMPLE_COLUMNS`) and the alerts raised
    during it.

    ``sampler_cpu_s``: CPU seconds the sampler thread used during the trial (``time.thread_time``: its reads and
    wake-ups, not its sleep); None when no thread ran (``interval_ms`` 0). ``peaks``: what the trial's end read
    besides the samples (see :meth:`Sampler.trial`), for :func:`summarise`. ``sample_requested``: set by
    :meth:`Sampler.mark` for the sampler thread, which clears it when it takes the sample.
    """

    trial_id: str
    samples: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    phase: str = "prefill"
    kv_probe: Callable[[], tuple[int, int, int]] | None = None
    sampler_cpu_s: float | None = None
    peaks: dict[str, Any] | None = None
    sample_requested: bool = False


class Sampler:
    """Samples host and GPU figures every ``interval_ms`` while a trial runs (see :meth:`trial`).

    Args:
        device: the torch device the model is on (NVML is read only for a CUDA device).
        interval_ms: sampling period; 0 = no thread, only the readings at start and at stop.
        alert_device_bytes: when device memory (this process's NVML figure, else the device total; on CPU the
            process RSS) crosses it upwards, an alert event is recorded and ``on_alert`` called with it.
        on_alert: e.g. print a warning.
        nvml_reader: a reader to use instead of opening NVML (tests feed recorded readings this way).
        pid: the process whose GPU memory ``gpu_process_bytes`` is (the engine's; default this process). Host
            figures (RSS, CPU, pinned bytes) are this process's.

    Unavailable fields (no GPU, no NVML, an NVML error, no ``/proc``) are None, each with one
    :class:`MonitorWarning` naming the reason; the run goes on.
    """

    def __init__(self, device: Any, interval_ms: int = 50, alert_device_bytes: int | None = None,
                 on_alert: Callable[[dict[str, Any]], None] | None = None, nvml_reader: Any = None,
                 pid: int | None = None):
        self.interval_s = interval_ms / 1000
        self._current: tuple[TrialTimeline, float] | None = None
        self._sampling = threading.Event()  # cleared by pause(): the thread then blocks without waking
        self._read_lock = threading.Lock()
        self.alert_device_bytes = alert_device_bytes
        self.on_alert = on_alert
        self.pid = os.getpid() if pid is None else pid
        cuda = getattr(device, "type", str(device)) == "cuda"
        self.notes: dict[str, str] = {}
        self.nvml = nvml_reader
        if self.nvml is None and cuda:
            try:
                self.nvml = NvmlReader(device)
            except NvmlUnavailable as exc:
                self._note("gpu", str(exc))
        elif self.nvml is None:  # expected: no warning
            self.notes["gpu"] = f"no GPU fields on a {getattr(device, 'type', device)} device"
        try:
            self.host: HostReader | None = HostReader(cuda)
            if self.host.pinned_reason:
                self.notes["pinned_host_bytes"] = self.host.pinned_reason
            if self.host.pinned_peak_reason:
                for field in ("pinned_host_requested_peak_bytes", "pinned_host_allocated_peak_bytes"):
                    self.notes[field] = self.host.pinned_peak_reason
        except (psutil.Error, OSError) as exc:  # e.g. a container without /proc access
            self.host = None
            self._note("host", f"psutil cannot read this process: {exc}")

    def _note(self, what: str, reason: str) -> None:
        """Record why fields are null, with one warning per reason."""
        if what not in self.notes:
            self.notes[what] = reason
            warnings.warn(f"{what} samples are null: {reason}", MonitorWarning, stacklevel=3)

    def read(self, timeline: TrialTimeline, t0: float, final: bool = False) -> dict[str, Any]:
        """One sample for ``timeline`` (appended), ``t_s`` seconds after ``t0``; ``final``: the trial's last.
        The sampler thread and the trial's (start, end) take turns, so samples stay in time order."""
        with self._read_lock:
            return self._read(timeline, t0, final)

    def _read(self, timeline: TrialTimeline, t0: float, final: bool) -> dict[str, Any]:
        t_s = time.perf_counter() - t0  # before the phase: a sample timed after a mark carries its phase
        row: dict[str, Any] = {"trial_id": timeline.trial_id, "phase": timeline.phase, "t_s": t_s}
        host: dict[str, Any] = dict.fromkeys(HOST_FIELDS)
        if self.host is not None:
            try:
                host = self.host.read(final)
            except (psutil.Error, OSError) as exc:
                self._note("host", f"psutil failed: {exc}")
        row.update(host)
        row.update(gpu_fields(self.nvml.raw(), self.pid) if self.nvml is not None else dict.fromkeys(GPU_FIELDS))
        row.update(zip(KV_FIELDS, timeline.kv_probe() if timeline.kv_probe is not None else (None,) * 3))
        if self.nvml is not None and getattr(self.nvml, "failed", None):
            for key, why in self.nvml.failed.items():
                self._note(f"gpu:{key}", f"NVML {key}: {why}")
        timeline.samples.append(row)
        self._check_alert(timeline, row)
        return row

    def device_level(self, row: dict[str, Any]) -> int | None:
        """The device memory an alert watches: this process's on the GPU (else the GPU's total used); on a CPU
        run the process RSS."""
        if self.nvml is None:
            return row["rss_bytes"]
        return row["gpu_process_bytes"] if row["gpu_process_bytes"] is not None else row["gpu_used_bytes"]

    def _check_alert(self, timeline: TrialTimeline, row: dict[str, Any]) -> None:
        limit = self.alert_device_bytes
        if limit is None:
            return
        level = self.device_level(row)
        prev_level = self.device_level(timeline.samples[-2]) if len(timeline.samples) > 1 else None
        if level is not None and level >= limit and (prev_level is None or prev_level < limit):
            event = {"t_s": row["t_s"], "phase": row["phase"], "device_bytes": level, "threshold_bytes": limit,
                     "trial_id": timeline.trial_id}
            timeline.alerts.append(event)
            if self.on_alert:
                self.on_alert(event)

    @contextmanager
    def trial(self, trial_id: str, kv_probe: Callable[[], tuple[int, int, int]] | None = None,
              pinned_probe: Callable[[], int] | None = None) -> Iterator[TrialTimeline]:
        """Sample while the block runs; yields the trial's :class:`TrialTimeline` (``mark`` phases on it with
        :meth:`mark`). The thread is a daemon and is stopped and joined on every exit (errors, Ctrl-C); it sleeps
        at most :data:`STOP_CHECK_S` at a time, so that join waits no longer than that.

        At the start the kernel's peak RSS and torch's host allocator peaks are reset; after the last sample the
        trial's ``peaks`` are read (:meth:`~kvbench.bench.telemetry.host_memory.HostReader.trial_peaks`):
        ``rss_peak_bytes`` (the kernel's ``VmHWM``, None where it cannot be reset: the reason in
        ``notes["rss_peak_bytes"]``), ``rss_peak_source``, ``pinned_host_allocated_peak_bytes`` and
        ``pinned_host_requested_peak_bytes``.

        Args:
            trial_id: the id each sample carries.
            kv_probe: returns the KV bytes the cache holds now on (device, host, disk), read with every sample
                into ``kv_device_bytes``/``kv_host_bytes``/``kv_disk_bytes`` (None without a probe).
            pinned_probe: returns the bytes of pinned host buffers the trial's cache asked for at its peak (its
                own accounting), read once at the end on CUDA into ``pinned_host_requested_peak_bytes`` (None
                without a probe, and off CUDA).
        """
        timeline = TrialTimeline(trial_id, [], [], kv_probe=kv_probe)
        t0 = time.perf_counter()
        stop = threading.Event()
        self._sampling.set()
        self._current = (timeline, t0)
        if self.host is not None:
            self.host.start()
        self.read(timeline, t0)
        thread = None
        if self.interval_s > 0:
            def loop() -> None:
                # time.sleep, not stop.wait(timeout): on a 2-vCPU VM a timed Event.wait used about twice the
                # CPU per wake-up (time.thread_time: ~140 against ~75 µs idle, ~75 against ~40 µs beside a busy
                # torch loop), CPU a trial that keeps every core busy loses
                cpu0 = time.thread_time()
                _lower_priority(SAMPLER_NICE)
                try:
                    due = time.monotonic() + self.interval_s
                    while True:
                        time.sleep(max(0.0, min(due - time.monotonic(), STOP_CHECK_S)))
                        if stop.is_set():
                            break
                        if not self._sampling.is_set():  # paused: wait, untimed, for resume() or the end
                            self._sampling.wait()
                            if stop.is_set():
                                break
                            due = time.monotonic() + self.interval_s
                        elif timeline.sample_requested or time.monotonic() >= due:
                            timeline.sample_requested = False  # before the read: a mark during it asks again
                            self.read(timeline, t0)
                            due = time.monotonic() + self.interval_s
                finally:
                    timeline.sampler_cpu_s = time.thread_time() - cpu0

            thread = threading.Thread(target=loop, name="kvbench-sampler", daemon=True)
            thread.start()
        try:
            yield timeline
        finally:
            stop.set()
            self._sampling.set()  # a paused thread wakes, sees stop and ends
            if thread is not None:
                thread.join()
            self.read(timeline, t0, final=True)
            self._current = None
            timeline.peaks = self._trial_peaks(pinned_probe)

    def _trial_peaks(self, pinned_probe: Callable[[], int] | None) -> dict[str, Any]:
        """The trial's ``peaks`` (see :meth:`trial`), read once at its end."""
        ms = self.interval_s * 1000
        sampled = f"sampled every {ms:g} ms" if ms > 0 else "sampled at the trial's start and end (interval_ms 0)"
        peaks: dict[str, Any] = {"rss_peak_bytes": None, "rss_peak_source": sampled,
                                 "pinned_host_requested_peak_bytes": None, "pinned_host_allocated_peak_bytes": None}
        if self.host is None:
            return peaks
        got = self.host.trial_peaks()
        if got["rss_hwm_bytes"] is not None:
            peaks.update(rss_peak_bytes=got["rss_hwm_bytes"], rss_peak_source=KERNEL_PEAK_SOURCE)
        elif self.host.hwm_reason:
            self.notes.setdefault("rss_peak_bytes", f"{self.host.hwm_reason}; the peak is {sampled}")
        peaks["pinned_host_allocated_peak_bytes"] = got["pinned_host_allocated_peak_bytes"]
        if self.host.pinned_peak_reason is None and pinned_probe is not None:
            peaks["pinned_host_requested_peak_bytes"] = pinned_probe()
        return peaks

    def pause(self) -> None:
        """Stop the running trial's thread from sampling until :meth:`resume`: it ends the sleep under way (one
        last wake-up, with no reading) and then blocks without waking. ``benchmarks/sampler_overhead.py`` uses
        this to time decode steps with and without sampling inside one trial."""
        self._sampling.clear()

    def resume(self) -> None:
        """Sample again after :meth:`pause`, the first sample one interval later."""
        self._sampling.set()

    def mark(self, phase: str) -> None:
        """Label the following samples of the running trial with ``phase`` and ask the sampler thread for a sample
        soon (within :data:`STOP_CHECK_S`). It reads nothing itself: it runs on the trial's thread between clock
        readings (inside the first inter-token gap), where nothing that can block belongs, so it is two attribute
        writes. At ``interval_ms`` 0 (no thread) it only labels: the end's sample carries the phase."""
        current = self._current
        if current is not None:
            current[0].phase = phase
            current[0].sample_requested = True

    def close(self) -> None:
        """Release NVML."""
        if self.nvml is not None and hasattr(self.nvml, "close"):
            self.nvml.close()


def summarise(samples: list[dict[str, Any]], peaks: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per-trial figures from a timeline: peaks (``*_peak_*``, bytes), means (``*_mean_*``) and the host's minimum
    available memory; None where no sample had the field.

    ``peaks``: the trial's own peaks (:attr:`TrialTimeline.peaks`). With the kernel's ``VmHWM`` in it,
    ``rss_peak_bytes`` is that (or the largest sample, if higher: pages the kernel reclaims leave its high-water
    mark behind) and ``rss_peak_source`` says ``"kernel VmHWM"``; else the largest sample, with the sampling named.
    The anonymous and file-backed peaks are always the samples' (the kernel keeps no high-water mark of each).
    Without ``peaks`` the pinned peaks are None.
    """

    def col(name: str) -> list[float]:
        return [s[name] for s in samples if s.get(name) is not None]

    def peak(name: str) -> Any:
        v = col(name)
        return max(v) if v else None

    def mean(name: str) -> Any:
        v = col(name)
        return sum(v) / len(v) if v else None

    avail = col("host_available_bytes")
    peaks = peaks or {}
    rss_peak = peak("rss_bytes")
    if peaks.get("rss_peak_bytes") is not None:
        rss_peak = max(peaks["rss_peak_bytes"], rss_peak or 0)
    return {
        "rss_peak_bytes": rss_peak,
        "rss_peak_source": peaks.get("rss_peak_source", "sampled"),
        "rss_mean_bytes": mean("rss_bytes"),
        "rss_anon_peak_bytes": peak("rss_anon_bytes"),
        "rss_file_peak_bytes": peak("rss_file_bytes"),
        "cpu_percent_mean": mean("cpu_percent"),
        "host_available_min_bytes": min(avail) if avail else None,
        "pinned_host_requested_peak_bytes": peaks.get("pinned_host_requested_peak_bytes"),
        "pinned_host_allocated_peak_bytes": peaks.get("pinned_host_allocated_peak_bytes"),
        "nvml_device_peak_bytes": peak("gpu_used_bytes"),
        "nvml_process_peak_bytes": peak("gpu_process_bytes"),
        "gpu_util_mean_percent": mean("gpu_util_percent"),
        "pcie_tx_mean_bytes_per_s": mean("pcie_tx_bytes_per_s"),
        "pcie_rx_mean_bytes_per_s": mean("pcie_rx_bytes_per_s"),
        "power_mean_w": mean("power_w"),
        "n_samples": len(samples),
    }
