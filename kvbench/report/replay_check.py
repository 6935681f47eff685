"""``kvbench trace validate`` as a library: a run that replayed a trace (``workload.trace``), per mode its measured
cached prompt tokens against the simulator's prediction at the mode's cache capacity
(kvbench.analysis.trace_validation), the capacity and the policy each taken from what the run says of its engine,
and ``replay_check.csv``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.analysis.trace_validation import ReplayCheck, check_replay
from kvbench.errors import ResultsError
from kvbench.report.simulation import write_csv
from kvbench.results.load import load_results
from kvbench.scenario.trace_checks import replayed_slice
from kvbench.scenario.workload import TraceSpec
from kvbench.serving import KINDS

@dataclass(frozen=True)
class ModeCheck:
    """One mode's check: its ``label``, the ``engine``, the ``capacity_tokens`` simulated and where that figure
    comes from (``capacity_source``), and the :class:`~kvbench.analysis.trace_validation.ReplayCheck`."""

    label: str
    engine: str
    capacity_tokens: int
    capacity_source: str
    check: ReplayCheck


def _capacity(label: str, part: pd.DataFrame, servers: list[dict[str, Any]], policy: str) -> tuple[int, str] | None:
    """A mode's cache capacity in tokens under ``policy``: for ``prompt-lru`` the RAM cache beside the slots (the
    rows' ``kv_budget_tokens`` less the servers' ``device_cache_tokens``); else the larger of the two (vLLM's
    blocks × block size; llama.cpp's slots' context and its host tier). None when neither is known."""
    caps = [s["device_cache_tokens"] for s in servers if s.get("mode_label") == label
            and type(s.get("device_cache_tokens")) is int and s["device_cache_tokens"] > 0]
    budget = (pd.to_numeric(part["kv_budget_tokens"], errors="coerce").dropna() if "kv_budget_tokens" in part
              else pd.Series(dtype=float))
    if policy == "prompt-lru":
        if not caps or not len(budget):
            return None
        return max(0, int(budget.min()) - min(caps)), "the host tier: kv_budget_tokens less the slots' context"
    known = [(min(caps), "the server's device cache (run.json)")] if caps else []
    if len(budget):
        known.append((int(budget.min()), "kv_budget_tokens: the slots' context and the host tier"))
    return max(known, key=lambda k: k[0]) if known else None


def check_run(run: str | Path, capacity_tokens: int | None = None, policy: str | None = None,
              engine_block_tokens: int | None = None) -> list[ModeCheck]:
    """Per mode of the replay run ``run``, measured against simulated cached tokens.

    Args:
        run: a run directory whose scenario replays ``workload.trace``.
        capacity_tokens: the cache capacity to simulate (tokens; ``prompt-lru``: the RAM cache's); default: each
            mode's own (:func:`_capacity`).
        policy: the simulator's policy; default: the engine's closest (its kind's
            :attr:`~kvbench.serving.kind.ServerKind.cache_policy`; in-process, ``lru``).
        engine_block_tokens: the engine's own block (a gap beyond it is flagged); default the replayed block.

    Raises:
        kvbench.errors.ResultsError: not a run, or not a replay of a trace, or no mode with cached prompt tokens
            and a known capacity (a mode with none, such as a cold ``none``, is left out).
        kvbench.errors.BadFile, kvbench.errors.BadValue: the trace cannot be read again as the run read it.
    """
    res = load_results(run)
    scenario = res.runs[0].get("scenario") if res.runs else None
    workload = scenario.get("workload") if isinstance(scenario, dict) else None
    raw = workload.get("trace") if isinstance(workload, dict) else None
    if not isinstance(raw, dict):
        raise ResultsError(f"{run}: not a replay of a trace (its scenario has no workload.trace)")
    try:
        spec = TraceSpec.model_validate(raw)
    except ValueError as exc:
        raise ResultsError(f"{run}: run.json's workload.trace cannot be read: {str(exc).splitlines()[0]}") from None
    trace = replayed_slice(spec)
    rows = res.trials
    rows = rows[rows["status"] == "ok"] if "status" in rows else rows
    engine = str(rows["engine"].dropna().iloc[0]) if "engine" in rows and rows["engine"].notna().any() \
        else "transformers"
    out = []
    for label, part in rows.groupby("mode_label", sort=False):
        if "warm" in part and part["warm"].notna().any():  # in-process: the warm trials restored from the store
            part = part[part["warm"] == True]  # noqa: E712 (an object column)
            part = part.assign(cached_prompt_tokens=part.get("tokens_restored"))
        chosen = policy or (KINDS[engine].cache_policy if engine in KINDS else "lru")
        cap = (capacity_tokens, "given") if capacity_tokens is not None else _capacity(str(label), part, res.servers,
                                                                                      chosen)
        if cap is None:
            continue
        check = check_replay(part, trace, spec.block_tokens, int(cap[0]), chosen, engine_block_tokens)
        if len(check.table):  # a mode that reports no cached tokens (a cold one) has nothing to compare
            out.append(ModeCheck(str(label), engine, int(cap[0]), cap[1], check))
    if not out:
        raise ResultsError(f"{run}: no mode has both cached prompt tokens and a known cache capacity (give one)")
    return out


def summary_line(m: ModeCheck) -> str:
    """One mode's overall comparison in a line."""
    c = m.check
    diff = c.measured - c.predicted
    pct = f" ({100 * diff / c.predicted:+.1f}%)" if c.predicted else ""
    return (f"{m.label} ({m.engine}): {len(c.table)} requests; cached prompt tokens measured {c.measured:,}, "
            f"simulated {c.predicted:,} ({c.policy} at {c.capacity_blocks:,} blocks = {m.capacity_tokens:,} tokens, "
            f"{m.capacity_source}): difference {diff:+,}{pct}; an unlimited cache {c.unlimited:,}; "
            f"{c.flagged} requests off by more than a block" + (f"; {c.missing} requests of the slice not measured"
                                                               if c.missing else ""))


def write_checks(checks: list[ModeCheck], out_dir: str | Path) -> list[Path]:
    """``replay_check.csv`` (every mode's per-request table, with ``mode_label``) in ``out_dir`` (created).

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: the file cannot be written.
    """
    frame = pd.concat([m.check.table.assign(mode_label=m.label, policy=m.check.policy,
                                            capacity_tokens=m.capacity_tokens) for m in checks], ignore_index=True)
    return write_csv(frame, out_dir, "replay_check.csv")
