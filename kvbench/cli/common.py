"""What every command shares: the consoles, the one way of failing (``error: …`` and an exit status), warnings, and
the table renderer."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Piped output (CI logs, README examples) gets 120 columns instead of Rich's 80.
out = Console(width=None if sys.stdout.isatty() else 120, soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False)


def _fail(msg: str, code: int = 2) -> None:
    """Print ``error: msg`` (``msg`` as it is: paths and values from files are never read as markup) and exit."""
    err.print(f"[red]error:[/] {escape(str(msg))}", highlight=False)
    raise typer.Exit(code)


def _count_units(n: float) -> str:
    """A count in B (10^9), M (10^6) or K (10^3), two decimals."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f}"


def _mib(v: Any) -> str:
    return "-" if v is None or v != v else f"{v / 2**20:,.1f}"


def _ms(med: Any, lo: Any, hi: Any) -> str:
    """Seconds as ``median (min–max)`` in milliseconds; whole milliseconds from 100 ms up."""
    if med is None or med != med:
        return "-"
    fmt = "{:,.0f}" if med >= 0.1 else "{:,.1f}"
    return f"{fmt.format(med * 1e3)} ({fmt.format(lo * 1e3)}–{fmt.format(hi * 1e3)})"


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (e.g. `kill`, a job scheduler) stops the sweep like Ctrl-C: finished trials kept, temporary files
    removed, the run resumable."""
    raise KeyboardInterrupt


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _table(frame: Any, title: str, caption: str = "") -> Table:
    """A Rich table of a formatted DataFrame (first columns left-aligned, the rest right-aligned)."""
    t = Table(title=escape(title), caption=escape(caption) if caption else None)
    for i, col in enumerate(frame.columns):
        t.add_column(escape(str(col)), justify="left" if i < 4 else "right", overflow="fold",
                     no_wrap=col not in ("mode", "trials", "probes", "why it stops there"),
                     min_width={"mode": min(28, max([12, *(len(str(v)) for v in frame[col])])), "trials": 9,
                                "probes": 12, "why it stops there": 16}.get(col) if col in frame else None)
    for row in frame.itertuples(index=False):
        t.add_row(*(escape(str(v)) for v in row))
    return t


def _load(paths: list[Path]) -> Any:
    from kvbench.errors import ResultsError
    from kvbench.results.load import load_results

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # problems are collected and shown once below
            return load_results(paths)
    except ResultsError as exc:
        _fail(str(exc))


def _problems(results: Any) -> None:
    if results.problems:
        err.print(f"[yellow]warning:[/] {_count(len(results.problems), 'problem')} while loading:", highlight=False)
        for p in results.problems:
            err.print(f"  {p}", highlight=False, markup=False)


def _print_warnings(file: Path, s) -> None:
    from kvbench.scenario import scenario_warnings

    for path, msg in scenario_warnings(s):
        err.print(f"[yellow]warning:[/] {escape(f'{file}: {path}: {msg}')}", highlight=False)
