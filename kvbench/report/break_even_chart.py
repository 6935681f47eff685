"""The break-even map as heatmaps: per scenario and mode one figure, one panel per working-set ratio, shared share
(x) × prompt length (y), coloured by the saving in USD per 1M generated tokens (percent; measured where measured,
else the model's prediction), with the pays/does-not-pay boundary drawn between cells, inconclusive cells hatched
and model-filled cells marked ``model``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.break_even import panel_rank
from kvbench.report.charts import pyplot, save_figure
from kvbench.report.format import number

#: The colour scale's half range (percent): savings beyond ±60% take the end colours.
SCALE_PCT = 60.0


def _pays(r: dict[str, Any]) -> bool:
    return r["label"] in ("pays", "model: pays")


def _value(r: dict[str, Any]) -> float:
    v = r["saving_pct"] if r["source"] == "measured" else r["predicted_saving_pct"]
    return float(v) if v == v and v is not None else np.nan


def break_even_heatmap(cells: pd.DataFrame, title: str, path: Path) -> Path | None:
    """One figure of the cells of one scenario and mode (:class:`kvbench.analysis.break_even.BreakEvenMap`'s
    ``cells``), saved to ``path``; None without cells. Each cell reads its saving (percent) and its label: ``pays``,
    ``loses``, ``?`` (inconclusive, hatched), ``bad`` (ids differ); model-filled cells say ``model`` and have a
    dotted edge; a thick black line separates cells that pay from cells that do not."""
    if cells.empty:
        return None
    plt = pyplot()
    panels = sorted(dict.fromkeys(cells["panel"]), key=panel_rank)
    xs = sorted(cells["shared_pct"].astype(int).unique())
    ys = sorted(cells["prompt_tokens"].astype(int).unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(1.0 + 0.95 * len(xs) * len(panels), 1.4 + 0.6 * len(ys)),
                             squeeze=False)
    fig.subplots_adjust(left=0.09, right=0.88, bottom=0.2, top=0.8, wspace=0.25)
    image = None
    for ax, panel in zip(axes[0], panels):
        part = {(int(r["shared_pct"]), int(r["prompt_tokens"])): r
                for r in cells[cells["panel"] == panel].to_dict("records")}
        grid = np.full((len(ys), len(xs)), np.nan)
        for (x, y), r in part.items():
            grid[ys.index(y), xs.index(x)] = _value(r)
        image = ax.imshow(grid, cmap="RdBu", vmin=-SCALE_PCT, vmax=SCALE_PCT, origin="lower", aspect="auto")
        for (x, y), r in part.items():
            i, j = ys.index(y), xs.index(x)
            model = r["source"] != "measured"
            if r["label"] in ("inconclusive", "model: inconclusive"):
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.35",
                                           linewidth=0, zorder=2))
            if model:
                ax.add_patch(plt.Rectangle((j - 0.47, i - 0.47), 0.94, 0.94, fill=False, linestyle=":",
                                           edgecolor="0.3", linewidth=0.8))
            v = _value(r)
            word = {"pays": "pays", "loses": "loses", "inconclusive": "?", "invalid": "bad ids"}.get(
                str(r["label"]).removeprefix("model: "), "")
            text = ("n/a" if v != v else number(v, "+.0f") + "%") + f"\n{word}" + ("\nmodel" if model else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if v == v and abs(v) > 0.6 * SCALE_PCT else "black")
        for (x, y), r in part.items():  # the boundary: an edge between a cell that pays and one that does not
            i, j = ys.index(y), xs.index(x)
            for di, dj in ((0, 1), (1, 0)):
                other = part.get((xs[j + dj], ys[i + di])) if j + dj < len(xs) and i + di < len(ys) else None
                if other is not None and _pays(r) != _pays(other):
                    if dj:
                        ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], color="black", linewidth=2.5)
                    else:
                        ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], color="black", linewidth=2.5)
        ax.set_xticks(range(len(xs)), [f"{x}%" for x in xs], fontsize=8)
        ax.set_yticks(range(len(ys)), [str(y) for y in ys], fontsize=8)
        ax.set_xlabel("shared prefix (% of prompt)", fontsize=8)
        if ax is axes[0][0]:
            ax.set_ylabel("prompt (tokens)", fontsize=8)
        ax.set_title(f"KV working set {panel} budget", fontsize=9)
    cax = fig.add_axes((0.9, 0.2, 0.015, 0.6))
    fig.colorbar(image, cax=cax).set_label("saving, USD per 1M tokens (%)", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


__all__ = ["SCALE_PCT", "break_even_heatmap"]
