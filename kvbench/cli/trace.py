"""``kvbench trace``: a trace file checked and summarised (``check``), traces of any size made from a real one
(``synthesize``), a run's requests as a trace (``export``), and a replay's measured cached tokens against the
simulator's (``validate``)."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.cli.common import (Command, Group, fail, handle_errors, out, render, show, stop_on_signals,
                                write_or_stop)

app = typer.Typer(add_completion=False, no_args_is_help=True, cls=Group,
                  help="Request traces: check one, make one of any size, export a run's, check a replay against the "
                       "simulator.")

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
    """Read a trace as kvbench simulate and a replay (workload.trace) read it: every faulty line said, or what
    the trace holds."""
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
    if output.exists() and source.exists() and output.samefile(source):
        fail(f"--out {output} is the source trace: write the new one elsewhere")
    with handle_errors(FLAGS):
        made = make(read_trace(source, fmt, block_tokens, size_bytes(max_bytes, "max_bytes")), requests, seed,
                    copies, speedup)
    for line in trace_lines(made):
        out.print(line, highlight=False, markup=False)
    write_or_stop("the trace", output, lambda: [write_trace(made, output)], "trace")


@app.command(cls=Command)
def validate(
    run: Path = typer.Argument(..., metavar="RUN", help="A run directory of a scenario with workload.trace."),
    capacity_tokens: int | None = typer.Option(None, "--capacity-tokens", min=0, max=2**40, help="The cache "
                                               "capacity to simulate (default: each mode's, from the run)."),
    policy: str | None = typer.Option(None, "--policy", help="lru, lru-tail-first, lfu or prompt-lru (default: "
                                      "the engine's closest: vLLM lru-tail-first, llama.cpp prompt-lru, others lru)."),
    engine_block_tokens: int | None = typer.Option(None, "--engine-block-tokens", min=1, max=2**20, help="The "
                                                   "engine's block: a gap beyond it is flagged (default: the "
                                                   "replayed block)."),
    rows: int = typer.Option(20, "--rows", min=0, max=100_000, help="Requests shown per mode (all are in "
                             "replay_check.csv)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Where replay_check.csv goes (default: RUN/report)."),
) -> None:
    """Measured cached prompt tokens of a trace replay against the simulator's at the engine's capacity: per
    request and overall, the requests whose gap a block does not explain flagged."""
    import pandas as pd

    from kvbench.report.replay_check import check_run, summary_line, write_checks

    with handle_errors({"policy": "--policy"}):
        checks = check_run(run, capacity_tokens, policy, engine_block_tokens)
    for m in checks:
        t = m.check.table
        shown = pd.DataFrame({"repeat": t["repeat"], "trace index": t["trace_index"], "prompt": t["prompt_tokens"],
                              "reusable": t["reusable_tokens"], "simulated": t["predicted_tokens"],
                              "measured": t["measured_tokens"], "difference": t["difference_tokens"],
                              "": ["gap" if f else "" for f in t["flagged"]]}).head(rows).astype(str)
        if rows:
            show(render(shown, f"{m.label}: cached prompt tokens per request", "reusable: an unlimited cache's hit; "
                        "simulated: the policy at the mode's capacity; gap: off by more than one engine block",
                        left=0, wrap=False, min_width={}))
        out.print(summary_line(m), highlight=False, markup=False)
    target = out_dir or run / "report"
    write_or_stop("replay_check.csv", target, lambda: write_checks(checks, target), "replay check")


@app.command(cls=Command)
def export(
    run: Path = typer.Argument(..., metavar="RUN", help="A run directory of a request stream (a reuse workload, a "
                               "trace replay or a server run)."),
    output: Path = typer.Option(..., "--out", help="The JSONL file to write (Mooncake's format)."),
    block_tokens: int = typer.Option(16, "--block-tokens", min=1, max=2**20, help="Tokens per hash block."),
    mode: str | None = typer.Option(None, "--mode", help="The mode whose requests to export (default: the "
                                    "run's first)."),
    repeat: int = typer.Option(0, "--repeat", min=0, max=1_000_000, help="The repeat whose requests to export."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Rebuild prompts with a tokenizer "
                                           "that runs code from the model's files."),
) -> None:
    """A run's requests as a trace: its prompts rebuilt from its scenario (each checked against the digest the run
    recorded), cut into blocks named by chained hashes, at the times they arrived in a server run's load (an
    in-process run keeps none: one request a millisecond, in order)."""
    from kvbench.report.trace_export import export_trace
    from kvbench.report.trace_file import trace_lines, write_trace

    stop_on_signals()
    if output.resolve().is_relative_to(run.resolve()):
        fail(f"--out {output} is inside the run {run}: write the trace outside it (a run's own files stay as "
             "they are)")
    with handle_errors({"mode": "--mode", "repeat": "--repeat", "block_tokens": "--block-tokens",
                        "trust_remote_code": "--trust-remote-code"}):
        made = export_trace(run, block_tokens, mode, repeat, trust_remote_code)
    for line in trace_lines(made):
        out.print(line, highlight=False, markup=False)
    write_or_stop("the trace", output, lambda: [write_trace(made, output)], "trace")


@app.command(cls=Command)
def sweep(
    traces: list[Path] = typer.Argument(..., metavar="TRACE...", help="Trace files (any format kvbench reads)."),
    policies: str = typer.Option("lru", "--policies", help="Comma-separated: lru, lru-tail-first."),
    models: str | None = typer.Option(None, "--models", help="Comma-separated presets or config.json paths: "
                                      "capacities also in bytes of each one's KV."),
    tp: int = typer.Option(1, "--tp", min=1, max=1024, help="GPUs one copy of each model is split over."),
    dtype: str = typer.Option("bf16", "--dtype", help="KV dtype: fp32, fp16, bf16, fp8."),
    fmt: str = typer.Option("auto", "--format", help="auto, mooncake, bailian or columns."),
    block_tokens: int | None = typer.Option(None, "--block-tokens", min=1, max=2**20,
                                            help="Tokens per hash block (default: each format's)."),
    executor: str = typer.Option("local", "--executor", help="local, or ray: each trace × policy a Ray task."),
    address: str | None = typer.Option(None, "--address", help="--executor ray: auto or HOST:PORT of a running "
                                       "cluster (default: a local Ray instance)."),
    out_dir: Path = typer.Option(Path("results/trace-sweep"), "--out", help="Where sweep.csv goes."),
) -> None:
    """Every trace × policy simulated in one pass each, locally or on a Ray cluster: the hit rate of tokens at 1,
    3, 10, ... blocks and of the unlimited cache, per trace and policy; sweep.csv has every capacity in blocks,
    tokens and each model's bytes."""
    import pandas as pd

    from kvbench.bench.simulation_sweep import sweep_simulations
    from kvbench.report.simulation import write_csv
    from kvbench.results.run_dir import refuse_symlink_dir

    stop_on_signals()
    names = [m.strip() for m in models.split(",")] if models else [None]
    with handle_errors({"policies": "--policies", "executor": "--executor", "dtype": "--dtype", "tp": "--tp"}):
        refuse_symlink_dir(out_dir)
        frame = sweep_simulations(traces, [p.strip() for p in policies.split(",")], names, tp, dtype, fmt,
                                  block_tokens, executor, address)
    first = frame[frame["model"].isna()] if names[0] is None else frame[frame["model"] == names[0]]
    table = first.pivot_table(index=["trace", "policy"], columns="capacity_blocks", values="hit_rate_tokens",
                              sort=False)
    cells = pd.DataFrame({"trace": [k[0] for k in table.index], "policy": [k[1] for k in table.index],
                          **{f"{c:,}": [("" if v != v else f"{v:.3f}") for v in table[c]] for c in table.columns}})
    show(render(cells, "hit rate of tokens by capacity (blocks)", "the last column of a trace: its unlimited cache "
                "(its distinct blocks)", left=2, wrap=False, min_width={}))

    write_or_stop("sweep.csv", out_dir, lambda: write_csv(frame, out_dir, "sweep.csv"), "sweep")
