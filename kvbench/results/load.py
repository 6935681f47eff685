"""Loading results: any mix of run directories, ``trials.jsonl`` files and folders of runs into one pandas
DataFrame of trials (:func:`load_results`), their rows read by :func:`kvbench.results.read.read_rows`.

Runs are grouped as they are loaded. The *group* is the scenario name; runs of one scenario name are pooled only
when their scenario definition and machine are identical, otherwise each run is its own group
(``name @ run directory``), so different scenarios or machines are never averaged together.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.arguments import paths_arg
from kvbench.errors import BadFile, ForeignRow, RecordError, ResultsError
from kvbench.results.frame import prepare_trials
from kvbench.results.read import read_rows
from kvbench.results.record import SCHEMA_VERSION, check_run_meta
from kvbench.safe_read import read_json_file, skipped_message


@dataclass
class Results:
    """Loaded trials.

    Attributes:
        trials: one row per trial: the ``trials.jsonl`` columns (:mod:`kvbench.results.rows`; units in the names:
            ``_s`` seconds, ``_bytes`` bytes, ``_per_s`` per second) plus ``run`` (run directory name),
            ``run_path``, ``group`` (see the module docstring), ``repeats_planned``, ``kv_measured_bytes`` (the
            cache's peak of KV held over all tiers, each token once: ``kv_stored_peak_bytes``) and
            ``kv_check_error`` (``kv_measured_bytes / kv_bytes_predicted − 1``): see
            :data:`kvbench.results.rows.FRAME_COLUMNS`.
        runs: per run: ``path``, ``name``, ``group``, ``status``, ``started_at``, ``environment``, ``scenario``,
            ``weights_bytes``, ``capacity`` (the capacity search's results, see :mod:`kvbench.bench.capacity`),
            ``servers`` (a server run's servers: mode, repeat, command line, version, ``/metrics`` deltas, load)
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


def _loaded_rows(path: Path, problems: list[str], scenario: Any = None) -> list[dict[str, Any]]:
    """The trial rows of ``path`` (:func:`kvbench.results.read.read_rows`); the lines skipped are problems, with the
    warning of :func:`kvbench.results.read.read_trials`; of rows with one trial id (two writers on one run), the
    last.

    Raises:
        ResultsError: what :func:`kvbench.results.read.read_rows` raises, with its message.
    """
    try:
        rows, skipped = read_rows(path, scenario)
    except (BadFile, RecordError, ForeignRow) as exc:
        raise ResultsError(str(exc)) from None
    problems.extend(skipped_message(path, i, why) for i, why in skipped)
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


def load_results(paths: str | Path | list[str | Path]) -> Results:
    """Load any mix of run directories, ``trials.jsonl`` files and folders of runs (one path or a list) into one
    :class:`Results` (its pandas frame of every trial is :attr:`Results.trials`).

    Raises:
        kvbench.errors.BadParameter: ``paths`` is no path nor a list of paths.
        ResultsError: a path that does not exist, a folder with no run in it, a run.json of an unknown or newer
            schema version (naming the file), a run.json or JSON line that does not hold what kvbench writes
            (:mod:`kvbench.results.record`: naming the file, the line and the key), a row written under another
            scenario than its run.json's, or no trial rows at all.
    """
    paths = paths_arg(paths, "paths")
    with _no_gc():
        return _load(paths)


def _load(paths: list[str | Path]) -> Results:
    problems: list[str] = []
    runs: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    frames_by_run: list[pd.DataFrame | None] = []
    for tf in _trial_files(paths):
        meta = _run_meta(tf, problems)
        rows = _loaded_rows(tf, problems, meta.get("scenario"))
        run = {"path": str(tf.parent), "name": tf.parent.name, "status": meta.get("status"),
               "started_at": meta.get("started_at"), "environment": meta.get("environment") or {},
               "scenario": meta.get("scenario") or {}, "weights_bytes": meta.get("weights_bytes"),
               "capacity": meta.get("capacity") or [], "servers": meta.get("servers") or [],
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
    groups = trials["run_path"].map({r["path"]: r["group"] for r in runs})
    return Results(prepare_trials(trials, groups), runs, problems)


def _repeats(scenario: dict[str, Any]) -> float:
    """The ``repeats`` a run's scenario asked for (NaN when run.json does not say)."""
    v = scenario.get("repeats")
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else float("nan")


__all__ = ["Results", "load_results"]
