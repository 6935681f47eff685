"""The verdicts of ``kvbench cost`` as plain-language lines and table cells: per prompt length every decided saving
against ``none`` (never hidden behind an undecided cheaper median), and per reuse mode its saving against the
baseline it is taken from (``none`` for the *reuse saving*, the same engine's prefix-cache mode for a host or disk
tier's *tier saving*)."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from kvbench.analysis.intervals import pct_interval

#: What a row of :func:`kvbench.analysis.reuse_cost.reuse_cost` is taken against when it does not say (rows of a
#: kvbench before tier savings): the column and its value.
BASELINE_DEFAULTS = {"baseline": "none", "saving_kind": "reuse"}


def with_baselines(reuse: pd.DataFrame) -> pd.DataFrame:
    """``reuse`` (rows of :func:`kvbench.analysis.reuse_cost.reuse_cost`) with its ``baseline`` and
    ``saving_kind`` columns: where a column is missing or a cell empty, ``"none"`` and ``"reuse"``
    (:data:`BASELINE_DEFAULTS`). A copy; the columns follow ``mode_label`` when they were added here."""
    out = reuse.copy()
    for col, default in BASELINE_DEFAULTS.items():
        if col in out:
            out[col] = out[col].where(out[col].notna() & (out[col].astype(str) != ""), default)
        elif "mode_label" in out:
            out.insert(list(out.columns).index("mode_label") + 1 + (col == "saving_kind"), col, default)
        else:
            out[col] = default
    return out


def baseline_cell(baseline: str, kind: str) -> str:
    """The ``vs`` cell of a saving: ``none`` for a reuse saving, ``prefix-cache (tier)`` for a tier saving."""
    return baseline if kind == "reuse" else f"{baseline} ({kind})"


#: A verdict's reason (:func:`kvbench.analysis.intervals.judge`, the engagement gate) → its words in a table cell.
_SHORT = ((re.compile(r"the machine's load is unknown for (\d+ of \d+) trials.*"), r"load unknown in \1 trials"),
          (re.compile(r"the machine was busy during (\d+ of \d+) trials"), r"busy in \1 trials"),
          (re.compile(r"the interval includes no change"), "interval includes 0"),
          (re.compile(r"^implausible against the plan: "), "implausible: "),
          (re.compile(r"^(not engaged): .*"), r"\1"))


def short_verdict(why: Any) -> str:
    """A verdict's reason in the few words of a table cell (the lines below the table say it whole):
    ``inconclusive: busy in 5 of 10 trials``, ``inconclusive: load unknown in 10 of 10 trials``,
    ``inconclusive: interval includes 0``, ``implausible: check for noise``, ``not engaged``; other reasons as
    they are, less a trailing parenthesis."""
    text = str(why)
    for pattern, words in _SHORT:
        text = pattern.sub(words, text)
    return re.sub(r" \([^()]*\)$", "", text)


def verdict_text(why: Any, saving_pct: float) -> str:
    """A saving's verdict in full: ``lowers cost`` or ``raises cost`` when its pairs decide (``why`` is ``""``),
    else why not, as given."""
    return ("lowers cost" if saving_pct > 0 else "raises cost") if why == "" else str(why)


def verdict_cell(why: Any, saving_pct: float) -> str:
    """The ``verdict`` cell of a saving: :func:`verdict_text`, a reason in a few words (:func:`short_verdict`);
    ``-`` without a saving (nothing qualified)."""
    if saving_pct != saving_pct or why is None or why != why:
        return "-"
    return verdict_text(why, saving_pct) if why == "" else short_verdict(why)


def _n(c: Any, nb: int) -> str:
    pairs = int(c["pairs"])
    return f"{pairs} pair{'s' if pairs != 1 else ''}, batch {int(c['batch_size'])} vs none's {nb}"


def verdicts(costs: pd.DataFrame) -> dict[str, list[str]]:
    """Plain-language lines per group of :func:`kvbench.analysis.cost.cost_table`: at each prompt length, one
    line for every offload mode whose paired saving against ``none`` is decided
    (:func:`kvbench.analysis.intervals.judge`: ≥ 5 pairs, a quiet machine, an interval that excludes no change,
    plausible against the plan), "lowers cost" ones first, the largest saving first; then, when the cheapest
    among the modes that engaged (by that paired price) is undecided, its line saying why; then the decided "raises
    cost" ones (the cheapest worded "offload raises cost here" when no mode is cheaper). Each line gives the paired
    saving with its interval and pair count and the mode's price as ``none``'s less that paired saving, so both figures
    of a line agree. Modes that held no KV off the device are named as not engaged, not compared; a prompt length
    where nothing qualified, or ``none`` has no cost, says so."""
    out: dict[str, list[str]] = {}
    for (group, prompt), part in costs.groupby(["group", "prompt_tokens"], sort=False):
        lines = out.setdefault(group, [])
        ok = part.dropna(subset=["usd_per_million"])
        none = part[part["mode"] == "none"]
        if ok.empty:
            lines.append(f"at {prompt} tokens no mode qualified")
            continue
        best = ok.loc[ok["usd_per_million"].idxmin()]
        if none.empty or none["usd_per_million"].isna().all():
            why = none["why"].iloc[0] if len(none) else "not run"
            lines.append(f"at {prompt} tokens `none` has no cost ({why}); `{best['mode_label']}` costs "
                         f"{best['usd_per_million']:,.2f} USD per 1M tokens at batch {int(best['batch_size'])}")
            continue
        base, nb = none["usd_per_million"].iloc[0], int(none["batch_size"].iloc[0])
        offload = ok[ok["mode"] != "none"]
        if offload.empty:
            lines.append(f"at {prompt} tokens only `none` qualified: {base:,.2f} USD per 1M tokens")
            continue
        idle = offload["cost_verdict"].fillna("").str.startswith("not engaged")
        if idle.all():
            names = ", ".join(f"`{m}`" for m in offload["mode_label"])
            lines.append(f"at {prompt} tokens no offload mode engaged ({names}: no KV left the device): `none` "
                         f"{base:,.2f} USD per 1M tokens")
            continue
        if idle.any():  # a mode that offloaded nothing is `none` under another name: not the one to compare
            lines.append(f"at {prompt} tokens not engaged, so not compared: "
                         + ", ".join(f"`{m}`" for m in offload.loc[idle, "mode_label"]))
        offload = offload[~idle]
        # what the lines show
        offload = offload.assign(_paired=offload.apply(lambda c, base=base: _paired(base, c), axis=1))
        cheapest = offload["_paired"].idxmin()
        decided = offload[offload["cost_verdict"] == ""]
        lower = decided[decided["saving_pct"] > 0].sort_values("saving_pct", ascending=False, kind="stable")
        raise_ = decided[~(decided["saving_pct"] > 0)].sort_values("_paired", kind="stable")
        for _, c in lower.iterrows():
            lines.append(f"at {prompt} tokens `{c['mode_label']}` lowers cost to {c['_paired']:,.2f} USD per "
                         f"1M tokens from none's {base:,.2f} (paired saving {_saving(c)}; {_n(c, nb)})")
        c = offload.loc[cheapest]
        if c["cost_verdict"]:
            lines.append(f"at {prompt} tokens {c['cost_verdict']}: `{c['mode_label']}` {c['_paired']:,.2f} vs "
                         f"`none` {base:,.2f} USD per 1M tokens, paired saving {_saving(c)} ({_n(c, nb)})")
        for i, c in raise_.iterrows():
            raised = pct_interval(-c["saving_pct"], -c["saving_ci_high"], -c["saving_ci_low"])
            if i == cheapest:
                lines.append(f"at {prompt} tokens offload raises cost here: `none` {base:,.2f} USD per 1M tokens, "
                             f"the cheapest offload mode `{c['mode_label']}` {c['_paired']:,.2f} (paired cost "
                             f"{raised}; {_n(c, nb)})")
            else:
                lines.append(f"at {prompt} tokens `{c['mode_label']}` raises cost to {c['_paired']:,.2f} USD "
                             f"per 1M tokens from none's {base:,.2f} (paired cost {raised}; {_n(c, nb)})")
    return out


def _saving(c: Any) -> str:
    return pct_interval(c["saving_pct"], c["saving_ci_low"], c["saving_ci_high"])


def quiet_note(r: Any) -> str:
    """`` (1 quiet)`` where a comparison's busy pairs set no figure and ``pairs_figure`` quiet ones did, else ``""``:
    its throughputs, costs and saving are those pairs' trials."""
    used = r.get("pairs_figure")
    return f" ({int(used)} quiet)" if used is not None and used == used and 0 < used < r["pairs"] else ""


