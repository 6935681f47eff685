"""Loading results: any mix of run directories, ``trials.jsonl`` files and folders of runs into one pandas
DataFrame of trials (:func:`load_results`), their rows read by :func:`kvbench.results.read.read_rows`.

Runs are grouped as they are loaded. The *group* is the scenario name; runs of one scenario name are pooled only
when their scenario definition and machine are identical, otherwise each run is its own group
(``name @ run directory``), so different scenarios or machines are never averaged together. A run whose rows ran
on two or more placement kinds (their ``machine`` column: :data:`kvbench.results.rows.PLACEMENT_COLUMNS`) is split
once more: each row's group becomes ``<group> @ <machine>``, so every table compares a mode with ``none`` on the
same kind of machine.

Of rows with one trial id, the last is kept. A trial whose worker died and was retried is expected to appear twice
(:func:`kvbench.results.rows.retry_due`); any other repeat (two writers on one run) is a problem.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from kvbench.arguments import paths_arg
from kvbench.errors import BadFile, ForeignRow, RecordError, ResultsError
from kvbench.results.frame import prepare_trials
from kvbench.results.peers import peer_hint
from kvbench.results.read import read_rows
from kvbench.results.record import SCHEMA_VERSION, check_run_meta
from kvbench.results.rows import retry_due
from kvbench.safe_read import find_below, read_json_file, skipped_message


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
            ``weights_bytes``, ``capacity`` (the capacity search's results, see :mod:`kvbench.bench.plans.capacity`),
            ``servers`` (a server run's servers: mode, repeat, command line, version, ``/metrics`` deltas, load),
            ``executor`` and ``machines`` (run.json's: where a cluster run ran), ``n_trials``
            (``{}``/None/``[]`` where run.json is missing). A run split by machine (see the module docstring)
            appears once per machine, in the order its rows first name them: a copy with that ``group``,
            ``machine`` (the label; absent from unsplit runs), ``base_group`` (the group before the split),
            ``environment`` (run.json's ``machines[<label>].workers[0].environment`` where it has one, else the
            run's) and ``n_trials`` of that machine (a capacity search or a server engine runs on one kind).
        problems: what was skipped or is unknown, each naming its file (and line).
        lost: the rows of trials whose worker was lost (:func:`kvbench.results.rows.retry_due`) that a later row of
            the same trial id (the retry) replaced, as read, plus ``run``, ``run_path`` and ``group``.
    """

    trials: pd.DataFrame
    runs: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)

    @property
    def servers(self) -> list[dict[str, Any]]:
        """Every run's ``servers`` entries (run.json: one per server started or used, with its mode label, repeat,
        ``/metrics`` deltas and capacity facts), in the order of :attr:`runs`."""
        return [s for run in self.runs for s in run.get("servers") or [] if isinstance(s, dict)]


_LOST_HOST = re.compile(r"^worker lost \(host ([^)]*)\)")


def lost_host(row: dict[str, Any]) -> str:
    """The host of a lost worker's row (:func:`kvbench.results.rows.retry_due`): its ``host`` column, else the one
    its message names (``worker lost (host H): ...``), else ``"unknown"``."""
    if isinstance(row.get("host"), str) and row["host"]:
        return row["host"]
    found = _LOST_HOST.match(str(row.get("message") or ""))
    return found.group(1) if found else "unknown"


class LastRows(NamedTuple):
    """What :func:`last_rows_of` found: ``rows``, the last row of each trial id in the order the ids first
    appear; ``retried``, the rows of a first loss of a worker (:func:`kvbench.results.rows.retry_due`) that a later
    row of their trial id replaced, in file order; ``repeated``, the trial ids (sorted) written more than once
    otherwise (an earlier row that is not such a loss)."""

    rows: list[dict[str, Any]]
    retried: list[dict[str, Any]]
    repeated: list[str]


def last_rows_of(rows: list[dict[str, Any]]) -> LastRows:
    """The last row per ``trial_id`` of ``rows`` (trial rows in file order), and what it replaced: see
    :class:`LastRows`.

    Raises:
        KeyError: a row without ``trial_id`` (rows read by :func:`kvbench.results.read.read_rows` all have one).
    """
    last: dict[str, int] = {}
    for k, row in enumerate(rows):
        last[row["trial_id"]] = k  # a dict keeps the order of first insertion: first-seen order
    retried, repeated = [], set()
    for k, row in enumerate(rows):
        if last[row["trial_id"]] != k:
            if retry_due(row):
                retried.append(row)
            else:
                repeated.add(row["trial_id"])
    return LastRows([rows[k] for k in last.values()], retried, sorted(repeated))


