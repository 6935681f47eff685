"""A trace replayed on the fake llama-server (tests/data/fake_llama_server.py: its slot keeps the last prompt,
cached tokens are its common prefix with the new one): requests sent at the trace's scaled arrival times, rows
carrying their trace positions, `kvbench trace validate` predicting every cached count, and `kvbench trace export`
giving back a trace with the slice's reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fake_servers import fake_env, meta, nothing_left_running, rows, run, scenario  # noqa: F401 - a fixture
from kvbench.cli import app
from kvbench.traces.read import read_trace
from kvbench.traces.simulate import simulate
from kvbench.traces.trace import window

pytestmark = [pytest.mark.e2e, pytest.mark.model]
TRACE = Path(__file__).resolve().parents[4] / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    data = scenario(name="trace", workload={"source": "synthetic", "seed": 0, "trace": {
        "path": str(TRACE), "block_tokens": 8, "conversations": 3, "max_requests": 8, "time_scale": 0.001}},
        load={"profile": "trace", "concurrency": 1})
    with fake_env(tmp / "record.jsonl"):
        return run(tmp, data), tmp


def test_rows_carry_trace_positions_and_were_sent_at_scaled_arrivals(replay):
    run_dir, _ = replay
    warm = [r for r in rows(run_dir).values() if r["mode_label"] == "prefix-cache"]
    assert [r["trace_index"] for r in warm] == [1, 3, 6, 137, 429, 1585, 1900, 2199]
    assert [r["request_id"] for r in warm][:3] == ["t1", "t3", "t6"]
    assert all(r["load_profile"] == "trace" for r in warm)
    # trace times 0.001x: t2199 arrived 731,999 ms after t1 in the trace, so 0.732 s after it in the replay
    assert window(read_trace(TRACE), conversations_kept=3).arrival_s[7] == pytest.approx(731.999)
    assert [r["arrival_s"] for r in warm][-2:] == pytest.approx([0.642, 0.731999], abs=1e-9)
    assert all(r["queue_s"] >= 0 for r in warm)
    # 15 ids of which the last holds 7,322 - 14 x 512 = 154 tokens: 14 x 8 + ceil(154 x 8 / 512) = 115 tokens
    assert meta(run_dir)["requests"][0] == {"id": "t1", "document": "c0", "turn_index": 1, "prompt_tokens": 115,
                                            "held_tokens": 115, "trace_index": 1, "arrival_s": 0.0}


def test_validate_predicts_every_cached_count_of_the_slot(replay):
    run_dir, tmp = replay
    result = CliRunner().invoke(app, ["trace", "validate", str(run_dir), "--out", str(tmp / "check")])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("prefix-cache (llama.cpp)"))
    measured = sum(r["cached_prompt_tokens"] for r in rows(run_dir).values() if r["mode_label"] == "prefix-cache")
    assert f"cached prompt tokens measured {measured:,}" in line and "prompt-lru at 0 blocks" in line
    assert "0 requests off by more than a block" in line


def test_export_gives_back_the_slice_as_a_trace(replay):
    run_dir, tmp = replay
    out = tmp / "exported.jsonl"
    result = CliRunner().invoke(app, ["trace", "export", str(run_dir), "--mode", "prefix-cache", "--block-tokens",
                                      "8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    exported = read_trace(out, block_tokens=8)
    assert exported.n_requests == 8
    sent = [r["prompt_tokens"] for r in rows(run_dir).values() if r["mode_label"] == "prefix-cache"]
    assert exported.input_tokens.tolist() == sent
    # the replayed blocks are 8 tokens, so the export's 8-token blocks are the slice's: the same reuse
    from kvbench.scenario.trace_checks import replayed_slice
    from kvbench.scenario.workload import TraceSpec

    spec = TraceSpec.model_validate(meta(run_dir)["scenario"]["workload"]["trace"])
    assert simulate(exported).ceiling[0] == pytest.approx(simulate(replayed_slice(spec)).ceiling[0])
    assert json.loads(out.read_text().splitlines()[0])["timestamp"] == 0
