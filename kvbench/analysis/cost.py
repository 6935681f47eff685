"""``kvbench cost``: USD per million generated tokens from measured throughput (or what-if figures), the saving
against ``none``, and what it is worth per month.

Cost per 1M generated tokens = GPU price per hour ÷ (tokens/s × 3600) × 10^6
(:func:`kvbench.analysis.plan.cost_per_million`), plus, with a host price, the host and disk KV a mode held: host price
per GiB-hour × GiB ÷ (tokens/s × 3600) × 10^6. Memory turns into money only through throughput or a price the user
gives: no invented USD per GB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.points import qualifies
from kvbench.analysis.engaged import offload_not_engaged
from kvbench.analysis.intervals import PAIR_KEYS, judge, median_intervals, pair_load, quiet_pairs
from kvbench.analysis.plan import MAX_USD_PER_HOUR, cost_per_million
from kvbench.arguments import number_arg
from kvbench.errors import BadParameter, BadValue
from kvbench.results.rows import MEASURED

GIB = 2**30
#: Bounds of the user's figures (past them costs overflow to inf, savings to NaN): USD per GPU-hour or GiB-hour is
#: :data:`kvbench.analysis.plan.MAX_USD_PER_HOUR`; tokens per month, engineering USD, and a what-if's tokens/s range.
MAX_TOKENS_PER_MONTH, MAX_ENGINEERING_USD = 1e18, 1e12
WHAT_IF_TOKENS_PER_S = (1e-6, 1e12)


@dataclass(frozen=True)
class Prices:
    """What the user pays and plans.

    Attributes:
        gpu_per_hour: USD per GPU-hour (> 0).
        host_per_gib_hour: USD per GiB-hour of host memory held by KV (≥ 0; default 0).
        tokens_per_month: generated tokens per month, for the monthly saving (optional).
        engineering_cost: USD to build and run offload, for the payback time (optional).
        disk_per_gib_hour: USD per GiB-hour of disk held by KV (≥ 0; default 0), priced apart from host memory.

    Raises:
        kvbench.errors.BadParameter: a figure that is not finite, below its least or above its bound (prices
            :data:`~kvbench.analysis.plan.MAX_USD_PER_HOUR`, :data:`MAX_TOKENS_PER_MONTH`, :data:`MAX_ENGINEERING_USD`),
            naming the attribute (``param``) and the bound; ``engineering_cost`` without ``tokens_per_month``.
    """

    gpu_per_hour: float
    host_per_gib_hour: float = 0.0
    tokens_per_month: float | None = None
    engineering_cost: float | None = None
    disk_per_gib_hour: float = 0.0

    def __post_init__(self) -> None:
        def check(name: str, v: float | None, strict: bool, most: float, unit: str) -> None:
            number_arg(v, name, optional=name in ("tokens_per_month", "engineering_cost"))
            low_ok = v is None or (v > 0 if strict else v >= 0)
            if v is not None and not (math.isfinite(v) and low_ok and v <= most):
                least = "above 0" if strict else "0 or more"
                raise BadParameter(f"{{{name}}} must be a finite number {least} and at most {most:,.0f}{unit}, "
                                   f"not {v:g}", name)

        check("gpu_per_hour", self.gpu_per_hour, True, MAX_USD_PER_HOUR, " USD per hour")
        check("host_per_gib_hour", self.host_per_gib_hour, False, MAX_USD_PER_HOUR, " USD per GiB-hour")
        check("disk_per_gib_hour", self.disk_per_gib_hour, False, MAX_USD_PER_HOUR, " USD per GiB-hour")
        check("tokens_per_month", self.tokens_per_month, True, MAX_TOKENS_PER_MONTH, "")
        check("engineering_cost", self.engineering_cost, False, MAX_ENGINEERING_USD, " USD")
        if self.engineering_cost is not None and self.tokens_per_month is None:
            raise BadParameter("{engineering_cost} needs {tokens_per_month}: the payback is cost ÷ saving per month",
                               "engineering_cost", "tokens_per_month")

    def per_million(self, tokens_per_s: float, host_bytes: float = 0.0, disk_bytes: float = 0.0) -> float:
        """USD per 1M generated tokens at ``tokens_per_s``, with ``host_bytes`` of host memory and ``disk_bytes`` of
        disk held by KV charged: (GPU per hour + host price × host GiB + disk price × disk GiB) ÷ (tokens/s × 3600)
        × 10^6."""
        gpu = cost_per_million(self.gpu_per_hour, tokens_per_s)
        held = self.host_per_gib_hour * host_bytes / GIB + self.disk_per_gib_hour * disk_bytes / GIB
        return gpu + held / (tokens_per_s * 3600) * 1e6

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
        kvbench.errors.BadValue: a throughput outside :data:`WHAT_IF_TOKENS_PER_S` (the message gives the range).
    """
    low, high = WHAT_IF_TOKENS_PER_S
    for v in (base_tokens_per_s, offload_tokens_per_s):
        if not (math.isfinite(v) and low <= v <= high):
            raise BadValue(f"a throughput must be a finite number from {low:g} to {high:,.0f} tokens/s, not {v:g}")
    base, off = prices.per_million(base_tokens_per_s), prices.per_million(offload_tokens_per_s)
    monthly = prices.monthly_saving(base, off)
    return {"base_usd_per_million": base, "offload_usd_per_million": off, "saving_pct": 100 * (1 - off / base),
            "monthly_saving_usd": monthly, "payback_months": prices.payback_months(monthly)}


