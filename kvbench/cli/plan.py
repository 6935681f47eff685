"""``kvbench plan``: a model's KV footprint, the capacity of each mode and a decode roofline."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

import pandas as pd

from kvbench.cli.common import err, handle_errors, out, render, show, show_warning

#: Library argument → flag, for the messages of :class:`kvbench.errors.BadParameter`.
FLAGS = {"prompt_tokens": "--prompt-tokens", "batch": "--batch", "dtype": "--dtype", "gpu_mem": "--gpu-mem",
         "host_mem": "--host-mem", "window": "--window", "link_gbps": "--link-gbps", "hbm_gbps": "--hbm-gbps",
         "gpu": "--gpu", "tp": "--tp", "tflops": "--tflops", "gpu_price": "--gpu-price",
         "allow_busy": "--allow-busy-fit"}


def plan(
    model: str = typer.Argument(..., metavar="MODEL",
                                help="A preset (see `kvbench list presets`), a config.json or a model directory."),
    gpu: str = typer.Option("h100", "--gpu", help="GPU or node preset: h100, h100-pcie, h200, a100, l40s, gh200, "
                            "b200; nodes with their host memory: dgx-a100, dgx-h100, dgx-h200, dgx-b200."),
    tp: int = typer.Option(1, "--tp", help="Tensor parallelism: GPUs the weights and KV are split over."),
    prompt_tokens: int = typer.Option(4096, "--prompt-tokens", help="Context per sequence (tokens)."),
    batch: int = typer.Option(1, help="Sequences decoded together (the roofline's batch)."),
    dtype: str = typer.Option("bf16", help="KV and weights dtype: fp32, fp16, bf16, fp8 (or int8)."),
    gpu_mem: str | None = typer.Option(None, "--gpu-mem", help="Device memory per GPU (default: the preset's)."),
    host_mem: str | None = typer.Option(None, "--host-mem", help="Host memory for the model's KV (default: a "
                                           "node preset's, else not given; never this machine's)."),
    window: int = typer.Option(512, help="hierarchical's window (tokens on the device per layer)."),
    link_gbps: float | None = typer.Option(None, "--link-gbps", help="Host→device GB/s per GPU (default: the "
                                              "last `kvbench env` on this kind of GPU, else the preset's)."),
    hbm_gbps: float | None = typer.Option(None, "--hbm-gbps", help="Device memory GB/s (default: the preset's)."),
    tflops: float | None = typer.Option(None, "--tflops", help="Peak dense TFLOP/s per GPU (default: the "
                                           "preset's bf16), of which a prefill reaches 50%."),
    gpu_price: float | None = typer.Option(None, "--gpu-price", help="USD per GPU-hour: adds cost per 1M tokens."),
    break_even: bool = typer.Option(False, "--break-even", metavar="", help="Also: the saving in USD per 1M tokens "
                                    "of restoring a shared prefix against recomputing it, per prompt length and "
                                    "shared share (the break-even map's roofline)."),
    constants: Path | None = typer.Option(None, "--constants", help="--break-even with the constants `kvbench "
                                             "map` measured (its map.json) instead of assumed ones."),
    new_tokens: int = typer.Option(128, "--new-tokens", min=1, max=2**24,
                                   help="--break-even: tokens generated per request."),
    visits: int = typer.Option(3, "--visits", min=2, max=100, help="--break-even: requests per shared prefix."),
    allow_busy_fit: bool = typer.Option(False, "--allow-busy-fit", help="--constants: use constants fitted to "
                                        "trials measured on a busy machine (refused otherwise)."),
) -> None:
    """Both kinds of KV offload for a model config on a GPU preset (no GPU needed): the reuse tier (finished KV
    restored on reuse, as vLLM's and LMCache's CPU tiers do) and kvbench's decode-time streaming offload."""
    from kvbench.bench.telemetry.machine import last_link_probe
    from kvbench.report import plan as rp

    warnings.showwarning = show_warning
    with handle_errors(FLAGS):
        p = rp.plan(model, prompt_tokens, batch, dtype, gpu_mem, host_mem, window, link_gbps, hbm_gbps, gpu_price,
                    link_source="--link-gbps", link_probe=last_link_probe, gpu=gpu, tp=tp, tflops=tflops)
    for line in rp.summary_lines(p):
        out.print(line, highlight=False, markup=False)
    found = rp.plan_warnings(p)
    for kind, text in found.items():
        hint = {"host": " (--host-mem, or a node --gpu such as dgx-h100)", "weights": " (--tp, or a --gpu with more "
                "memory)"}.get(kind, "")
        err.print(f"[yellow]warning:[/] {escape(text + hint)}", highlight=False)
    priced = "weights" not in found
    if priced:
        show(render(rp.reuse_cells(p), "reuse tier (vLLM's CPU offload, LMCache): TTFT of a prompt whose prefix "
                    "the host tier holds" + (f", on {p.machine.tp} GPUs" if p.machine.tp > 1 else ""),
                    f"restore: the prefix's KV over the link at "
                    f"{p.link_gbps:g} GB/s per GPU, then the rest prefilled; recompute: the whole prompt at 50% of "
                    f"{p.machine.tflops:,.0f} TFLOP/s per GPU; break-even share: the share of the prompt from which "
                    "restoring beats recomputing (any: from the first token)", left=("prompt tokens",), wrap=False,
                    min_width={}, overflow="ellipsis"))
    out.print(f"kvbench's streaming offload: the history of every layer in host memory, over the link at every "
              f"decode step{f' (one GPU of {p.machine.tp})' if p.machine.tp > 1 else ''}", highlight=False,
              markup=False)
    show(render(rp.capacity_cells(p), f"capacity at {prompt_tokens:,} tokens per sequence", "KV per sequence on "
                "the device (with the layers in flight) and in host memory; device fits: device KV within the GPU "
                "less weights and reserve; host fits: host KV of all the model's GPUs within host memory",
                left=("mode",), wrap=True, min_width={}, overflow="ellipsis"))
    if priced:
        show(render(rp.roofline_cells(p), f"decode step at batch {batch} (or the most that fits)", "memory: "
                    "weights read + 3 passes over the KV in device memory (the cache's torch.cat reads and writes "
                    "it, attention reads it); link: history copied host→device; TPOT = the larger (copies "
                    "overlapped); link-bound from: the batch from which the link sets it",
                    left=("mode", "bound"), wrap=False, min_width={"mode": max(len(m.mode) for m in p.modes)},
                    overflow="ellipsis"))
    if note := rp.plan_note(p):
        out.print(note, highlight=False)
    if priced and (break_even or constants is not None):
        _break_even(p, constants, new_tokens, visits, allow_busy_fit)


