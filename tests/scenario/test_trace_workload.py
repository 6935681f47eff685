"""A scenario that replays a trace (``workload.trace``): its path taken from the scenario file's directory, its
window and load profile checked with key paths, a faulty trace file reported under ``workload.trace`` with its
line, and ``kvbench validate``'s summary naming the requests the slice holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli import app
from kvbench.errors import ScenarioError
from kvbench.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"


def trace_scenario(**trace) -> dict:
    """A valid in-process scenario replaying ``trace.jsonl`` on the tiny random model; keywords go to
    ``workload.trace``."""
    return {"name": "replay", "model": {"preset": "tiny-llama", "weights": "random"}, "device": "cpu",
            "workload": {"source": "synthetic", "trace": {"path": "trace.jsonl", "block_tokens": 4, **trace}},
            "max_new_tokens": 2, "modes": [{"kind": "none"}], "repeats": 1, "warmup": 0}


def server_scenario(**over) -> dict:
    base = {"name": "replay", "model": "smollm2-135m", "engine": {"kind": "llama.cpp"}, "load": {"profile": "trace"},
            "workload": {"source": "synthetic"}, "prompt_tokens": [16], "max_new_tokens": 2,
            "modes": [{"name": "none"}]}
    base.update(over)
    return base


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A scenario folder holding the trace's first 50 requests, and a working directory elsewhere."""
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "trace.jsonl").write_text("".join(MOONCAKE.read_text().splitlines(keepends=True)[:50]))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return d


def problems(path: Path, check_model: bool = False) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as e:
        load_scenario(path, check_model=check_model)
    return e.value.problems


def test_a_trace_scenario_validates_and_takes_the_path_from_its_folder(folder, write_yaml):
    path = write_yaml(trace_scenario(max_requests=10, start_s=3, time_scale=0.5), "scenarios/s.yaml")
    s = load_scenario(path, check_model=False)
    assert s.workload.reuse == "trace"
    spec = s.workload.trace
    assert spec.path == str(folder / "trace.jsonl")
    assert (spec.block_tokens, spec.format, spec.max_requests, spec.start_s, spec.time_scale) == (4, "auto", 10, 3, 0.5)
    assert spec.window_args == {"start_s": 3, "end_s": None, "first": None, "max_requests": 10, "time_scale": 0.5,
                                "conversations_kept": None}
    # an absolute path is kept as it is
    absolute = write_yaml(trace_scenario(path=str(MOONCAKE)), "scenarios/abs.yaml")
    assert load_scenario(absolute, check_model=False).workload.trace.path == str(MOONCAKE)


def test_a_trace_beside_the_scenario_is_not_looked_for_in_the_working_directory(folder, write_yaml):
    path = write_yaml(trace_scenario(path="missing.jsonl"), "scenarios/s.yaml")
    (Path.cwd() / "missing.jsonl").write_text((folder / "trace.jsonl").read_text())
    found = problems(path)
    assert len(found) == 1 and found[0][0] == "workload.trace"
    assert found[0][1].startswith(f"{folder / 'missing.jsonl'}: cannot read the file: No such file or directory")


@pytest.mark.parametrize("trace, key, message", [
    ({"path": None}, "workload.trace.path", "required key is missing"),
    ({"start_s": 2, "end_s": 1}, "workload.trace", "end_s 1.0 must be after start_s 2.0"),
    ({"start_s": 5, "end_s": 5}, "workload.trace", "end_s 5.0 must be after start_s 5.0"),
    ({"block_tokens": 0}, "workload.trace.block_tokens", None),
    ({"time_scale": 0}, "workload.trace.time_scale", None),
])
def test_faults_of_the_trace_key_are_named_by_key_path(folder, write_yaml, trace, key, message):
    data = trace_scenario(**{k: v for k, v in trace.items() if v is not None})
    if trace.get("path", "") is None:
        del data["workload"]["trace"]["path"]
    found = problems(write_yaml(data, "scenarios/s.yaml"))
    assert [k for k, _ in found] == [key]
    if message is not None:
        assert found[0][1] == message


