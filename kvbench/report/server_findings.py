"""The findings of a server run (``engine`` other than transformers): per mode (a server configuration) how much
of the reusable history the server's cache reused, whether cold starts were verified cold, how often its outputs
equal ``none``'s (a lossy preset: its KL lower bound beside the lossless reuse presets', the floor, and where its
ids first differ), the ``/metrics`` counter deltas, and "hit rate up, latency flat"."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

from kvbench.analysis.tier import tier_later_turns
from kvbench.report.format import missing, ratio_interval
from kvbench.results.rows import MEASURED
from kvbench.scenario.servers import PRESETS

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


def tier_lines(tiers: pd.DataFrame, group: str) -> list[str]:
    """One line per host or disk tier mode of ``group`` in ``tiers``
    (:func:`kvbench.analysis.tier.tier_later_turns`): its TTFT against its tier saving's baseline, the same
    engine's prefix-cache mode, with the interval, pairs and verdict ("not engaged" where its tier served
    nothing)."""
    if tiers is None or tiers.empty:
        return []
    out = []
    for r in tiers[tiers["group"] == group].to_dict("records"):
        ratio = ratio_interval(r["ttft_ratio"], r["ttft_ratio_ci_low"], r["ttft_ratio_ci_high"])
        out.append(f"`{r['mode_label']}`: its tier on top of prefix caching, TTFT ÷ `{r['baseline']}`'s (the same "
                   f"server, tier off) from turn 2 on: {ratio} over {int(r['pairs'])} request pairs"
                   + (f": {r['ttft_verdict']}" if r["ttft_verdict"] else
                      (": the tier is faster" if r["ttft_ratio"] < 1 else ": the tier is slower")))
    return out


def server_findings(trials: pd.DataFrame, group: str, later: pd.DataFrame | None, servers: list[dict[str, Any]]
                    ) -> list[str]:
    """The lines of a server group's findings (see the module docstring). ``later``:
    :func:`kvbench.analysis.reuse.reuse_later_turns`; ``servers``: the run's ``servers`` (run.json); a host or
    disk tier mode also gets its TTFT against the prefix-cache mode (:func:`tier_lines`)."""
    rows = server_rows(trials, group)
    if rows.empty:
        return []
    out = tier_lines(tier_later_turns(trials, servers), group)
    pooled = {} if later is None or later.empty else {
        r["mode_label"]: r for r in later[later["group"] == group].to_dict("records")}
    floors = {mode: kl.median() for mode, part in rows.groupby("mode_label", sort=False)
              if not (kl := _numbers(part, "floor_kl_mean")).empty}
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
                       f"{len(part)} requests"
                       f"{' reused cached tokens: contaminated, not used as the reference' if hits else ' (checked)'}")
        elif history is not None:
            out.append(f"`{mode}`: from turn 2 on reused {100 * history:.0f}% of what earlier turns held "
                       f"({len(reusable)} requests; the least {100 * least:.0f}%); "
                       f"{100 * _share(part['cached_prompt_tokens'], part['prompt_tokens']):.0f}% of all prompt "
                       "tokens came from the cache"
                       + ("; over 100%: the server also matched tokens the conversation's earlier turns did not "
                          "send (another conversation's or an earlier mode's prompt with the same start: see the "
                          "cold-start check)" if history > 1 else ""))
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
            out.append(_quality(mode, part, floors) or _matches(mode, part))
            if mode in floors:
                out.append(_floor(mode, part))
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
    probes = [s["cold_probe"] for s in servers if isinstance(s.get("cold_probe"), dict)]
    if probes:
        emptied = sum(1 for p in probes if p.get("verified") is True)
        out.append(f"cache resets: {emptied} of {len(probes)} servers found 0 cached tokens for the warm-up prompt "
                   f"sent again after {probes[0].get('reset_path')} (the probe, not the reset's reply, says so)"
                   + ("" if emptied == len(probes) else f"; {len(probes) - emptied} did not: their reset left the "
                      "warm-up's KV behind"))
    blocks = sorted({s["cache_block_tokens"] for s in servers if isinstance(s.get("cache_block_tokens"), int)})
    if blocks:
        out.append(f"cached prompt tokens come in whole KV blocks of {', '.join(map(str, blocks))} tokens (the "
                   "server's block size): a prompt's last partial block is always recomputed")
    out += _counter_lines(servers)
    return out


#: What the presets themselves set (their request keys and flags): a mode that sets only these changes the
#: server's cache, not what it generates.
CACHE_OPTIONS = frozenset(k for reg in PRESETS.values() for p in reg.values() for k in p.request)
CACHE_FLAGS = frozenset(a for reg in PRESETS.values() for p in reg.values() for a in p.args if a.startswith("-"))


def own_options(options: Any) -> list[str]:
    """The options a server mode sets beyond its preset that may change its outputs (a row's ``mode_options``:
    ``request`` keys and ``args`` flags other than the cache options every preset uses, :data:`CACHE_OPTIONS`
    and :data:`CACHE_FLAGS`), as text: ``request repeat_penalty: 1.5``, ``args --top-p 0.5``."""
    if not isinstance(options, dict):
        return []
    out = [f"request {k}: {v}" for k, v in (options.get("request") or {}).items() if k not in CACHE_OPTIONS]
    args = [str(a) for a in options.get("args") or []]
    for i, a in enumerate(args):
        if a.startswith("-") and a.split("=", 1)[0] not in CACHE_FLAGS:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else ""
            out.append(f"args {a} {value}".rstrip())
    return out


def _numbers(part: pd.DataFrame, col: str) -> pd.Series:
    """A column of ``part`` as numbers without the missing ones (empty where ``part`` has no such column)."""
    return pd.to_numeric(part[col], errors="coerce").dropna() if col in part else pd.Series(dtype=float)


def _method(part: pd.DataFrame) -> str:
    """How the KL of a mode's requests was taken (its rows' ``kl_method``)."""
    return next((m for m in part.get("kl_method", []) if isinstance(m, str)), "")


def _quality(mode: str, part: pd.DataFrame, floors: dict[str, float]) -> str | None:
    """A lossy preset's quality against ``none`` (its ids differ by design: not an exactness finding): its KL, a
    lower bound from the server's top-k log-probabilities, beside the lossless reuse presets' (``floors``: mode →
    median ``floor_kl_mean``, nats); where its greedy ids first leave ``none``'s and the share of steps before
    that; or None for a mode without quality columns."""
    kl = _numbers(part, "kl_mean")
    if kl.empty:
        return None
    worst = _numbers(part, "kl_max").max()
    floor = "".join(f"; floor: `{m}` (lossless reuse) ≥ {v:.3g}" for m, v in floors.items())
    steps = _numbers(part, "first_divergence_step")
    compared = int(part["tokens_match"].notna().sum()) if "tokens_match" in part else 0
    never = compared - len(steps)
    where = (f"first differing id at step {steps.median():g} (median over the {len(steps)} requests that differ"
             + (f"; {never} of {compared} never do)" if never else "; every one does)") if len(steps) else
             f"no differing id in {compared} requests")
    before = _numbers(part, "agreement_to_divergence")
    share = (f"; {before.median():.0%} of steps before a request's first differing id (median over "
             f"{len(before)})") if len(before) and len(steps) else ""
    return (f"`{mode}` (lossy): KL(none ‖ mode) ≥ {kl.median():.3g} nats median over {len(kl)} requests (largest "
            f"≥ {worst:.3g}; {_method(part)}{floor}); {where}{share}")


def _floor(mode: str, part: pd.DataFrame) -> str:
    """A lossless reuse preset's own KL against ``none`` (``floor_kl_mean``, nats): the floor of the lossy
    presets'."""
    kl = _numbers(part, "floor_kl_mean")
    return (f"`{mode}` (lossless reuse): KL(none ‖ mode) ≥ {kl.median():.3g} nats median over {len(kl)} requests "
            f"(largest ≥ {_numbers(part, 'floor_kl_max').max():.3g}; {_method(part)}): the floor a lossy preset's "
            "KL is read against (the server's cached and recomputed prompts are not bit-identical)")


