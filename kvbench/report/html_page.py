"""``report.html``: one self-contained page (charts as data URIs, no scripts, no network) that a reader takes in at
1,280 pixels: every table wraps to the page's width (long mode labels break after their commas and brackets),
the per-point table shows its main columns and keeps every column in a closed ``<details>``, each scenario has a
cost section, and the column glossary is rendered, not shown as Markdown. Every text from files is escaped."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

from kvbench.report.cost_section import CAPTION, CostSection
from kvbench.report.cost_verdicts import short_verdict
from kvbench.report.documents import GLOSSARY, Report, env_lines, extra_tables, of_group
from kvbench.results.load import Results
from kvbench.safe_text import visible

#: The per-point table's columns shown in the page's main table (the KV column is named by its unit); the rest
#: are in the ``<details>`` below it.
MAIN_COLUMNS = ("prompt (tokens)", "batch", "mode", "trials", "TTFT (ms)", "TPOT (ms)", "tokens/s (e2e)",
                "KV device peak", "memory saving (%)", "time overhead (%)", "pairs", "verdict", "ids match none")

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;padding:0 1em;max-width:1240px;color:#222}
.table{max-width:100%}table{border-collapse:collapse;font-size:13px;margin:1em 0;max-width:100%}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;vertical-align:top}th{background:#f3f3f3}
.n{white-space:nowrap}td.t{min-width:6em}
th:nth-child(-n+3),td:nth-child(-n+3),.t{text-align:left}
img{max-width:100%;display:block;margin:1em 0}details{margin:.5em 0 1em}summary{cursor:pointer;color:#345}
details .wide{overflow-x:auto}details td{white-space:nowrap}
.rec{background:#eef6ee;padding:.6em;border-left:4px solid #4a4}.diag li{color:#8a3b00}
.meta{color:#555;font-size:13px}code{background:#f3f3f3;padding:0 .2em}.cap{color:#555;font-size:13px}
.cost{border-left:4px solid #468;padding-left:1em}"""

#: Cells whose text is words (left-aligned, wrapping), by column name.
_TEXT_COLUMNS = {"mode", "vs", "trials", "verdict", "ids match none", "= none", "charged", "why it stops there",
                 "probes", "quality vs none"}


def _escape(text: object) -> str:
    """``text`` as HTML text: its control characters and undecodable bytes as readable escapes
    (:func:`~kvbench.safe_text.visible`), then HTML-escaped."""
    return html.escape(visible(text))


def _cell(value: object, figure: bool = False) -> str:
    """A cell's text, escaped. Words: a break opportunity after each comma or bracket that joins words (a mode
    label such as ``hierarchical(window=16,host_max_tokens=16)`` wraps there; ``1,024`` does not). A figure
    (``figure``): never broken inside, but its interval or range may go onto a line of its own
    (``1,162`` / ``[612–1,529]``) when the page is narrow."""
    text = _escape(value)
    parts = re.split(r" (?=\[)", text) if figure else []
    if len(parts) > 1:
        return " ".join(f'<span class="n">{part}</span>' for part in parts)
    return re.sub(r"((?<=[A-Za-z])\(|,(?=[A-Za-z_]))", r"\1<wbr>", text)


def table(frame: pd.DataFrame) -> str:
    """An HTML table of a frame of text cells, every header and cell escaped (:func:`_cell`): figures on one
    line, right-aligned; word columns (and the first three) left-aligned, the word columns wrapping."""
    cls = [' class="t"' if str(c) in _TEXT_COLUMNS else "" for c in frame.columns]
    head = "".join(f"<th{k}>{_cell(c)}</th>" for k, c in zip(cls, frame.columns))
    body = "\n".join("<tr>" + "".join(f"<td{k}>{_cell(v, not k)}</td>" for k, v in zip(cls, row)) + "</tr>"
                     for row in frame.to_numpy(dtype=object).tolist())
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def main_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The per-point table's :data:`MAIN_COLUMNS` (in that order, those it has), its verdicts in a few words
    (:func:`~kvbench.report.cost_verdicts.short_verdict`)."""
    cols = [c for want in MAIN_COLUMNS for c in frame.columns if c == want or (
        want == "KV device peak" and str(c).startswith("KV device peak"))]
    out = frame[cols].copy()
    if "verdict" in out:
        out["verdict"] = [short_verdict(v) for v in out["verdict"]]
    return out


def _text(text: str) -> str:
    """HTML of a plain-language line: escaped, with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _escape(text))


