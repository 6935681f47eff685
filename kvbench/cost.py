"""``kvbench cost``: USD per million generated tokens from measured throughput (or what-if figures), the saving
against ``none``, and what it is worth per month.

Cost per 1M generated tokens = GPU price per hour ÷ (tokens/s × 3600) × 10^6 (:func:`kvbench.plan.cost_per_million`),
plus, with a host price, the host and disk KV a mode held: host price per GiB-hour × GiB ÷ (tokens/s × 3600) × 10^6.
Memory turns into money only through throughput or a price the user gives: no invented USD per GB.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.analysis import qualifies
from kvbench.plan import cost_per_million

GIB = 2**30


@dataclass(frozen=True)
class Prices:
    """What the user pays and plans.

    Attributes:
        gpu_per_hour: USD per GPU-hour (> 0).
        host_per_gib_hour: USD per GiB-hour of host memory or disk held by KV (≥ 0; default 0).
        tokens_per_month: generated tokens per month, for the monthly saving (optional).
        engineering_cost: USD to build and run offload, for the payback time (optional).
    """

    gpu_per_hour: float
    host_per_gib_hour: float = 0.0
    tokens_per_month: float | None = None
    engineering_cost: float | None = None

    def __post_init__(self) -> None:
        def bad(v: float | None, low: float, strict: bool) -> bool:
            return v is not None and not (math.isfinite(v) and (v > low if strict else v >= low))

        if bad(self.gpu_per_hour, 0, True):
            raise ValueError(f"--gpu-price must be a finite number above 0 USD per hour, not {self.gpu_per_hour}")
        if bad(self.host_per_gib_hour, 0, False):
            raise ValueError(f"--host-price must be 0 or more USD per GiB-hour (finite), not {self.host_per_gib_hour}")
        if bad(self.tokens_per_month, 0, True):
            raise ValueError(f"--tokens-per-month must be a finite number above 0, not {self.tokens_per_month}")
        if bad(self.engineering_cost, 0, False):
            raise ValueError(f"--engineering-cost must be 0 or more USD (finite), not {self.engineering_cost}")
        if self.engineering_cost is not None and self.tokens_per_month is None:
            raise ValueError("--engineering-cost needs --tokens-per-month: the payback is cost ÷ saving per month")

    def per_million(self, tokens_per_s: float, host_bytes: float = 0.0) -> float:
        """USD per 1M generated tokens at ``tokens_per_s``, with ``host_bytes`` of host/disk KV charged."""
        gpu = cost_per_million(self.gpu_per_hour, tokens_per_s)
        return gpu + self.host_per_gib_hour * (host_bytes / GIB) / (tokens_per_s * 3600) * 1e6

    def monthly_saving(self, base: float, other: float) -> float | None:
        """USD saved per month at ``tokens_per_month`` when the cost per 1M goes from ``base`` to ``other``."""
        return None if self.tokens_per_month is None else (base - other) * self.tokens_per_month / 1e6

    def payback_months(self, monthly: float | None) -> float | None:
        """Months until the engineering cost is paid back (None without one, or when nothing is saved)."""
        if self.engineering_cost is None or monthly is None or monthly <= 0:
            return None
        return self.engineering_cost / monthly


def what_if(prices: Prices, base_tokens_per_s: float, offload_tokens_per_s: float) -> dict[str, Any]:
    """The cost chain from two throughputs (tokens/s), without results: cost per 1M for each, the saving in % and,
    with the optional prices, per month and the payback time.

    Raises:
        ValueError: a throughput that is not more than 0.
    """
    base, off = prices.per_million(base_tokens_per_s), prices.per_million(offload_tokens_per_s)
    monthly = prices.monthly_saving(base, off)
    return {"base_usd_per_million": base, "offload_usd_per_million": off, "saving_pct": 100 * (1 - off / base),
            "monthly_saving_usd": monthly, "payback_months": prices.payback_months(monthly)}


def cost_table(table: pd.DataFrame, prices: Prices, max_ttft_s: float | None = None,
               max_tpot_s: float | None = None) -> pd.DataFrame:
    """Per group × prompt length × mode, the best measured point and its cost.

    A point qualifies when every trial ended ``ok`` (within the budget), its ids matched ``none``, and its median
    TTFT and TPOT meet the optional SLOs; of those, the batch with the highest median throughput is taken.

    Args:
        table: :func:`kvbench.analysis.point_table`.

    Returns:
        Columns ``group``, ``prompt_tokens``, ``mode_label``, ``mode``, ``batch_size`` (the best; NaN if none
        qualified), ``throughput_tokens_per_s`` (median) with ``throughput_min``/``throughput_max`` over its
        trials, ``host_kv_bytes`` (host + disk KV peak), ``usd_per_million``,
        ``saving_pct`` (vs ``none`` at the same prompt length), ``monthly_saving_usd``, ``payback_months`` and
        ``why`` (why nothing qualified).
    """
    rows = []
    for (group, prompt, mode), part in table.groupby(["group", "prompt_tokens", "mode_label"], sort=False):
        ok = part[qualifies(part) & part["throughput_tokens_per_s_median"].notna()]
        if max_ttft_s is not None:
            ok = ok[ok["ttft_s_median"] <= max_ttft_s]
        if max_tpot_s is not None:
            ok = ok[ok["tpot_s_median"] <= max_tpot_s]
        rec: dict[str, Any] = {"group": group, "prompt_tokens": prompt, "mode_label": mode,
                               "mode": part["mode"].iloc[0]}
        if ok.empty:
            rec["why"] = _why_not(part, max_ttft_s, max_tpot_s)
            rows.append(rec)
            continue
        best = ok.loc[ok["throughput_tokens_per_s_median"].idxmax()]
        host = sum(0.0 if pd.isna(best[c]) else best[c] for c in ("kv_host_peak_bytes_median",
                                                                  "kv_disk_peak_bytes_median"))
        rec.update(batch_size=best["batch_size"], throughput_tokens_per_s=best["throughput_tokens_per_s_median"],
                   throughput_min=best["throughput_tokens_per_s_min"],
                   throughput_max=best["throughput_tokens_per_s_max"],
                   host_kv_bytes=host, usd_per_million=prices.per_million(best["throughput_tokens_per_s_median"],
                                                                          host), why="")
        rows.append(rec)
    out = pd.DataFrame(rows)
    for col in ("batch_size", "throughput_tokens_per_s", "throughput_min", "throughput_max", "host_kv_bytes",
                "usd_per_million"):
        if col not in out:
            out[col] = math.nan
    base = out[out["mode"] == "none"].set_index(["group", "prompt_tokens"])["usd_per_million"]
    ref = [base.get((g, p), math.nan) for g, p in zip(out["group"], out["prompt_tokens"])]
    out["saving_pct"] = [100 * (1 - c / r) if r == r and c == c else math.nan for c, r in zip(out["usd_per_million"], ref)]
    monthly = [prices.monthly_saving(r, c) if r == r and c == c else None for c, r in zip(out["usd_per_million"], ref)]
    out["monthly_saving_usd"] = monthly
    out["payback_months"] = [prices.payback_months(m) for m in monthly]
    return out


def _why_not(part: pd.DataFrame, max_ttft_s: float | None, max_tpot_s: float | None) -> str:
    """Why no batch of a mode qualified, from its points' statuses and figures."""
    if (part["n_over_budget"] > 0).all():
        return "over the budget at every batch size"
    if (part["n_oom"] > 0).all():
        return "out of memory at every batch size"
    if (part["measured"] == 0).all():
        return f"never measured ({part['status'].iloc[0]})"
    if part["tokens_match"].map(lambda v: v is False).all():
        return "its outputs differ from none"
    if max_ttft_s is not None and (part["ttft_s_median"] > max_ttft_s).all():
        return f"TTFT above {max_ttft_s * 1e3:g} ms at every batch size"
    if max_tpot_s is not None and (part["tpot_s_median"] > max_tpot_s).all():
        return f"TPOT above {max_tpot_s * 1e3:g} ms at every batch size"
    return "no batch size qualified (over budget, failed or above an SLO)"


