"""What every command shares: the consoles (every character they print through :func:`kvbench.safe_text.visible`:
no escape sequence, control character or bidirectional override from input reaches the terminal raw), the one way
of failing (``error: …`` and an exit status), the one mapping of errors to exit statuses (:func:`handle_errors`),
warnings, the table renderer (:func:`render`) and printer (:func:`show`), the loading of results
(:func:`load_runs`, :func:`show_problems`), the handling of Ctrl-C and SIGTERM (:func:`stop_on_signals`,
:func:`write_or_stop`), the price flags of ``kvbench cost`` and ``kvbench map`` (:data:`PRICE_FLAGS`,
:func:`kvbench_runs_only`), and the commands' ``--help`` (:class:`Command`, :class:`Group`)."""

from __future__ import annotations

import contextlib
import io
import signal
import sys
import traceback
import warnings
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import typer
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderHook, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from kvbench.safe_text import visible

if TYPE_CHECKING:
    from kvbench.results.load import Results


class Command(TyperCommand):
    """A command whose ``--help`` shows no ``<bool>`` metavar (Typer 0.29 with Click 8.5 prints one for it)."""

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class Group(TyperGroup, Command):
    """A command group, its ``--help`` as :class:`Command`'s."""


class _Visible:
    """A renderable drawn as the one it wraps, the text of each segment through :func:`visible` (Rich's own
    control segments, e.g. cursor moves, pass as they are)."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for seg in console.render(self.inner, options):
            yield seg if seg.control else Segment(visible(seg.text), seg.style)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.inner)


class _VisibleHook(RenderHook):
    """Wraps everything a console prints in :class:`_Visible`: one guard for every line, table and message."""

    def process_renderables(self, renderables: list[Any]) -> list[Any]:
        return [_Visible(r) for r in renderables]


class _VisibleConsole(Console):
    """A console whose printed strings go through :func:`visible` before Rich reads them: Rich drops BEL, BS, CR,
    VT and FF from a string it renders (``a\x07b`` would show as ``ab``), so the render hook would never see them."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(visible(o) if isinstance(o, str) else o for o in objects), **kwargs)


def _console(**kwargs: Any) -> Console:
    """A console that never wraps a long line and shows every character from input as :func:`visible` makes it."""
    console = _VisibleConsole(soft_wrap=True, **kwargs)
    console.push_render_hook(_VisibleHook())
    return console


# Piped output (CI logs, README examples) gets 120 columns instead of Rich's 80.
out = _console(width=None if sys.stdout.isatty() else 120)
err = _console(stderr=True)


def show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """A :data:`warnings.showwarning` that prints ``warning: <message>`` on stderr (category and source line left
    out): a command sets it so that the library's warnings read as its own."""
    err.print(f"[yellow]warning:[/] {escape(visible(message))}", highlight=False)


def fail(msg: str, code: int = 2) -> NoReturn:
    """Print ``error: msg`` on stderr (``msg`` as it is: paths and values from files are never read as markup) and
    exit with ``code`` (2: what the user gave is wrong; 1: the run itself failed).

    Raises:
        typer.Exit: always, with ``code``.
    """
    err.print(f"[red]error:[/] {escape(visible(msg))}", highlight=False)
    raise typer.Exit(code)


#: Library argument → flag of the prices ``kvbench cost`` and ``kvbench map`` take, for the messages of
#: :class:`kvbench.errors.BadParameter`.
PRICE_FLAGS = {"gpu_per_hour": "--gpu-price", "host_per_gib_hour": "--host-price", "disk_per_gib_hour": "--disk-price",
               "tokens_per_month": "--tokens-per-month", "engineering_cost": "--engineering-cost",
               "host_tier": "--host-tier"}

#: The message that ends the traceback of an error kvbench did not expect.
BUG_LINE = ("this is a bug in kvbench, not in what you gave it: please report it with the command and the traceback "
            "above")


