"""Every ```yaml block of README.md validates with the code `kvbench validate` runs (load_scenario).

A block with a top-level ``name`` is a whole scenario; any other block is a fragment, checked inside the README's
first whole scenario (its keys replace that scenario's; a reuse workload drops prompt_tokens and batch_sizes, which
it does not take); a workload fragment that offers multi_turn ``# or`` doc_qa ``# or`` shared_prefix is checked once
with each.
"""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import ROOT
from kvbench.scenario import load_scenario
from kvbench.scenario.workload import REUSE_KINDS

BLOCKS = re.findall(r"^```yaml\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S | re.M)
BASE = next(yaml.safe_load(b) for b in BLOCKS if "name" in yaml.safe_load(b))


def _scenarios(block: dict) -> list[dict]:
    """The whole scenarios a README block stands for."""
    if "name" in block:
        return [block]
    data = {**BASE, **block}
    wl = data["workload"]
    offered = [k for k in REUSE_KINDS if k in wl]
    if offered:
        data = {k: v for k, v in data.items() if k not in ("prompt_tokens", "batch_sizes")}
        return [{**data, "workload": {k: v for k, v in wl.items() if k not in offered or k == keep}}
                for keep in offered]
    return [data]


def test_the_readme_has_yaml_blocks():
    assert len(BLOCKS) >= 5 and BASE["name"] == "dialogue"


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_every_readme_yaml_block_validates(i, tmp_path):
    for n, data in enumerate(_scenarios(yaml.safe_load(BLOCKS[i]))):
        path = tmp_path / f"block{i}-{n}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_scenario(path)  # raises ScenarioError naming the key that fails