def _within_spread(a: pd.Series, b: pd.Series) -> bool:
    """The two rows' throughput ranges (min–max over their trials) overlap: the measurements do not separate them."""
    return bool(a["throughput_min"] <= b["throughput_max"] and b["throughput_min"] <= a["throughput_max"])


def verdicts(costs: pd.DataFrame) -> dict[str, list[str]]:
    """Plain-language lines per group: at each prompt length, the cheapest qualifying mode, and whether offload
    lowers or raises the cost against ``none`` there — or, when the throughput ranges (min–max over trials) of
    the cheapest offload mode and ``none`` overlap, that the measurements do not separate them."""
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
        base = none["usd_per_million"].iloc[0]
        offload = ok[ok["mode"] != "none"]
        if offload.empty:
            lines.append(f"at {prompt} tokens only `none` qualified: {base:,.2f} USD per 1M tokens")
        elif _within_spread(cheapest := offload.loc[offload["usd_per_million"].idxmin()], none.iloc[0]):
            lines.append(f"at {prompt} tokens offload does not change the cost measurably: `{cheapest['mode_label']}` "
                         f"{cheapest['usd_per_million']:,.2f} vs `none` {base:,.2f} USD per 1M tokens, within the "
                         f"spread of their tokens/s ({cheapest['throughput_min']:,.2f}–"
                         f"{cheapest['throughput_max']:,.2f} vs {none['throughput_min'].iloc[0]:,.2f}–"
                         f"{none['throughput_max'].iloc[0]:,.2f}); more repeats would tell")
        elif best["mode"] == "none":
            lines.append(f"at {prompt} tokens offload raises cost here: `none` {base:,.2f} USD per 1M tokens, the "
                         f"cheapest offload mode `{cheapest['mode_label']}` {cheapest['usd_per_million']:,.2f} "
                         f"({-cheapest['saving_pct']:+.0f}%)")
        else:
            lines.append(f"at {prompt} tokens `{best['mode_label']}` lowers cost to {best['usd_per_million']:,.2f} "
                         f"USD per 1M tokens from none's {base:,.2f} ({best['saving_pct']:.0f}% saved, batch "
                         f"{int(best['batch_size'])})")
    return out