#: Trial columns of the host memory a mode held, best first: what torch really pinned (CUDA: rounded up to powers of
#: two), the capacity kvbench's host buffers allocated (filled part × up to 2, as they grow by doubling), and, in
#: rows of an older kvbench, the filled KV alone.
HOST_HELD_COLUMNS = (("pinned_host_allocated_peak_bytes", "pinned by torch"),
                     ("kv_host_allocated_peak_bytes", "allocated host buffers"),
                     ("kv_host_peak_bytes", "filled KV (older run: less than held)"))


def held_bytes(trials: pd.DataFrame) -> pd.DataFrame:
    """Per trial, the KV memory it held off the device: ``host_bytes`` (the first recorded of
    :data:`HOST_HELD_COLUMNS`), ``host_basis`` (which) and ``disk_bytes`` (``kv_disk_peak_bytes``); 0 for modes
    without a host tier."""
    host = pd.Series(np.nan, index=trials.index, dtype=float)
    basis = pd.Series("", index=trials.index, dtype=object)
    for col, what in HOST_HELD_COLUMNS:
        if col in trials:
            v = pd.to_numeric(trials[col], errors="coerce")
            take = host.isna() & v.notna() & (v > 0)
            host[take], basis[take] = v[take], what
    disk = pd.to_numeric(trials["kv_disk_peak_bytes"], errors="coerce") if "kv_disk_peak_bytes" in trials else 0.0
    return pd.DataFrame({"host_bytes": host.fillna(0.0), "host_basis": basis,
                         "disk_bytes": pd.Series(disk, index=trials.index).fillna(0.0)}, index=trials.index)