def glossary_items() -> list[str]:
    """The column glossary (:data:`~kvbench.report.documents.GLOSSARY`, our own Markdown: `code` and **bold**)
    as HTML list items."""
    items = [x.strip("- ").replace("\n  ", " ") for x in GLOSSARY.split("\n- ")[1:]]
    return [re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", _text(x.strip())) for x in items]


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def cost_html(sec: CostSection, group: str) -> list[str]:
    """The cost section of one group (nothing when it has none)."""
    if group not in sec.groups():
        return []
    parts = ['<section class="cost">', "<h3>Cost: saving against the baseline</h3>",
             f'<p class="cap">{_text(CAPTION)}</p>']
    if sec.lines.get(group):
        parts += ["<ul>"] + [f"<li>{_text(x)}</li>" for x in sec.lines[group]] + ["</ul>"]
    if group in sec.offload:
        parts += ['<div class="table">', table(sec.offload[group]), "</div>"]
    if group in sec.reuse:
        parts += ["<h4>Reuse: restore against the baseline (vs)</h4>", '<div class="table">',
                  table(sec.reuse[group]), "</div>"]
    return parts + ["</section>"]


def html_document(results: Results, rep: Report, shown: pd.DataFrame, costs: CostSection) -> str:
    """``report.html``: per group its recommendation, findings, diagnoses, runs, the per-point table (main
    columns; every column in a ``<details>``), its cost section (``costs``), the other tables and the charts; the
    machines, the memory timelines, what was skipped and the glossary. ``shown`` is
    :func:`~kvbench.report.tables.display_frame`'s."""
    e = _escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">', "<title>kvbench report</title>",
             f"<style>{CSS}</style></head><body>", "<h1>kvbench report</h1>"]
    for g in rep.recommendations:
        parts += [f"<h2>{e(g)}</h2>", f'<p class="rec"><b>Recommendation:</b> {_text(rep.recommendations[g])}</p>',
                  "<h3>Findings</h3><ul>"] + [f"<li>{_text(f)}</li>" for f in rep.findings[g]] + ["</ul>"]
        if rep.diagnoses[g]:
            parts += ['<h3>Diagnoses</h3><ul class="diag">'] + [f"<li>{_text(d)}</li>" for d in rep.diagnoses[g]]
            parts += ["</ul>"]
        parts += ['<div class="meta"><ul>']
        for run in (r for r in results.runs if r.get("group") == g):
            parts += [f"<li>{_text(x)}</li>" for x in env_lines(run)]
        parts += ["</ul></div>"]
        if (mine := of_group(shown, g)) is not None:
            parts += ['<div class="table">', table(main_columns(mine)), "</div>",
                      f"<details><summary>Every column ({len(mine.columns)})</summary>", '<div class="wide">',
                      table(mine), "</div></details>"]
        parts += cost_html(costs, g)
        for head, note, frame in extra_tables(rep, g):  # a long caption under the heading, not in it
            parts += [f"<h3>{e(head)}</h3>"] + ([f'<p class="meta">({e(note)})</p>'] if note else []) + [
                '<div class="table">', table(frame), "</div>"]
        parts += [_img(p) for t, p in rep.charts if t.startswith(f"{g}: ")]
    for g in (g for g in costs.groups() if g not in rep.recommendations):
        parts += [f"<h2>{e(g)}</h2>"] + cost_html(costs, g)
    for base, sec in rep.machines.items():
        parts += [f"<h2>Machines: {e(base)}</h2>", '<div class="table">', table(sec.table), "</div><ul>"]
        parts += [f"<li>{_text(f)}</li>" for f in sec.findings] + ["</ul>"]
    timelines = [p for t, p in rep.charts if t.startswith("memory timelines")]
    if timelines:
        parts += ["<h2>Memory timelines</h2>"] + [_img(p) for p in timelines]
    if results.problems:
        parts += ["<h2>Skipped or unknown</h2><ul>"] + [f"<li>{e(p)}</li>" for p in results.problems] + ["</ul>"]
    parts += ["<h2>Columns</h2><ul>"] + [f"<li>{x}</li>" for x in glossary_items()]
    parts += ["</ul></body></html>"]
    return "\n".join(parts) + "\n"


__all__ = ["CSS", "MAIN_COLUMNS", "cost_html", "glossary_items", "html_document", "main_columns", "table"]
