"""``kvbench trace``: a trace file checked and summarised (``check``), and traces of any size made from a real one
(``synthesize``)."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.cli.common import Command, Group, handle_errors, out, stop_on_signals, write_or_stop

app = typer.Typer(add_completion=False, no_args_is_help=True, cls=Group,
                  help="Request traces: check one, or make one of any size from a real one.")

#: Library argument → flag, for the messages of :class:`kvbench.errors.BadParameter`.
FLAGS = {"max_bytes": "--max-bytes"}


@app.command(cls=Command)
def check(
    trace: Path = typer.Argument(..., metavar="TRACE", help="A Mooncake or Bailian JSONL, or a CSV/JSONL of "
                                 "timestamp (ms), input_length, output_length, hash_ids."),
    fmt: str = typer.Option("auto", "--format", help="auto, mooncake, bailian or columns."),
    block_tokens: int | None = typer.Option(None, "--block-tokens", min=1, max=2**20,
                                            help="Tokens per hash block (default: the format's)."),
    max_bytes: str = typer.Option("512MiB", "--max-bytes", help="The largest trace file read."),
) -> None:
    """Read a trace as kvbench simulate and replay read it: every faulty line said, or what the trace holds."""
    from kvbench.report.plan import size_bytes
    from kvbench.report.trace_file import trace_lines
    from kvbench.traces.read import read_trace

    with handle_errors(FLAGS):
        t = read_trace(trace, fmt, block_tokens, size_bytes(max_bytes, "max_bytes"))
    for line in trace_lines(t):
        out.print(line, highlight=False, markup=False)


@app.command(cls=Command)
def synthesize(
    source: Path = typer.Argument(..., metavar="SOURCE", help="The trace to resample (any format kvbench reads)."),
    requests: int = typer.Option(..., "--requests", min=1, max=10_000_000, help="Requests to make."),
    output: Path = typer.Option(..., "--out", help="The JSONL file to write (Mooncake's format)."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**63 - 1, help="The random seed: the same seed, source and "
                             "flags make the same trace."),
    copies: int = typer.Option(1, "--copies", min=1, max=1_000_000, help="Disjoint copies of the source's prefix "
                               "tree: the working set grows with them."),
    speedup: float = typer.Option(1.0, "--speedup", min=1e-6, max=1e6, help="Arrival gaps divided by this."),
    fmt: str = typer.Option("auto", "--format", help="The source's format: auto, mooncake, bailian or columns."),
    block_tokens: int | None = typer.Option(None, "--block-tokens", min=1, max=2**20,
                                            help="The source's tokens per hash block (default: its format's)."),
    max_bytes: str = typer.Option("512MiB", "--max-bytes", help="The largest source file read."),
) -> None:
    """A trace of any size by prefix-tree resampling of a real one: each request keeps a source request's shared
    prefix path and lengths, with fresh ids for its unique tail; arrival gaps drawn from the source's."""
    from kvbench.report.plan import size_bytes
    from kvbench.report.trace_file import trace_lines, write_trace
    from kvbench.traces.read import read_trace
    from kvbench.traces.synthesize import synthesize as make

    stop_on_signals()
    with handle_errors(FLAGS):
        made = make(read_trace(source, fmt, block_tokens, size_bytes(max_bytes, "max_bytes")), requests, seed,
                    copies, speedup)
    for line in trace_lines(made):
        out.print(line, highlight=False, markup=False)
    write_or_stop("the trace", output, lambda: [write_trace(made, output)], "trace")
