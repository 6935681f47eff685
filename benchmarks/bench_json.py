"""The file a benchmark writes with ``--json PATH``: its rows of figures, for ``benchmarks/gpu.sh`` to gather into
one result file (``kvbench report`` renders it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_result(path: str, benchmark: str, args: argparse.Namespace, model: str, rows: list[dict],
                 notes: list[str]) -> None:
    """Write ``{"benchmark", "args", "model", "rows", "notes"}`` to ``path``: ``rows`` flat dicts of one table
    (the same columns in each), ``notes`` lines the table does not hold (a mode skipped, the target's verdict).
    A figure that is not a finite number raises ValueError: JSON has no NaN."""
    options = {k: v for k, v in vars(args).items() if k != "json"}
    doc = {"benchmark": benchmark, "args": options, "model": model, "rows": rows, "notes": notes}
    Path(path).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