def cost_table(table: pd.DataFrame, prices: Prices, trials: pd.DataFrame | None = None,
               max_ttft_s: float | None = None, max_tpot_s: float | None = None) -> pd.DataFrame:
    """Per group × prompt length × mode, the best measured point, its cost and, for offload modes, the paired
    saving against ``none``.

    A point qualifies when it passes :func:`kvbench.analysis.points.qualifies` (every trial ``ok`` within the budget,
    ids equal to ``none``'s, measured ``repeats`` times) and its median TTFT and TPOT meet the optional SLOs; of those,
    the batch with the highest median throughput is taken. The saving is paired (:mod:`kvbench.analysis.intervals`):
    repeat r of the mode at its best batch against repeat r of ``none`` at ``none``'s best batch in the same run, each
    trial costed from its own throughput and held memory; the median of the quiet pairs' savings (a busy pair is
    counted, never a figure: :func:`~kvbench.analysis.intervals.quiet_pairs`) with its 95% interval
    (:func:`~kvbench.analysis.intervals.median_interval`), and a verdict (:func:`kvbench.analysis.intervals.judge`; a
    saving at ``none``'s own batch is implausible: the roofline puts an offload mode's throughput at or below ``none``'s
    there).

    Args:
        table: :func:`kvbench.analysis.points.point_table`.
        trials: the trial rows behind it (:attr:`kvbench.results.load.Results.trials`); without them no pairs.

    Returns:
        Columns ``group``, ``prompt_tokens``, ``mode_label``, ``mode``, ``batch_size`` (the best; NaN if none
        qualified), ``throughput_tokens_per_s`` (median) with ``throughput_min``/``throughput_max`` over its
        trials, ``host_kv_bytes`` (median host memory held, see :func:`held_bytes`) with ``host_basis``,
        ``disk_kv_bytes``, ``usd_per_million`` (from the medians) with ``usd_ci_low``/``usd_ci_high`` (from the
        throughput's interval), ``saving_pct`` (paired median, vs ``none`` at the same prompt length) with
        ``saving_ci_low``/``saving_ci_high``, ``pairs``, ``pairs_busy_trials``, ``cost_verdict`` ("" = decided,
        else why not; None for ``none``), ``monthly_saving_usd``, ``payback_months`` and ``why`` (why nothing
        qualified).
    """
    keys = ["group", "prompt_tokens", "mode_label"]
    ok = qualifies(table) & table["throughput_tokens_per_s_median"].notna()
    if max_ttft_s is not None:
        ok &= table["ttft_s_median"] <= max_ttft_s
    if max_tpot_s is not None:
        ok &= table["tpot_s_median"] <= max_tpot_s
    # the best qualifying batch of each group × prompt length × mode (its first on a tie), in one pass
    good = table[ok]
    best = {k: good.loc[i] for k, i in good.groupby(keys, sort=False)["throughput_tokens_per_s_median"].idxmax()
            .items()} if len(good) else {}
    rows = []
    firsts = table.drop_duplicates(keys)[keys + ["mode"]].set_index(keys)["mode"]
    missing = [k for k in firsts.index if k not in best]  # why nothing qualified: their points only, grouped once
    parts = dict(tuple(table[pd.MultiIndex.from_frame(table[keys]).isin(missing)].groupby(keys, sort=False))) \
        if missing else {}
    for key, first in firsts.items():
        rec: dict[str, Any] = dict(zip(keys, key), mode=first)
        b = best.get(key)
        if b is None:
            rec["why"] = _why_not(parts[key], max_ttft_s, max_tpot_s)
        else:
            rec.update(batch_size=b["batch_size"], throughput_tokens_per_s=b["throughput_tokens_per_s_median"],
                       throughput_min=b["throughput_tokens_per_s_min"],
                       throughput_max=b["throughput_tokens_per_s_max"], why="")
        rows.append(rec)
    out = pd.DataFrame(rows)
    for col in ("batch_size", "throughput_tokens_per_s", "throughput_min", "throughput_max"):
        if col not in out:
            out[col] = math.nan
    measured = _measured(trials, prices)
    _cost_of_best(out, table, measured, prices)
    _paired_savings(out, measured)
    base = out[out["mode"] == "none"].set_index(["group", "prompt_tokens"])["usd_per_million"]
    ref = [base.get((g, p), math.nan) for g, p in zip(out["group"], out["prompt_tokens"])]
    # the monthly saving follows the paired saving: none's cost × the saving
    monthly = [prices.monthly_saving(r, r * (1 - pct / 100)) if r == r and pct == pct else None
               for pct, r in zip(out["saving_pct"], ref)]
    out["monthly_saving_usd"] = monthly
    out["payback_months"] = [prices.payback_months(m) for m in monthly]
    return out


#: The columns that name a point: its group, prompt length, mode label and batch size.
_POINT = ["group", "prompt_tokens", "mode_label", "batch_size"]


def _key(rec: Any) -> tuple[Any, float, Any, float]:
    """A point's :data:`_POINT` values as a dict key (lengths and batches as floats, however they were stored)."""
    return rec["group"], float(rec["prompt_tokens"]), rec["mode_label"], float(rec["batch_size"])


