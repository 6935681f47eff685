"""What a cluster worker watches of its server engine, so that a worker that dies or is stopped loses as little
as it can: each server's log goes to the driver as that server stops (:class:`LogShipper`), and each measured
request is announced as it is sent (:class:`EngineWatch`), so that a worker lost mid-request names the requests in
flight. :func:`salvage` runs on the node of a lost worker (a Ray task the driver starts there): the logs its
folder still holds, then the folder removed.

A worker's folder (``kvbench-worker-<pid>-<random>`` in the node's temporary directory) is the run directory its
server engine sees: the servers' logs in ``servers/`` (``<mode>-r<repeat>[.<n>].log``), disk slots beside them."""

from __future__ import annotations

import contextlib
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: A server log's name, as the server engine makes them (``<mode>-r<repeat>[.<n>].log``).
LOG_NAME = re.compile(r"[A-Za-z0-9_.@+-]{1,200}\.log")
#: How much of the end of each server log a worker sends to the driver, in bytes.
MAX_LOG_BYTES = 4 << 20
#: How a worker's folder is named (in the temporary directory of its node): only such folders are salvaged.
FOLDER_PREFIX = "kvbench-worker-"

Send = Callable[[tuple[str, Any]], None]


def read_tail(path: Path) -> bytes | None:
    """The last :data:`MAX_LOG_BYTES` bytes of ``path``; None when it is no regular file (or a link)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - MAX_LOG_BYTES))
            return fh.read()
    except OSError:
        return None


class LogShipper:
    """The server logs of one worker's folder, each sent once: :meth:`ship` one that is complete (its server
    stopped), :meth:`rest` all the others (at a unit's end or when the worker closes). Thread-safe: the unit's
    thread and :meth:`~kvbench.bench.executors.ray.worker.TrialWorker.close` both take logs."""

    def __init__(self, root: Path):
        self.logs = root / "servers"
        self._sent: set[str] = set()
        self._lock = threading.Lock()

    def begin(self, taken: list[str]) -> None:
        """Before a unit: ``taken`` are the names the run's ``servers/`` already has (or its run.json names), left
        here as placeholders so that a new server's log gets the next free name, as in the run. A placeholder is
        an empty folder: never read as a log, here or by :func:`salvage`."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for name in taken:
            path = self.logs / name
            if LOG_NAME.fullmatch(name) and not path.exists() and not path.is_symlink():
                path.mkdir()

    def ship(self, name: str, again: bool = False) -> tuple[str, bytes] | None:
        """The log ``name`` (its last :data:`MAX_LOG_BYTES` bytes) unless it is no file here (a placeholder) or
        was sent already (``again``: sent anyway)."""
        with self._lock:
            if (name in self._sent and not again) or not LOG_NAME.fullmatch(name):
                return None
            data = read_tail(self.logs / name)
            if data is None:
                return None
            self._sent.add(name)
            return name, data

    def rest(self, again: bool = False) -> list[tuple[str, bytes]]:
        """Every log here not sent yet (a running server's: what it wrote so far); ``again``: those sent already
        too (the worker is being stopped: what it sent last may not have reached the driver)."""
        names = sorted(p.name for p in self.logs.glob("*.log")) if self.logs.is_dir() else []
        return [found for name in names if (found := self.ship(name, again)) is not None]


class EngineWatch:
    """Watches one server engine for a worker: wrapping ``session`` on the instance, each server's log sent as
    the server stops, its run.json entry marked with the worker and host that ran it; :meth:`start_row` is a
    measured request's row as an error row would have it (the ``("start", row)`` event the worker sends as the
    server sweep starts the request: :attr:`~kvbench.bench.plans.sweep.Recorder.on_start`)."""

    def __init__(self, engine: Any, shipper: LogShipper, where: dict[str, Any]):
        self.engine, self.shipper, self.where = engine, shipper, where
        self._send: Send | None = None
        session = engine.session

        @contextlib.contextmanager
        def watched_session(*args: Any, **kw: Any) -> Iterator[Any]:
            first = len(engine.launches)
            try:
                with session(*args, **kw) as srv:
                    self._mark(engine.launches[first:])
                    yield srv
            finally:  # the server has stopped (or never started): its log is complete
                self._mark(engine.launches[first:])
                for info in engine.launches[first:]:
                    found = self.shipper.ship(Path(info["log"]).name) if info.get("log") else None
                    if found is not None:
                        self._emit(("file", found))

        engine.session = watched_session

    def start_row(self, t: Any) -> dict[str, Any]:
        """The row of measured request ``t`` (a :class:`~kvbench.bench.trial.ServerTrial`) before it has a reply."""
        from kvbench.bench.engines.server.rows import request_row

        return request_row(self.engine, t, None, None)

    def begin(self, send: Send) -> None:
        """Before a unit: ``send`` the unit's event channel."""
        self._send = send

    def end(self) -> None:
        """After a unit: nothing more is sent."""
        self._send = None

    def _emit(self, event: tuple[str, Any]) -> None:
        if self._send is not None:
            self._send(event)

    def _mark(self, entries: list[dict[str, Any]]) -> None:
        for info in entries:
            info.setdefault("worker", self.where.get("worker"))
            info.setdefault("host", self.where.get("host"))


def salvage(root: str) -> list[tuple[str, bytes]]:
    """On the node of a lost worker: the server logs its folder ``root`` holds (their last :data:`MAX_LOG_BYTES`
    bytes; placeholders are folders, not read), then the folder removed. A path that is no worker's folder (its
    name does not start with :data:`FOLDER_PREFIX`, or a link) is left alone.

    Returns:
        ``(name, bytes)`` per log found (none when the folder is gone or was never made).
    """
    path = Path(root)
    if not path.name.startswith(FOLDER_PREFIX) or path.is_symlink() or not path.is_dir():
        return []
    logs = path / "servers"
    out = []
    for f in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        data = read_tail(f) if LOG_NAME.fullmatch(f.name) else None
        if data is not None:
            out.append((f.name, data))
    shutil.rmtree(path, ignore_errors=True)
    return out


__all__ = ["EngineWatch", "FOLDER_PREFIX", "LOG_NAME", "LogShipper", "MAX_LOG_BYTES", "read_tail", "salvage"]