@contextlib.contextmanager
def handle_errors(flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """The one mapping of errors to exit statuses: a :class:`kvbench.errors.UserError` prints ``error: <message>``
    and exits 2 (a :class:`~kvbench.errors.BadParameter` worded with ``flags``: library argument name → flag);
    any other exception is a bug: its traceback, then :data:`BUG_LINE`, exit 1. Exits and Ctrl-C pass through."""
    from kvbench.errors import BadParameter, UserError

    try:
        yield
    except (typer.Exit, click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        raise
    except UserError as exc:
        fail(exc.worded(dict(flags or {})) if isinstance(exc, BadParameter) else str(exc))
    except Exception:
        err.print(traceback.format_exc(), end="", highlight=False, markup=False)
        err.print(f"[red]error:[/] {escape(BUG_LINE)}", highlight=False)
        raise typer.Exit(1) from None


@contextlib.contextmanager
def warnings_shown() -> Iterator[None]:
    """Warnings raised inside (e.g. a chart that could not be drawn) printed as they come, one ``warning: …`` line
    each on stderr, like every other warning of a command."""
    with warnings.catch_warnings():
        warnings.showwarning = show_warning
        yield


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """Make SIGTERM (e.g. ``kill``, a job scheduler) stop the command as Ctrl-C does, by raising
    :class:`KeyboardInterrupt` (a sweep keeps its finished trials and stays resumable; files being written are
    whole, new or from before), and Ctrl-C raise it too when the command was started in the background (where
    SIGINT is ignored)."""
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, with an ``s`` unless ``n`` is 1: ``plural(2, "chart")`` is ``"2 charts"``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


#: Columns of :func:`render` that wrap by default (the others do not), and their least widths.
WRAPPING = ("mode", "trials", "probes", "why it stops there")
#: The reuse table's columns that may wrap (a figure and its [interval] on two lines), so that on 120 columns the
#: mode keeps its width (Rich shrinks only the columns that may wrap).
REUSE_WRAPPING = ("mode", "recompute TTFT ms", "restore TTFT ms", "÷")
#: How :func:`render` styles a marked cell.
MARK_STYLES = {"worse": "red", "better": "green"}


def render(frame: Any, title: str, caption: str = "", *, left: int | Collection[str] = 4,
           wrap: bool | Collection[str] = WRAPPING, min_width: Mapping[str, int] | None = None,
           overflow: str = "fold", marks: Any = None) -> Table:
    """The one renderer: a Rich table of ``frame``, a DataFrame of text cells (cells, title and caption never read
    as markup, and through :func:`visible` before the columns are measured), one row per row of ``frame``.

    Args:
        left: the first so many columns, or the columns named, are left-aligned; the rest right-aligned.
        wrap: the columns whose cells may wrap (True: all, False: none).
        min_width: least widths per column; default: ``mode`` as wide as its widest cell (12 to 28), ``trials``
            9, ``probes`` 12, ``why it stops there`` 16.
        overflow: Rich's overflow of a cell wider than its column (``fold``, ``ellipsis``).
        marks: a frame of the same shape whose cells name a :data:`MARK_STYLES` key (or ``""``).
    """
    t = Table(title=escape(visible(title)), caption=escape(visible(caption)) if caption else None)
    for i, col in enumerate(frame.columns):
        if min_width is None:
            least = {"mode": min(28, max([12, *(len(visible(v)) for v in frame[col])])), "trials": 9, "probes": 12,
                     "why it stops there": 16}.get(col)
        else:
            least = min_width.get(col)
        t.add_column(escape(visible(col)), justify="left" if (i < left if isinstance(left, int) else col in left)
                     else "right", overflow=overflow, min_width=least,
                     no_wrap=not wrap if isinstance(wrap, bool) else col not in wrap)
    styles = marks.to_numpy(dtype=object).tolist() if marks is not None else None
    for r, row in enumerate(frame.itertuples(index=False)):
        cells = [escape(visible(v)) for v in row]
        if styles:
            cells = [f"[{MARK_STYLES[m]}]{c}[/]" if m else c for c, m in zip(cells, styles[r])]
        t.add_row(*cells)
    return t


def _least_width(t: Table) -> int:
    """Characters ``t`` needs with no column squeezed below its least: a wrapping column its ``min_width`` (else its
    longest word), any other its widest cell; plus the borders and padding."""
    width = 1
    for col in t.columns:
        cells = [Text.from_markup(c).plain if isinstance(c, str) else "" for c in col._cells] + [str(col.header)]
        if col.no_wrap:
            least = max(cell_len(c) for c in cells)
        else:
            least = col.min_width or max(cell_len(w) for c in cells for w in [*c.split(), ""])
        width += max(least, col.min_width or 0) + 3
    return width


def _rendered_width(t: Table, width: int) -> int:
    """The widest line of ``t`` (title and caption aside) as Rich draws it in ``width`` columns: more than
    ``width`` where its columns cannot shrink enough."""
    console = Console(file=io.StringIO(), width=width, soft_wrap=True, color_system=None)
    title, caption = t.title, t.caption
    t.title = t.caption = None
    try:
        console.print(t)
    finally:
        t.title, t.caption = title, caption
    return max(cell_len(line) for line in console.file.getvalue().splitlines())


def show(t: Table, keep: int = 3, first: Collection[str] = ()) -> None:
    """Print a table without squeezing a column to nothing: piped output gets the width the table needs (a wide
    line rather than a lost cell); a terminal too narrow for it loses the columns named in ``first``, in that
    order, then columns from the right after the first ``keep``, and the caption names them (the report's files
    have every column)."""
    need = _least_width(t)
    if need <= out.width:
        out.print(t)
        return
    if not out.is_terminal:
        width = out.width
        out.width = need
        try:
            out.print(t)
        finally:
            out.width = width
        return
    for col in t.columns:  # wrapping columns folded at 16 first: Rich does not shrink a long word's column
        if not col.no_wrap and col.min_width:
            col.min_width = col.max_width = min(col.min_width, 16)
    dropped = []
    order = [str(c.header) for c in t.columns]
    while len(t.columns) > keep and max(_least_width(t), _rendered_width(t, out.width)) > out.width:
        named = [i for name in first for i, c in enumerate(t.columns) if str(c.header) == escape(name)]
        dropped.append(str(t.columns.pop(named[0] if named else -1).header))
    if dropped:
        dropped.sort(key=order.index)
        note = f"left out at {out.width} columns: {', '.join(dropped)} (a wider terminal shows them)"
        t.caption = f"{t.caption}; {note}" if t.caption else note  # the headers are escaped already
    out.print(t)


def load_runs(paths: list[Path]) -> Results:
    """:func:`kvbench.results.load.load_results` of ``paths``, its warnings held back (:func:`show_problems` shows
    them once); results that cannot be loaded fail the command (``error: …``, exit 2)."""
    from kvbench.errors import ResultsError
    from kvbench.results.load import load_results

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # problems are collected and shown once below
            return load_results(paths)
    except ResultsError as exc:
        fail(str(exc))


def show_problems(results: Results) -> None:
    """The problems met while loading ``results``, a count then one line each, on stderr; nothing when there were
    none."""
    if results.problems:
        err.print(f"[yellow]warning:[/] {plural(len(results.problems), 'problem')} while loading:", highlight=False)
        for p in results.problems:
            err.print(f"  {visible(p)}", highlight=False, markup=False)


def kvbench_runs_only(flags: Mapping[str, Any], why: str) -> None:
    """Fail (exit 2) naming the flags of ``flags`` (flag → its value) that were given, i.e. not None, 0 or False:
    they apply to kvbench runs, not to other tools' result files (``why``, e.g. what those files lack)."""
    given = [flag for flag, v in flags.items() if v is not None and v is not False and v != 0]
    if given:
        fail(f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} to kvbench runs, not to other tools' "
             f"result files ({why})")


def results_and_target(results: list[Path] | None, out_dir: str | None, verb: str, none_hint: str,
                       what: str) -> tuple[list[Path], Path]:
    """The paths a reading command works on (the newest run under ``results/`` when none are given, said with
    ``verb``, e.g. ``costing``; none there fails with ``none_hint``) and the folder its files (``what``) go in:
    ``out_dir``, else ``<first path>/report``, refused before any output when it is a symbolic link or not a
    directory."""
    from kvbench.results.run_dir import refuse_symlink_dir

    if not results:
        from kvbench.results.newest import newest_run

        with handle_errors():
            found = newest_run("results")
        if found is None:
            fail(f"no results given and no run under results/: {none_hint}")
        out.print(f"{verb} the newest run under results/: {found}", highlight=False, markup=False)
        results = [found]
    if out_dir is not None and not out_dir.strip():
        fail("--out is empty: give a directory")
    first = results[0]
    target = Path(out_dir) if out_dir else (first if first.is_dir() else first.parent) / "report"
    with handle_errors():
        refuse_symlink_dir(target)  # before any output: a refused run prints no table
    if target.exists() and not target.is_dir():
        fail(f"{target} is not a directory: the {what} go in a directory (give another with --out)")
    blocked = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        fail(f"{blocked} is not a directory: the {what} cannot go in {target} (give another with --out)")
    return results, target


def write_or_stop(what: str, target: Path, write: Any, label: str) -> None:
    """Call ``write()`` (it returns the paths written) under :func:`handle_errors`; Ctrl-C while it writes stops
    with exit 130, saying that each of ``what`` in ``target`` is whole, new or from before; then print
    ``<label>: <paths>``."""
    try:
        with handle_errors(), warnings_shown():
            files = write()
    except KeyboardInterrupt:
        err.print(f"interrupted while writing {what} in {target}: each is whole, new or from before",
                  highlight=False, markup=False)
        raise typer.Exit(130) from None
    out.print(f"{label}: {', '.join(str(f) for f in files)}", highlight=False, markup=False)