def _paired(base: float, c: Any) -> float:
    """The mode's price as its pairs put it (none's × (1 − paired saving)): the two modes' medians need not imply
    the paired saving, so a line shows the paired figure on both sides."""
    return base * (1 - c["saving_pct"] / 100) if c["saving_pct"] == c["saving_pct"] else c["usd_per_million"]


def _units(r: dict[str, Any]) -> str:
    """``15 pairs from 5 conversations`` (``15 request pairs`` where the pairs are their own units)."""
    pairs = int(r["pairs"])
    text = f"{pairs} request pair{'s' if pairs != 1 else ''}"
    units, unit = r.get("units"), str(r.get("unit") or "")
    if units is None or units != units or unit in ("", "pairs"):
        return text
    name = unit if int(units) != 1 else (unit.removesuffix("es") if unit.endswith("xes") else unit.removesuffix("s"))
    return f"{text} from {int(units)} {name}"


def mode_in_cell(r: dict[str, Any]) -> str:
    """A reuse row's mode label, with its break-even map cell where it has one: ``full (256 tokens, 80% shared, 5
    prefixes)``."""
    cell = r.get("cell")
    return str(r["mode_label"]) + (f" ({cell})" if isinstance(cell, str) and cell else "")


def reuse_verdicts(reuse: pd.DataFrame) -> list[str]:
    """One line per row of :func:`kvbench.analysis.reuse_cost.reuse_cost` (a group × mode × baseline), naming what
    the saving is taken against: a reuse saving (restoring stored KV against ``none`` recomputing every prompt),
    or a tier saving (a host or disk tier mode against the same engine's prefix-cache mode: the figure for a user
    with prefix caching already on); with the saving's interval, the pairs and the units they come from, and what
    was charged beside the device; "lowers" or "raises" only when the pairs decide, else why not. Rows without
    ``baseline`` / ``saving_kind`` (an older kvbench) are reuse savings against ``none``."""
    lines = []
    for r in with_baselines(reuse).to_dict("records"):
        saving = pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1)
        held = (f"; held beside the device: {r['charged']} ({r['charged_from']})"
                if r.get("charged") not in (None, "none")
                else f"; {r['charged_from']}" if "not charged" in str(r.get("charged_from") or "") else "")
        figure = f"{r['saving_kind']} saving vs {r['baseline']}: {saving}, {_units(r)}{held}"
        mine, theirs = r["restore_usd_per_million"], r["recompute_usd_per_million"]
        tier = r["saving_kind"] != "reuse"
        if r["saving_verdict"]:
            sides = (f"{mine:,.2f} vs `{r['baseline']}` {theirs:,.2f}" if tier else
                     f"restore {mine:,.2f} vs recompute {theirs:,.2f}")
            lines.append(f"{r['group']}: `{mode_in_cell(r)}` {r['saving_verdict']}: {sides} USD per 1M tokens "
                         f"({figure})")
        else:
            what = "lowers" if r["saving_pct"] > 0 else "raises"
            lead = f"its tier {what} the cost" if tier else f"restoring stored KV {what} the cost"
            lines.append(f"{r['group']}: `{mode_in_cell(r)}` {lead} to {mine:,.2f} USD per 1M tokens from "
                         + (f"`{r['baseline']}`'s" if tier else "recomputing's") + f" {theirs:,.2f} ({figure})")
    return lines


__all__ = ["BASELINE_DEFAULTS", "baseline_cell", "mode_in_cell", "quiet_note", "reuse_verdicts", "short_verdict",
           "verdict_cell", "verdict_text", "verdicts", "with_baselines"]
