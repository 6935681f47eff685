"""``kvbench validate``: check scenario files without running them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from kvbench.cli.common import err, handle_errors, out


def validate(files: list[Path] = typer.Argument(..., help="Scenario YAML files.")) -> None:
    """Check scenario files without loading any model weights (reads the model's config for its context limit);
    warn about configurations that run but mislead. Exit 2 when a file is invalid (each is reported), as `run`."""
    from kvbench.scenario import ScenarioError, load_scenario, sweep_summary
    from kvbench.scenario.cluster import check_placement

    bad = 0
    for f in files:
        with handle_errors():
            try:
                s = load_scenario(f)
                check_placement(s.executor, s.placement, f)  # as `kvbench run` of the file refuses it
            except ScenarioError as exc:
                bad += 1
                err.print(str(exc), highlight=False, markup=False)
                continue
            _print_warnings(f, s)
            out.print(f"{f}: ok ({sweep_summary(s)})", highlight=False, markup=False)
    if bad:
        raise typer.Exit(2)  # bad input, as `run` says of the same file


def _print_warnings(file: Path, s: Any) -> None:
    """One ``warning: <file>: <key>: <message>`` line on stderr per configuration of scenario ``s`` that runs but
    misleads (:func:`kvbench.scenario.scenario_warnings`)."""
    from kvbench.scenario import scenario_warnings

    for path, msg in scenario_warnings(s):
        err.print(f"[yellow]warning:[/] {escape(f'{file}: {path}: {msg}')}", highlight=False)
