"""``kvbench plan``: a model's KV footprint, the capacity of each mode and a decode roofline."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

import pandas as pd

from kvbench.cli.common import _fail, _show_warning, _table, err, handle_errors, out, show

#: Library argument → flag, for the messages of :class:`kvbench.errors.BadParameter`.
FLAGS = {"prompt_tokens": "--prompt-tokens", "batch": "--batch", "dtype": "--dtype", "gpu_mem": "--gpu-mem",
         "host_mem": "--host-mem", "window": "--window", "link_gbps": "--link-gbps", "hbm_gbps": "--hbm-gbps"}


def plan(
    model: str = typer.Argument(..., metavar="MODEL",
                                help="A preset (see `kvbench list presets`), a config.json or a model directory."),
    prompt_tokens: int = typer.Option(4096, "--prompt-tokens", help="Context per sequence (tokens)."),
    batch: int = typer.Option(1, help="Sequences decoded together (the roofline's batch)."),
    dtype: str = typer.Option("bf16", help="KV and weights dtype: fp32, fp16, bf16, fp8 (or int8)."),
    gpu_mem: str = typer.Option("80GiB", "--gpu-mem", help="Device memory."),
    host_mem: Optional[str] = typer.Option(None, "--host-mem", help="Host memory for KV (default: this machine's)."),
    window: int = typer.Option(512, help="hierarchical's window (tokens on the device per layer)."),
    link_gbps: Optional[float] = typer.Option(None, "--link-gbps", help="Host→device bandwidth, GB/s (default: the "
                                              "last `kvbench env` probe on a GPU, else 50)."),
    hbm_gbps: float = typer.Option(2000.0, "--hbm-gbps", help="Device memory bandwidth, GB/s."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="USD per GPU-hour: adds cost per 1M tokens."),
    break_even: bool = typer.Option(False, "--break-even", metavar="", help="Also: where restoring a shared prefix pays against "
                                    "recomputing it, per prompt length and shared share (the break-even map's "
                                    "roofline)."),
    constants: Optional[Path] = typer.Option(None, "--constants", help="--break-even with the constants `kvbench "
                                             "map` measured (its map.json) instead of assumed ones."),
    tflops: float = typer.Option(989.0, "--tflops", help="--break-even: the GPU's peak dense TFLOP/s (default: an "
                                 "H100's or H200's bf16), of which a prefill reaches 50%."),
    new_tokens: int = typer.Option(128, "--new-tokens", help="--break-even: tokens generated per request."),
    visits: int = typer.Option(3, "--visits", help="--break-even: requests per shared prefix (≥ 2)."),
) -> None:
    """Analytic KV footprint, the largest batch per mode and a decode-step roofline for a model config (no GPU)."""
    from kvbench.bench.telemetry.machine import last_link_probe
    from kvbench.report import plan as rp

    warnings.showwarning = _show_warning
    if not 2 <= visits <= 100 or not 1 <= new_tokens <= 2**24:
        _fail("--visits must be 2 to 100 and --new-tokens 1 to 16,777,216")
    with handle_errors(FLAGS):
        p = rp.plan(model, prompt_tokens, batch, dtype, gpu_mem, host_mem, window, link_gbps, hbm_gbps, gpu_price,
                    link_source="--link-gbps", link_probe=last_link_probe)
    for line in rp.summary_lines(p):
        out.print(line, highlight=False, markup=False)
    show(_table(rp.capacity_cells(p), f"capacity at {prompt_tokens:,} tokens per sequence", "KV per sequence on "
                "the device (with the layers in flight) and in host memory; max batch: device KV within the GPU "
                "less weights and reserve, host KV within host memory", left=("mode",), wrap=True, min_width={},
                overflow="ellipsis"))
    show(_table(rp.roofline_cells(p), f"decode step at batch {batch}", "memory: weights + 3 passes over the KV "
                "in device memory (the cache's torch.cat reads and writes it, attention reads it); link: history "
                "copied host→device; TPOT = the larger (copies overlapped); link-bound from: the batch from which "
                "the link sets it", left=("mode", "bound"), wrap=False,
                min_width={"mode": max(len(m.mode) for m in p.modes)}, overflow="ellipsis"))
    for kind, text in rp.plan_warnings(p).items():
        hint = " (--host-mem and --gpu-mem set the limits)" if kind == "batch" else ""
        err.print(f"[yellow]warning:[/] {escape(text + hint)}", highlight=False)
    if note := rp.plan_note(p):
        out.print(note, highlight=False)
    if break_even or constants is not None:
        _break_even(p, constants, tflops, new_tokens, visits)


def _break_even(p: Any, constants: Optional[Path], tflops: float, new_tokens: int, visits: int) -> None:
    """``--break-even``: the constants (measured or assumed, each said) and the saving per prompt length × share."""
    from kvbench.analysis.plan_break_even import (assumed_constants, constant_rows, contexts_up_to,
                                                   measured_constants, plan_break_even)
    from kvbench.report.plan import break_even_cells

    with handle_errors(FLAGS):
        c = (measured_constants(constants) if constants is not None else
             assumed_constants(p.arch, p.dtype_bytes, tflops, p.link_gbps * 1e9, p.hbm_gbps * 1e9))
        grid = plan_break_even(c, contexts_up_to(p.prompt_tokens), visits=visits, new_tokens=new_tokens)
    show(_table(pd.DataFrame([[r["constant"], f"{r['value']:.4g}", r["source"]] for r in constant_rows(c)],
                             columns=["constant (s, s/token, s/token pair)", "value", "source"], dtype=object),
                "break-even constants", "", left=3, wrap=True, min_width={}))
    show(_table(break_even_cells(grid), f"restore vs recompute: saving per request stream of {visits} visits "
                f"per prefix, {new_tokens} new tokens each", "saving of USD per 1M generated tokens (no memory "
                "charged) when every revisit restores its shared prefix whole from the host tier; the "
                "constants' sources are above (measure yours: kvbench run scenarios/break_even.yaml, then "
                "kvbench map)" + ("; measured constants are those of that run's model and machine, "
                                  "whatever MODEL is" if constants is not None else ""),
                left=1, wrap=False, min_width={}))