def _measured(trials: pd.DataFrame | None, prices: Prices) -> pd.DataFrame | None:
    """The measured trials of plain points (a reuse workload's, which carry ``warm``, are left out), each with what
    it held (:func:`held_bytes`: ``_host``, ``_basis``, ``_disk``) and its own cost (``_usd``: USD per 1M
    generated tokens from its throughput and that memory), computed once for every point."""
    if trials is None:
        return None
    sel = trials["status"].isin(MEASURED)
    if "warm" in trials:
        sel &= trials["warm"].isna()
    out = trials[sel]
    held = held_bytes(out)
    tput = pd.to_numeric(out["throughput_tokens_per_s"], errors="coerce").to_numpy(dtype=float) \
        if "throughput_tokens_per_s" in out else np.full(len(out), np.nan)
    usd = [prices.per_million(t, h, d) if t == t and t > 0 else math.nan
           for t, h, d in zip(tput, held["host_bytes"], held["disk_bytes"])]
    return out.assign(_host=held["host_bytes"], _basis=held["host_basis"], _disk=held["disk_bytes"], _usd=usd)


def _held_per_point(measured: pd.DataFrame | None) -> dict[tuple[Any, float, Any, float], tuple[float, float, str]]:
    """Per point (:func:`_key`) of ``measured`` (:func:`_measured`): the median host and disk bytes its trials
    held and the most common basis of the host figure."""
    if measured is None or measured.empty or any(c not in measured for c in _POINT):
        return {}
    by = measured.groupby(_POINT, sort=False, dropna=False)
    med = by[["_host", "_disk"]].median()
    basis = measured.groupby([*_POINT, "_basis"], sort=False, dropna=False).size().reset_index(name="n")
    basis = basis.sort_values("n", ascending=False, kind="stable").drop_duplicates(_POINT).set_index(_POINT)["_basis"]
    return {_key(dict(zip(_POINT, k))): (float(r["_host"]), float(r["_disk"]), str(basis.get(k, "")))
            for k, r in med.iterrows()}


def _cost_of_best(out: pd.DataFrame, table: pd.DataFrame, measured: pd.DataFrame | None, prices: Prices) -> None:
    """``host_kv_bytes``, ``host_basis``, ``disk_kv_bytes``, ``usd_per_million`` and its interval (in place): the
    held bytes are the medians over the best point's trials (the point table's filled KV medians without trials);
    the interval maps the point's throughput interval through the price (cost falls as throughput rises)."""
    cols: dict[str, list[Any]] = {k: [] for k in ("host_kv_bytes", "host_basis", "disk_kv_bytes", "usd_per_million",
                                                  "usd_ci_low", "usd_ci_high")}
    points: dict[tuple[Any, float, Any, float], dict[str, Any]] = {}
    for r in table.to_dict("records"):
        points.setdefault(_key(r), r)
    held = _held_per_point(measured)
    for rec in out.to_dict("records"):
        if rec["batch_size"] != rec["batch_size"]:
            for k, v in cols.items():
                v.append("" if k == "host_basis" else math.nan)
            continue
        point, mine = points[_key(rec)], held.get(_key(rec))
        if mine is not None:
            h, d, basis = mine
            basis = basis if h else ""
        else:
            h = 0.0 if pd.isna(point["kv_host_peak_bytes_median"]) else float(point["kv_host_peak_bytes_median"])
            d = 0.0 if pd.isna(point["kv_disk_peak_bytes_median"]) else float(point["kv_disk_peak_bytes_median"])
            basis = HOST_HELD_COLUMNS[-1][1] if h else ""
        t_lo = point.get("throughput_tokens_per_s_ci_low", math.nan)
        t_hi = point.get("throughput_tokens_per_s_ci_high", math.nan)
        for k, v in (("host_kv_bytes", h), ("host_basis", basis), ("disk_kv_bytes", d),
                     ("usd_per_million", prices.per_million(rec["throughput_tokens_per_s"], h, d)),
                     ("usd_ci_low", prices.per_million(t_hi, h, d) if t_hi == t_hi and t_hi > 0 else math.nan),
                     ("usd_ci_high", prices.per_million(t_lo, h, d) if t_lo == t_lo and t_lo > 0 else math.nan)):
            cols[k].append(v)
    for k, v in cols.items():
        out[k] = v


