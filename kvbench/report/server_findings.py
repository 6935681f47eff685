"""The findings of a server run (``engine`` other than transformers): per mode (a server configuration) how much
of the reusable history the server's cache reused, whether cold starts were verified cold, how often its outputs
equal ``none``'s, the ``/metrics`` counter deltas, and "hit rate up, latency flat"."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from kvbench.report.format import missing, ratio_interval
from kvbench.results.rows import MEASURED

#: A mode whose cached share is at least this, but whose TTFT is not clearly lower than recompute, is flagged.
HIT_SHARE_FLAG = 0.5
#: ... when its TTFT ÷ ``none``'s (median over the request pairs) is still above this.
FLAT_RATIO = 0.9


def server_rows(trials: pd.DataFrame, group: str) -> pd.DataFrame:
    """The measured server rows of ``group`` (empty when it is no server run)."""
    if "engine" not in trials:
        return trials.iloc[0:0]
    rows = trials[(trials["group"] == group) & trials["engine"].notna()]
    return rows[rows["status"].isin(MEASURED)]


def _share(num: pd.Series, den: pd.Series) -> float | None:
    n, d = pd.to_numeric(num, errors="coerce"), pd.to_numeric(den, errors="coerce")
    ok = n.notna() & d.notna()
    return float(n[ok].sum() / d[ok].sum()) if ok.any() and d[ok].sum() > 0 else None


def server_findings(trials: pd.DataFrame, group: str, later: pd.DataFrame | None, servers: list[dict[str, Any]]
                    ) -> list[str]:
    """The lines of a server group's findings (see the module docstring). ``later``:
    :func:`kvbench.analysis.reuse.reuse_later_turns`; ``servers``: the run's ``servers`` (run.json)."""
    rows = server_rows(trials, group)
    if rows.empty:
        return []
    out = []
    pooled = {} if later is None or later.empty else {
        r["mode_label"]: r for r in later[later["group"] == group].to_dict("records")}
    for mode, part in rows.groupby("mode_label", sort=False):
        kind = part["mode"].iloc[0]
        cached = pd.to_numeric(part.get("cached_prompt_tokens"), errors="coerce")
        if cached.isna().all():
            out.append(f"`{mode}`: the server reported no cached prompt tokens")
            continue
        turn = pd.to_numeric(part["turn_index"], errors="coerce")
        reusable = part[(pd.to_numeric(part["reusable_prompt_tokens"], errors="coerce") > 0) & (turn >= 2)]
        history = _share(reusable["cached_prompt_tokens"], reusable["reusable_prompt_tokens"])
        least = (pd.to_numeric(reusable["cached_prompt_tokens"], errors="coerce")
                 / pd.to_numeric(reusable["reusable_prompt_tokens"], errors="coerce")).min()
        if kind == "none":
            hits = int((cached > 0).sum())
            out.append(f"`{mode}`: {'0 cached prompt tokens on every one of' if not hits else f'{hits} of'} "
                       f"{len(part)} requests{' reused cached tokens: contaminated, not used as the reference' if hits else ' (checked)'}")
        elif history is not None:
            out.append(f"`{mode}`: from turn 2 on reused {100 * history:.0f}% of what earlier turns held "
                       f"({len(reusable)} requests; the least {100 * least:.0f}%); "
                       f"{100 * _share(part['cached_prompt_tokens'], part['prompt_tokens']):.0f}% of all prompt "
                       "tokens came from the cache")
        p = pooled.get(mode)
        if kind != "none" and p is not None and not missing(p["ttft_ratio"]):
            ratio = ratio_interval(p["ttft_ratio"], p["ttft_ratio_ci_low"], p["ttft_ratio_ci_high"])
            out.append(f"`{mode}`: TTFT ÷ `none`'s from turn 2 on: {ratio} over {int(p['pairs'])} request pairs"
                       f"{': ' + p['ttft_verdict'] if p['ttft_verdict'] else ''}")
            if history is not None and history >= HIT_SHARE_FLAG and p["ttft_ratio"] > FLAT_RATIO:
                out.append(f"`{mode}`: hit rate up, latency flat: {100 * history:.0f}% of the history came from "
                           "the cache but TTFT did not clearly drop (prefill is not what limits TTFT here, or the "
                           "restore costs what recompute does)")
        if kind != "none":
            out.append(_matches(mode, part))
    cold = rows["cold_verified"] if "cold_verified" in rows else pd.Series(dtype=object)
    checked = cold.dropna()
    if len(checked):
        bad = int((~checked.astype(bool)).sum())
        unchecked = max(0, len(servers) - len(checked))
        out.append(f"cold starts: {len(checked) - bad} of {len(checked)} mode starts answered their first request "
                   f"with 0 cached tokens" + (f"; {bad} did not: those modes began warm (a server kvbench did not "
                                              "restart or reset)" if bad else "")
                   + (f"; {unchecked} more servers were not checked (a resumed mode, its cache refilled first, or "
                      "one whose requests all failed)" if unchecked else ""))
    out += _counter_lines(servers)
    return out


