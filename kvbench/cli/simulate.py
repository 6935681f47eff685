"""``kvbench simulate``: a trace's prefix-cache hit rates at every capacity from one pass, split over device, host
and disk tiers, and (with a GPU price) the cost of each host tier size with the knee."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from kvbench.cli.common import err, fail, handle_errors, out, render, show, stop_on_signals, write_or_stop

if TYPE_CHECKING:
    from kvbench.report.simulation import Simulation
    from kvbench.report.simulation_cost import Basis

#: Library argument → flag, for the messages of :class:`kvbench.errors.BadParameter`.
FLAGS = {"model": "--model", "tp": "--tp", "dtype": "--dtype", "gpu": "--gpu", "gpu_price": "--gpu-price",
         "host_price": "--host-price", "disk_price": "--disk-price", "device_tokens": "--device",
         "host_tokens": "--host", "disk_tokens": "--disk", "constants_path": "--constants",
         "allow_busy": "--allow-busy-fit", "max_bytes": "--max-bytes", "policy": "--policy",
         "decode_batch": "--decode-batch", "capacity_blocks": "--at"}


def simulate(
    trace: Path = typer.Argument(..., metavar="TRACE", help="A Mooncake or Bailian JSONL trace, or a CSV/JSONL of "
                                 "the columns timestamp (ms), input_length, output_length, hash_ids."),
    fmt: str = typer.Option("auto", "--format", help="auto, mooncake, bailian or columns."),
    block_tokens: int | None = typer.Option(None, "--block-tokens", min=1, max=2**20, help="Tokens per hash "
                                            "block (default: the format's, Mooncake 512, Bailian 16)."),
    policy: str = typer.Option("lru", "--policy", help="lru (a request's blocks most recent in prompt order) or "
                               "lru-tail-first (vLLM's order: a prompt's tail evicted first)."),
    also: str | None = typer.Option(None, "--also", help="Other policies simulated directly at --at capacities, "
                                    "comma-separated: lfu (least often used block first), prompt-lru (llama.cpp: "
                                    "whole prompt states, a slot and a RAM cache of that many blocks)."),
    at: str | None = typer.Option(None, "--at", help="--also: the capacities (blocks), comma-separated, e.g. "
                                  "10000,100000."),
    model: str | None = typer.Option(None, "--model", help="A preset or config.json: capacities in bytes of its "
                                     "KV, and the cost."),
    tp: int = typer.Option(1, "--tp", min=1, max=1024, help="GPUs one copy of the model is split over."),
    dtype: str = typer.Option("bf16", "--dtype", help="KV dtype: fp32, fp16, bf16, fp8."),
    device: str | None = typer.Option(None, "--device", help="The device prefix cache: tokens, or a size of "
                                      "KV such as 40GiB (with --model). Splits the hits over tiers."),
    host: str | None = typer.Option(None, "--host", help="Host tier sizes, comma-separated (tokens or sizes), "
                                    "e.g. 64GiB,256GiB,1TiB (default with --gpu-price: doubling up to the "
                                    "working set)."),
    disk: str = typer.Option("0", "--disk", help="A disk tier under the host tier (tokens or a size)."),
    gpu: str = typer.Option("h100", "--gpu", help="The GPU preset of the assumed constants and of the default "
                            "device cache."),
    gpu_price: float | None = typer.Option(None, "--gpu-price", help="USD per GPU-hour: prices every host size "
                                           "(needs --model)."),
    host_price: float = typer.Option(0.0, "--host-price", help="USD per GiB-hour of host memory held by KV."),
    disk_price: float = typer.Option(0.0, "--disk-price", help="USD per GiB-hour of disk held by KV."),
    constants: Path | None = typer.Option(None, "--constants", help="The map.json of `kvbench map`: measured "
                                          "constants (with --device) instead of the GPU preset's assumed ones."),
    allow_busy_fit: bool = typer.Option(False, "--allow-busy-fit", help="--constants fitted on a busy machine."),
    decode_batch: int = typer.Option(1, "--decode-batch", min=1, max=4096, help="Sequences decoded together "
                                     "(the weights read once per step for all): 1 serves one request at a time."),
    start_s: float | None = typer.Option(None, "--from-s", min=0, help="Only requests arriving from this second."),
    end_s: float | None = typer.Option(None, "--to-s", min=0, help="Only requests arriving before this second."),
    first: int | None = typer.Option(None, "--first", min=0, help="Skip the requests before this position."),
    conversations: int | None = typer.Option(None, "--conversations", min=1, max=10_000_000, help="Only the "
                                             "requests of the first N conversations with more than one request "
                                             "(inferred from the ids)."),
    max_requests: int | None = typer.Option(None, "--max-requests", min=1, help="At most this many requests."),
    max_bytes: str = typer.Option("512MiB", "--max-bytes", help="The largest trace file read."),
    out_dir: Path | None = typer.Option(None, "--out", help="Where simulation.csv, .json and .png go (default: "
                                        "results/simulation-<trace name>)."),
) -> None:
    """Hit rates of a trace's prefix cache at every capacity, from one pass (Mattson's stack algorithm): per tier,
    in blocks, tokens and bytes of a model's KV; with --gpu-price, USD per 1M tokens per host tier size."""
    import pandas as pd

    from kvbench.report import simulation as rs
    from kvbench.report.plan import size_bytes
    from kvbench.report.simulation_cost import check_prices, sizing_basis
    from kvbench.results.run_dir import refuse_symlink_dir

    stop_on_signals()
    if gpu_price is not None and model is None:
        fail("--gpu-price needs --model: the cost is the model's time and its KV's memory")
    if (host or disk.strip() != "0") and device is None and gpu_price is None:
        fail("--host and --disk are tiers under a device cache: give --device (or --gpu-price, which prices "
             "each host size)")
    if at is not None and not also:
        fail("--at gives the capacities of --also's policies: give --also too (e.g. --also lfu,prompt-lru)")
    capacities = _blocks(at) if also else []
    others = [p.strip() for p in also.split(",")] if also else []
    from kvbench.traces.direct import DIRECT_POLICIES

    if unknown := [p for p in others if p not in DIRECT_POLICIES]:
        fail(f"--also {', '.join(unknown)}: the policies simulated directly are {', '.join(DIRECT_POLICIES)} "
             "(lru and lru-tail-first: --policy)")
    if gpu_price is None:
        priced_only = {"--host-price": host_price != 0.0, "--disk-price": disk_price != 0.0,
                       "--decode-batch": decode_batch != 1, "--gpu": gpu != "h100", "--constants": constants,
                       "--allow-busy-fit": allow_busy_fit}
        if given := [flag for flag, on in priced_only.items() if on]:
            fail(f"{', '.join(given)}: {'price' if len(given) == 1 else 'prices'} the host tier sizes: give "
                 "--gpu-price (and --model) too")
    if model is None and (dtype != "bf16" or tp != 1):
        fail("--dtype and --tp size a model's KV: give --model too")
    target = out_dir or Path("results") / f"simulation-{rs.trace_stem(trace)}"
    if target.exists() and not target.is_dir():
        fail(f"{target} is not a directory: the simulation's files go in a directory (give another with --out)")
    with handle_errors(FLAGS):
        refuse_symlink_dir(target)  # before the simulation: a refused folder prints no table
        per_token = rs.kv_bytes_per_token(model, tp, dtype) if model else None
        device_tokens = rs.tokens_of(device, per_token, "device_tokens") if device else None
        basis = None
        if gpu_price is not None and model is not None:
            check_prices(gpu_price, host_price, disk_price)
            basis = sizing_basis(model, tp, dtype, gpu, constants, device_tokens, allow_busy_fit)
        hosts = [rs.tokens_of(h, per_token, "host_tokens") for h in host.split(",")] if host else None
        disk_tokens = rs.tokens_of(disk, per_token, "disk_tokens")
        cap = size_bytes(max_bytes, "max_bytes")
        window = {k: v for k, v in (("start_s", start_s), ("end_s", end_s), ("first", first),
                                    ("conversations_kept", conversations), ("max_requests", max_requests))
                  if v is not None}
        sim = rs.simulate_trace(trace, fmt, block_tokens, policy, model, tp, dtype,
                                device_tokens if gpu_price is None else None, hosts, disk_tokens, window, cap)
    for line in rs.summary_lines(sim):
        out.print(line, highlight=False, markup=False)
    show(render(rs.curve_cells(sim), f"{sim.curve.policy} prefix cache: hit rate by capacity", rs.DEFINITIONS,
                left=0, wrap=False, min_width={}))
    if also:
        with handle_errors(FLAGS):
            frame = rs.direct_frame(sim, others, capacities)
        cells = pd.DataFrame({"policy": frame["policy"], "blocks": frame["capacity_blocks"].map("{:,}".format),
                              "tokens": frame["capacity_tokens"].map("{:,}".format),
                              "hit rate of blocks": frame["hit_rate_blocks"].map("{:.3f}".format),
                              "hit rate of tokens": frame["hit_rate_tokens"].map("{:.3f}".format)})
        show(render(cells, "policies at chosen capacities", "each policy simulated at each "
                    "capacity (blocks; prompt-lru: its RAM cache's, beside the slot)", left=1, wrap=False,
                    min_width={}))
    if sim.tiers:
        show(render(rs.tier_cells(sim), "hits per tier (exclusive tiers, one LRU cascade: device, then host, then "
                    "disk)", "hit rate of tokens (of blocks) each tier serves", left=0, wrap=True, min_width={}))
    doc_extra: dict[str, object] = {}
    if gpu_price is not None:
        doc_extra = _cost(sim, gpu_price, host_price, disk_price, basis, hosts, disk_tokens, decode_batch)
    write_or_stop("the simulation's files", target, lambda: rs.write_simulation(sim, target, doc_extra),
                  "simulation")


