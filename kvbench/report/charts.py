"""The charts of ``kvbench report`` (matplotlib, Agg backend, PNG; every figure is closed after saving).

Text from input (group and mode names, trial ids) is drawn as plain text: :func:`save_figure` passes every text of a
figure through :func:`kvbench.safe_text.visible` and turns math text and TeX off for it, so a ``$`` reads as a
dollar sign. A chart that still fails is left out with one line (:func:`not_drawn`); the files beside it are
written all the same.

Every chart takes the per-point table of :func:`kvbench.analysis.points.point_table` (or samples) and a colour map from
:func:`mode_colours`, so a mode has the same colour in every chart of a report. matplotlib is imported on first
use, so that a command that draws no chart never loads it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.report.chart_axes import MARKERS, central_range, clip_axis, dodge
from kvbench.results.rows import MEASURED
from kvbench.safe_text import visible

MIB = 2**20
#: matplotlib's "tab10" colours, in order; modes beyond ten reuse them.
TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf"]
#: Fixed margins (fractions of the figure) per layout: a layout engine (tight or constrained) measures every text
#: before drawing and makes a chart 2–3× slower to save; these margins fit the labels the charts use.
TWO_PANELS = {"left": 0.07, "right": 0.985, "bottom": 0.12, "top": 0.85, "wspace": 0.22}
ONE_PANEL = {"left": 0.12, "right": 0.97, "bottom": 0.13, "top": 0.9}
_LINESTYLES = ["-", "--", ":", "-."]


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mode_colours(labels: list[str]) -> dict[str, str]:
    """A fixed colour per mode label (``none`` first, then in order of appearance), from :data:`TAB10`."""
    ordered = sorted(dict.fromkeys(labels), key=lambda m: (m != "none", labels.index(m)))
    return {m: TAB10[i % len(TAB10)] for i, m in enumerate(ordered)}


class ChartWarning(UserWarning):
    """A chart that could not be drawn (:func:`not_drawn` says which and why); the files beside it are written."""


def not_drawn(what: str, exc: BaseException) -> str:
    """The one line that says the chart ``what`` was not drawn, with the error's text on one line."""
    why = " ".join(str(exc).split())
    return f"{what}: chart not drawn ({type(exc).__name__}{': ' + why if why else ''})"


def _log_axis(ax: Any, which: str, base: float = 10, ticks: Any = None) -> None:
    """A log scale on ``ax``'s ``which`` axis ("x"/"y") labelled with plain numbers (256, 1024; 0.1, 10) instead
    of mathtext powers, which are slow to lay out and harder to read; ticks at ``ticks`` (e.g. the prompt lengths
    measured) when there are at most 12 of them, else at 1, 2 and 5 × powers of ``base``."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    axis = ax.xaxis if which == "x" else ax.yaxis
    values = sorted(set(ticks)) if ticks is not None else []
    if 0 < len(values) <= 12:
        axis.set_major_locator(FixedLocator(values))
    else:
        axis.set_major_locator(LogLocator(base=base, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _plain_text(fig: Any) -> None:
    """Every text of ``fig`` through :func:`visible` (a control character or an undecodable byte as an escape),
    read as plain text: no math text, no TeX. Tick labels that are drawn later come from their formatter's list,
    which is passed through :func:`visible` here (:func:`save_figure` turns math off while they are made)."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for formatter in (axis.get_major_formatter(), axis.get_minor_formatter()):
                if isinstance(formatter, FixedFormatter):
                    formatter.seq = [visible(x) for x in formatter.seq]
    for text in fig.findobj(Text):
        text.set_text(visible(text.get_text()))
        text.set_parse_math(False)
        text.set_usetex(False)


def save_figure(fig: Any, path: Path) -> Path:
    """Save ``fig`` as a PNG at ``path`` (110 dpi), its texts plain (:func:`_plain_text`), and close it, saved or
    not; returns ``path``. Nothing is left at ``path`` when saving fails."""
    import matplotlib

    try:
        _plain_text(fig)
        with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
            fig.savefig(path, dpi=110)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        pyplot().close(fig)
    return path


