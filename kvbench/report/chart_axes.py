"""Axes that show what was measured: a value axis clipped to the central range of a chart's values, so that one
busy trial cannot stretch it and flatten every real result onto zero (the values beyond are drawn at the edge,
marked and labelled), and series of one chart set apart (markers and small offsets), so that equal lines stay
visible."""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Iterable

import numpy as np

#: A value is beyond the central range when it lies more than this many spreads (the interquartile range, or a
#: tenth of the quartiles' size when they are nearly equal) outside the quartiles of a chart's values.
FENCE = 3.0
#: Fewer values than this: no quartiles to judge by, every value is shown.
MIN_VALUES = 4
#: The margin added on each side of the range, as a fraction of it.
PAD = 0.08
#: Markers of the series of one mode (batch sizes, in order), so that lines drawn over each other stay apart.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: Offset between neighbouring series along a log₂ axis (× 2^(k × DODGE)): about 3.5% of a value per series.
DODGE = 0.05
#: The gid of the markers drawn for values beyond the axis (tests find them by it).
OUTLIER_GID = "beyond-axis"


def central_range(values: Iterable[float], include: Iterable[float] = (0.0,)) -> tuple[float, float]:
    """The limits of a value axis: from the least to the largest of ``values`` (the medians and interval ends
    drawn; NaN and infinities ignored) that lie within :data:`FENCE` spreads of their quartiles, and of
    ``include`` (a reference line, e.g. 0 = no change), with :data:`PAD` on each side. With fewer than
    :data:`MIN_VALUES` values every value counts. ``(-1, 1)`` with nothing to show."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    keep = list(include)
    if len(v) >= MIN_VALUES:
        q1, q3 = np.percentile(v, [25, 75])
        spread = max(q3 - q1, 0.1 * max(abs(q1), abs(q3)), 1e-9)
        v = v[(v >= q1 - FENCE * spread) & (v <= q3 + FENCE * spread)]
    both = np.concatenate([v, np.array(keep, dtype=float)])
    if not len(both):
        return -1.0, 1.0
    lo, hi = float(both.min()), float(both.max())
    span = hi - lo or max(abs(hi), 1.0)
    return lo - PAD * span, hi + PAD * span


def clip_axis(ax: Any, values: Iterable[float], include: Iterable[float] = (0.0,), unit: str = "",
              fmt: str = "{:+,.0f}") -> list[tuple[float, float]]:
    """Set ``ax``'s y limits to :func:`central_range` of ``values`` and mark every point drawn on ``ax`` (its
    labelled lines' data) that lies beyond them: a triangle at the edge it passed (▲ above, ▼ below) in the line's
    colour, labelled with its value (``fmt`` + ``unit``). Returns the (x, y) of the points marked."""
    lo, hi = central_range(values, include)
    ax.set_ylim(lo, hi)
    marked = []
    for line in [x for x in ax.get_lines() if not str(x.get_label()).startswith("_")]:  # no caps, no ref lines
        xs, ys = (np.asarray(d, dtype=float) for d in line.get_data())
        for x, y in zip(xs, ys):
            if not math.isfinite(y) or lo <= y <= hi:
                continue
            edge = hi if y > hi else lo
            ax.plot([x], [edge], marker="^" if y > hi else "v", markersize=9, color=line.get_color(),
                    linestyle="none", clip_on=False, zorder=4, gid=OUTLIER_GID)
            ax.annotate(fmt.format(y) + unit, (x, edge), xytext=(4, -10 if y > hi else 4),
                        textcoords="offset points", fontsize=7, color=line.get_color())
            marked.append((float(x), float(y)))
    if marked:
        ax.text(0.01, 0.99, f"{len(marked)} beyond the axis (▲▼, labelled)", transform=ax.transAxes, fontsize=7,
                va="top", color="#555")
    return marked


def dodge(k: int, n: int) -> float:
    """The factor that sets series ``k`` of ``n`` apart on a log₂ x axis (centred: the middle series is at ×1)."""
    return 2 ** ((k - (n - 1) / 2) * DODGE)


__all__ = ["DODGE", "FENCE", "MARKERS", "MIN_VALUES", "OUTLIER_GID", "PAD", "central_range", "clip_axis", "dodge"]
