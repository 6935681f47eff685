"""``kvbench list``: presets, modes and scenarios."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.cli.common import fail, handle_errors, out


class ListWhat(StrEnum):
    scenarios = "scenarios"
    modes = "modes"
    presets = "presets"


def list_(
    what: ListWhat = typer.Argument(..., help="scenarios, modes or presets"),
    directory: Path = typer.Option(Path("scenarios"), "--dir", help="Where to look for scenarios."),
) -> None:
    """List the scenario files in a folder, the offload modes, or the architecture presets."""
    with handle_errors():
        out.print(_listing(what, directory))


def _listing(what: ListWhat, directory: Path) -> Table:
    t = Table()
    if what is ListWhat.modes:
        from kvbench.offload.modes import MODES
        from kvbench.scenario.servers import PRESETS
        from kvbench.serving import KINDS

        t.add_column("engine")
        t.add_column("mode")
        t.add_column("what it does")
        t.add_column("needs")
        for m in MODES.values():
            t.add_row("transformers", m.kind, m.summary, "CUDA" if m.needs_cuda else "-")
        for kind, presets in PRESETS.items():
            gpu = KINDS[kind].cpu_refusal is not None  # the kind's program cannot serve on a CPU at all
            for p in presets.values():
                size = f"size: {p.size[0]}, default {p.size[1]:g}" if p.size else ""
                needs = ", ".join(x for x in ("GPU" if p.needs_gpu or gpu or p.cpu_refusal else "", size) if x) or "-"
                t.add_row(kind, p.name, escape(p.meaning), escape(needs))
    elif what is ListWhat.presets:
        from kvbench.models import preset_names

        t.add_column("preset")
        for name in preset_names():
            t.add_row(name)
    else:
        from kvbench.scenario import ScenarioError, read_folder, shipped_elsewhere

        found = read_folder(directory)
        if not found:
            shipped = shipped_elsewhere(directory)
            hint = f"; kvbench's own are in {shipped}" if shipped else ""
            fail(f"no scenario files (*.yaml) in {directory.resolve()}: pass --dir DIR{hint}")
        t.add_column("file")
        t.add_column("name")
        t.add_column("description")
        for f, s in found:
            if isinstance(s, ScenarioError):
                t.add_row(escape(str(f)), "[red]invalid[/]", escape(str(s).splitlines()[0]))
            else:
                t.add_row(escape(str(f)), s.name, escape(s.description))
    return t
