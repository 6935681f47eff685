"""``kvbench plan``: a model's KV footprint, the capacity of each mode and a decode roofline."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvbench.cli.common import _count_units, _fail, _show_warning, err, out


def _bytes_option(value: str, option: str) -> int:
    from pydantic import ByteSize, TypeAdapter

    from kvbench.scenario.bounds import check_size_input

    try:
        n = TypeAdapter(ByteSize).validate_python(check_size_input(value))
    except ValueError:  # pydantic.ValidationError is one
        _fail(f"{option} {value!r}: give bytes or a size such as 80GiB, 512GB")
    if n <= 0:
        _fail(f"{option} {value!r}: must be more than 0 bytes")
    return int(n)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"


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
) -> None:
    """Analytic KV footprint, the largest batch per mode and a decode-step roofline for a model config (no GPU)."""
    import difflib
    import math

    import psutil

    from kvbench.bench.machine import last_link_probe

    warnings.showwarning = _show_warning
    from kvbench.models import preset_names, preset_path
    from kvbench.analysis.plan import DTYPE_BYTES, cost_per_million, plan_modes
    from kvbench.models.config import read_config_file
    from kvbench.offload.architecture import architecture_of

    if dtype not in DTYPE_BYTES:
        _fail(f"--dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    if prompt_tokens <= 0 or batch <= 0 or window < 0:
        bad = [f"{n} {v}" for n, v, least in (("--prompt-tokens", prompt_tokens, 1), ("--batch", batch, 1),
                                               ("--window", window, 0)) if v < least]
        _fail(f"{', '.join(bad)}: --prompt-tokens and --batch must be more than 0, --window 0 or more")
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if model in preset_names():
        path = preset_path(model)
    elif path.suffix == ".json" or path.exists():
        if not path.is_file():
            _fail(f"{path}: no such config.json")
    else:
        close = difflib.get_close_matches(model, preset_names(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        _fail(f"unknown model {model!r}: {hint}presets: {', '.join(preset_names())}; or give a config.json path")
    try:
        arch = architecture_of(read_config_file(path))
    except ValueError as exc:
        _fail(str(exc))
    except (OSError, KeyError) as exc:
        _fail(f"{path}: not a usable model config ({exc})")
    link_source = "--link-gbps"
    if link_gbps is None:
        probe = last_link_probe()
        link_gbps, link_source = probe if probe else (50.0, "default; measure it with kvbench env on a GPU")
    for name, v in (("--link-gbps", link_gbps), ("--hbm-gbps", hbm_gbps)):
        if not (v > 0 and math.isfinite(v)):
            _fail(f"{name} must be a finite number of GB/s above 0, not {v}")
    gpu = _bytes_option(gpu_mem, "--gpu-mem")
    host = _bytes_option(host_mem, "--host-mem") if host_mem else psutil.virtual_memory().total
    nbytes = DTYPE_BYTES[dtype]
    try:
        modes = plan_modes(arch, prompt_tokens, batch, nbytes, gpu, host, link_gbps * 1e9, hbm_gbps * 1e9, window)
        costs = [cost_per_million(gpu_price, m.tokens_per_s) for m in modes] if gpu_price is not None else None
    except ValueError as exc:
        _fail(str(exc))
    per_seq = arch.kv_bytes(prompt_tokens, nbytes)
    sliding = arch.layers - arch.full_layers
    out.print(f"{model}: {arch.layers} layers ({sliding} with a sliding window), {arch.kv_heads} kv heads × "
              f"{arch.head_dim}, {dtype}; {_count_units(arch.parameters)} parameters = weights "
              f"{_gib(arch.parameters * nbytes)}", highlight=False, markup=False)
    out.print(f"KV: {per_seq / prompt_tokens:,.0f} bytes per token at {prompt_tokens:,} tokens "
              f"({2 * arch.kv_heads * arch.head_dim * nbytes * arch.layers:,} for full attention in every layer); "
              f"{_gib(per_seq)} per sequence, {_gib(per_seq * batch)} for batch {batch}", highlight=False, markup=False)
    out.print(f"assumed: GPU {_gib(gpu)} (10% reserved), host {_gib(host)}, link {link_gbps:g} GB/s ({link_source}), "
              f"device memory {hbm_gbps:g} GB/s", highlight=False, markup=False)
    unit_name, unit = ("GiB", 2**30) if per_seq >= 2**30 else ("MiB", 2**20)
    cap = Table(title=f"capacity at {prompt_tokens:,} tokens per sequence",
                caption="KV per sequence on the device (with the layers in flight) and in host memory; max batch: "
                        "device KV within the GPU less weights and reserve, host KV within host memory")
    for c in ("mode", f"device KV/seq ({unit_name})", f"host KV/seq ({unit_name})", "max batch"):
        cap.add_column(c, justify="left" if c == "mode" else "right")
    roof = Table(title=f"decode step at batch {batch}",
                 caption="memory: weights + 3 passes over the KV in device memory (the cache's torch.cat reads and "
                         "writes it, attention reads it); link: history copied host→device; TPOT = "
                         "the larger (copies overlapped); link-bound from: the batch from which the link sets it")
    widest = max(len(m.mode) for m in modes)
    for c in ["mode", f"link {unit_name}", "link ms", "memory ms", "TPOT ms", "tok/s", "bound",
              "link-bound from"] + (["USD/1M tok"] if costs else []):
        roof.add_column(c, justify="left" if c in ("mode", "bound") else "right", no_wrap=True,
                        min_width=widest if c == "mode" else None)
    for i, m in enumerate(modes):
        cross = ("-" if m.link_bound_batch is None else "batch 1" if m.link_bound_batch < 1
                 else f"batch {math.floor(m.link_bound_batch) + 1:,}")
        cap.add_row(m.mode, f"{m.device_bytes_per_seq / unit:,.2f}", f"{m.host_bytes_per_seq / unit:,.2f}",
                    f"{m.max_batch:,}")
        roof.add_row(m.mode, f"{m.link_bytes_per_step / unit:,.2f}", f"{m.link_s * 1e3:,.1f}",
                     f"{m.memory_s * 1e3:,.1f}", f"{m.step_s * 1e3:,.1f}", f"{m.tokens_per_s:,.1f}",
                     "link" if m.bound == "link" else "memory", cross, *([f"{costs[i]:,.2f}"] if costs else []))
    out.print(cap)
    out.print(roof)
    weights = arch.parameters * nbytes
    if weights > gpu * 0.9:
        err.print(f"[yellow]warning:[/] the weights ({_gib(weights)}) do not fit in {_gib(gpu * 0.9)} of the GPU (10% "
                  "reserved): no batch fits in any mode; the decode step above assumes they did", highlight=False)
    over = [f"{m.mode} ({m.max_batch})" for m in modes if 0 < m.max_batch < batch]
    if over and weights <= gpu * 0.9:
        err.print(f"[yellow]warning:[/] batch {batch} does not fit every mode (max batch: {', '.join(over)}); the "
                  f"decode step above is for batch {batch} anyway (--host-mem and --gpu-mem set the limits)",
                  highlight=False)
    if arch.max_positions and prompt_tokens > arch.max_positions:
        err.print(f"[yellow]warning:[/] {prompt_tokens:,} tokens is beyond the model's max_position_embeddings "
                  f"({arch.max_positions:,})", highlight=False)
    if arch.full_layers == 0:
        out.print("every layer has a sliding window: its KV is capped and stays on the device; offload moves "
                  "nothing", highlight=False)
