"""``kvbench env``: the machine as kvbench sees it."""

from __future__ import annotations

import warnings

import typer
from rich.table import Table

from kvbench.cli.common import fail, handle_errors, out, show_warning


def env_(
    device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N: the device whose link is probed."),
    as_json: bool = typer.Option(False, "--json", metavar="", help="Print the raw JSON (as stored in every run.json)."),
) -> None:
    """Print the machine: CPU, memory, GPUs with their PCIe link, versions; on CUDA measure host↔device copy
    bandwidth (pinned and pageable, GB/s, median of 5 copies of 256 MiB)."""
    import json

    import re

    from kvbench.bench.telemetry.machine import probe_machine, save_link_probe

    if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", device):
        fail(f"--device: must be auto, cpu, cuda or cuda:N (got {device!r})")
    with handle_errors():
        e = probe_machine(device)
    warnings.showwarning = show_warning
    kept = save_link_probe(e)
    if as_json:
        out.print_json(json.dumps(e, default=str))
        return
    t = Table(show_header=False, box=None)
    t.add_column("what", style="bold")
    t.add_column("value")
    for key in ("kvbench", "torch", "transformers", "python", "platform", "cpu", "cpu_count", "cuda", "driver"):
        t.add_row(key, str(e.get(key)))
    t.add_row("memory", f"{e['memory_total_bytes'] / 2**30:.1f} GiB")
    for g in e.get("gpus") or []:
        link = (f"PCIe gen {g['pcie_gen']} x{g['pcie_width']} (max gen {g['pcie_gen_max']} x{g['pcie_width_max']})"
                if g.get("pcie_gen") else "PCIe link not reported")
        t.add_row(f"gpu {g['index']}", f"{g['name']}, {g['memory_total_bytes'] / 2**30:.1f} GiB, {link}")
    if not e.get("gpus"):
        t.add_row("gpus", e.get("note", "none"))
    bw = e.get("link_bandwidth")
    if bw:
        for k, v in bw.items():
            t.add_row(k.removesuffix("_gbps").replace("_", " "), f"{v:.1f} GB/s")
    else:
        t.add_row("link bandwidth", e.get("link_bandwidth_note", "not measured"))
    mem = e.get("memory_bandwidth")
    t.add_row("memory bandwidth", f"{mem['memory_gbps']:.1f} GB/s read + write ({mem['device']}, a copy of 256 MiB)"
              if mem else e.get("memory_bandwidth_note", "not measured"))
    if kept:
        t.add_row("kept", f"{kept} (kvbench plan's default --link-gbps)")
    git = e.get("git") or {}
    t.add_row("git", f"{git.get('commit')}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit")
              else str(git.get("note")))
    out.print(t)
