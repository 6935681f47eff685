"""The scenario files of a folder, each read as a scenario or the error that refuses it (what ``kvbench list
scenarios`` shows), and where kvbench's own scenarios are."""

from __future__ import annotations

from pathlib import Path

from kvbench.errors import ScenarioError
from kvbench.scenario.load import SHIPPED, parse_scenario, read_yaml
from kvbench.scenario.schema import Scenario


def read_folder(directory: Path) -> list[tuple[Path, Scenario | ScenarioError]]:
    """Every ``*.yaml`` then ``*.yml`` file of ``directory`` (each sorted by name) with its scenario, parsed and
    validated but not checked against the environment, or the :class:`ScenarioError` it raises; ``[]`` for a
    folder without one."""
    files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    out: list[tuple[Path, Scenario | ScenarioError]] = []
    for f in files:
        try:
            out.append((f, parse_scenario(read_yaml(f), f)))
        except ScenarioError as exc:
            out.append((f, exc))
    return out


def shipped_elsewhere(directory: Path) -> Path | None:
    """:data:`SHIPPED` when it exists and is not ``directory``, else None (where else to look for scenarios)."""
    return SHIPPED if SHIPPED.is_dir() and SHIPPED != directory.resolve() else None