def _break_even(p: Any, constants: Path | None, new_tokens: int, visits: int, allow_busy: bool) -> None:
    """``--break-even``: the constants (measured or assumed, each said) and the saving per prompt length × share;
    a warning where measured constants are busy or extrapolated beyond 2x of the prompt lengths they rest on."""
    from kvbench.analysis.plan_break_even import (constant_rows, contexts_up_to, extrapolation_warning,
                                                   measured_constants, plan_break_even)
    from kvbench.report.plan import break_even_cells

    with handle_errors(FLAGS):
        c = measured_constants(constants, allow_busy=allow_busy) if constants is not None else p.constants
        contexts = contexts_up_to(p.prompt_tokens)
        grid = plan_break_even(c, contexts, visits=visits, new_tokens=new_tokens)
    for text in ("the measured constants were fitted to trials on a busy machine (--allow-busy-fit): the savings "
                 "below are not a measurement of it" if c.busy else "", extrapolation_warning(c, contexts)):
        if text:
            err.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)
    show(render(pd.DataFrame([[r["constant"], f"{r['value']:.4g}", r["source"]] for r in constant_rows(c)],
                             columns=["constant (s, s/token, s/token pair)", "value", "source"], dtype=object),
                "break-even constants", "", left=3, wrap=True, min_width={}))
    show(render(break_even_cells(grid), f"restore vs recompute: saving per request stream of {visits} visits "
                f"per prefix, {new_tokens} new tokens each", "saving of USD per 1M generated tokens (no memory "
                "charged) when every revisit restores its shared prefix whole from the host tier; the "
                "constants' sources are above (measure yours: kvbench run scenarios/break_even.yaml, then "
                "kvbench map)" + ("; measured constants are those of that run's model and machine, "
                                  "whatever MODEL is" if constants is not None else ""),
                left=1, wrap=False, min_width={}))
