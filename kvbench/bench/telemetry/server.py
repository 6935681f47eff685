"""The server process's own telemetry: resident memory and CPU of the server and its children (psutil) and, on a
GPU, their GPU memory and the device's (NVML, per PID), sampled on a thread while a mode's requests run; the
machine's load then counts the server's CPU as kvbench's own."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` of this machine (a server kvbench did not start, at a loopback
    URL), so that its CPU counts as the trial's own and its memory is sampled; None when no process, or more than
    one, listens there, or when the system does not tell (another user's process: psutil gives no PID for it)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    pids = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    return pids.pop() if len(pids) == 1 and None not in pids else None


class ProcessTree:
    """A started server's processes: ``pid`` and its children, listed once when made, so that each reading (CPU
    beside requests in flight, RSS every sample) reads only their own counters instead of walking ``/proc``."""

    def __init__(self, pid: int):
        self.procs = _tree(pid)
        self.pids = {p.pid for p in self.procs}

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the tree has used so far (0 once it is gone)."""
        total = 0.0
        for p in self.procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
        return total

    def rss_bytes(self) -> int | None:
        """Resident bytes of the tree now (None when it is gone)."""
        total, alive = 0, False
        for p in self.procs:
            try:
                total += p.memory_info().rss
                alive = True
            except psutil.Error:
                continue
        return total if alive else None


class ServerWatch:
    """Samples a server's process tree every ``interval_s`` seconds on a thread between :meth:`start` and
    :meth:`stop`; :meth:`stop` returns the fields ``rss_peak_bytes`` (peak of the samples, bytes),
    ``rss_mean_bytes``, ``cpu_percent_mean`` (CPU seconds of the tree over the wall time × 100: 100 = one CPU),
    ``n_samples`` and ``rss_peak_source`` (``server samples``); with ``nvml`` (a
    :class:`~kvbench.bench.telemetry.nvml.NvmlReader` of the server's GPU) also ``nvml_process_peak_bytes`` (the tree's
    GPU memory, summed over its PIDs; None where NVML lists none of them, e.g. another PID namespace),
    ``nvml_device_peak_bytes``, ``gpu_util_mean_percent`` and ``power_mean_w``."""

    def __init__(self, pid: int, interval_s: float = 0.05, nvml: Any = None):
        self.pid, self.interval_s, self.nvml = pid, max(interval_s, 0.01), nvml
        self._rss: list[int] = []
        self._gpu: dict[str, list[float]] = {"process": [], "device": [], "util": [], "power": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = self._cpu0 = 0.0

    def start(self) -> ServerWatch:
        """Begin sampling (one sample at once)."""
        self._tree = ProcessTree(self.pid)
        self._t0, self._cpu0 = time.monotonic(), self._tree.cpu_seconds()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="kvbench-server-watch", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        rss = self._tree.rss_bytes()
        if rss is not None:
            self._rss.append(rss)
        if self.nvml is not None:
            raw, pids = self.nvml.raw(), self._tree.pids
            mine = [used for p, used in raw.get("processes") or () if p in pids and used is not None]
            for key, v in (("process", sum(mine) if mine else None), ("device", (raw.get("memory") or (None,))[0]),
                           ("util", raw.get("util")), ("power", raw.get("power_mw"))):
                if v is not None:
                    self._gpu[key].append(v)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> dict[str, Any]:
        """Stop sampling (one last sample) and return the fields (see the class docstring)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        wall = time.monotonic() - self._t0
        cpu = self._tree.cpu_seconds() - self._cpu0
        gpu = self._gpu
        on_gpu = {} if self.nvml is None else {
            "nvml_process_peak_bytes": max(gpu["process"]) if gpu["process"] else None,
            "nvml_device_peak_bytes": max(gpu["device"]) if gpu["device"] else None,
            "gpu_util_mean_percent": sum(gpu["util"]) / len(gpu["util"]) if gpu["util"] else None,
            "power_mean_w": sum(gpu["power"]) / len(gpu["power"]) / 1000 if gpu["power"] else None}
        return {**on_gpu, "rss_peak_bytes": max(self._rss) if self._rss else None,
                "rss_mean_bytes": sum(self._rss) / len(self._rss) if self._rss else None,
                "rss_peak_source": "server samples" if self._rss else None,
                "cpu_percent_mean": 100 * cpu / wall if wall > 0 and cpu >= 0 else None,
                "n_samples": len(self._rss)}