def reuse_cost(trials: pd.DataFrame, prices: Prices) -> pd.DataFrame:
    """What reuse saves, per group × mode of a reuse workload (:mod:`kvbench.reuse`): the same requests served by
    recomputing every prompt (cold) and by restoring stored prefixes (warm), one at a time.

    Throughput = Σ generated tokens ÷ Σ e2e seconds over the measured trials of each side; USD per 1M generated
    tokens from it (:meth:`Prices.per_million`; restore is also charged the host price for ``store_bytes``, the
    median bytes its store held after a request, host and disk); ``saving_pct`` = 1 − restore's ÷ recompute's;
    ``prefill_saved_pct`` = Σ tokens restored ÷ Σ prompt tokens of the warm trials (the prefill compute not
    done); ``ttft_saved_s`` = Σ (recompute − restore) TTFT ÷ requests; ``tokens_match`` as in
    :func:`kvbench.reuse.reuse_table`.
    """
    from kvbench.reuse import ids_verdict, reuse_trials

    rows = reuse_trials(trials)
    rows = rows[rows["status"].isin(["ok", "over_budget"])]
    out = []
    for (group, mode), part in rows.groupby(["group", "mode_label"], sort=False):
        warm, cold = part[part["warm"].astype(bool)], part[~part["warm"].astype(bool)]
        rec: dict[str, Any] = {"group": group, "mode_label": mode, "mode": part["mode"].iloc[0],
                               "requests": len(warm)}
        held = (warm["store_host_bytes"].fillna(0) + warm["store_disk_bytes"].fillna(0)).astype(float)
        rec["store_bytes"] = float(held.median()) if len(held) else 0.0
        for side, frame, host in (("recompute", cold, 0.0), ("restore", warm, rec["store_bytes"])):
            e2e = frame["e2e_s"].astype(float).sum()
            tps = (frame["n_output_tokens"] * frame["batch_size"]).sum() / e2e if e2e > 0 else math.nan
            rec[f"{side}_tokens_per_s"] = tps
            rec[f"{side}_usd_per_million"] = prices.per_million(tps, host) if tps == tps else math.nan
        rec["saving_pct"] = 100 * (1 - rec["restore_usd_per_million"] / rec["recompute_usd_per_million"])
        prompt = warm["prompt_tokens"].sum()
        rec["prefill_saved_pct"] = 100 * warm["tokens_restored"].sum() / prompt if prompt else math.nan
        rec["ttft_saved_s"] = ((cold["ttft_s"].astype(float).sum() - warm["ttft_s"].astype(float).sum())
                               / len(warm) if len(warm) and len(cold) == len(warm) else math.nan)
        rec["tokens_match"] = ids_verdict(part)
        out.append(rec)
    return pd.DataFrame(out)


def write_costs(costs: pd.DataFrame, out_dir: str | Path, prices: Prices,
                reuse: pd.DataFrame | None = None) -> list[Path]:
    """``cost.csv``, ``cost.json`` (the table, the prices, the verdicts and, for reuse workloads, the
    :func:`reuse_cost` rows) and ``cost.png`` (USD per 1M tokens per mode and prompt length) in ``out_dir``
    (created), plus ``reuse_cost.csv`` when ``reuse`` has rows; returns their paths."""
    from kvbench import charts

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    doc: dict[str, Any] = {"prices": dataclasses.asdict(prices)}
    if len(costs):
        costs.to_csv(out / "cost.csv", index=False)
        paths.append(out / "cost.csv")
        doc.update(verdicts=verdicts(costs), rows=json.loads(costs.to_json(orient="records")))
    if reuse is not None and len(reuse):
        reuse.to_csv(out / "reuse_cost.csv", index=False)
        paths.append(out / "reuse_cost.csv")
        doc["reuse"] = json.loads(reuse.to_json(orient="records"))
    (out / "cost.json").write_text(json.dumps(doc, indent=2) + "\n")
    paths.append(out / "cost.json")
    png = charts.cost_bars(costs, out / "cost.png") if len(costs) else None
    return paths + ([png] if png is not None else [])


__all__ = ["Prices", "cost_table", "reuse_cost", "verdicts", "what_if", "write_costs"]
