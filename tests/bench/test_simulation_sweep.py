"""A sweep of simulations: every trace × policy, locally or as Ray tasks, the same rows as one simulation each,
priced in bytes of each model's KV."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvbench.bench.simulation_sweep import sweep_simulations
from kvbench.cli import app
from kvbench.errors import BadFile, BadParameter
from kvbench.traces.read import read_trace
from kvbench.traces.simulate import simulate

MOONCAKE = Path(__file__).resolve().parents[2] / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    """The Mooncake trace's first and last 3,000 lines as two trace files."""
    tmp = tmp_path_factory.mktemp("sweep")
    lines = MOONCAKE.read_text().splitlines(keepends=True)
    first, last = tmp / "first.jsonl", tmp / "last.jsonl"
    first.write_text("".join(lines[:3000]))
    last.write_text("".join(lines[-3000:]))
    return first, last


def test_every_trace_and_policy_gives_the_rows_of_its_own_simulation(halves):
    frame = sweep_simulations(halves, ["lru", "lru-tail-first"], ["llama-3.1-8b", None])
    assert sorted(set(zip(frame["trace"], frame["policy"]))) == [
        ("first.jsonl", "lru"), ("first.jsonl", "lru-tail-first"), ("last.jsonl", "lru"),
        ("last.jsonl", "lru-tail-first")]
    for path in halves:
        curve = simulate(read_trace(path), "lru-tail-first")
        part = frame[(frame["trace"] == path.name) & (frame["policy"] == "lru-tail-first")
                     & (frame["model"] == "llama-3.1-8b")]
        blocks, tokens = curve.rates(part["capacity_blocks"].to_numpy())
        assert np.array_equal(part["hit_rate_blocks"].to_numpy(), blocks)
        assert np.array_equal(part["hit_rate_tokens"].to_numpy(), tokens)
        assert part["unlimited"].tolist()[-1] and part["capacity_blocks"].tolist()[-1] == curve.distinct_blocks
        # Llama-3.1-8B in bf16: 131,072 KV bytes per token
        assert (part["capacity_bytes"] == part["capacity_tokens"] * 131_072).all()
    assert frame[frame["model"].isna()]["capacity_bytes"].isna().all()


def test_bad_input_stops_the_sweep_before_it_runs(halves, tmp_path):
    with pytest.raises(BadParameter, match="policies lfu: give one or more of lru, lru-tail-first"):
        sweep_simulations(halves, ["lfu"])
    with pytest.raises(BadParameter, match="executor 'slurm' is not one of: local, ray"):
        sweep_simulations(halves, executor="slurm")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(BadFile, match="line 1: missing input_length"):
        sweep_simulations([halves[0], bad])


def test_the_command_prints_a_row_per_trace_and_policy_and_writes_the_csv(halves, tmp_path):
    r = CliRunner().invoke(app, ["trace", "sweep", *map(str, halves), "--policies", "lru,lru-tail-first", "--out",
                                 str(tmp_path / "out")], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert sum(line.startswith(("│ first.jsonl", "│ last.jsonl")) for line in r.output.splitlines()) == 4
    assert (tmp_path / "out" / "sweep.csv").read_text().startswith(
        "trace,policy,capacity_blocks,capacity_tokens,hit_rate_blocks,hit_rate_tokens,unlimited,model,capacity_bytes")


@pytest.mark.ray
def test_on_ray_the_rows_are_the_local_ones(halves):
    local = sweep_simulations(halves, ["lru"])
    on_ray = sweep_simulations(halves, ["lru"], executor="ray")
    assert local.equals(on_ray)
