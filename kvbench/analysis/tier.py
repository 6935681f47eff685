"""The tier question: does a host or disk KV tier pay *on top of* the same engine's prefix cache?

Two savings are named apart (DESIGN's terms): the *reuse saving* of a mode against ``none`` (recompute every
prompt), and the *tier saving* of a host/disk tier mode (:attr:`kvbench.serving.kind.Preset.tier`: vLLM
``cpu-offload`` and ``lmcache``, SGLang ``hicache``, llama.cpp ``host-cache`` and ``disk-slots``) against the same
engine's prefix-cache mode with the tier off (:attr:`kvbench.serving.kind.ServerKind.prefix_preset`) at the same
load. A tier engages only when its own counters moved: llama.cpp's cached tokens beyond what the answering slot
held (``tier_hit_tokens``), vLLM's and SGLang's tier counters in the ``/metrics`` deltas of its servers
(:attr:`~kvbench.serving.kind.ServerKind.tier_counters`); device prefix-cache hits never count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from kvbench.analysis.reuse import paired_ttft, reuse_trials
from kvbench.results.rows import MEASURED
from kvbench.serving import KINDS


def tier_of(engine: Any, mode: Any) -> str | None:
    """``"host"`` or ``"disk"`` where preset ``mode`` of server kind ``engine`` adds that tier on top of the
    kind's prefix cache, else None (the in-process engine, an unknown kind or preset)."""
    kind = KINDS.get(str(engine)) if isinstance(engine, str) else None
    preset = kind.presets.get(str(mode)) if kind is not None else None
    return preset.tier if preset is not None else None


def baseline_label(rows: pd.DataFrame, part: pd.DataFrame) -> str | None:
    """The label of the mode in ``rows`` that runs the prefix-cache preset of ``part``'s engine in ``part``'s
    group and at its concurrency (``prefix-cache@c4`` for ``host-cache@c4``), the first one run: the baseline of
    a tier mode's (``part``'s rows) tier saving; None where there is none."""
    engine = str(part["engine"].iloc[0])
    base = KINDS[engine].prefix_preset if engine in KINDS else None
    if base is None:
        return None
    same = rows[(rows["group"] == part["group"].iloc[0]) & (rows["mode"] == base)]
    if "concurrency" in part and part["concurrency"].notna().any():
        same = same[same["concurrency"].isin(part["concurrency"].dropna().unique())]
    return str(same["mode_label"].iloc[0]) if len(same) else None


