"""Background samplers. For now: the process's resident set size (RSS) peak, from psutil."""

from __future__ import annotations

import threading

import psutil


class RssPeak:
    """Peak RSS of this process while active, sampled every ``interval_s`` on a daemon thread.

    Use as a context manager; ``peak_bytes`` holds the highest RSS seen (bytes), including one reading at
    start and one at stop, so a region shorter than the interval still has a figure.
    """

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        rss = self._proc.memory_info().rss
        if rss > self.peak_bytes:
            self.peak_bytes = rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "RssPeak":
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="kvbench-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
