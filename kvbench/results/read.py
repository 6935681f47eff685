"""The one reader of ``trials.jsonl``, with its one schema check (the declared columns,
:mod:`kvbench.results.rows`): ``run --resume`` (:class:`kvbench.results.run_dir.RunDir`) and the loader of results
(:func:`kvbench.results.load.load_results`) read rows through it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from kvbench.errors import BadFile, RecordError, RunDirError
from kvbench.results.identity import check_parsed
from kvbench.results.record import check_rows
from kvbench.safe_read import scan_rows, skipped_message


def read_rows(path: str | Path, scenario: Any = None) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The rows of a ``trials.jsonl`` and the lines skipped, with why (:func:`kvbench.safe_read.scan_rows`: not
    valid JSON, e.g. a run killed mid-write, not UTF-8, too long or nested too deeply), in one read of the file;
    every row checked against the declared columns (:func:`kvbench.results.record.check_rows`).

    Raises:
        BadFile: the file is not a regular file or cannot be read.
        RecordError: a valid JSON line that is not a trial row (naming the file, the line and the key).
        ForeignRow: with ``scenario`` (run.json's), a row written under another scenario
            (:func:`kvbench.results.identity.check_parsed`).
    """
    path = Path(path)
    rows, lines, skipped = scan_rows(path)
    checked = check_rows(rows, lines, path)
    if isinstance(scenario, dict):  # rows of another scenario are refused, never merged
        check_parsed(path, rows, lines, scenario)
    return checked, skipped


def read_trials(path: str | Path, scenario: Any = None) -> list[dict[str, Any]]:
    """The rows of a ``trials.jsonl`` (:func:`read_rows`). Lines kvbench cannot read are skipped with a warning
    naming file and line, the same warning ``report`` gives. With ``scenario`` (run.json's), rows written under
    another scenario are refused.

    Raises:
        RunDirError: the file is not a regular file, or a line is not a trial row (naming the file, the line and
            the key).
        ForeignRow: a row of another scenario (a RunDirError).
    """
    try:
        rows, skipped = read_rows(path, scenario)
    except (RecordError, BadFile) as exc:
        raise RunDirError(str(exc)) from None
    for i, why in skipped:
        warnings.warn(skipped_message(path, i, why), stacklevel=2)
    return rows


__all__ = ["read_rows", "read_trials"]
