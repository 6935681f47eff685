"""Host measurements: the process's resident set size (RSS) peak and the memory still available, from psutil."""

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