def _paired_savings(out: pd.DataFrame, measured: pd.DataFrame | None) -> None:
    """``saving_pct`` with ``saving_ci_low``/``saving_ci_high``, ``pairs``, ``pairs_busy_trials`` and
    ``cost_verdict`` of every offload row against ``none``'s row at the same group and prompt length (in place):
    every row's best trials (``measured``: :func:`_measured`) paired with its ``none`` trials of the same run and
    repeat in one merge (as :func:`~kvbench.analysis.intervals.pair_with_reference` pairs them)."""
    recs = out.to_dict("records")
    none_rows = {(r["group"], r["prompt_tokens"]): r for r in recs if r["mode"] == "none"}
    meta = [{"pairs": 0, "busy": 0, "unknown": 0} for _ in recs]
    wanted = [(i, rec, none_rows.get((rec["group"], rec["prompt_tokens"]))) for i, rec in enumerate(recs)]
    wanted = [(i, rec, ref) for i, rec, ref in wanted if rec["mode"] != "none" and ref is not None
              and rec["batch_size"] == rec["batch_size"] and ref["batch_size"] == ref["batch_size"]]
    pairs = pd.DataFrame()
    if measured is not None and wanted and all(k in measured for k in PAIR_KEYS):
        keys = pd.DataFrame([{"_rec": i, "_mine": _key(rec), "_ref": _key(ref)} for i, rec, ref in wanted])
        measured = measured[measured[PAIR_KEYS].notna().all(axis=1)]  # a null key pairs with nothing
        measured = measured.assign(_point=list(zip(measured["group"], measured["prompt_tokens"].astype(float),
                                                   measured["mode_label"], measured["batch_size"].astype(float))))
        mine = keys.merge(measured, left_on="_mine", right_on="_point")
        theirs = keys.merge(measured.drop_duplicates(["_point", *PAIR_KEYS]), left_on="_ref", right_on="_point")
        pairs = mine.merge(theirs[["_rec", *PAIR_KEYS, "_usd", "machine_busy"]] if "machine_busy" in theirs
                           else theirs[["_rec", *PAIR_KEYS, "_usd"]], on=["_rec", *PAIR_KEYS], suffixes=("", "_ref"))
    if len(pairs):
        load = pair_load(pairs)
        per = pd.DataFrame({"_rec": pairs["_rec"], "busy": load["busy_trials"], "unknown": load["load_unknown"]})
        counts = per.groupby("_rec").agg(pairs=("busy", "size"), busy=("busy", "sum"), unknown=("unknown", "sum"))
        held = {c: pd.to_numeric(mine[c], errors="coerce").groupby(mine["_rec"]).median()
                for c in ("kv_host_peak_bytes", "kv_disk_peak_bytes") if c in mine}
        for i, row in counts.iterrows():
            meta[i] = {"pairs": int(row["pairs"]), "busy": int(row["busy"]), "unknown": int(row["unknown"]),
                       "idle": offload_not_engaged({"mode": recs[i]["mode"], **{
                           f"{c}_median": held[c].get(i) if c in held else None
                           for c in ("kv_host_peak_bytes", "kv_disk_peak_bytes")}})}
        series = (100 * (1 - pairs["_usd"] / pairs["_usd_ref"])).astype(float)
        pid = pairs["_rec"].astype(np.int64)
        figure, interval = quiet_pairs(load, pid)
    else:
        series, pid = pd.Series([], dtype=float), pd.Series([], dtype=np.int64)
        figure = interval = pd.Series([], dtype=bool)
    medians = series[figure].groupby(pid[figure]).median()
    ci = median_intervals(series[interval], pid[interval])
    out["saving_pct"] = [medians.get(i, math.nan) for i in range(len(recs))]
    out["saving_ci_low"] = [ci["low"].get(i, math.nan) for i in range(len(recs))]
    out["saving_ci_high"] = [ci["high"].get(i, math.nan) for i in range(len(recs))]
    out["pairs"] = [m["pairs"] for m in meta]
    out["pairs_busy_trials"] = [m["busy"] for m in meta]
    verdicts: list[str | None] = []
    for i, rec in enumerate(recs):
        ref = none_rows.get((rec["group"], rec["prompt_tokens"]))
        if rec["mode"] == "none" or rec["batch_size"] != rec["batch_size"]:
            verdicts.append(None)
            continue
        lo, hi = out["saving_ci_low"].iloc[i], out["saving_ci_high"].iloc[i]
        same_batch = ref is not None and ref["batch_size"] == rec["batch_size"]
        verdicts.append(meta[i].get("idle") or judge(meta[i]["pairs"], meta[i]["busy"], meta[i]["unknown"], lo, hi,
                                                     no_change=0.0, implausible=bool(same_batch and lo > 0)))
    out["cost_verdict"] = verdicts


