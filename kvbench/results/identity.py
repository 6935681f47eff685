"""Which scenario a trial row belongs to. Every recorded row carries the scenario's ``scenario`` name and a
``scenario_digest`` of what shapes a trial's result, so that ``--resume`` refuses rows written under another
scenario (another model, workload, ``max_new_tokens``...) instead of keeping them as finished trials."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kvbench.errors import ForeignRow

#: Scenario keys left out of the digest: those that name it, those that only choose which trials run (a
#: trial's id says its prompt length, batch, mode with its options and repeat), ``quality`` (thresholds the report
#: applies) and ``executor`` (where they run: a run may be resumed on another executor; each row says its
#: machine). Every other key (model, device, workload, max_new_tokens, budget, store, monitor, disk, placement,
#: seed...) shapes what a trial measures.
NOT_IN_DIGEST = frozenset({"name", "description", "prompt_tokens", "batch_sizes", "modes", "repeats", "warmup",
                           "capacity", "quality", "executor"})


def scenario_digest(scenario: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the canonical JSON (sorted keys, no spaces) of ``scenario``'s keys outside
    :data:`NOT_IN_DIGEST`; ``scenario`` as run.json stores it (a scenario dumped in JSON mode)."""
    shaping = {k: v for k, v in scenario.items() if k not in NOT_IN_DIGEST}
    text = json.dumps(shaping, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _mismatches(row: dict[str, Any], scenario: dict[str, Any], digest: str) -> list[str]:
    out = []
    if "scenario" in row and row["scenario"] != scenario.get("name"):
        out.append(f"scenario {row['scenario']!r} (run.json: {scenario.get('name')!r})")
    if "max_new_tokens" in row and row["max_new_tokens"] != scenario.get("max_new_tokens"):
        out.append(f"max_new_tokens {row['max_new_tokens']!r} (run.json: {scenario.get('max_new_tokens')!r})")
    if "scenario_digest" in row and row["scenario_digest"] != digest:
        out.append(f"scenario_digest {row['scenario_digest']!r} (run.json's scenario: {digest!r})")
    return out


def check_parsed(path: Path, rows: list[Any], lines: list[int], scenario: dict[str, Any]) -> None:
    """Refuse the parsed rows of ``trials.jsonl`` at ``path`` (``lines`` their line numbers) written under a
    scenario other than ``scenario`` (run.json's): another ``scenario`` name, ``max_new_tokens`` or
    ``scenario_digest``. A row from before the digest (an older kvbench) is checked by the name and
    ``max_new_tokens`` it carries. Values that are not objects are left to :func:`kvbench.results.record.check_rows`.

    Raises:
        ForeignRow: naming the file, the line, the trial and each mismatch.
    """
    digest = scenario_digest(scenario)
    for row, number in zip(rows, lines):
        if isinstance(row, dict) and (why := _mismatches(row, scenario, digest)):
            raise ForeignRow(f"{path}:{number}: trial {row.get('trial_id')!r} was written under another "
                             f"scenario: {'; '.join(why)}; a run keeps only rows of its own scenario: move "
                             "that line out, or run the other scenario in a new run")
