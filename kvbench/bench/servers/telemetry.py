"""The server process's own telemetry: resident memory and CPU of the server and its children (psutil), sampled
on a thread while a mode's requests run; the machine's load then counts the server's CPU as kvbench's own."""

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


def tree_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds used so far by process ``pid`` and its children (0 when it is gone or None)."""
    total = 0.0
    for p in _tree(pid) if pid else ():
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def tree_rss_bytes(pid: int) -> int | None:
    """Resident bytes of process ``pid`` and its children now (None when it is gone)."""
    procs = _tree(pid)
    if not procs:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


class ServerWatch:
    """Samples a server's process tree every ``interval_s`` seconds on a thread between :meth:`start` and
    :meth:`stop`; :meth:`stop` returns the row fields ``rss_peak_bytes`` (peak of the samples, bytes),
    ``rss_mean_bytes``, ``cpu_percent_mean`` (CPU seconds of the tree over the wall time × 100: 100 = one CPU),
    ``n_samples`` and ``rss_peak_source`` (``server samples``)."""

    def __init__(self, pid: int, interval_s: float = 0.05):
        self.pid, self.interval_s = pid, max(interval_s, 0.01)
        self._rss: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = self._cpu0 = 0.0

    def start(self) -> "ServerWatch":
        """Begin sampling (one sample at once)."""
        self._t0, self._cpu0 = time.monotonic(), tree_cpu_seconds(self.pid)
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="kvbench-server-watch", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        rss = tree_rss_bytes(self.pid)
        if rss is not None:
            self._rss.append(rss)

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
        cpu = tree_cpu_seconds(self.pid) - self._cpu0
        return {"rss_peak_bytes": max(self._rss) if self._rss else None,
                "rss_mean_bytes": sum(self._rss) / len(self._rss) if self._rss else None,
                "rss_peak_source": "server samples" if self._rss else None,
                "cpu_percent_mean": 100 * cpu / wall if wall > 0 and cpu >= 0 else None,
                "n_samples": len(self._rss)}
