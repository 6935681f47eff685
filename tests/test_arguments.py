"""The library's arguments (kvbench/arguments.py): a wrong type or value raises BadParameter naming the argument,
never a TypeError or AttributeError from inside kvbench."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvbench
from conftest import ROOT
from kvbench.errors import BadParameter, ModelNotFound

GOLDEN = ROOT / "tests" / "data" / "golden" / "golden-20261130T011302Z"


@pytest.fixture(scope="module")
def golden():
    return kvbench.load_results(GOLDEN)  # one path, not a list, is taken too


@pytest.mark.parametrize("call, message", [
    (lambda: kvbench.load_results(None), "paths must be a path or a list of paths, not NoneType None"),
    (lambda: kvbench.load_results([5]), "paths must be a path (a str or pathlib.Path), not int 5"),
    (lambda: kvbench.load_results([]), "paths is empty: give at least one path"),
    (lambda: kvbench.load_scenario(5), "file must be a path (a str or pathlib.Path), not int 5"),
    (lambda: kvbench.run_scenario([ROOT / "scenarios" / "smoke.yaml"]), "scenario must be a path (a str or "
                                                                        "pathlib.Path), not list"),
    (lambda: kvbench.run_scenario(ROOT / "scenarios" / "smoke.yaml", out=5), "out must be a path"),
    (lambda: kvbench.Prices(gpu_per_hour=None), "gpu_per_hour must be a number, not NoneType None"),
    (lambda: kvbench.Prices(gpu_per_hour="2"), "gpu_per_hour must be a number, not str '2'"),
    (lambda: kvbench.Prices(gpu_per_hour=True), "gpu_per_hour must be a number, not bool True"),
    (lambda: kvbench.Prices(gpu_per_hour=2, host_per_gib_hour=None), "host_per_gib_hour must be a number"),
    (lambda: kvbench.plan(None), "model must be a preset name or a path, not NoneType"),
    (lambda: kvbench.plan("llama-3.1-8b", prompt_tokens=1.5), "prompt_tokens must be a whole number, not float 1.5"),
    (lambda: kvbench.plan("llama-3.1-8b", link_gbps="x"), "link_gbps must be a number, not str 'x'"),
    (lambda: kvbench.plan("llama-3.1-8b", host_mem=0), "host_mem 0: must be more than 0 bytes"),
    (lambda: kvbench.write_report(None, "x"), "results must be kvbench.load_results(...), not NoneType"),
    (lambda: kvbench.cost_report(None, "x", kvbench.Prices(2.0)), "results must be kvbench.load_results(...)"),
])
def test_wrong_arguments_name_the_argument(call, message):
    with pytest.raises(BadParameter) as caught:
        call()
    assert str(caught.value).startswith(message)


def test_wrong_arguments_of_report_and_cost(golden, tmp_path):
    with pytest.raises(BadParameter, match=r"^prices must be a kvbench.Prices, not float$"):
        kvbench.cost_report(golden, tmp_path / "c", 2.0)
    with pytest.raises(BadParameter, match=r"^max_ttft_s must be a finite number of seconds above 0, not -1$"):
        kvbench.cost_report(golden, tmp_path / "c", kvbench.Prices(2.0), max_ttft_s=-1)
    with pytest.raises(BadParameter, match=r"^timelines must be a list of trial ids, not the str 'p256'$"):
        kvbench.write_report(golden, tmp_path / "r", timelines="p256")
    with pytest.raises(BadParameter, match=r"^out_dir must be a path \(a str or pathlib.Path\), not int 5$"):
        kvbench.write_report(golden, 5)
    assert not (tmp_path / "c").exists() and not (tmp_path / "r").exists()  # refused before anything is written
    assert len(golden.trials) == 120


def test_a_path_names_a_preset_with_a_did_you_mean():
    with pytest.raises(ModelNotFound, match=r"unknown model 'llama-3.1-8c': did you mean llama-3.1-8b"):
        kvbench.plan(Path("llama-3.1-8c"))