def _matches(mode: str, part: pd.DataFrame) -> str:
    """How many of a mode's requests generated ``none``'s ids, and where the others first diverged."""
    m = part["tokens_match"]
    compared = m.dropna()
    if compared.empty:
        return f"`{mode}`: no request could be compared with `none`"
    same = int(compared.astype(bool).sum())
    if same == len(compared):
        return f"`{mode}`: every request ({same}) generated the same ids as `none`"
    steps = Counter(int(s) for s in part.loc[m.eq(False), "first_divergence_step"].dropna())
    where = (" (first differing token at " + ", ".join(
        f"step {k}" + (f" in {n} requests" if n > 1 else "") for k, n in sorted(steps.items())) + ")") if steps else ""
    return (f"`{mode}`: {len(compared) - same} of {len(compared)} requests generated other ids than `none`"
            f"{where}: the server's cached and recomputed prompts are not bit-identical, a finding about the "
            "engine, not an error of kvbench")


def _counter_lines(servers: list[dict[str, Any]]) -> list[str]:
    """Per mode, the ``/metrics`` deltas of its measured requests summed over its repeats (a counter any server did
    not report: "not reported"), and its unrecorded holds' own share; where a hold overlapped another request its
    share could not be taken out, and the line says the deltas include the holds."""
    by_mode: dict[str, dict[str, float | None]] = {}
    holds: dict[str, dict[str, float | None]] = {}
    counted: dict[str, list[int]] = {}
    mixed: dict[str, list[int]] = {}
    legacy: set[str] = set()
    for srv in servers:
        mode = str(srv.get("mode_label"))
        deltas = srv.get("metrics_delta") or {}
        n = counted.setdefault(mode, [0, 0])
        n[1] += 1
        if not deltas:
            continue  # a server killed, or one whose /metrics could not be read
        n[0] += 1
        if "metrics_holds" not in srv:  # an older kvbench's run: its deltas include the holds, uncounted
            legacy.add(mode)
        sent = (srv.get("metrics_holds") or {}).get("sent", 0)
        separated = (srv.get("metrics_holds") or {}).get("separated", sent)
        m = mixed.setdefault(mode, [0, 0])
        m[0], m[1] = m[0] + sent - separated, m[1] + sent
        _add(by_mode.setdefault(mode, {}), deltas)
        if srv.get("metrics_delta_holds") is not None:
            _add(holds.setdefault(mode, {}), srv["metrics_delta_holds"])
    out = []
    for mode, acc in by_mode.items():
        shown = _shown(acc)
        if not shown:
            continue
        read, total = counted[mode]
        of = f" ({read} of its {total} servers: the others' counters could not be read)" if read < total else ""
        overlapped, sent = mixed[mode]
        if mode in legacy:
            out.append(f"`{mode}` /metrics deltas over its servers, its unrecorded holds included (a run of an older "
                       f"kvbench, which did not read them apart): {shown}{of}")
            continue
        if overlapped:
            out.append(f"`{mode}` /metrics deltas over its servers, including {overlapped} of its {sent} unrecorded "
                       f"holds (sent while other requests were in flight, so their share cannot be taken out): "
                       f"{shown}{of}")
            continue
        own = f"; its {sent} unrecorded holds: {_shown(holds[mode])}" if sent and holds.get(mode) else ""
        out.append(f"`{mode}` /metrics deltas of its measured requests over its servers: {shown}{own}{of}")
    return out


def _add(acc: dict[str, float | None], deltas: dict[str, float | None]) -> None:
    """Sum ``deltas`` into ``acc`` (a counter None anywhere stays None)."""
    for name, v in deltas.items():
        acc[name] = None if v is None or (name in acc and acc[name] is None) else acc.get(name, 0.0) + v


def _shown(acc: dict[str, float | None]) -> str:
    """The prompt-token and cache counters of ``acc`` as text."""
    return ", ".join(f"{k} {'not reported' if v is None else f'{v:,.0f}'}" for k, v in acc.items()
                     if k.startswith(("prompt_tokens", "cached_tokens", "prefix_cache", "external_prefix")))