def test_load_profile_trace_needs_workload_trace(tmp_path, write_yaml):
    found = problems(write_yaml(server_scenario()))
    assert found == [("load", "profile trace sends each request at its arrival time in workload.trace; this "
                              "workload is independent prompts: give workload.trace, or another profile")]


def test_a_faulty_trace_file_is_reported_under_workload_trace_with_its_line(folder, write_yaml):
    (folder / "trace.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
                                        '{"timestamp": 1, "input_length": -3, "output_length": 1, "hash_ids": [0]}\n')
    found = problems(write_yaml(trace_scenario(), "scenarios/s.yaml"))
    assert found == [("workload.trace", f"{folder / 'trace.jsonl'}: line 2: input_length must be a whole number of "
                                        "at least 1, not -3")]


def test_an_empty_window_is_reported_under_workload_trace(folder, write_yaml):
    found = problems(write_yaml(trace_scenario(start_s=10_000), "scenarios/s.yaml"))
    assert found == [("workload.trace", "trace window: no request of trace.jsonl (50 requests over 15.0 s) is in "
                                        "the window asked for")]


def test_a_block_making_prompts_past_the_model_s_positions_is_refused_with_the_block_that_fits(folder, write_yaml):
    # tiny-llama: 2,048 positions less 2 new tokens
    lengths = []
    for line in (folder / "trace.jsonl").read_text().splitlines():
        rec = json.loads(line)
        whole = len(rec["hash_ids"]) - 1
        lengths.append(whole * 64 + math.ceil((rec["input_length"] - whole * 512) * 64 / 512))
    assert max(lengths) == 10_897 and 64 * 2046 // 10_897 == 12
    found = problems(write_yaml(trace_scenario(block_tokens=64), "scenarios/s.yaml"), check_model=True)
    assert found == [("workload.trace.block_tokens", "64 tokens per block make a prompt of 10,897 tokens, longer "
                      "than the model's longest of 2,046: at most 12 tokens per block, or fewer requests")]
    assert load_scenario(write_yaml(trace_scenario(block_tokens=12), "scenarios/t.yaml"))
    assert problems(write_yaml(trace_scenario(block_tokens=13), "scenarios/u.yaml"), check_model=True)[0][1] == (
        "13 tokens per block make a prompt of 2,214 tokens, longer than the model's longest of 2,046: at most 12 tokens "
        "per block, or fewer requests")


def test_validate_names_the_requests_of_the_slice(folder, write_yaml):
    runner = CliRunner()
    path = write_yaml(trace_scenario(max_requests=10), "scenarios/s.yaml")
    r = runner.invoke(app, ["validate", str(path)], terminal_width=400)
    assert r.exit_code == 0, r.output
    assert r.output.strip() == (f"{path}: ok (20 trials: trace: 10 requests of trace.jsonl arriving over 0.0 s, 4 tokens "
                                "per block = "
                                "10 requests × 1 mode × cold and warm × 1 repeat; prompts are built from the data "
                                "as it runs)")
    # fewer requests in the window than max_requests: the slice's count, not the bound
    more = write_yaml(trace_scenario(max_requests=500), "scenarios/more.yaml")
    r = runner.invoke(app, ["validate", str(more)], terminal_width=400)
    assert r.exit_code == 0 and "trace: 50 requests of trace.jsonl arriving over 15.0 s, 4 tokens per block" in r.output
    bad = write_yaml(trace_scenario(start_s=2, end_s=1), "scenarios/bad.yaml")
    r = runner.invoke(app, ["validate", str(bad)], terminal_width=400)
    assert r.exit_code == 2 and f"{bad}: workload.trace: end_s 1.0 must be after start_s 2.0" in r.output
