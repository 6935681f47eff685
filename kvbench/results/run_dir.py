"""The run directory: ``run.json`` (environment and resolved scenario) and ``trials.jsonl`` (one line per trial,
flushed as written).

Layout: ``<root>/<scenario name>-<UTC time>/``.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import errno
import fcntl
import io
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvbench.errors import BadFile, NotRegular, RecordError, RunDirError, SymlinkRefused
from kvbench.results.files import append_all, samples_end
from kvbench.results.read import read_rows, read_trials
from kvbench.results.record import SCHEMA_VERSION, check_run_meta
from kvbench.results.samples import SAMPLE_COLUMNS
from kvbench.safe_read import MAX_ROW_BYTES, read_json_file, scan_rows


def open_nofollow(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of a regular file that refuses a symbolic link as the last component (``O_NOFOLLOW``) and
    anything but a regular file (a FIFO is opened without blocking, then refused).

    Raises:
        SymlinkRefused: ``path`` is a symbolic link.
        NotRegular: ``path`` is a directory, a FIFO, a device or a socket.
        OSError: any other failure.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode)  # a FIFO must not block the open
    except OSError as exc:
        if exc.errno == errno.ELOOP or Path(path).is_symlink():
            raise SymlinkRefused(path) from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):  # a directory; a FIFO with no reader
            raise NotRegular(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(path)
    return fd


def refuse_symlink_dir(path: str | Path) -> None:
    """Raise :class:`SymlinkRefused` when the directory kvbench is about to write into is a symbolic link."""
    if Path(path).is_symlink():
        raise SymlinkRefused(path)


def utc_now(timestamp: float | None = None) -> str:
    """The UTC time of ``timestamp`` (seconds since the epoch; default now), ISO 8601 with a Z, as run.json's
    ``started_at``."""
    when = dt.datetime.now(dt.UTC) if timestamp is None else dt.datetime.fromtimestamp(timestamp,
                                                                                                 dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".run.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunDir:
    """One run's directory. Create with :meth:`create`, reopen for ``--resume`` with :meth:`open`."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = path
        self.meta = meta
        self._locked = False

    @property
    def trials_path(self) -> Path:
        """``trials.jsonl`` in the run directory."""
        return self.path / "trials.jsonl"

    @classmethod
    def create(cls, root: str | Path, scenario: dict[str, Any], env: dict[str, Any]) -> RunDir:
        """A new ``<root>/<name>-<UTC time>/`` with ``run.json`` (status ``running``) and an empty trials file."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{scenario['name']}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = root / f"{scenario['name']}-{stamp}-{n}"
        path.mkdir()
        meta = {"schema_version": SCHEMA_VERSION, "status": "running", "started_at": utc_now(),
                "environment": env, "scenario": scenario}
        run = cls(path, meta)
        _write_json_atomic(path / "run.json", meta)
        run.trials_path.touch()
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """Reopen an existing run.

        Raises:
            SymlinkRefused: one of the files kvbench writes there (run.json, trials.jsonl, samples.csv, .lock) is a
                symbolic link: resuming would write, truncate or lock its target.
            RunDirError: run.json is missing, unreadable or of another schema, or run.json or a row of
                trials.jsonl does not hold what kvbench writes (:mod:`kvbench.results.record`; naming the file, the
                line and the key).
        """
        p = Path(path)
        for name in ("run.json", "trials.jsonl", "samples.csv", ".lock"):
            if (p / name).is_symlink():
                raise SymlinkRefused(p / name)
        rj = p / "run.json"
        if not rj.exists():
            raise RunDirError(f"{p}: no run.json here; is this a kvbench run directory?")
        try:
            meta = read_json_file(rj)
        except BadFile as exc:
            raise RunDirError(str(exc)) from None
        if not isinstance(meta, dict):
            raise RunDirError(f"{rj}: not a kvbench run.json (a JSON object was expected)")
        version = meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise RunDirError(f"{rj}: schema_version {version!r}; this kvbench reads {SCHEMA_VERSION}")
        try:
            check_run_meta(meta, rj)
            if (p / "trials.jsonl").exists():  # a FIFO or device is refused there, not skipped
                read_rows(p / "trials.jsonl")
        except (RecordError, BadFile) as exc:
            raise RunDirError(str(exc)) from None
        return cls(p, meta)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold an exclusive lock on the run directory while writing trials (a second writer would duplicate them);
        a nested ``lock()`` of the same RunDir holds it once. On taking it, what a killed writer left is cut off,
        the only cuts kvbench makes, always under the lock: a last line without its newline in ``trials.jsonl``
        (with a warning: that trial runs again) and in ``samples.csv``, and the samples of a trial whose row was
        never written (see :meth:`record_trial`).

        Raises:
            RunDirError: another process holds it (nothing was cut).
            SymlinkRefused: ``.lock``, ``trials.jsonl`` or ``samples.csv`` is a symbolic link.
        """
        if self._locked:
            yield
            return
        fd = open_nofollow(self.path / ".lock", os.O_WRONLY | os.O_CREAT)  # never truncated: nothing is in it
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirError(f"{self.path}: another kvbench run is writing to this directory") from None
            self._locked = True
            try:
                self._cut_what_a_killed_writer_left()
                yield
            finally:
                self._locked = False
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _cut_what_a_killed_writer_left(self) -> None:
        committed: set[str] = set()
        if self.trials_path.exists():
            cut = _cut_tail(self.trials_path, lambda data: data.rfind(b"\n") + 1)
            if cut:
                warnings.warn(f"{self.trials_path}: dropped an incomplete last line ({cut} bytes); that trial runs "
                              "again", stacklevel=2)
            committed = _trial_ids(self.trials_path)
        if self.samples_path.exists():
            _cut_tail(self.samples_path, lambda data: samples_end(data, committed), header=True)

    def update(self, **fields: Any) -> None:
        """Set fields of run.json and rewrite it atomically."""
        self.meta.update(fields)
        _write_json_atomic(self.path / "run.json", self.meta)

    def append(self, row: dict[str, Any]) -> None:
        """Append one trial as a JSON line, fsynced so a killed run keeps it.

        Raises:
            OSError: the line cannot be written (disk full, quota); the file is cut back to its earlier length,
                so no half line is left.
        """
        data = (json.dumps(row, default=str, allow_nan=False) + "\n").encode()
        fd = open_nofollow(self.trials_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            append_all(fd, data)
        finally:
            os.close(fd)

    def record_trial(self, row: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        """Write one trial: its samples (:meth:`append_samples`), then its row (:meth:`append`), the commit point:
        a trial is in the run when its row is. The row gets (in place) ``scenario_digest``, the digest of
        run.json's scenario (:func:`kvbench.results.identity.scenario_digest`) that ``--resume`` checks.

        Raises:
            OSError: either write failed (disk full, quota); neither file keeps any of this trial (samples.csv
                is cut back to its size before it; were that cut to fail too, the next :meth:`lock` makes it).
        """
        from kvbench.results.identity import scenario_digest

        row["scenario_digest"] = scenario_digest(self.meta.get("scenario") or {})
        before = self.samples_path.lstat().st_size if self.samples_path.exists() else 0
        try:
            self.append_samples(samples)
            self.append(row)
        except OSError:
            with contextlib.suppress(OSError):
                _truncate_to(self.samples_path, before)
            raise

    @property
    def samples_path(self) -> Path:
        """``samples.csv`` in the run directory: the sampler timelines of the recorded trials."""
        return self.path / "samples.csv"

    def append_samples(self, samples: list[dict[str, Any]]) -> None:
        """Append one trial's samples (dicts with :data:`kvbench.results.samples.SAMPLE_COLUMNS`) to ``samples.csv`` in
        one fsynced write, with the header when the file is new; missing values are empty cells.

        Raises:
            OSError: the samples cannot be written (disk full, quota); the file is cut back to its earlier
                length, so no part of them is left.
        """
        if not samples:
            return
        new = not self.samples_path.exists() or self.samples_path.stat().st_size == 0
        columns = list(SAMPLE_COLUMNS)
        if not new:  # a resumed run keeps its file's columns (an older kvbench may have written fewer)
            with self.samples_path.open(newline="") as f:
                columns = next(csv.reader(f), columns)
        text = io.StringIO()
        w = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(samples)
        fd = open_nofollow(self.samples_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            append_all(fd, text.getvalue().encode())
        finally:
            os.close(fd)

    def finished_trials(self) -> list[dict[str, Any]]:
        """The trials already written; reading them changes no file (a partial last line, which :meth:`lock`
        cuts, is skipped with a warning by :func:`kvbench.results.read.read_trials`).

        Raises:
            kvbench.errors.ForeignRow: a row was written under another scenario than run.json's.
        """
        if not self.trials_path.exists():
            return []
        return read_trials(self.trials_path, self.meta.get("scenario"))


def _truncate_to(path: Path, size: int) -> None:
    """Cut ``path`` back to ``size`` bytes when it is longer (never through a link, never a non-regular file)."""
    fd = open_nofollow(path, os.O_WRONLY)
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


#: How much of a file's end :func:`_cut_tail` reads: a killed writer leaves at most one trial's line or samples
#: unfinished, far less than this.
CUT_WINDOW_BYTES = 64 << 20


def _cut_tail(path: Path, keep: Callable[[bytes], int], header: bool = False) -> int:
    """Cut ``path`` to its first ``keep(content)`` bytes; returns the bytes removed. At most
    :data:`CUT_WINDOW_BYTES` are read at a time, from the end (after the header line when ``header``, which is passed
    first): ``keep`` sees the header and a window of whole lines, and what it keeps maps back onto the file. When it
    keeps nothing of a window, that window goes and the one before it is read, until ``keep`` stops in one.

    Raises:
        SymlinkRefused: ``path`` is a symbolic link (its target is never cut).
        NotRegular: ``path`` is not a regular file.
        RunDirError: the last line would be cut but is longer than a row can be
            (:data:`kvbench.safe_read.MAX_ROW_BYTES`): not a file kvbench wrote; nothing is cut.
    """
    fd = open_nofollow(path, os.O_RDWR)
    with os.fdopen(fd, "r+b") as f:
        size = end = os.fstat(fd).st_size
        head = f.readline(MAX_ROW_BYTES) if header else b""
        while True:
            start = max(len(head), end - CUT_WINDOW_BYTES)
            f.seek(start)
            tail = f.read(end - start)
            if start > len(head):  # the window starts mid-line: keep sees whole lines only
                first_end = tail.find(b"\n") + 1
                start, tail = start + first_end, tail[first_end:]
            k = keep(head + tail)
            n = k if k < len(head) else start + k - len(head)
            if end - n > MAX_ROW_BYTES and b"\n" not in tail[max(0, n - start):]:
                raise RunDirError(f"{path}: its last line, {end - n:,} bytes without a line end, is longer than "
                                  "kvbench writes: not a file it made; nothing was cut: move it away")
            if n > start or start <= len(head) or n < len(head):  # keep stopped inside what it saw
                break
            end = n  # the whole window goes: look before it
        if n < size:
            f.truncate(n)
    return size - n


def _trial_ids(path: Path) -> set[str]:
    """The ``trial_id`` of every JSON-object line of a trials file (other lines are left to
    :func:`kvbench.results.read.read_rows`)."""
    values, _, _ = scan_rows(path)
    return {row["trial_id"] for row in values if isinstance(row, dict) and isinstance(row.get("trial_id"), str)}