def _trial_files(paths: list[str | Path]) -> list[Path]:
    """``trials.jsonl`` files named by ``paths`` (run directories, trials files, or folders of runs)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise ResultsError(f"{p}: no such file or directory")
        if p.is_file():
            hint = peer_hint(p)  # the file read once
            if p.suffix != ".jsonl" or hint:
                raise ResultsError(f"{p}: not a trials.jsonl file or a run directory{hint}")
            found.append(p)
        elif (p / "trials.jsonl").is_file():
            found.append(p / "trials.jsonl")
        else:
            try:
                inside = find_below(p, "trials.jsonl")
            except BadFile as exc:
                raise ResultsError(str(exc)) from None
            if not inside:
                raise ResultsError(f"{p}: no kvbench runs here (no trials.jsonl in it or below it){peer_hint(p)}")
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


def _loaded_rows(path: Path, problems: list[str], scenario: Any = None) -> LastRows:
    """The trial rows of ``path`` (:func:`kvbench.results.read.read_rows`); the lines skipped are problems, with the
    warning of :func:`kvbench.results.read.read_trials`; of rows with one trial id, the last
    (:func:`last_rows_of`): a problem unless every row it replaced was a lost worker's (the expected retry).

    Raises:
        ResultsError: what :func:`kvbench.results.read.read_rows` raises, with its message.
    """
    try:
        rows, skipped = read_rows(path, scenario)
    except (BadFile, RecordError, ForeignRow) as exc:
        raise ResultsError(str(exc)) from None
    problems.extend(skipped_message(path, i, why) for i, why in skipped)
    found = last_rows_of(rows)
    if found.repeated:  # e.g. two writers on one run before kvbench locked it
        problems.append(f"{path}: {len(found.repeated)} trial id(s) appear more than once ({found.repeated[0]}, "
                        "...); the last of each is kept")
    return found


def _machine_environment(meta: dict[str, Any], label: str, rj: Path) -> dict[str, Any] | None:
    """run.json's ``machines[<label>].workers[0].environment`` (what the first worker of that placement kind
    measured), checked as run.json's own ``environment`` is; None where run.json does not hold one.

    Raises:
        ResultsError: a step of that key path, or the environment's machine fields, not of what kvbench writes
            (naming the file and the key path).
    """
    node: Any = meta
    key = ""
    for part in ("machines", label, "workers", 0, "environment"):
        if isinstance(part, int):
            if not isinstance(node, list):
                raise ResultsError(f"{rj}: {key}: must be a list, not {type(node).__name__}")
            node, key = (node[0] if node else None), f"{key}[0]"
        else:
            if not isinstance(node, dict):
                raise ResultsError(f"{rj}: {key}: must be an object, not {type(node).__name__}")
            node, key = node.get(part), f"{key}.{part}" if key else part
        if node is None:
            return None
    try:
        check_run_meta({"schema_version": SCHEMA_VERSION, "environment": node}, rj)
    except RecordError as exc:
        why = str(exc).removeprefix(f"{rj}: {exc.key}: ")
        raise ResultsError(f"{rj}: {key}{exc.key.removeprefix('environment')}: {why}") from None
    return node


def _machine_runs(run: dict[str, Any], meta: dict[str, Any], frame: pd.DataFrame, labels: list[str]
                  ) -> list[dict[str, Any]]:
    """One copy of ``run`` per placement kind in ``labels`` (see :class:`Results`' ``runs``)."""
    rj = Path(run["path"]) / "run.json"
    out = []
    for label in labels:
        ids = set(frame.loc[frame["machine"] == label, "trial_id"])
        env = _machine_environment(meta, label, rj)
        out.append(dict(run, group=f"{run['group']} @ {label}", machine=label, base_group=run["group"],
                        environment=run["environment"] if env is None else env, n_trials=len(ids)))
    return out


def _machine_labels(frame: pd.DataFrame | None) -> list[str]:
    """The distinct non-null ``machine`` values of a run's rows, in the order they first appear."""
    if frame is None or "machine" not in frame:
        return []
    return list(dict.fromkeys(frame["machine"].dropna()))


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
    metas: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    frames: list[pd.DataFrame] = []
    frames_by_run: list[pd.DataFrame | None] = []
    for tf in _trial_files(paths):
        meta = _run_meta(tf, problems)
        rows, retried, _ = _loaded_rows(tf, problems, meta.get("scenario"))
        run = {"path": str(tf.parent), "name": tf.parent.name, "status": meta.get("status"),
               "started_at": meta.get("started_at"), "environment": meta.get("environment") or {},
               "scenario": meta.get("scenario") or {}, "weights_bytes": meta.get("weights_bytes"),
               "capacity": meta.get("capacity") or [], "servers": meta.get("servers") or [],
               "executor": meta.get("executor"), "machines": meta.get("machines") or {}, "n_trials": len(rows)}
        runs.append(run)
        metas.append(meta)
        lost += [dict(row, run=run["name"], run_path=run["path"]) for row in retried]
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
    for key in ("max_kl", "max_server_kl", "min_agreement"):  # the quality a lossy mode must keep (quality:)
        trials[key] = trials["run_path"].map({r["path"]: _quality(r["scenario"], key) for r in runs})
    groups = trials["run_path"].map({r["path"]: r["group"] for r in runs})
    split: list[dict[str, Any]] = []  # a run measured on two or more placement kinds: one group per kind
    for r, meta, frame in zip(runs, metas, frames_by_run):
        labels = _machine_labels(frame)
        split += _machine_runs(r, meta, frame, labels) if len(labels) > 1 else [r]
    split_paths = {r["path"] for r in split if "machine" in r}
    if split_paths:
        at = trials["run_path"].isin(split_paths) & trials["machine"].notna()
        groups[at] = groups[at] + " @ " + trials.loc[at, "machine"].astype(str)
    base = {r["path"]: r["group"] for r in runs}
    for row in lost:
        split_here = row["run_path"] in split_paths and row.get("machine") is not None
        row["group"] = base[row["run_path"]] + (f" @ {row['machine']}" if split_here else "")
    return Results(prepare_trials(trials, groups), split, problems, lost)


def _repeats(scenario: dict[str, Any]) -> float:
    """The ``repeats`` a run's scenario asked for (NaN when run.json does not say)."""
    v = scenario.get("repeats")
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else float("nan")


def _quality(scenario: dict[str, Any], key: str) -> float:
    """A run's ``quality.max_kl``, ``quality.max_server_kl`` or ``quality.min_agreement`` (NaN when it sets none)."""
    v = (scenario.get("quality") or {}).get(key) if isinstance(scenario.get("quality"), dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


__all__ = ["LastRows", "Results", "last_rows_of", "load_results", "lost_host"]
