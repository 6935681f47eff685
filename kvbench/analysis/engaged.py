"""The offload-engaged gate: no verdict for a reuse or offload mode unless its run shows that it engaged.

A key that silently does nothing gives a run that looks like a result (llm-d-benchmark's CPU-offload experiment once
set one; LMCache users report "hit tokens: 0" runs). So before any verdict the rows must show the mode at work:
for a server configuration, cached prompt tokens on a warm request or bytes in its slot files; for a reuse mode of
the in-process engine, tokens restored from its store; for an offload mode, KV held on the host or disk. Otherwise
the verdict is "not engaged" with what was read.
"""

from __future__ import annotations

import pandas as pd


def _total(rows: pd.DataFrame, col: str) -> float | None:
    """Σ ``col`` over ``rows``, None where no row has a value."""
    if col not in rows:
        return None
    v = pd.to_numeric(rows[col], errors="coerce")
    return float(v.sum()) if v.notna().any() else None


def reuse_not_engaged(warm: pd.DataFrame) -> str:
    """Of the measured warm rows of one reuse mode: ``""`` when it engaged, else why it shows nothing
    (``"not engaged: 0 cached prompt tokens over 9 requests"``). A server mode engages with a cached prompt token
    (``cached_prompt_tokens``) or a byte in its slot files (``store_disk_bytes``); the in-process engine with a
    restored token (``tokens_restored``). A cold server mode (``none``) is the reference: never gated."""
    if warm.empty:
        return ""
    n = len(warm)
    reqs = f"{n} request{'s' if n != 1 else ''}"
    if "engine" in warm and warm["engine"].notna().all():
        cached, disk = _total(warm, "cached_prompt_tokens"), _total(warm, "store_disk_bytes")
        if (cached or 0) > 0 or (disk or 0) > 0:
            return ""
        if cached is None:
            return f"not engaged: the server reported no cached prompt tokens on any of {reqs}"
        return f"not engaged: 0 cached prompt tokens over {reqs}" + (
            ", 0 bytes in its slot files" if disk is not None else "")
    restored = _total(warm, "tokens_restored")
    return "" if (restored or 0) > 0 else f"not engaged: no stored token was restored over {reqs}"


def warm_start(rows: pd.DataFrame) -> str:
    """Of a server mode's rows (and its baseline's): ``""`` when every server it ran on was verified cold (the first
    request of each reused 0 tokens: ``cold_verified``), else ``"inconclusive: 2 of 5 servers began warm (their
    first request reused cached tokens): not a cold start"``. A server kvbench did not start (kind openai) keeps
    what earlier modes and repeats left, unless reset; such a comparison measures that, not the mode."""
    if "cold_verified" not in rows:
        return ""
    first = rows["cold_verified"].map(lambda v: v if isinstance(v, bool) else None).dropna()
    warm = int((~first.astype(bool)).sum())
    if not warm:
        return ""
    return (f"inconclusive: {warm} of {len(first)} servers began warm (their first request reused cached tokens): "
            "not a cold start")


def offload_not_engaged(point: dict) -> str:
    """Of one point of :func:`kvbench.analysis.points.point_table` (a dict of its columns): ``""`` when its
    mode held KV off the device (median host or disk peak above 0) or is ``none``, else ``"not engaged: no KV
    left the device (host and disk peaks 0)"``, e.g. a window that holds the whole prompt."""
    if point.get("mode") == "none":
        return ""
    held = [point.get(c) for c in ("kv_host_peak_bytes_median", "kv_disk_peak_bytes_median")]
    if any(v is not None and v == v and v > 0 for v in held):
        return ""
    if all(v is None or v != v for v in held):
        return "not engaged: no host or disk KV peak was recorded"
    return "not engaged: no KV left the device (host and disk peaks 0)"


__all__ = ["offload_not_engaged", "reuse_not_engaged", "warm_start"]
