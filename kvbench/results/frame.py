"""Trial rows as one pandas DataFrame: the row's columns (:mod:`kvbench.results.rows`) plus the per-trial columns
derived from them (:data:`kvbench.results.rows.FRAME_COLUMNS`), the frame every table of :mod:`kvbench.analysis`
takes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvbench.results.rows import MEASURED


def numeric(df: pd.DataFrame, col: str) -> pd.Series:
    """Column ``col`` of ``df`` as floats (NaN where a value is null or not a number, all NaN when ``df`` has no
    such column)."""
    if col not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce").astype(float)


def trials_frame(rows: list[dict[str, Any]], group: str) -> pd.DataFrame:
    """Trial rows of one scenario (e.g. a run being written) as the frame :func:`kvbench.analysis.points.point_table`
    takes, all in ``group``."""
    return prepare_trials(pd.DataFrame(rows), group)


def prepare_trials(trials: pd.DataFrame, group: Any) -> pd.DataFrame:
    """``trials`` (one row per trial) with ``group`` (one name, or a Series aligned with it), ``mode_label`` filled
    from ``mode`` where absent, ``message`` and ``run_path`` where absent, and the derived columns
    ``bytes_moved_per_token``, ``h2d_bytes_per_step``, ``kv_measured_bytes`` and ``kv_check_error``; changed in
    place and returned."""
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


def _derive(df: pd.DataFrame) -> None:
    """Columns computed per trial: bytes moved per generated token, the KV accounting check."""
    moved = sum(numeric(df, c).fillna(0) for c in ("h2d_bytes", "d2h_bytes", "disk_read_bytes", "disk_write_bytes"))
    tokens = numeric(df, "n_output_tokens") * numeric(df, "batch_size")
    has_traffic = numeric(df, "h2d_bytes").notna() | (df["mode"] == "none")
    df["bytes_moved_per_token"] = (moved / tokens).where(has_traffic & (tokens > 0))
    steps = numeric(df, "n_output_tokens") - 1
    df["h2d_bytes_per_step"] = (numeric(df, "h2d_bytes") / steps).where(steps > 0)
    # rows of older runs have no kv_stored_peak_bytes: only `none` (all KV on the device) can be checked there
    stored = numeric(df, "kv_stored_peak_bytes").fillna(numeric(df, "kv_device_peak_bytes").where(df["mode"] == "none"))
    measured = df["status"].isin(MEASURED) & numeric(df, "kv_device_peak_bytes").notna()
    df["kv_measured_bytes"] = stored.where(measured)
    df["kv_check_error"] = df["kv_measured_bytes"] / numeric(df, "kv_bytes_predicted") - 1


__all__ = ["numeric", "prepare_trials", "trials_frame"]