def _per_mode_lines(ax: Any, table: pd.DataFrame, x: str, y: str, colours: dict[str, Any],
                    by_batch: bool = True, interval: tuple[str, str] | None = None) -> list[float]:
    """One line per mode (and batch size), each batch size with its own marker and line style, every series
    shifted a little along the (log₂) x axis (:func:`~kvbench.report.chart_axes.dodge`), so that equal lines stay
    visible; with ``interval`` = (low column, high column), each point's 95% interval as an error bar. Returns
    every value drawn (medians and interval ends), for :func:`~kvbench.report.chart_axes.clip_axis`."""
    batches = sorted(table["batch_size"].unique())
    series = [(mode, j, b, part if b is None else part[part["batch_size"] == b])
              for mode, part in table.groupby("mode_label", sort=False)
              for j, b in enumerate(batches if by_batch else [None])]
    series = [(mode, j, b, rows.dropna(subset=[y]).sort_values(x)) for mode, j, b, rows in series]
    series = [s for s in series if not s[3].empty]
    drawn: list[float] = []
    for k, (mode, j, b, rows) in enumerate(series):
        label = mode if b is None or len(batches) == 1 else f"{mode}, batch {b}"
        xs = rows[x] * dodge(k, len(series))
        ax.plot(xs, rows[y], marker=MARKERS[j % len(MARKERS)], markersize=5, color=colours[mode],
                linestyle=_LINESTYLES[j % 4], label=label)
        drawn += list(rows[y])
        if interval is not None and interval[0] in rows:
            _error_bars(ax, xs, rows[y], rows[interval[0]], rows[interval[1]], colours[mode])
            drawn += list(rows[interval[0]]) + list(rows[interval[1]])
    return drawn


def _error_bars(ax: Any, x: pd.Series, y: pd.Series, low: pd.Series, high: pd.Series, colour: Any) -> None:
    """Vertical bars from ``low`` to ``high`` at ``x`` (points without an interval get none)."""
    has = low.notna() & high.notna()
    if has.any():
        ax.errorbar(x[has], y[has], yerr=[(y - low)[has].clip(lower=0), (high - y)[has].clip(lower=0)], fmt="none",
                    ecolor=colour, elinewidth=1, capsize=3, alpha=0.8)


def saving_and_overhead(table: pd.DataFrame, group: str, colours: dict[str, Any], path: Path) -> Path | None:
    """The article's two panels for one group: memory saving % (device KV peak vs ``none``) and time overhead %
    (TPOT vs ``none``) against prompt length, one line per mode and batch size; the overhead axis is clipped to the
    central range of its values (:func:`~kvbench.report.chart_axes.clip_axis`: values beyond it are marked at the
    edge and labelled). None when nothing to plot."""
    t = table[(table["group"] == group) & (table["mode"] != "none")]
    if t[["memory_saving_pct", "time_overhead_pct"]].notna().to_numpy().sum() == 0:
        return None
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=TWO_PANELS)
    _per_mode_lines(a, t, "prompt_tokens", "memory_saving_pct", colours)
    drawn = _per_mode_lines(b, t, "prompt_tokens", "time_overhead_pct", colours,
                            interval=("time_overhead_ci_low", "time_overhead_ci_high"))
    a.set(title="Device KV memory saved vs none (exact bytes)", xlabel="prompt length (tokens)",
          ylabel="memory saving (%)")
    b.set(title="TPOT overhead vs none (paired; bars: 95% interval)", xlabel="prompt length (tokens)",
          ylabel="time overhead (%)")
    b.axhline(0, color="grey", linewidth=0.8)
    clip_axis(b, drawn, unit="%")  # one busy trial's +1,600% would flatten every other point onto 0
    for ax in (a, b):
        _log_axis(ax, "x", 2, t["prompt_tokens"])
        ax.grid(alpha=0.3)
    a.legend(fontsize=7)
    fig.suptitle(group)
    return save_figure(fig, path)


def throughput_vs_batch(table: pd.DataFrame, group: str, colours: dict[str, Any], path: Path) -> Path | None:
    """Throughput (tokens/s) and device KV peak (MiB) against batch size at the group's longest prompt, one line
    per mode, with the budget line where one was set; over-budget points are marked with a red × in both panels."""
    t = table[table["group"] == group]
    if t.empty or t["throughput_tokens_per_s_median"].notna().sum() == 0:
        return None
    longest = t.loc[t["throughput_tokens_per_s_median"].notna(), "prompt_tokens"].max()
    t = t[t["prompt_tokens"] == longest]
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=TWO_PANELS)
    marked = False  # the legend names the over-budget mark once
    for mode, part in t.groupby("mode_label", sort=False):
        part = part.dropna(subset=["throughput_tokens_per_s_median"]).sort_values("batch_size")
        if part.empty:
            continue
        a.plot(part["batch_size"], part["throughput_tokens_per_s_median"], marker="o", color=colours[mode], label=mode)
        over = part[part["n_over_budget"] > 0]
        a.scatter(over["batch_size"], over["throughput_tokens_per_s_median"], marker="x", s=80, color="red", zorder=3,
                  label="over the budget" if len(over) and not marked else None)
        marked = marked or len(over) > 0
        if "throughput_tokens_per_s_ci_low" in part:
            _error_bars(a, part["batch_size"], part["throughput_tokens_per_s_median"],
                        part["throughput_tokens_per_s_ci_low"], part["throughput_tokens_per_s_ci_high"], colours[mode])
        b.plot(part["batch_size"], part["kv_device_peak_bytes_median"] / MIB, marker="o", color=colours[mode],
               label=mode)
        b.scatter(over["batch_size"], over["kv_device_peak_bytes_median"] / MIB, marker="x", s=80, color="red",
                  zorder=3)
    budget = t["budget_bytes"].dropna()
    if len(budget):
        b.axhline(budget.iloc[0] / MIB, color="red", linestyle="--", linewidth=1,
                  label=f"budget {budget.iloc[0] / MIB:,.0f} MiB")
    a.set(title=f"Throughput at {longest} prompt tokens (bars: 95% interval)", xlabel="batch size (sequences)",
          ylabel="throughput (generated tokens/s)")
    b.set(title=f"Device KV peak at {longest} prompt tokens", xlabel="batch size (sequences)",
          ylabel="device KV peak (MiB)")
    for ax in (a, b):
        ax.set_xticks(sorted(t["batch_size"].unique()))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(group)
    return save_figure(fig, path)


