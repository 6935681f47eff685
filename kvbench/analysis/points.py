"""Results into tables: loading runs into one pandas DataFrame, and the per-point table of ``kvbench report``
(median, min–max and a bootstrap interval of each latency; the article's memory saving % and time overhead %
against ``none`` at the same point).

A *point* is (group, prompt length, batch size, mode label). The *group* is the scenario name; runs of one
scenario name are pooled only when their scenario definition and machine are identical, otherwise each run is
its own group (``name @ run directory``), so different scenarios or machines are never averaged together.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.intervals import (BOOTSTRAP_MIN_REPEATS, add_comparisons, bootstrap_intervals, busy_flags, median_ci,
                               paired_point_stats)
from kvbench.results.run_dir import SCHEMA_VERSION
from kvbench.results.identity import ForeignRow, check_parsed
from kvbench.safe_read import BadFile, read_json_file, scan_rows, skipped_message
from kvbench.results.record import RecordError, check_rows, check_run_meta
from kvbench.analysis.latency import ITL_PERCENTILES
from kvbench.errors import ResultsError

#: Statuses of trials that ran to the end (an over-budget trial is measured, it just does not fit).
MEASURED = ("ok", "over_budget")
#: Latency/throughput columns summarised with median, min, max and a bootstrap interval.
SPREAD_METRICS = ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s")
#: Memory/traffic columns summarised by their median.
MEDIAN_METRICS = ("decode_tokens_per_s", "kv_device_peak_bytes", "kv_host_peak_bytes", "kv_disk_peak_bytes",
                  "peak_device_allocated_bytes", "nvml_process_peak_bytes", "rss_peak_bytes", "kv_bytes_predicted",
                  "bytes_moved_per_token", "h2d_bytes_per_s", "h2d_bytes_per_step", "plan_kv_device_bytes",
                  "plan_link_bytes_per_step", "plan_tpot_s")
POINT_KEYS = ["group", "prompt_tokens", "batch_size", "mode_label"]
#: A trial whose KV accounting differs from the analytic prediction by more than this fraction is flagged.
KV_CHECK_TOLERANCE = 0.25


@dataclass
class Results:
    """Loaded trials.

    Attributes:
        trials: one row per trial: the ``trials.jsonl`` fields (units in the names: ``_s`` seconds, ``_bytes``
            bytes, ``_per_s`` per second) plus ``run`` (run directory name), ``run_path``, ``group`` (see the
            module docstring), ``kv_measured_bytes`` (the cache's peak of KV held over all tiers, each token once:
            ``kv_stored_peak_bytes``) and
            ``kv_check_error`` (``kv_measured_bytes / kv_bytes_predicted − 1``).
        runs: per run: ``path``, ``name``, ``group``, ``status``, ``started_at``, ``environment``, ``scenario``,
            ``weights_bytes``, ``capacity`` (the capacity search's results, see :mod:`kvbench.bench.capacity`)
            (``{}``/None/``[]`` where run.json is missing).
        problems: what was skipped or is unknown, each naming its file (and line).
    """

    trials: pd.DataFrame
    runs: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _trial_files(paths: list[str | Path]) -> list[Path]:
    """``trials.jsonl`` files named by ``paths`` (run directories, trials files, or folders of runs)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise ResultsError(f"{p}: no such file or directory")
        if p.is_file():
            if p.suffix != ".jsonl":
                raise ResultsError(f"{p}: not a trials.jsonl file or a run directory")
            found.append(p)
        elif (p / "trials.jsonl").is_file():
            found.append(p / "trials.jsonl")
        else:
            inside = sorted(p.rglob("trials.jsonl"))
            if not inside:
                raise ResultsError(f"{p}: no kvbench runs here (no trials.jsonl in it or below it)")
            found.extend(inside)
    unique: dict[Path, Path] = {}
    for f in found:
        unique.setdefault(f.resolve(), f)
    return list(unique.values())


def _run_meta(trials_file: Path, problems: list[str]) -> dict[str, Any]:
    rj = trials_file.parent / "run.json"
    if not (rj.exists() or rj.is_symlink()):
        problems.append(f"{trials_file}: no run.json beside it: machine and scenario unknown")
        return {}
    try:
        meta = read_json_file(rj)
    except BadFile as exc:
        raise ResultsError(str(exc)) from None
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    if version is None:
        raise ResultsError(f"{rj}: no schema_version; not a kvbench run.json")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ResultsError(f"{rj}: schema_version {version!r} is not a whole number")
    if version > SCHEMA_VERSION:
        raise ResultsError(f"{rj}: schema_version {version} is newer than this kvbench reads ({SCHEMA_VERSION}); "
                           "upgrade kvbench")
    if version != SCHEMA_VERSION:
        raise ResultsError(f"{rj}: schema_version {version} is unknown; this kvbench reads {SCHEMA_VERSION}")
    try:
        return check_run_meta(meta, rj)
    except RecordError as exc:
        raise ResultsError(str(exc)) from None


def _read_rows(path: Path, problems: list[str], scenario: Any = None) -> list[dict[str, Any]]:
    """The trial rows of ``path``; lines kvbench cannot read (not JSON, e.g. a run killed mid-write, not UTF-8, too
    long or too deep: :func:`kvbench.safe_read.scan_rows`) are skipped as problems, with the warning of
    :func:`kvbench.results.run_dir.read_trials`.

    Raises:
        ResultsError: not a regular file; a JSON line that is not a trial row (:func:`kvbench.results.record.check_rows`);
            with ``scenario`` (run.json's), a row written under another scenario
            (:func:`kvbench.results.identity.check_parsed`, as ``run --resume`` refuses it).
    """
    try:
        rows, lines, skipped = scan_rows(path)
    except BadFile as exc:
        raise ResultsError(str(exc)) from None
    problems.extend(skipped_message(path, i, why) for i, why in skipped)
    try:
        check_rows(rows, lines, path)
        if isinstance(scenario, dict):  # as run --resume: rows of another scenario are refused, never merged
            check_parsed(path, rows, lines, scenario)
    except (RecordError, ForeignRow) as exc:
        raise ResultsError(str(exc)) from None
    ids = [row["trial_id"] for row in rows]
    if len(set(ids)) < len(ids):  # e.g. two writers on one run before kvbench locked it: keep the last of each
        last = {tid: k for k, tid in enumerate(ids)}
        repeated = sorted({tid for k, tid in enumerate(ids) if last[tid] != k})
        problems.append(f"{path}: {len(repeated)} trial id(s) appear more than once ({repeated[0]}, ...); "
                        "the last of each is kept")
        rows = [row for k, row in enumerate(rows) if last[row["trial_id"]] == k]
    return rows


def _machine(env: dict[str, Any]) -> tuple:
    gpus = env.get("gpus") or []
    return (env.get("cpu"), env.get("cpu_count"), env.get("memory_total_bytes"),
            tuple(g.get("name") for g in gpus if isinstance(g, dict)))


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing tens of thousands of rows allocates over a million containers,
    and the collections that triggers cost more than the parsing itself (none of these objects form cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_results(paths: list[str | Path]) -> Results:
    """Load any mix of run directories, ``trials.jsonl`` files and folders of runs into one :class:`Results`.

    Raises:
        ResultsError: a path that does not exist, a folder with no run in it, a run.json of an unknown or newer
            schema version (naming the file), a run.json or JSON line that does not hold what kvbench writes
            (:mod:`kvbench.results.record`: naming the file, the line and the key), or no trial rows at all.
    """
    with _no_gc():
        return _load(paths)


def _load(paths: list[str | Path]) -> Results:
    problems: list[str] = []
    runs: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    frames_by_run: list[pd.DataFrame | None] = []
    for tf in _trial_files(paths):
        meta = _run_meta(tf, problems)
        rows = _read_rows(tf, problems, meta.get("scenario"))
        run = {"path": str(tf.parent), "name": tf.parent.name, "status": meta.get("status"),
               "started_at": meta.get("started_at"), "environment": meta.get("environment") or {},
               "scenario": meta.get("scenario") or {}, "weights_bytes": meta.get("weights_bytes"),
               "capacity": meta.get("capacity") or [],
               "n_trials": len(rows)}
        runs.append(run)
        if rows:
            frame = pd.DataFrame(rows)
            frame["run"] = run["name"]
            frame["run_path"] = run["path"]
            frames.append(frame)
            frames_by_run.append(frame)
        else:
            problems.append(f"{tf}: no trials")
            frames_by_run.append(None)
    if not frames:
        why = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise ResultsError(f"no trials to report in {', '.join(str(p) for p in paths)}" + (f" ({why})" if why else ""))
    # group: pool runs of one scenario name only when their definition and machine are the same
    by_name: dict[str, set] = {}
    for r, frame in zip(runs, frames_by_run):
        # without run.json, the scenario name the rows carry (when they agree), else the directory's
        named = set(frame["scenario"].dropna()) if frame is not None and "scenario" in frame else set()
        r["scenario_name"] = r["scenario"].get("name") or (named.pop() if len(named) == 1 else r["name"])
        key = (json.dumps(r["scenario"], sort_keys=True, default=str), _machine(r["environment"]))
        by_name.setdefault(r["scenario_name"], set()).add(key)
    for r in runs:
        name = r["scenario_name"]
        r["group"] = name if len(by_name[name]) == 1 else f"{name} @ {r['name']}"
    trials = pd.concat(frames, ignore_index=True, sort=False)
    # a point is measured as often as its scenario asked (a capacity probe, once, is not a measured point)
    trials["repeats_planned"] = trials["run_path"].map({r["path"]: _repeats(r["scenario"]) for r in runs})
    return Results(_prepare(trials, trials["run_path"].map({r["path"]: r["group"] for r in runs})), runs, problems)


def _repeats(scenario: dict[str, Any]) -> float:
    """The ``repeats`` a run's scenario asked for (NaN when run.json does not say)."""
    v = scenario.get("repeats")
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else float("nan")


def trials_frame(rows: list[dict[str, Any]], group: str) -> pd.DataFrame:
    """Trial rows of one scenario (e.g. a run being written) as the frame :func:`point_table` takes."""
    return _prepare(pd.DataFrame(rows), group)


def _prepare(trials: pd.DataFrame, group: Any) -> pd.DataFrame:
    trials["group"] = group
    if "mode_label" not in trials:
        trials["mode_label"] = trials["mode"]
    trials["mode_label"] = trials["mode_label"].fillna(trials["mode"])
    if "message" not in trials:
        trials["message"] = ""
    if "run_path" not in trials:  # rows of one run being written (trials_frame)
        trials["run_path"] = ""
    _derive(trials)
    return trials


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce").astype(float)


def _derive(df: pd.DataFrame) -> None:
    """Columns computed per trial: bytes moved per generated token, the KV accounting check."""
    moved = sum(_num(df, c).fillna(0) for c in ("h2d_bytes", "d2h_bytes", "disk_read_bytes", "disk_write_bytes"))
    tokens = _num(df, "n_output_tokens") * _num(df, "batch_size")
    has_traffic = _num(df, "h2d_bytes").notna() | (df["mode"] == "none")
    df["bytes_moved_per_token"] = (moved / tokens).where(has_traffic & (tokens > 0))
    steps = _num(df, "n_output_tokens") - 1
    df["h2d_bytes_per_step"] = (_num(df, "h2d_bytes") / steps).where(steps > 0)
    # rows of older runs have no kv_stored_peak_bytes: only `none` (all KV on the device) can be checked there
    stored = _num(df, "kv_stored_peak_bytes").fillna(_num(df, "kv_device_peak_bytes").where(df["mode"] == "none"))
    measured = df["status"].isin(MEASURED) & _num(df, "kv_device_peak_bytes").notna()
    df["kv_measured_bytes"] = stored.where(measured)
    df["kv_check_error"] = df["kv_measured_bytes"] / _num(df, "kv_bytes_predicted") - 1


def qualifies(table: pd.DataFrame) -> pd.Series:
    """Per point of :func:`point_table`: every trial ended ``ok`` (ran to the end within the budget), every measured
    trial's greedy ids were compared with ``none``'s and equal them (``tokens_match`` True: a point never compared
    does not qualify), and it was measured as many times as its scenario's ``repeats`` (a capacity probe, run once,
    is not a cost point): the condition for recommending a mode or costing it."""
    planned = table["repeats_planned"] if "repeats_planned" in table else pd.Series(np.nan, index=table.index)
    return ((table["n_ok"] == table["trials"]) & table["tokens_match"].map(lambda v: v is True)
            & (planned.isna() | (table["n_ok"] >= planned)))


def _itl_pooled(measured: pd.DataFrame, mpid: pd.Series) -> pd.DataFrame:
    """Per point: the p50/p90/p99 and max of every inter-token gap of its measured trials, pooled (seconds; the
    value at 0-based rank ⌈(n − 1)·p⌉ of the sorted gaps, as the trial rows' ``itl_p*_s``)."""
    cols = [f"itl_p{p}_s" for p in ITL_PERCENTILES] + ["itl_max_s"]
    if "itl_s" not in measured or measured.empty:
        return pd.DataFrame(columns=cols, dtype=float)
    gaps = measured["itl_s"].map(lambda v: v if isinstance(v, list) else []).explode()
    gaps = pd.to_numeric(gaps, errors="coerce").dropna()
    by = gaps.groupby(mpid.reindex(gaps.index))
    out = by.quantile([p / 100 for p in ITL_PERCENTILES], interpolation="higher").unstack()
    out.columns = cols[:-1]
    out["itl_max_s"] = by.max()
    return out


def point_table(trials: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per point (group × prompt length × batch size × mode), in the order points first appear.

    Columns: the keys; ``mode`` (kind); ``trials``, ``measured`` (ok + over budget) and one count per status
    (``n_ok``, ``n_over_budget``, ``n_skipped``, ``n_error``, ``n_oom``, ``n_other`` for unknown ones); ``status`` (``ok``, or the first other
    status) and its ``message``; ``tokens_match`` (False if any measured trial's ids differed from ``none``,
    None when never compared) and ``first_divergence_step``; for each of :data:`SPREAD_METRICS` its
    ``_median``/``_min``/``_max`` over measured trials and ``_ci_low``/``_ci_high`` (95% bootstrap interval of
    the median, with ≥ 5 measured repeats); the medians of :data:`MEDIAN_METRICS`; ``kv_check_flagged`` (trials
    whose KV accounting is off the prediction by more than 25%) and ``kv_check_worst`` (that relative error);
    ``budget_bytes``; and against ``none`` at the same group, prompt length and batch size:
    ``memory_saving_pct`` = 100 × (1 − device KV peak / none's), ``measured_saving_pct`` (the same with the
    allocator's peak, CUDA only), ``time_overhead_pct`` = 100 × (TPOT / none's − 1), ``throughput_ratio`` =
    tokens/s ÷ none's — NaN where ``none`` has no measured trial there; measured ÷ ``kvbench plan``'s prediction
    (trial fields ``plan_*``): ``kv_device_vs_plan`` (device KV peak), ``link_vs_plan`` (host→device bytes per
    decode step, ``h2d_bytes_per_step``) and ``tpot_vs_plan`` (TPOT vs the roofline's step time) — NaN where the
    trials carry no prediction (older runs, modes plan does not model, bandwidths not measured).
    Reuse trials (:mod:`kvbench.bench.reuse`: cold and warm runs of one request share a prompt length and batch) are
    left out; :func:`kvbench.analysis.reuse.reuse_table` is their table.
    """
    df = trials[trials["warm"].isna()] if "warm" in trials else trials
    keys = POINT_KEYS
    # one integer id per point (first-appearance order): every aggregate groups by it and aligns on it
    pid = df.groupby(keys, sort=False).ngroup()
    by_point = df.groupby(pid, sort=False)
    table = by_point[keys + ["mode"]].first()
    table.insert(len(keys), "trials", by_point.size())
    table = table[keys + ["trials", "mode"]]
    counts = pd.crosstab(pid, df["status"])
    known = ["ok", "over_budget", "skipped", "error", "oom"]
    for s in known:
        if s not in counts:
            counts[s] = 0
    counts["other"] = counts.drop(columns=known).sum(axis=1).astype(int)  # statuses this kvbench does not know
    for c in known + ["other"]:
        table[f"n_{c}"] = counts[c]
    table["measured"] = table["n_ok"] + table["n_over_budget"]
    bad = df["status"] != "ok"
    first_bad = df[bad].groupby(pid[bad], sort=False)[["status", "message"]].first()
    table["status"] = first_bad["status"]
    table["message"] = first_bad["message"]
    table["status"] = table["status"].fillna("ok")
    table["message"] = table["message"].fillna("")

    is_measured = df["status"].isin(MEASURED)
    measured = df[is_measured]
    mpid = pid[is_measured]
    if "tokens_match" in measured:
        tm = measured["tokens_match"].map({True: 1.0, False: 0.0}).groupby(mpid).min()
        table["tokens_match"] = tm.map({1.0: True, 0.0: False}).reindex(table.index).astype(object)
        table.loc[table["tokens_match"].isna(), "tokens_match"] = None
    else:
        table["tokens_match"] = None
    table["first_divergence_step"] = _num(measured, "first_divergence_step").groupby(mpid).min()

    numeric = pd.DataFrame({col: _num(measured, col) for col in SPREAD_METRICS + MEDIAN_METRICS})
    gm = numeric.groupby(mpid, sort=False)
    stats = gm[list(SPREAD_METRICS)].agg(["median", "min", "max"])
    stats.columns = [f"{a}_{b}" for a, b in stats.columns]
    medians = gm[list(MEDIAN_METRICS)].median()
    medians.columns = [f"{c}_median" for c in medians.columns]
    table = table.join(stats).join(medians)
    for col in SPREAD_METRICS:
        ci = bootstrap_intervals(numeric[col], mpid, n_boot, seed)
        table[f"{col}_ci_low"] = ci["low"]
        table[f"{col}_ci_high"] = ci["high"]

    table = table.join(_itl_pooled(measured, mpid))
    busy = measured["machine_busy"] if "machine_busy" in measured else pd.Series(None, index=measured.index)
    table["n_busy"] = busy_flags(busy).groupby(mpid).sum()
    table["n_busy"] = table["n_busy"].fillna(0).astype(int)
    table["others_cpu_percent_median"] = _num(measured, "others_cpu_percent").groupby(mpid).median()
    paired = paired_point_stats(measured, mpid, n_boot, seed)
    table = table.join(paired)
    for c in ("pairs", "pairs_busy_trials", "pairs_load_unknown"):
        table[c] = table[c].fillna(0).astype(int) if c in table else 0

    err = measured["kv_check_error"].abs()
    table["kv_check_flagged"] = (err > KV_CHECK_TOLERANCE).groupby(mpid).sum()
    worst = measured["kv_check_error"].where(err == err.groupby(mpid).transform("max"))
    table["kv_check_worst"] = worst.groupby(mpid, sort=False).first()
    table["kv_check_flagged"] = table["kv_check_flagged"].fillna(0).astype(int)
    table["budget_bytes"] = _num(df, "budget_bytes").groupby(pid, sort=False).max()
    table["repeats_planned"] = _num(df, "repeats_planned").groupby(pid, sort=False).max()
    table = table.reset_index(drop=True)

    ref_cols = {"kv_device_peak_bytes_median": "ref_kv", "peak_device_allocated_bytes_median": "ref_alloc"}
    ref = table[table["mode"] == "none"].drop_duplicates(keys[:3])[keys[:3] + list(ref_cols)].rename(columns=ref_cols)
    table = table.merge(ref, on=keys[:3], how="left")
    # bytes are the same in every repeat: a ratio of medians; times are paired (kvbench.analysis.intervals)
    table["memory_saving_pct"] = 100 * (1 - table["kv_device_peak_bytes_median"] / table["ref_kv"])
    table["measured_saving_pct"] = 100 * (1 - table["peak_device_allocated_bytes_median"] / table["ref_alloc"])
    table = table.drop(columns=list(ref_cols.values()))
    add_comparisons(table)
    # measured ÷ kvbench plan's prediction (kvbench.analysis.plan: placement and decode-step roofline)
    table["kv_device_vs_plan"] = table["kv_device_peak_bytes_median"] / table["plan_kv_device_bytes_median"]
    table["link_vs_plan"] = table["h2d_bytes_per_step_median"] / table["plan_link_bytes_per_step_median"]
    table["tpot_vs_plan"] = table["tpot_s_median"] / table["plan_tpot_s_median"]
    return table.replace([np.inf, -np.inf], np.nan)


__all__ = ["BOOTSTRAP_MIN_REPEATS", "KV_CHECK_TOLERANCE", "MEASURED", "MEDIAN_METRICS", "POINT_KEYS", "Results",
           "ResultsError", "SPREAD_METRICS", "load_results", "median_ci", "point_table", "qualifies",
           "trials_frame"]
