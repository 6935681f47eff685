"""The memory samples a report draws: which trials get a timeline by default, and reading them from each run's
``samples.csv`` (bounded, regular files only; an unreadable file costs its timelines, never the report)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from kvbench.results.load import Results
from kvbench.errors import BadFile
from kvbench.safe_read import open_regular
from kvbench.results.rows import MEASURED


def default_timelines(results: Results) -> dict[str, list[str]]:
    """Per group: the first measured trial of every mode at its longest prompt and largest batch (none of a server
    run: its samples are per mode, in run.json)."""
    picks = {}
    measured = results.trials[results.trials["status"].isin(MEASURED)]
    if "engine" in measured:  # a server run samples its server per mode, into run.json, not samples.csv
        measured = measured[measured["engine"].isna()]
    for group, t in measured.groupby("group", sort=False):
        top = t[t["prompt_tokens"] == t["prompt_tokens"].max()]
        top = top[top["batch_size"] == top["batch_size"].max()]
        picks[group] = top.groupby("mode_label", sort=False)["trial_id"].first().tolist()
    return picks


#: The largest samples.csv a report reads (bytes): a sample is about 150 bytes, so hours of 10 ms samples.
MAX_SAMPLES_BYTES = 2 << 30


def read_samples(path: Path) -> pd.DataFrame:
    """A run's ``samples.csv``: a regular file of at most :data:`MAX_SAMPLES_BYTES`, with ``trial_id``, ``phase``
    and ``t_s``; numeric columns that hold text become NaN (that sample draws nothing).

    Raises:
        BadFile: not a regular file, too large, or without those columns (the message says which).
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_SAMPLES_BYTES:
            raise BadFile(f"{size:,} bytes, over the {MAX_SAMPLES_BYTES:,} a report reads")
        samples = pd.read_csv(f, dtype={"trial_id": str, "phase": str}, low_memory=False)
    missing = [c for c in ("trial_id", "phase", "t_s") if c not in samples]
    if missing:
        raise BadFile(f"no {', '.join(missing)} column: not a kvbench samples file")
    for c in samples.columns.difference(["trial_id", "phase"]):
        samples[c] = pd.to_numeric(samples[c], errors="coerce")
    return samples.dropna(subset=["t_s"])


def load_samples(results: Results, trial_ids: list[str]) -> dict[str, tuple[pd.DataFrame, str]]:
    """Samples of the selected trials, read from each run's ``samples.csv``: trial id → (samples, mode)."""
    out: dict[str, tuple[pd.DataFrame, str]] = {}
    wanted = set(trial_ids)
    for run in results.runs:
        path = Path(run["path"]) / "samples.csv"
        if not path.is_file() or not wanted - set(out):
            continue
        try:
            samples = read_samples(path)
        except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            results.problems.append(f"{path}: unreadable ({str(exc).removeprefix(f'{path}: ')}); no timelines "
                                    "from it")
            continue
        rows = results.trials[results.trials["run_path"] == run["path"]].set_index("trial_id")["mode_label"]
        for tid, part in samples[samples["trial_id"].isin(wanted - set(out))].groupby("trial_id"):
            out[tid] = (part, rows.get(tid, ""))
    return out


__all__ = ["MAX_SAMPLES_BYTES", "default_timelines", "load_samples", "read_samples"]