def point_costs(table: pd.DataFrame, prices: Prices, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """What ``kvbench cost`` charges every point of ``table`` (:func:`kvbench.analysis.points.point_table`), best
    batch or not, by :func:`cost_table`'s rule: ``group``, ``prompt_tokens``, ``mode_label``, ``batch_size``,
    ``throughput_tokens_per_s`` (the median of its measured trials), ``host_kv_bytes`` / ``host_basis`` /
    ``disk_kv_bytes`` (bytes held, medians over ``trials``), ``usd_per_million`` with ``usd_ci_low`` /
    ``usd_ci_high`` (USD per 1M generated tokens; NaN where the point does not qualify) and ``why`` (``""`` when it
    qualifies, else why not: over the budget, failed, ids differ). One row per point, in ``table``'s order."""
    ok = (qualifies(table) & table["throughput_tokens_per_s_median"].notna()).to_numpy()
    out = table[_POINT].assign(throughput_tokens_per_s=table["throughput_tokens_per_s_median"]).reset_index(drop=True)
    batch = out["batch_size"].copy()
    out["batch_size"] = batch.where(ok)  # _cost_of_best costs the rows with a batch: those that qualify
    _cost_of_best(out, table, _measured(trials, prices), prices)
    out["batch_size"] = batch
    out["why"] = ["" if good else _why_not(table.iloc[[i]], None, None).replace(" at every batch size", "")
                  for i, good in enumerate(ok)]
    return out


def _why_not(part: pd.DataFrame, max_ttft_s: float | None, max_tpot_s: float | None) -> str:
    """Why no batch of a mode qualified, from its points' statuses and figures."""
    if (part["n_over_budget"] > 0).all():
        return "over the budget at every batch size"
    if (part["n_oom"] > 0).all():
        return "out of memory at every batch size"
    if (part["measured"] == 0).all():
        return f"never measured ({part['status'].iloc[0]})"
    if "quality_ok" in part and part["quality_ok"].map(lambda v: v is False).all():
        return str(part["quality"].iloc[0])  # "fails quality: KL … > max_kl …"
    if part["tokens_match"].map(lambda v: v is False).all() and "quality_ok" not in part:
        return "its outputs differ from none"
    if part["tokens_match"].map(lambda v: v is False).all() and part["quality_ok"].map(lambda v: v is None).all():
        return "its outputs differ from none"
    if max_ttft_s is not None and (part["ttft_s_median"] > max_ttft_s).all():
        return f"TTFT above {max_ttft_s * 1e3:g} ms at every batch size"
    if max_tpot_s is not None and (part["tpot_s_median"] > max_tpot_s).all():
        return f"TPOT above {max_tpot_s * 1e3:g} ms at every batch size"
    return "no batch size qualified (over budget, failed or above an SLO)"


__all__ = ["HOST_HELD_COLUMNS", "MAX_ENGINEERING_USD", "MAX_TOKENS_PER_MONTH", "WHAT_IF_TOKENS_PER_S", "Prices",
           "cost_table", "held_bytes", "point_costs", "what_if"]
