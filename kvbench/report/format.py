"""Cells for people: milliseconds, sizes, ranges, percentages, ratios and their intervals, trial counts. Every
function takes raw numbers (seconds, bytes, percent) and returns text; a missing value (None or NaN) is ``-``
(``n/a`` where a comparison is missing)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from kvbench.results.rows import Status, agg

MIB, GIB = 2**20, 2**30

#: Trial statuses in the order the ``trials`` cell counts them (statuses kvbench does not know: ``other``).
STATUSES = (*Status, "other")


def finite_json(v: Any) -> Any:
    """``v`` with every NaN or infinite float (a figure that could not be measured) as None, at any depth of dicts,
    lists and tuples (tuples become lists): JSON has neither."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite_json(x) for x in v]
    return v


def missing(v: Any) -> bool:
    """True for None and NaN."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def size_unit(values: pd.Series) -> tuple[str, int]:
    """("GiB", 2**30) when the largest value (bytes) is at least 10 GiB, else ("MiB", 2**20)."""
    top = pd.to_numeric(values, errors="coerce").max()
    return ("GiB", GIB) if not missing(top) and top >= 10 * GIB else ("MiB", MIB)


def size(v: Any, unit: int) -> str:
    """Bytes in ``unit`` (e.g. :data:`MIB`), one decimal, thousands separated."""
    return "-" if missing(v) else f"{v / unit:,.1f}"


def mib(v: Any) -> str:
    """Bytes in MiB, one decimal (``-`` when missing, NaN included)."""
    return "-" if v is None or v != v else f"{v / MIB:,.1f}"


def gib_or_mib(n: float) -> str:
    """Bytes as ``1.50 GiB`` from 1 GiB up, else ``512.00 MiB``."""
    return f"{n / GIB:,.2f} GiB" if n >= GIB else f"{n / MIB:,.2f} MiB"


def count_units(n: float) -> str:
    """A count in B (10^9), M (10^6) or K (10^3), two decimals; below 1,000 the count itself."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f}"


def ms(v: Any) -> str:
    """Seconds in milliseconds: whole (thousands separated) from 100 ms up, one decimal below."""
    if missing(v):
        return "-"
    m = v * 1e3
    return f"{m:,.0f}" if m >= 100 else f"{m:.1f}"


def ms_range(median: Any, low: Any, high: Any, brackets: str = "[]", *, median_precision: bool = False,
             collapse: bool = True) -> str:
    """Seconds as ``median [min–max]`` in milliseconds (``brackets="()"``: ``median (min–max)``).

    Args:
        brackets: the two characters around the range: ``"[]"`` (``kvbench report``) or ``"()"`` (``kvbench run``).
        median_precision: every figure at the median's precision (whole ms when the median is at least 100 ms,
            else one decimal, thousands separated) instead of each at its own (:func:`ms`).
        collapse: the median alone when min equals max.

    Returns:
        ``-`` without a median.
    """
    if missing(median):
        return "-"
    if collapse and low == high:
        return ms(median)
    if median_precision:
        fmt = "{:,.0f}" if median >= 0.1 else "{:,.1f}"
        mid, lo, hi = (fmt.format(v * 1e3) for v in (median, low, high))
    else:
        mid, lo, hi = ms(median), ms(low), ms(high)
    return f"{mid} {brackets[0]}{lo}–{hi}{brackets[1]}"


def spread(row: Any, col: str, brackets: str = "[]", **style: bool) -> str:
    """A point's ``<col>_median [<col>_min–<col>_max]`` in milliseconds (``brackets`` and ``style``: as
    :func:`ms_range`)."""
    return ms_range(*(row[agg(col, s)] for s in ("median", "min", "max")), brackets, **style)


def ci(row: Any, col: str) -> str:
    """A point's ``<col>_ci_low–<col>_ci_high`` in milliseconds (``-`` without an interval)."""
    lo, hi = row[agg(col, "ci_low")], row[agg(col, "ci_high")]
    return "-" if missing(lo) else f"{ms(lo)}–{ms(hi)}"


def pct(v: Any, signed: bool = False) -> str:
    """A percentage, one decimal (``+`` before gains when ``signed``); ``n/a`` when missing."""
    return "n/a" if missing(v) else (f"{v:+.1f}" if signed else f"{v:.1f}")


def ratio(v: Any) -> str:
    """A ratio, two decimals."""
    return "-" if missing(v) else f"{v:.2f}"


def ratio_interval(v: Any, lo: Any, hi: Any) -> str:
    """A ratio with its 95% interval, e.g. ``0.91 [0.85, 0.97]``; the ratio alone without an interval (fewer than 5
    values); ``n/a`` without a ratio."""
    if missing(v):
        return "n/a"
    return f"{v:.2f}" if missing(lo) or missing(hi) else f"{v:.2f} [{lo:.2f}, {hi:.2f}]"


def number(v: Any, fmt: str) -> str:
    """``v`` in the format spec ``fmt`` (e.g. ``",.2f"``), never ``-0``; ``-`` when missing."""
    if v is None or v != v:
        return "-"
    text = format(v, fmt)
    return format(0.0, fmt) if float(text.replace(",", "")) == 0 else text


def status_counts(row: Any) -> str:
    """Trial counts per status of a point (its ``n_<status>`` columns), e.g. ``3 ok, 2 error``."""
    return ", ".join(f"{n} {s.replace('_', ' ')}" for s in STATUSES if (n := int(row.get(f"n_{s}", 0))))


def match(v: Any) -> str:
    """Whether ids matched ``none``'s: ``yes``, ``NO`` or ``-`` (not compared)."""
    return "-" if missing(v) else ("yes" if v else "NO")


def kl_cell(kl: Any, bound: Any = False) -> str:
    """A lossy mode's median KL against ``none`` (nats) in a table's ``= none`` cell: ``KL 0.050`` (two
    significant digits, trailing zeros kept); ``KL ≥0.050`` where it is a server's lower bound (``bound`` True)."""
    return f"KL {'≥' if bound in (True,) else ''}{kl:#.2g}"


__all__ = ["GIB", "MIB", "STATUSES", "ci", "count_units", "gib_or_mib", "kl_cell", "match", "mib", "missing", "ms",
           "ms_range", "number", "pct", "ratio", "ratio_interval", "size", "size_unit", "spread", "status_counts"]
