"""Scenario files: the strict pydantic models of the YAML, and loading with errors a person can act on.

A scenario is one sweep: a model, a workload, prompt lengths × batch sizes × offload modes × repeats. Errors name
the file, the key path (``modes[1].window``), the bad value and what is allowed. The modules: :mod:`.schema` and
:mod:`.workload` (the models), :mod:`.bounds` (their value types), :mod:`.messages` (how an error is worded),
:mod:`.load` (reading a file), :mod:`.paths` (the paths it names), :mod:`.checks` (the environment and the model),
:mod:`.summary` and :mod:`.catalog` (what ``kvbench validate`` and ``kvbench list`` say).
"""

from kvbench.errors import ScenarioError
from kvbench.scenario.catalog import read_folder, shipped_elsewhere
from kvbench.scenario.checks import check_scenario, scenario_warnings
from kvbench.scenario.load import load_scenario, parse_scenario, read_yaml
from kvbench.scenario.schema import CAPACITY_DEFAULTS, CapacitySpec, ModelSpec, RunKind, Scenario, ScenarioMode
from kvbench.scenario.summary import sweep_summary
from kvbench.scenario.workload import WorkloadSpec

__all__ = ["CAPACITY_DEFAULTS", "CapacitySpec", "ModelSpec", "RunKind", "Scenario", "ScenarioMode", "ScenarioError",
           "WorkloadSpec",
           "check_scenario", "load_scenario", "parse_scenario", "read_folder", "read_yaml", "scenario_warnings",
           "shipped_elsewhere", "sweep_summary"]