def bytes_per_token(table: pd.DataFrame, group: str, colours: dict[str, Any], path: Path) -> Path | None:
    """Bytes moved (H2D + D2H + disk reads and writes) per generated token against prompt length, per mode
    and batch size (log scale)."""
    t = table[(table["group"] == group) & (table["bytes_moved_per_token_median"] > 0)]
    if t.empty:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2), gridspec_kw=ONE_PANEL)
    t = t.assign(moved_mib=t["bytes_moved_per_token_median"] / MIB)
    _per_mode_lines(ax, t, "prompt_tokens", "moved_mib", colours)
    ax.set(title=f"{group}: bytes moved per generated token", xlabel="prompt length (tokens)",
           ylabel="moved per token (MiB)")
    _log_axis(ax, "x", 2, t["prompt_tokens"])
    _log_axis(ax, "y")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def reuse_ttft(turns: pd.DataFrame, trials: pd.DataFrame, group: str, colours: dict[str, Any],
               path: Path) -> Path | None:
    """TTFT of recompute (cold, dashed) vs restore (warm, solid) for one reuse group: median per turn index, one
    line per mode (from :func:`kvbench.analysis.reuse.reuse_table`), and every measured trial against its prompt length
    (cold ○, warm ●). None when nothing was measured."""
    t = turns[turns["group"] == group]
    pts = trials[(trials["group"] == group) & trials["status"].isin(MEASURED)]
    if t.empty or pts.empty:
        return None
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=TWO_PANELS)
    for mode, part in t.groupby("mode_label", sort=False):
        part = part.sort_values("turn_index")
        a.plot(part["turn_index"], part["cold_ttft_s"] * 1e3, marker="o", color=colours[mode], linestyle="--",
               label=f"{mode} recompute")
        a.plot(part["turn_index"], part["warm_ttft_s"] * 1e3, marker="o", color=colours[mode], linestyle="-",
               label=f"{mode} restore")
    for (mode, warm), part in pts.groupby(["mode_label", "warm"], sort=False):
        b.scatter(part["prompt_tokens"], part["ttft_s"].astype(float) * 1e3, s=18, color=colours[mode],
                  facecolors=colours[mode] if warm else "none", label=f"{mode} {'restore' if warm else 'recompute'}")
    a.set(title="TTFT per turn (median)", xlabel="turn index (1 = first request of a conversation/document)",
          ylabel="TTFT (ms)")
    a.set_xticks(sorted(t["turn_index"].unique()))
    b.set(title="TTFT vs prompt length (every trial: ○ recompute, ● restore)", xlabel="prompt length (tokens)",
          ylabel="TTFT (ms)")
    for ax in (a, b):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    a.legend(fontsize=7)
    fig.suptitle(f"{group}: restore vs recompute")
    return save_figure(fig, path)