def _matches(mode: str, part: pd.DataFrame) -> str:
    """How many of a mode's requests generated ``none``'s ids, where the others first diverged, and why: the mode's
    own output-changing options (:func:`own_options`), else the server's cache where those requests reused cached
    tokens, else not the cache."""
    m = part["tokens_match"]
    compared = m.dropna()
    if compared.empty:
        return f"`{mode}`: no request could be compared with `none`"
    same = int(compared.astype(bool).sum())
    if same == len(compared):
        return f"`{mode}`: every request ({same}) generated the same ids as `none`"
    differ = part[m.eq(False)]
    steps = Counter(int(s) for s in differ["first_divergence_step"].dropna())
    where = (" (first differing token at " + ", ".join(
        f"step {k}" + (f" in {n} requests" if n > 1 else "") for k, n in sorted(steps.items())) + ")") if steps else ""
    head = f"`{mode}`: {len(compared) - same} of {len(compared)} requests generated other ids than `none`{where}"
    cached = pd.to_numeric(differ.get("cached_prompt_tokens"), errors="coerce")
    reused = f"{int(cached.fillna(0).sum()):,} cached prompt tokens"
    options = own_options(next((o for o in part.get("mode_options", []) if isinstance(o, dict)), None))
    if options:
        return (f"{head}: the mode sets its own options ({', '.join(options)}), which change what it generates: "
                f"its outputs differ because of them, not because of the cache (those requests reused {reused})")
    if not (cached > 0).any():
        return (f"{head}: not the cache's doing: those requests reused 0 cached prompt tokens (the server's outputs "
                "vary between runs of the same prompt, e.g. with concurrent batching)")
    return (f"{head}: the server's cached and recomputed prompts are not bit-identical, a finding about the "
            "engine, not an error of kvbench")