def _servers_of(servers: Sequence[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    return [s for s in servers if isinstance(s, dict) and str(s.get("mode_label")) == label]


def capacity_text(servers: Sequence[dict[str, Any]]) -> str:
    """The token arithmetic of a run's servers: ``"the working set (9,120 tokens) fits the device cache (23,296
    tokens)"`` or ``"... is 2.1x the device cache ..."``; ``""`` where either figure is missing (run.json's
    ``working_set_tokens`` and ``device_cache_tokens``, the smallest device cache of the servers)."""
    def counts(key: str) -> list[int]:
        return [v for s in servers if isinstance(s, dict) and type(v := s.get(key)) is int and v > 0]

    ws, cap = counts("working_set_tokens"), counts("device_cache_tokens")
    if not ws or not cap or min(cap) <= 0:
        return ""
    w, c = max(ws), min(cap)
    if w <= c:
        return f"the working set ({w:,} tokens) fits the device cache ({c:,} tokens)"
    return f"the working set ({w:,} tokens) is {w / c:.{1 if w / c >= 1.1 else 3}f}x the device cache ({c:,} tokens)"


def tier_hits(warm: pd.DataFrame, servers: Sequence[dict[str, Any]], engine: str, label: str
              ) -> tuple[float | None, str]:
    """What a tier mode's own counters say it served: ``(amount, what)``, amount None where nothing of the tier's
    was read. Per request, Σ ``tier_hit_tokens`` of ``warm`` (llama.cpp); else, over the mode's servers in
    ``servers`` (run.json), Σ of the kind's :attr:`~kvbench.serving.kind.ServerKind.tier_counters` in their
    ``metrics_delta``."""
    if "tier_hit_tokens" in warm:
        hits = pd.to_numeric(warm["tier_hit_tokens"], errors="coerce")
        hits = hits[hits >= 0]
        if hits.notna().any():
            n = int(hits.notna().sum())
            return float(hits.sum()), (f"{hits.sum():,.0f} prompt tokens served by the tier over {n} "
                                       f"request{'s' if n != 1 else ''}")
    # a server kvbench did not start has its /metrics read with whichever kind's names it exports
    names = (KINDS[engine].tier_counters if engine in KINDS and KINDS[engine].started else
             {n for k in KINDS.values() for n in k.tier_counters})
    read: dict[str, float] = {}
    for srv in _servers_of(servers, label):
        deltas = srv.get("metrics_delta")
        for name, v in (deltas.items() if isinstance(deltas, dict) else ()):
            if name in names and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
                    and v >= 0:
                read[name] = read.get(name, 0.0) + float(v)
    if not read:
        return None, ""
    return sum(read.values()), ", ".join(f"{k} {v:,.0f}" for k, v in read.items())


def tier_not_engaged(warm: pd.DataFrame, servers: Sequence[dict[str, Any]], engine: str, label: str) -> str:
    """``""`` when tier mode ``label`` served something from its own tier (:func:`tier_hits` above 0), else why
    it has no tier verdict, with the token arithmetic of its servers where run.json has it
    (:func:`capacity_text`): ``"not engaged: its tier served nothing (0 prompt tokens served by the tier over 9
    requests); the working set (4,200 tokens) fits the device cache (8,448 tokens)"``, or ``"not measured: ..."``
    where nothing of the tier's was read (a server whose replies and ``/metrics`` say nothing per tier).
    Negative, non-finite or non-numeric readings (an edited file) count as not read."""
    amount, what = tier_hits(warm, servers, engine, label)
    if amount is not None and amount > 0:
        return ""
    arithmetic = capacity_text(_servers_of(servers, label))
    if amount is None:
        return ("not measured: the tier's own counters were not read (no per-request tier hits, no tier counter in "
                "/metrics), so whether it served anything is unknown") + (f"; {arithmetic}" if arithmetic else "")
    return f"not engaged: its tier served nothing ({what})" + (f"; {arithmetic}" if arithmetic else "")


def tier_later_turns(trials: pd.DataFrame, servers: Sequence[dict[str, Any]] = (), from_turn: int = 2
                     ) -> pd.DataFrame:
    """Per group × server tier mode, its TTFT against its tier saving's baseline (the engine's prefix-cache mode
    at the same concurrency: :func:`baseline_label`) from turn ``from_turn`` on, paired by request: ``group``,
    ``mode_label``, ``baseline`` and the columns of :func:`kvbench.analysis.reuse.paired_ttft`, whose verdict is
    "not engaged" where the tier's own counters did not move (:func:`tier_not_engaged`). Empty without tier
    modes."""
    rows = reuse_trials(trials)
    if rows.empty or "engine" not in rows or "turn_index" not in rows:
        return pd.DataFrame()
    rows = rows[rows["status"].isin(MEASURED) & rows["engine"].notna() & rows["warm"].astype(bool)
                & (pd.to_numeric(rows["turn_index"], errors="coerce") >= from_turn)]
    out = []
    for (group, mode), part in rows.groupby(["group", "mode_label"], sort=False):
        engine = str(part["engine"].iloc[0])
        base = baseline_label(rows, part) if tier_of(engine, part["mode"].iloc[0]) else None
        if base is None:
            continue
        ref = rows[(rows["group"] == group) & (rows["mode_label"] == base)]
        out.append({"group": group, "mode_label": mode, "baseline": base,
                    **paired_ttft(part, ref, tier_not_engaged(part, servers, engine, str(mode)))})
    return pd.DataFrame(out)


__all__ = ["baseline_label", "capacity_text", "tier_hits", "tier_later_turns", "tier_not_engaged", "tier_of"]
