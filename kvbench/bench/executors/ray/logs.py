"""The servers' logs of a cluster run, on the driver's side: each log a worker sends goes into the run's
``servers/`` (:meth:`RunLogs.write`); a lost worker's folder is read, then removed, on its node
(:func:`salvage_folders`, a Ray task pinned there); and run.json's ``servers`` never names a log the run folder
lacks: such an entry gets ``log: null`` and ``log_lost`` (why it could not be recovered) instead
(:meth:`RunLogs.settle`)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from kvbench.bench.executors.ray.watch import LOG_NAME

#: Seconds the driver waits for the folders of lost (or unanswering) workers to be read and removed on their nodes.
SALVAGE_TIMEOUT_S = 20.0

Files = list[tuple[str, bytes]]


def salvage_folders(ray: Any, folders: list[tuple[str, str]],
                    timeout_s: float | None = None) -> list[tuple[Files, str | None]]:
    """Read the server logs of workers' folders, then remove the folders, each on its own node: ``folders`` holds
    ``(node id, folder)`` per worker (:func:`~kvbench.bench.executors.ray.watch.salvage`, a task of no
    CPU pinned to the node), all within ``timeout_s`` seconds (default :data:`SALVAGE_TIMEOUT_S`).

    Returns:
        Per folder, in order: the logs found (``(name, bytes)``) and None, or no logs and why the node could not
        do it (gone, or no answer in time). Never raises for a node.
    """
    if not folders:
        return []
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from kvbench.bench.executors.ray.watch import salvage

    timeout_s = SALVAGE_TIMEOUT_S if timeout_s is None else timeout_s
    task = ray.remote(num_cpus=0, max_retries=0)(salvage)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(folder)
            for node, folder in folders]
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    out: list[tuple[Files, str | None]] = []
    for ref in refs:
        if ref not in done:
            ray.cancel(ref, force=True)
            out.append(([], f"its node did not answer within {timeout_s:g} s"))
            continue
        try:
            out.append((ray.get(ref), None))
        except Exception as exc:
            text = str(exc).strip().splitlines()
            out.append(([], f"its node could not be reached ({type(exc).__name__}"
                        + (f": {text[-1][:200]})" if text else ")")))
    return out


class RunLogs:
    """The server logs of one run on the driver: ``run`` is its :class:`~kvbench.results.run_dir.RunDir`. The
    names it knows (in ``servers/``, named by run.json, on their way) are never given to another server;
    :attr:`lost` holds, per log as run.json names it (``servers/<name>``), why it could not be recovered.
    Thread-safe."""

    def __init__(self, run: Any):
        self.run = run
        self.lost: dict[str, str] = {}
        self._coming: set[str] = set()
        self._lock = threading.Lock()

    @property
    def folder(self) -> Path:
        """The run's ``servers/``."""
        return Path(self.run.path) / "servers"

    def has(self, log: str) -> bool:
        """Whether the run folder holds ``log`` (a path as run.json's ``servers`` names it) as a regular file."""
        f = self.folder / Path(log).name
        return f.is_file() and not f.is_symlink()

    def taken(self) -> list[str]:
        """Every log name the run has, names or is about to get: a worker's new server takes another."""
        d = self.folder
        names = {p.name for p in d.iterdir()} if d.is_dir() and not d.is_symlink() else set()
        names |= {Path(e["log"]).name for e in self.run.meta.get("servers") or []
                  if isinstance(e, dict) and isinstance(e.get("log"), str)}
        with self._lock:
            return sorted(names | self._coming | {Path(k).name for k in self.lost})

    def expect(self, name: str) -> None:
        """A log ``name`` is on its way (an event not yet written): not to be taken by another server."""
        with self._lock:
            self._coming.add(name)

    def write(self, name: str, data: bytes) -> None:
        """A worker's server log into the run's ``servers/`` (a new regular file: never through a link, never
        over an existing file, never outside that folder; another name is ignored).

        Raises:
            SymlinkRefused: ``servers/`` is a symbolic link.
            OSError: the file cannot be written (a full disk).
        """
        from kvbench.results.run_dir import open_nofollow, refuse_symlink_dir

        if not LOG_NAME.fullmatch(name) or name.startswith("."):
            return
        d = self.folder
        refuse_symlink_dir(d)
        d.mkdir(exist_ok=True)
        try:
            fd = open_nofollow(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:  # the run has a log of that name already (sent twice: the first one stays)
            return
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def worker_lost(self, worker: str, why: str) -> None:
        """The logs of ``worker``'s servers (run.json entries marked with its id) that the run folder lacks now
        could not be recovered, for the reason ``why``."""
        for e in self.run.meta.get("servers") or []:
            if isinstance(e, dict) and e.get("worker") == worker and isinstance(e.get("log"), str) \
                    and not self.has(e["log"]):
                self.lost.setdefault(e["log"], why)

    def amend(self, servers: list[Any]) -> list[Any]:
        """``servers`` (a worker's run.json update) with each log known to be lost replaced by ``log: null`` and
        its ``log_lost`` reason."""
        return [{**e, "log": None, "log_lost": self.lost[e["log"]]}
                if isinstance(e, dict) and isinstance(e.get("log"), str) and e["log"] in self.lost
                and not self.has(e["log"]) else e for e in servers]

    def amend_fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A run.json update (a worker's ``fields``) whose ``servers`` name no log known to be lost."""
        if not isinstance(fields.get("servers"), list):
            return fields
        return {**fields, "servers": self.amend(fields["servers"])}

    def settle(self, why: str, lock: Any) -> None:
        """Make run.json's ``servers`` name no log the run folder lacks: each such log is lost, for its recorded
        reason or else ``why`` (``lock``: held while run.json is read and written). A run.json that cannot be
        written (a full disk) is left as it is."""
        with lock:
            servers = self.run.meta.get("servers")
            if not isinstance(servers, list):
                return
            for e in servers:
                if isinstance(e, dict) and isinstance(e.get("log"), str) and not self.has(e["log"]):
                    self.lost.setdefault(e["log"], why)
            fixed = self.amend(servers)
            if fixed != servers:
                with contextlib.suppress(OSError):
                    self.run.update(servers=fixed)


def stop_workers(ray: Any, workers: list[Any], logs: RunLogs | None, again: bool) -> None:
    """Kill ``workers`` (:class:`~kvbench.bench.executors.ray.pool.Worker`) after each removed its folder, writing into
    ``logs`` (None: the sweep never began, nothing to keep) the server logs they hand over (``again``: those they
    sent already too); the folders of those that did not answer are read and removed on their nodes
    (:func:`salvage_folders`). A log that cannot be written (a full disk) is left out."""
    from kvbench.bench.executors.ray.pool import kill_workers

    closed = kill_workers(ray, workers, tidy=True, again=again)
    left = [w for w, got in closed if got is None and w.info.get("folder")]
    found = salvage_folders(ray, [(w.info["node"], w.info["folder"]) for w in left])
    if logs is None:
        return
    for files in [got or [] for _, got in closed] + [f for f, _ in found]:
        for name, data in files:
            with contextlib.suppress(OSError):
                logs.write(name, data)
    for w, (_, problem) in zip(left, found):
        if problem:
            logs.worker_lost(w.info["where"]["worker"], f"its worker (host {w.host}, pid {w.info['pid']}) did not "
                             f"answer when the run stopped, and {problem}")


__all__ = ["RunLogs", "SALVAGE_TIMEOUT_S", "salvage_folders", "stop_workers"]
