"""``kvbench cost`` as a library: the cost tables as text cells, the verdict lines, and the files (``cost.csv``,
``cost.json``, ``cost.png``, ``reuse_cost.csv``); :func:`cost_report` computes and writes them all."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pandas as pd

from kvbench.analysis.server_load import server_load_table
from kvbench.analysis.cost import Prices, cost_table
from kvbench.analysis.intervals import pct_interval
from kvbench.analysis.points import point_table
from kvbench.results.load import Results
from kvbench.analysis.reuse_cost import HOST_TIER_BASES, reuse_cost
from kvbench.arguments import path_arg, positive_seconds
from kvbench.errors import BadParameter, UnwritableOutput, UserError
from kvbench.report import charts
from kvbench.report.cost_verdicts import (baseline_cell, mode_in_cell, quiet_note, reuse_verdicts, verdict_cell,
                                         verdicts, with_baselines)
from kvbench.report.format import number
from kvbench.results.rows import MEASURED
from kvbench.results.run_dir import refuse_symlink_dir


@dataclass
class CostReport:
    """What :func:`cost_report` computed (and wrote).

    Attributes:
        prices: the prices and plans it costed at.
        table: :func:`kvbench.analysis.cost.cost_table` of the results (empty without points).
        reuse: :func:`kvbench.analysis.reuse_cost.reuse_cost` of their reuse workloads (empty without).
        server_load: :func:`kvbench.analysis.server_load.server_load_table` of their server runs, with the SLOs
            (per request) and goodput (empty without server runs).
        files: the files written (empty until written).
    """

    prices: Prices
    table: pd.DataFrame
    reuse: pd.DataFrame
    server_load: pd.DataFrame = field(default_factory=pd.DataFrame)
    files: list[Path] = field(default_factory=list)

    def verdicts(self) -> dict[str, list[str]]:
        """:func:`verdicts` of the table (empty without rows)."""
        return verdicts(self.table) if len(self.table) else {}

    def host_bases(self) -> list[str]:
        """What the host memory charged was (:data:`kvbench.analysis.cost.HOST_HELD_COLUMNS`), each once, sorted."""
        return sorted(set(self.table["host_basis"]) - {""}) if "host_basis" in self.table else []


def compute_costs(results: Results, prices: Prices, max_ttft_s: float | None = None,
                  max_tpot_s: float | None = None, host_tier: str = "configured") -> CostReport:
    """The cost of every measured point of ``results`` and of their reuse workloads at ``prices``, with the
    optional SLOs (a point's median TTFT and TPOT at most so many seconds; for a server run's goodput, each
    request's own); a server mode's host tier charged as ``host_tier`` says (``configured``: its flags' size;
    ``measured``: its RSS growth beyond ``none``'s; :func:`kvbench.analysis.reuse_cost.server_host_bytes`);
    nothing written.

    Raises:
        kvbench.errors.BadParameter: ``results`` is no :class:`~kvbench.results.load.Results`, ``prices`` no
            :class:`~kvbench.analysis.cost.Prices`, an SLO not a finite number of seconds above 0, or
            ``host_tier`` not one of :data:`~kvbench.analysis.reuse_cost.HOST_TIER_BASES`.
    """
    if not isinstance(results, Results):
        raise BadParameter(f"{{results}} must be kvbench.load_results(...), not {type(results).__name__}", "results")
    if not isinstance(prices, Prices):
        raise BadParameter(f"{{prices}} must be a kvbench.Prices, not {type(prices).__name__}", "prices")
    max_ttft_s, max_tpot_s = positive_seconds(max_ttft_s, "max_ttft_s"), positive_seconds(max_tpot_s, "max_tpot_s")
    if host_tier not in HOST_TIER_BASES:
        raise BadParameter(f"{{host_tier}} must be one of {', '.join(HOST_TIER_BASES)}, not {host_tier!r}",
                           "host_tier")
    points = point_table(results.trials)
    table = cost_table(points, prices, results.trials, max_ttft_s, max_tpot_s) if len(points) else points
    return CostReport(prices, table, reuse_cost(results.trials, prices, host_tier=host_tier, servers=results.servers),
                      server_load_table(results.trials, max_ttft_s, max_tpot_s))


def cost_report(results: Results, out_dir: str | Path, prices: Prices, max_ttft_s: float | None = None,
                max_tpot_s: float | None = None, host_tier: str = "configured") -> CostReport:
    """:func:`compute_costs`, then :func:`write_costs` into ``out_dir``; the report's ``files`` are those written.

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written.
    """
    out_dir = path_arg(out_dir, "out_dir")
    rep = compute_costs(results, prices, max_ttft_s, max_tpot_s, host_tier)
    rep.files = write_costs(rep.table, out_dir, prices, rep.reuse, rep.server_load)
    return rep


#: The caption of :func:`cost_display`'s table in the terminal.
COST_CAPTION = ("best qualifying batch per mode (all trials ok within the budget, ids equal to none's, measured "
                "`repeats` times, SLOs met); USD/1M with the 95% interval of its throughput; saving against none at "
                "the same prompt length, paired by repeat, with its 95% interval over the pairs (paired: it need not "
                "equal 1 − the two USD/1M medians); verdict: lowers or raises cost only when the pairs decide, else "
                "why not (the lines below say it whole)")


def cost_display(table: pd.DataFrame, monthly: bool = False, payback: bool = False) -> pd.DataFrame:
    """:func:`kvbench.analysis.cost.cost_table` as text cells: scenario, prompt, mode, batch, tokens/s, USD/1M (with
    the interval of its throughput), saving % against ``none`` (paired, with its interval; ``ref`` for ``none``; why
    nothing qualified where nothing did), pairs, the verdict (:func:`~kvbench.report.cost_verdicts.verdict_cell`:
    ``lowers cost``, ``raises cost`` or why the pairs do not decide), and with ``monthly`` USD/month, with
    ``payback`` payback months."""
    cols = ["scenario", "prompt", "mode", "batch", "tokens/s", "USD/1M", "saving % vs none", "pairs", "verdict"] + \
        (["USD/month"] if monthly else []) + (["payback months"] if payback else [])
    rows = []
    for r in table.to_dict("records"):
        if r["usd_per_million"] != r["usd_per_million"]:
            cells = ["-", "-", "-", r["why"], "-", "-"] + (["-"] if monthly else []) + (["-"] if payback else [])
        else:
            usd = f"{r['usd_per_million']:,.2f}" + ("" if r["usd_ci_low"] != r["usd_ci_low"] else
                                                    f" [{r['usd_ci_low']:,.2f}–{r['usd_ci_high']:,.2f}]")
            none = r["mode"] == "none"
            cells = [str(int(r["batch_size"])), f"{r['throughput_tokens_per_s']:,.2f}", usd,
                     "ref" if none else
                     pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1).replace("%", ""),
                     "-" if none else str(int(r["pairs"])),
                     "ref" if none else verdict_cell(r["cost_verdict"], r["saving_pct"])]
            if monthly:
                m = r["monthly_saving_usd"]
                cells.append("-" if m is None or m != m else f"{m:,.0f}")
            if payback:
                pb = r["payback_months"]
                cells.append("-" if pb is None or pb != pb else f"{pb:.1f}")
        rows.append([r["group"], str(int(r["prompt_tokens"])), r["mode_label"], *cells])
    return pd.DataFrame(rows, columns=cols, dtype=object)


def reuse_cost_display(reuse: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`kvbench.analysis.reuse_cost.reuse_cost` as text cells, one row per scenario × mode × baseline: what
    the saving is taken against (``vs``: :func:`~kvbench.report.cost_verdicts.baseline_cell`; ``none`` where the
    rows do not say), throughput and cost of the baseline (cold: ``none`` recomputing every prompt, or the
    prefix-cache mode for a tier saving) vs the mode (warm: restoring), the saving with its interval, pairs, the
    verdict, prefill and TTFT saved, whether the ids matched ``none``'s, and what memory was charged beside the
    device (``charged``). Returns (cells, marks): marks has ``worse`` where restored ids differ, else ``""``."""
    cols = ["scenario", "mode", "vs", "requests", "tok/s cold", "tok/s warm", "USD/1M cold", "USD/1M warm",
            "saving %", "pairs", "verdict", "prefill saved %", "TTFT saved ms", "= none", "charged"]
    rows = []
    for r in with_baselines(reuse).to_dict("records"):
        rows.append([r["group"], mode_in_cell(r), baseline_cell(r["baseline"], r["saving_kind"]), str(r["requests"]),
                     number(r["recompute_tokens_per_s"], ",.2f"), number(r["restore_tokens_per_s"], ",.2f"),
                     number(r["recompute_usd_per_million"], ",.2f"), number(r["restore_usd_per_million"], ",.2f"),
                     pct_interval(r["saving_pct"], r["saving_ci_low"], r["saving_ci_high"], 1).replace("%", ""),
                     quiet_count(r), verdict_cell(r["saving_verdict"], r["saving_pct"]),
                     number(r["prefill_saved_pct"], ".1f"), number(r["ttft_saved_s"] * 1e3, ",.0f"),
                     {True: "yes", False: "NO", "near tie": "near tie"}.get(r["tokens_match"], "-"),
                     r.get("charged") or "-"])
    cells = pd.DataFrame(rows, columns=cols, dtype=object)
    marks = pd.DataFrame("", index=cells.index, columns=cols, dtype=object)
    marks["= none"] = ["worse" if v == "NO" else "" for v in cells["= none"]]
    return cells, marks


def reuse_cost_caption(server: bool) -> str:
    """The caption of :func:`reuse_cost_display`'s table in the terminal; ``server``: some of its rows are server
    runs (each mode at its own concurrency, its cold side ``none`` on the same requests)."""
    return (("each server mode at its own concurrency; " if server else "the same requests one at a time; ")
            + "vs: what the saving is taken against, cold = that baseline (none: recompute every prompt, the reuse "
            "saving; a prefix-cache mode: the tier saving of a host or disk tier), warm = the mode restoring stored "
            "prefixes (charged --host-price for the memory it holds beside the device, --disk-price for its disk: "
            "the charged column says what); tokens/s = generated tokens ÷ e2e time; saving with its 95% interval "
            "(the jackknife over conversations of the request pairs); pairs (n quiet): busy pairs set no figure, "
            "the tokens/s and costs are the quiet pairs' trials; prefill saved = prompt tokens restored instead of "
            "computed"
            + ("; a server mode's cold side is `none` on the same requests and concurrency, its tokens/s ÷ the time "
               "requests were in flight, a slot restore inside TTFT" if server else ""))


def quiet_count(r: dict[str, Any]) -> str:
    """A comparison's pairs, and where busy ones set no figure, how many quiet ones did: ``6 (1 quiet)``; the
    throughputs and costs beside it are those pairs' trials."""
    return f"{r['pairs']}{quiet_note(r)}"


def what_if_lines(prices: Prices, w: dict[str, Any], base_tokens_per_s: float,
                  offload_tokens_per_s: float) -> list[str]:
    """The lines of a what-if (``w`` = :func:`kvbench.analysis.cost.what_if`): the cost per 1M tokens before and
    after, the saving per month and the payback where the prices plan them."""
    lines = [f"cost per 1M generated tokens at {prices.gpu_per_hour:g} USD per GPU-hour: "
             f"{w['base_usd_per_million']:,.2f} → {w['offload_usd_per_million']:,.2f} USD ({w['saving_pct']:.1f}% "
             f"saving; {base_tokens_per_s:g} → {offload_tokens_per_s:g} tokens/s)"]
    if w["monthly_saving_usd"] is not None:
        lines.append(f"at {prices.tokens_per_month:,.0f} tokens per month: {w['monthly_saving_usd']:,.2f} USD per "
                     "month")
    if w["payback_months"] is not None:
        lines.append(f"payback of {prices.engineering_cost:,.0f} USD: {w['payback_months']:.1f} months")
    elif prices.engineering_cost is not None:
        lines.append(f"no payback of {prices.engineering_cost:,.0f} USD: offload saves nothing here")
    if w["saving_pct"] < 0:
        lines.append("offload raises cost here: its throughput is lower than without it")
    return lines


def failed_groups(trials: pd.DataFrame) -> dict[str, str]:
    """Per group none of whose trials (a server run's requests) was measured: one text saying that every one
    failed, how many with which statuses, and the first one's reason (its message as the row has it)."""
    out: dict[str, str] = {}
    for group, part in trials.groupby("group", sort=False):
        if part["status"].isin(MEASURED).any():
            continue
        what = "request" if "engine" in part and part["engine"].notna().all() else "trial"
        counts = part["status"].astype(str).value_counts(sort=False)
        ended = counts.index[0] if len(counts) == 1 else ", ".join(f"{s} ({n})" for s, n in counts.items())
        first = part.iloc[0]
        why = str(first.get("message") or "").strip() or "no message"
        out[group] = (f"{group}: every {what} failed: all {len(part)} ended {ended}; the first, "
                      f"{first['trial_id']}: {why}")
    return out


def replacing(path: Path, write: Any) -> Path | None:
    """Call ``write(tmp)`` on a new private file beside ``path`` and move it onto ``path`` (``os.replace``): a
    symbolic link or any other file already at ``path`` is replaced, never written through. Returns ``path``, or
    None (nothing left behind) when ``write`` returned None."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kvbench-", suffix=path.suffix)
    os.fchmod(fd, 0o644)  # what a plain write would leave, not mkstemp's 0600
    os.close(fd)
    try:
        if write(Path(tmp)) is None:
            os.unlink(tmp)
            return None
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # named for the file it was to be, not the private one
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise
    return path


@contextlib.contextmanager
def writing_into(out: Path) -> Iterator[None]:
    """Around the writing of files into ``out``: an ``OSError`` (a full disk, no permission, a file in a folder's
    place) becomes :class:`~kvbench.errors.UnwritableOutput` naming the file; a :class:`~kvbench.errors.UserError`
    passes as it is.

    Raises:
        kvbench.errors.UnwritableOutput: a file cannot be written.
    """
    try:
        yield
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(exc.filename or out, exc.strerror or str(exc)) from exc


def replacing_chart(path: Path, draw: Any, what: str) -> Path | None:
    """:func:`replacing` for a chart (``draw(tmp)`` draws it): one that cannot be drawn (e.g. a text matplotlib
    cannot lay out) gives a :class:`~kvbench.report.charts.ChartWarning` (:func:`~kvbench.report.charts.not_drawn`
    of ``what``) and None, so that the files beside it are still written; an ``OSError`` raises as for any file."""
    try:
        return replacing(path, draw)
    except OSError:
        raise
    except Exception as exc:
        warnings.warn(charts.ChartWarning(charts.not_drawn(what, exc)), stacklevel=3)
        return None


def write_costs(costs: pd.DataFrame, out_dir: str | Path, prices: Prices,
                reuse: pd.DataFrame | None = None, server_load: pd.DataFrame | None = None) -> list[Path]:
    """``cost.csv``, ``cost.json`` (the table, the prices, the verdicts and, for reuse workloads, the
    :func:`kvbench.analysis.reuse_cost.reuse_cost` rows and their lines, ``reuse_verdicts``; for server runs the
    load table with goodput,
    :func:`kvbench.analysis.server_load.server_load_table`, under ``server_load``) and ``cost.png`` (USD per 1M
    tokens per mode and prompt length) in ``out_dir`` (created), plus ``reuse_cost.csv`` when ``reuse`` has rows
    and ``goodput.csv`` (the load table) when ``server_load`` has; returns their paths. Every saving names what it
    is taken against: ``cost.csv`` has ``baseline`` (``none``), ``reuse_cost.csv`` ``baseline`` and
    ``saving_kind`` (``none`` and ``reuse`` where the rows do not say: an older kvbench). Each file is
    written beside its place and moved onto it, so a symbolic link there is replaced, never followed.

    Raises:
        kvbench.errors.SymlinkRefused: ``out_dir`` is a symbolic link.
        kvbench.errors.UnwritableOutput: a file cannot be written (naming it; an ``OSError``).
    """
    out = Path(out_dir)
    refuse_symlink_dir(out)
    try:
        return _write_costs(costs, out, prices, reuse, server_load)
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(exc.filename or out, exc.strerror or str(exc)) from exc


def _write_costs(costs: pd.DataFrame, out: Path, prices: Prices, reuse: pd.DataFrame | None,
                 server_load: pd.DataFrame | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    doc: dict[str, Any] = {"prices": dataclasses.asdict(prices)}
    if len(costs):
        if "baseline" not in costs:  # every saving of the cost table is against `none` at its prompt length
            costs = costs.copy()
            costs.insert(list(costs.columns).index("mode") + 1, "baseline", "none")
        paths.append(replacing(out / "cost.csv", lambda tmp: costs.to_csv(tmp, index=False) or tmp))
        doc.update(verdicts=verdicts(costs), rows=json.loads(costs.to_json(orient="records")))
    if reuse is not None and len(reuse):
        reuse = with_baselines(reuse)
        doc["reuse_verdicts"] = reuse_verdicts(reuse)
        paths.append(replacing(out / "reuse_cost.csv", lambda tmp: reuse.to_csv(tmp, index=False) or tmp))
        doc["reuse"] = json.loads(reuse.to_json(orient="records"))
    if server_load is not None and len(server_load):
        paths.append(replacing(out / "goodput.csv", lambda tmp: server_load.to_csv(tmp, index=False) or tmp))
        doc["server_load"] = json.loads(server_load.to_json(orient="records"))
    paths.append(replacing(out / "cost.json", lambda tmp: tmp.write_text(json.dumps(doc, indent=2) + "\n")))
    png = replacing_chart(out / "cost.png", lambda tmp: charts.cost_bars(costs, tmp), "cost") if len(costs) else None
    return paths + ([png] if png is not None else [])


__all__ = ["COST_CAPTION", "CostReport", "compute_costs", "cost_display", "cost_report", "failed_groups", "replacing",
           "replacing_chart", "reuse_cost_caption", "reuse_cost_display", "reuse_verdicts", "verdicts",
           "what_if_lines", "write_costs"]
