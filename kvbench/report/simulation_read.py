"""A simulation read back for ``kvbench report``: ``simulation.json`` (what ``kvbench simulate`` wrote: the trace,
the definitions, the unlimited cache and, when it was priced, the cost per host tier size and its advice),
checked before anything of it is shown."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kvbench.errors import BadFile
from kvbench.safe_read import read_json_file

#: The largest simulation.json read (bytes): a curve of 120 points and a table of 16 sizes take some 60 KiB.
MAX_SIMULATION_BYTES = 8 << 20


def simulation_file(path: Path) -> Path | None:
    """The ``simulation.json`` that ``path`` names (the file, or a folder holding it and no run), else None."""
    if path.name == "simulation.json" and not path.is_dir():
        return path
    if path.is_dir() and (path / "simulation.json").is_file() and not (path / "run.json").exists():
        return path / "simulation.json"
    return None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def simulation_lines(path: Path) -> list[str]:
    """What ``kvbench report`` prints of a simulation: the trace, the unlimited cache's hit rates, the definitions
    and, for a priced simulation, the paragraph of what to buy.

    Raises:
        BadFile: unreadable, too large or not JSON (:func:`kvbench.safe_read.read_json_file`), or not what kvbench
            simulate writes (naming the key).
    """
    doc = read_json_file(path, MAX_SIMULATION_BYTES)
    trace, ceiling = (doc.get("trace"), doc.get("ceiling")) if isinstance(doc, dict) else (None, None)
    if not isinstance(trace, dict) or not isinstance(ceiling, dict):
        raise BadFile(f"{path}: not a simulation.json of kvbench simulate (no trace and ceiling)")
    counts = {k: trace.get(k) for k in ("requests", "block_visits", "distinct_blocks", "block_tokens")}
    if not all(type(v) is int and v >= 0 for v in counts.values()):
        raise BadFile(f"{path}: trace: requests, block_visits, distinct_blocks and block_tokens must be whole "
                      "numbers")
    blocks, tokens = _number(ceiling.get("hit_rate_blocks")), _number(ceiling.get("hit_rate_tokens"))
    if blocks is None or tokens is None:
        raise BadFile(f"{path}: ceiling: hit_rate_blocks and hit_rate_tokens must be numbers")
    lines = [f"trace {str(trace.get('source'))[:200]}: {counts['requests']:,} requests, {counts['block_visits']:,} "
             f"block visits, {counts['distinct_blocks']:,} distinct blocks of {counts['block_tokens']} tokens",
             f"unlimited cache ({str(doc.get('policy'))[:40]}): hit rate of blocks {blocks:.3f}, of tokens "
             f"{tokens:.3f}", str(doc.get("definitions", ""))[:2000]]
    cost = doc.get("cost")
    if isinstance(cost, dict) and isinstance(cost.get("advice"), str):
        lines.append(cost["advice"][:4000])
    elif cost is None:
        lines.append("not priced: kvbench simulate --model M --gpu-price P prices each host tier size and says "
                     "what to buy")
    return lines