def _counter_lines(servers: list[dict[str, Any]]) -> list[str]:
    """Per mode, the ``/metrics`` deltas of its measured requests summed over its repeats (a counter with no delta
    on some server: why, as run.json's ``metrics_notes`` says, e.g. "went down from 900 to 800 (the server
    restarted?)"; "not reported" where it says nothing), and its unrecorded holds' own share; where a hold
    overlapped another request its share could not be taken out, and the line says the deltas include the holds."""
    by_mode: dict[str, dict[str, float | None]] = {}
    holds: dict[str, dict[str, float | None]] = {}
    notes: dict[str, dict[str, list[str]]] = {}
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
        why = srv.get("metrics_notes") or {}
        for name, v in deltas.items():
            if v is None and why.get(name):
                notes.setdefault(mode, {}).setdefault(name, []).append(str(why[name]))
        if srv.get("metrics_delta_holds") is not None:
            _add(holds.setdefault(mode, {}), srv["metrics_delta_holds"])
    out = []
    for mode, acc in by_mode.items():
        shown = _shown(acc, notes.get(mode, {}), counted[mode][0])
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


def _shown(acc: dict[str, float | None], notes: dict[str, list[str]] | None = None, servers: int = 1) -> str:
    """The prompt-token and cache counters of ``acc`` as text; a None one with why (``notes``: per counter, one
    note per server whose delta of it is None, of the ``servers`` read), else "not reported"."""
    def text(name: str, v: float | None) -> str:
        if v is not None:
            return f"{name} {v:,.0f}"
        why = list(dict.fromkeys((notes or {}).get(name, [])))
        if not why:
            return f"{name} not reported"
        n = len((notes or {})[name])
        return f"{name}: {'; '.join(why)}" + (f" (on {n} of its {servers} servers)" if n < servers else "")

    return ", ".join(text(k, v) for k, v in acc.items()
                     if k.startswith(("prompt_tokens", "cached_tokens", "prefix_cache", "external_prefix")))