def _blocks(at: str | None) -> list[int]:
    """``--at``: whole numbers of blocks, comma-separated (at most 32), each once, ascending; fails (exit 2)
    otherwise."""
    if at is None:
        fail("--also needs --at: the capacities (blocks) to simulate its policies at, e.g. --at 10000,100000")
    parts = [p.strip() for p in at.split(",") if p.strip()]
    if not parts or len(parts) > 32 or not all(p.isascii() and p.isdigit() and len(p) <= 12 for p in parts):
        fail(f"--at {at[:40]!r}: capacities in blocks, whole numbers separated by commas (at most 32), e.g. "
             "10000,100000")
    return sorted({int(p) for p in parts})


def _cost(sim: Simulation, gpu_price: float, host_price: float, disk_price: float, basis: Basis | None,
          hosts: list[int] | None, disk_tokens: int, decode_batch: int) -> dict[str, object]:
    """The cost table, the constants with their sources, the knee and the advice; returns what simulation.json
    adds."""
    from kvbench.report import simulation_cost as sc

    with handle_errors(FLAGS):
        s = sc.size_tiers(sim, gpu_price, host_price, disk_price, basis, hosts, disk_tokens, decode_batch)
    if s.constants.busy:
        err.print("[yellow]warning:[/] the measured constants were fitted to trials on a busy machine "
                  "(--allow-busy-fit): the costs below are not a measurement of it", highlight=False)
    if far := sc.extrapolation(sim, s):
        err.print(f"[yellow]warning:[/] {escape(far)}", highlight=False)
    show(render(sc.sizing_cells(sim, s), f"cost per host tier size at {gpu_price:g} USD per GPU-hour, host "
                f"{host_price:g} and disk {disk_price:g} USD per GiB-hour", "USD per 1M generated tokens, prefills one "
                f"at a time, decodes in batches of {decode_batch}; savings against the device's prefix cache alone "
                "(the tier saving) and against no cache; [95% interval over the measured constants' bootstrap "
                "draws]", left=1, wrap=True, min_width={}))
    out.print("constants:", highlight=False)
    for line in sc.constant_lines(s):
        out.print(f"  {escape(line)}", highlight=False)
    text = sc.advice(sim, s)
    out.print(text, highlight=False, markup=False)
    return sc.sizing_doc(s, text)
