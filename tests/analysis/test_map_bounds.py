"""Bounded inputs of `kvbench map`: values a shared_prefix row cannot hold (the map sizes its predictions from
them), and flags that would size the map past reason or hold digits `int` refuses. Each gives one line naming the
file and column, or the flag, and what is allowed (exit 2), never a traceback, and in bounded memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_break_even import base_scenario, synthetic_rows
from typer.testing import CliRunner

from kvbench.analysis.break_even import break_even_map
from kvbench.analysis.cost import Prices
from kvbench.cli import app
from kvbench.errors import BadParameter
from kvbench.results.run_dir import RunDir
from kvbench.scenario import parse_scenario


def _run(tmp_path: Path, **change) -> Path:
    run = RunDir.create(tmp_path / "results", parse_scenario(base_scenario()).model_dump(mode="json"), {})
    for i, r in enumerate(synthetic_rows(lengths=(128, 1024))):
        run.append({**r, **(change if i == 7 else {})})
    return run.path


def _refused(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.replace("\n", " ").strip().endswith(message), res.output


@pytest.mark.parametrize("column, value", [("working_set_prompts", 1_000_000), ("working_set_prompts", 2**63 - 1),
                                           ("turn_index", 2**62)])
def test_a_row_the_map_would_size_past_a_scenario_is_refused_by_column_and_file(tmp_path, column, value):
    run = _run(tmp_path, **{column: value})
    most = {"working_set_prompts": "1,000", "turn_index": "100"}[column]
    _refused(["map", str(run), "--out", str(tmp_path / "m")],
             f"error: {run / 'trials.jsonl'}: {column} {value:,} is above {most}, the most a shared_prefix scenario "
             "asks for: not a row kvbench wrote")
    assert not (tmp_path / "m").exists()


def test_a_prediction_s_noise_does_not_grow_with_the_cell():
    from kvbench.analysis.break_even_fit import residual_sums

    residuals = np.array([-0.01, 0.0, 0.02])
    small = residual_sums(residuals, 400, 15)
    large = residual_sums(residuals, 400, 10**12)  # 8 TB if drawn request by request
    assert small.shape == large.shape == (2, 400)
    assert abs(large.mean() / 10**12 - residuals.mean()) < 1e-6  # the normal limit: mean n × theirs


@pytest.mark.parametrize("flag, text, message", [
    ("--contexts", ",".join(str(1024 + i) for i in range(17)), "--contexts: give at most 16 values (each adds a row "
                                                               "or column of predictions)"),
    ("--shares", ",".join(str(i) for i in range(100)), "--shares: give at most 16 values (each adds a row or column "
                                                       "of predictions)"),
    ("--shares", "²", "--shares '²': give whole numbers separated by commas (digits 0-9), e.g. 0,25,50"),
    ("--contexts", "1,³", "--contexts '1,³': give whole numbers separated by commas (digits 0-9), e.g. 2048,4096"),
    ("--contexts", "٣", "--contexts '٣': give whole numbers separated by commas (digits 0-9), e.g. 2048,4096"),
    ("--contexts", "9" * 5000, "every value must be 1 to 16,777,216"),
])
def test_map_flags_are_ascii_whole_numbers_and_few(tmp_path, flag, text, message):
    _refused(["map", str(_run(tmp_path)), flag, text], message)


def test_the_library_caps_the_values_too(tmp_path):
    with pytest.raises(BadParameter) as exc:
        break_even_map(None, Prices(2.0), (0, 50), tuple(range(1, 18)))
    assert exc.value.worded({"contexts": "--contexts"}) == "--contexts takes at most 16 values, not 17"
