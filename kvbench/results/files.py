"""Writes to a run directory's files that leave no partial record behind: appends cut back when they fail, the
cut of what a killed writer left at the end of ``samples.csv``, and the error a sweep stops with when its files
cannot be written. :class:`kvbench.results.run_dir.RunDir` uses them; they work on open descriptors and bytes."""

from __future__ import annotations

import contextlib
import csv
import errno
import os

from kvbench.errors import UserError

#: errno values that mean the results' file system is full (run.json's reason then starts ``disk full:``)
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def append_all(fd: int, data: bytes) -> None:
    """Write ``data`` at the end of ``fd`` (opened ``O_APPEND``) and fsync it.

    Raises:
        OSError: a write or the sync failed (disk full, quota); the file is first cut back to its size before
            this call, so no part of ``data`` is left.
    """
    start = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise


def samples_end(data: bytes, committed: set[str]) -> int:
    """How many bytes of ``samples.csv`` (its whole content, ``data``) to keep: all but a last line without its
    newline and the samples after the last one of a trial in ``committed`` (the trial ids of ``trials.jsonl``).
    A trial's samples are written just before its row, so samples of a trial without a row are those of a run
    killed between the two; they would be written again, twice, when the trial reruns. The header is always
    kept."""
    keep = data.rfind(b"\n") + 1
    header_end = data.find(b"\n") + 1
    if not header_end:
        return keep
    columns = next(csv.reader([data[:header_end].decode(errors="replace")]), [])
    if "trial_id" not in columns:
        return keep
    col = columns.index("trial_id")
    while keep > header_end:
        start = data.rfind(b"\n", 0, keep - 1) + 1
        cells = next(csv.reader([data[start:keep].decode(errors="replace")]), [])
        if col < len(cells) and cells[col] in committed:
            break
        keep = start
    return keep


def failure_reason(exc: OSError) -> str:
    """run.json's ``reason`` for a sweep stopped by ``exc``: ``disk full: No space left on device`` (ENOSPC,
    EDQUOT), else the error's text."""
    text = exc.strerror or str(exc)
    return f"disk full: {text}" if exc.errno in DISK_FULL else text


class ResultsNotWritten(UserError, OSError):
    """A sweep stopped because its run directory could not be written (disk full, quota, a removed directory).
    Its message is one line: the directory, the cause, the trial lost and what run.json says.

    Attributes:
        path: the run directory.
        trial_id: the trial measured but not kept (neither its row nor any of its samples is in the files), or
            None when the failure came between trials.
        reason: run.json's ``reason`` (:func:`failure_reason`).
        status_error: None when run.json was marked ``interrupted`` with that reason; else why run.json could not
            be written either (it still says ``running``).
    """

    def __init__(self, cause: OSError, path: str | os.PathLike, trial_id: str | None, status_error: str | None):
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.path, self.trial_id, self.status_error = path, trial_id, status_error
        self.reason = failure_reason(cause)

    def __str__(self) -> str:
        text = f"cannot write the results in {self.path}: {self.strerror}"
        if self.trial_id:
            text += f"; trial {self.trial_id} was measured but not kept (neither its row nor its samples)"
        if self.status_error:
            return (f"{text}; run.json could not be marked interrupted either ({self.status_error}): it still says "
                    "running")
        return f"{text}; run.json says interrupted ({self.reason})"
