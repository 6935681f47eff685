"""The newest run under a results root, for commands given no results (``kvbench cost --gpu-price 2.0``)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from kvbench.results.run_dir import utc_now
from kvbench.safe_read import find_below, read_json_file


def _started(run: Path) -> str:
    """run.json's ``started_at`` (ISO 8601, UTC), else the trials file's modification time in the same form."""
    with contextlib.suppress(OSError, ValueError):  # BadFile (a FIFO, a device, not JSON...) is a ValueError
        meta = read_json_file(run / "run.json")
        started = meta.get("started_at") if isinstance(meta, dict) else None
        if isinstance(started, str) and started:
            return started
    return utc_now((run / "trials.jsonl").stat().st_mtime)


def newest_run(root: str | Path) -> Path | None:
    """The run directory (one holding ``trials.jsonl``) at or below ``root`` that started last (run.json
    ``started_at``, else its trials file's time; ties go to the later path); None when there is none or ``root`` is
    not a directory.

    Raises:
        BadFile: ``root`` holds folders nested deeper than :func:`kvbench.safe_read.find_below` searches.
    """
    root = Path(root)
    if not root.is_dir():
        return None
    runs = [f.parent for f in find_below(root, "trials.jsonl") if f.is_file()]
    return max(runs, key=lambda r: (_started(r), str(r)), default=None)


__all__ = ["newest_run"]