def cost_bars(costs: pd.DataFrame, path: Path) -> Path | None:
    """USD per 1M generated tokens per mode, grouped by scenario and prompt length (bars; modes with no
    qualifying point have none), the axis clipped to the central range of the bars and their intervals
    (:func:`~kvbench.report.chart_axes.central_range`; what lies beyond is labelled with its value at the top).
    None when nothing qualified."""
    c = costs.dropna(subset=["usd_per_million"])
    if c.empty:
        return None
    plt = pyplot()
    colours = mode_colours(list(costs["mode_label"]))
    points = list(dict.fromkeys(zip(c["group"], c["prompt_tokens"])))
    modes = list(dict.fromkeys(c["mode_label"]))
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.2 * len(points) * len(modes) ** 0.5), 4.2), gridspec_kw=ONE_PANEL)
    drawn: list[tuple[float, float]] = []
    for j, mode in enumerate(modes):
        xs, ys, lo, hi = [], [], [], []
        for i, point in enumerate(points):
            hit = c[(c["group"] == point[0]) & (c["prompt_tokens"] == point[1]) & (c["mode_label"] == mode)]
            if len(hit):
                xs.append(i + (j - (len(modes) - 1) / 2) * width)
                ys.append(hit["usd_per_million"].iloc[0])
                lo.append(hit["usd_ci_low"].iloc[0] if "usd_ci_low" in hit else math.nan)
                hi.append(hit["usd_ci_high"].iloc[0] if "usd_ci_high" in hit else math.nan)
        ax.bar(xs, ys, width=width, color=colours[mode], label=mode)
        _error_bars(ax, pd.Series(xs, dtype=float), pd.Series(ys, dtype=float), pd.Series(lo, dtype=float),
                    pd.Series(hi, dtype=float), "black")
        drawn += list(zip(xs, ys)) + list(zip(xs, lo)) + list(zip(xs, hi))
    top = central_range([v for _, v in drawn])[1]  # a busy trial's interval end cannot stretch the axis
    ax.set_ylim(0, top)
    for x, v in drawn:  # a bar or interval end beyond the axis: its value at the edge
        if v == v and v > top:
            ax.annotate(f"▲ {v:,.0f}", (x, top), xytext=(0, -9), textcoords="offset points", ha="center",
                        fontsize=6)
    ax.set_xticks(range(len(points)), [f"{g}\n{p} tokens" for g, p in points], fontsize=8)
    ax.set(title="Cost per 1M generated tokens (best qualifying batch; bars: 95% interval)",
           ylabel="USD per 1M tokens")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def memory_timelines(trials: list[tuple[str, pd.DataFrame, Any]], title: str, path: Path) -> Path | None:
    """Memory over time of several trials from ``samples.csv``, one panel each (same KV scale, so modes compare at
    a glance): the cache's KV on the device, in host memory and on disk (MiB), and on a second axis the process's
    GPU memory and RSS where sampled; the prefill→decode switch is a vertical line.

    Args:
        trials: (trial id, its samples, the mode's colour) per panel.
        title: the figure's title.
        path: the PNG to write.

    Returns:
        ``path``, or None when no trial has samples.
    """
    trials = [(tid, s.sort_values("t_s"), c) for tid, s, c in trials if not s.empty]
    if not trials:
        return None
    height = 1.2 + 2.1 * len(trials)  # inches: fixed margins in inches, whatever the number of panels
    plt = pyplot()
    fig, axes = plt.subplots(len(trials), 1, figsize=(8, height), sharey=True, squeeze=False,
                             gridspec_kw={"left": 0.09, "right": 0.87, "top": 1 - 0.75 / height,
                                          "bottom": 0.45 / height, "hspace": 0.75 * len(trials) / height})
    series = [("kv_device_bytes", "KV on device", "-"), ("kv_host_bytes", "KV in host memory", "--"),
              ("kv_disk_bytes", "KV on disk", ":")]
    for ax, (tid, s, colour) in zip(axes[:, 0], trials):
        for col, label, style in series:
            if col in s and s[col].notna().any():
                ax.plot(s["t_s"], s[col] / MIB, linestyle=style, color=colour, label=label)
        ax.set_title(tid, fontsize=9)
        ax.set_ylabel("KV (MiB)")
        right = ax.twinx()
        for col, label, c in (("gpu_process_bytes", "GPU memory of this process", "black"),
                              ("rss_bytes", "process RSS", "grey")):
            if col in s and s[col].notna().any():
                right.plot(s["t_s"], s[col] / MIB, color=c, linewidth=0.8, alpha=0.7, label=label)
        right.set_ylabel("process (MiB)")
        right.ticklabel_format(axis="y", useOffset=False, style="plain")  # 1057.2, not "+1.057e3" and 0.2
        decode = s[s["phase"] == "decode"]
        if len(decode):
            ax.axvline(decode["t_s"].iloc[0], color="grey", linestyle="-.", linewidth=0.8, label="decode starts")
        ax.grid(alpha=0.3)
        if ax is axes[0, 0]:
            lines, more = ax.get_legend_handles_labels(), right.get_legend_handles_labels()
            ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right", ncols=2)
    axes[-1, 0].set_xlabel("time since trial start (s)")
    fig.suptitle(title)
    return save_figure(fig, path)


__all__ = ["TAB10", "ChartWarning", "bytes_per_token", "cost_bars", "memory_timelines", "mode_colours", "not_drawn",
           "saving_and_overhead", "throughput_vs_batch"]
