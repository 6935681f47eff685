"""``kvbench validate``: check scenario files without running them."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.cli.common import _print_warnings, err, handle_errors, out


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
