"""Capacity search: doubling then bisection, every probe a recorded trial, exact on CPU with a budget."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_scenario
from kvbench.analysis.points import point_table
from kvbench.bench.plans.capacity import search
from kvbench.bench.trial import bounds
from kvbench.analysis.capacity import capacity_frame
from kvbench.report.advice import capacity_findings, capacity_recommendation
from kvbench.report.write import write_report
from kvbench.results.load import load_results
from kvbench.results.read import read_trials
from kvbench.results.run_dir import RunDir
from kvbench.bench.engines.transformers import TransformersEngine
from kvbench.bench.executors.local import LocalExecutor
from kvbench.bench.plans.sweep import run_sweep
from kvbench.bench.plans.plan import plan_for
from kvbench.scenario import ScenarioError, check_scenario, parse_scenario
from kvbench.workloads import SyntheticSource

# tiny-llama: 2 layers × 2 kv heads × head_dim 16 × 4 bytes × 2 (K and V)
KV_PER_TOKEN = 512
LAYER_PER_TOKEN = KV_PER_TOKEN // 2


def threshold(cap: int, failure: str = "over_budget"):
    calls = []

    def probe(v: int) -> str:
        calls.append(v)
        return "ok" if v <= cap else failure
    return probe, calls


def test_search_doubles_then_bisects_to_the_exact_capacity():
    probe, calls = threshold(13)
    res = search(probe, 1, 64)
    assert res.capacity == 13 and res.first_failure == 14
    assert calls == [1, 2, 4, 8, 16, 12, 14, 13]
    assert res.probes == [(1, "ok"), (2, "ok"), (4, "ok"), (8, "ok"), (16, "over_budget"), (12, "ok"),
                          (14, "over_budget"), (13, "ok")]
    assert res.stopped == "14 did not fit (over_budget)"


def test_search_limit_resolution_nothing_fits_and_errors():
    probe, calls = threshold(100)
    res = search(probe, 3, 20)
    assert (res.capacity, res.first_failure, calls) == (20, None, [3, 6, 12, 20])
    assert res.stopped == "reached capacity.max 20: it may fit more"

    probe, calls = threshold(77, "oom")
    res = search(probe, 16, 128, resolution=8)
    assert calls == [16, 32, 64, 128, 96, 80, 72] and res.capacity == 72 and res.first_failure == 80
    assert res.stopped == "80 did not fit (oom) (to within 8)"

    probe, calls = threshold(0)
    res = search(probe, 4, 64)
    assert (res.capacity, res.first_failure, calls) == (None, 4, [4])
    assert res.stopped == "nothing fits: the first value 4 ended over_budget"

    res = search(lambda v: "ok" if v < 8 else "error", 1, 64)
    assert res.capacity == 4 and res.first_failure is None and res.stopped == "stopped: 8 ended error"

    with pytest.raises(ValueError, match="need 1 <= start <= limit"):
        search(lambda v: "ok", 8, 4)


def test_scenario_auto_fields_and_their_errors():
    s = parse_scenario(tiny_scenario(batch_sizes="auto", budget="40KiB"))
    assert s.searched == "batch_size" and s.largest_batch == 4  # workload.n_prompts
    assert bounds(s, 2000) == (1, 4, 1)
    assert s.run_kind == "capacity" and plan_for(s).planned(0) is None
    s = parse_scenario(tiny_scenario(prompt_tokens="auto", budget="40KiB", capacity={"start": 16, "resolution": 8}))
    assert s.searched == "prompt_tokens" and s.longest_prompt is None and bounds(s, 2045) == (16, 2045, 8)

    def problems(**over):
        with pytest.raises(ScenarioError) as e:
            parse_scenario(tiny_scenario(**over), "s.yaml")
        return e.value.problems

    assert problems(batch_sizes="auto", prompt_tokens="auto") == [
        ("batch_sizes", "cannot be auto together with prompt_tokens: the search varies one at a fixed other")]
    assert problems(capacity={"max": 8}) == [
        ("capacity", "bounds the search of batch_sizes: auto or prompt_tokens: auto; neither is auto")]
    assert problems(batch_sizes="most") == [("batch_sizes", "must be a list of positive integers or auto (got 'most')")]
    assert problems(batch_sizes="auto", capacity={"start": 8, "max": 4}) == [
        ("capacity", "start 8 is larger than max 4")]
    assert problems(batch_sizes="auto", capacity={"step": 2})[0][0] == "capacity.step"

    s = parse_scenario(tiny_scenario(batch_sizes="auto", capacity={"max": 8}))
    found = check_scenario(s, check_model=False)
    assert ("capacity.max", "8 is more than workload.n_prompts 4: a batch needs distinct prompts; raise n_prompts "
                            "or lower capacity.max") in found
    assert ("budget", "batch_size search without CUDA needs a device KV budget: there is no device memory to run "
                      "out of (set budget, e.g. 256MiB)") in found
    s = parse_scenario(tiny_scenario(batch_sizes="auto", budget="40KiB", capacity={"start": 16}))
    assert check_scenario(s, check_model=False) == [
        ("capacity.start", "16 is above the search's max, workload.n_prompts 4: smaller batches would never be tried")]
    # device: auto on a machine without CUDA (these tests' machines) needs a budget too, as `run` would say
    s = parse_scenario(tiny_scenario(device="auto", prompt_tokens="auto", capacity={"start": 3000, "max": 4000}))
    key, why = plan_for(s).problem("cpu")
    assert key == "budget" and why.startswith("prompt_tokens search on cpu needs a device KV budget")
    assert plan_for(s).problem("cuda") is None
    found = check_scenario(s)
    for key, v in (("max", 4000), ("start", 3000)):
        assert (f"capacity.{key}", f"{v} tokens + max_new_tokens 3 exceeds the model's max_position_embeddings 2048; "
                                   "the longest prompt allowed is 2045") in found
    if not torch.cuda.is_available():
        assert ("budget", "prompt_tokens search without CUDA needs a device KV budget: there is no device memory "
                          "to run out of (set budget, e.g. 256MiB)") in found


def _run(tiny_model, tmp_path, **over):
    s = parse_scenario(tiny_scenario(**over))
    runner = LocalExecutor(s, TransformersEngine(s, tiny_model,
                                                 SyntheticSource(tiny_model.shape.vocab_size, seed=0, n_prompts=32)))
    assert runner.engine.preflight() == []
    run = RunDir.create(tmp_path, s.model_dump(mode="json"), {"test": True})
    res = run_sweep(s, run, runner)
    assert not res.interrupted
    return s, runner, run, res


@pytest.mark.e2e
def test_batch_search_on_cpu_is_exact_and_records_every_probe(tiny_model, tmp_path):
    # 32 prompt + 4 new tokens: 35 cached per sequence; none holds all of them, full one layer's
    budget = 40960
    s, runner, run, res = _run(tiny_model, tmp_path, prompt_tokens=[32], max_new_tokens=4, batch_sizes="auto",
                               budget=budget, modes=[{"kind": "none"}, {"kind": "full"}], repeats=2, warmup=0,
                               workload={"source": "synthetic", "n_prompts": 32})
    found = json.loads((run.path / "run.json").read_text())["capacity"]
    by_mode = {f["mode"]: f for f in found}
    assert by_mode["none"]["capacity"] == budget // (KV_PER_TOKEN * 35) == 2
    assert by_mode["full"]["capacity"] == budget // (LAYER_PER_TOKEN * 35) == 4
    assert by_mode["none"]["probes"] == [[1, "ok"], [2, "ok"], [4, "over_budget"], [3, "over_budget"]]
    assert by_mode["full"]["probes"] == [[1, "ok"], [2, "ok"], [4, "ok"], [8, "over_budget"], [6, "over_budget"],
                                         [5, "over_budget"]]
    assert by_mode["full"]["trial_ids"] == ["p32-b4-full-r0", "p32-b4-full-r1"]
    assert by_mode["none"]["stopped"] == "3 did not fit (over_budget)"
    rows = read_trials(run.trials_path)
    ids = [r["trial_id"] for r in rows]
    assert len(ids) == len(set(ids)) == res.written
    # every probe is a trial; none ran first at every point full probed (its ids are the reference)
    for f in found:
        for v, status in f["probes"]:
            row = next(r for r in rows if r["trial_id"] == f"p32-b{v}-{f['mode_label']}-r0")
            assert row["status"] == status
    for r in rows:
        if r["mode"] == "full":
            assert ids.index(r["trial_id"].replace("-full-", "-none-")) < ids.index(r["trial_id"])
            assert r["tokens_match"] is True
    # capacity measured `repeats` times
    assert sum(r["trial_id"].startswith("p32-b4-full-") for r in rows) == 2
    # resumed: nothing runs again, the same capacities
    again = run_sweep(s, RunDir.open(run.path), runner)
    assert again.written == 0 and again.skipped_done == len(rows)
    assert json.loads((run.path / "run.json").read_text())["capacity"] == found

    results = load_results([run.path])
    table = point_table(results.trials)
    frame = capacity_frame(found, table)
    assert list(frame["capacity"]) == [2, 4] and list(frame["tokens_match"]) == [True, True]
    full = frame[frame["mode_label"] == "full"].iloc[0]
    assert capacity_findings(frame)[1] == (
        f"at 32 tokens, `full`: largest batch 4, {full['throughput_tokens_per_s_median']:,.1f} tokens/s there "
        f"(2.00× none's 2, {full['throughput_tokens_per_s_median'] / frame['throughput_tokens_per_s_median'][0]:.2f}× "
        "its tokens/s)")
    assert capacity_recommendation(frame).startswith("at 32 tokens ")
    rep = write_report(results, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### Capacity within the budget" in md and "| 32 | full | 4 | 1 2 4 8✗ 6✗ 5✗ |" in md
    assert rep.findings[results.runs[0]["group"]][0].startswith("at 32 tokens, `none`: largest batch 2")


@pytest.mark.e2e
def test_prompt_search_and_plan_predictions_in_rows(tiny_model, tmp_path):
    # batch 1, 3 new tokens: (n + 2) × 512 bytes ≤ 40960 → n ≤ 78; resolution 8 from 16: 16 32 64 128✗ 96✗ 80✗ 72
    s, runner, run, res = _run(tiny_model, tmp_path, prompt_tokens="auto", batch_sizes=[1], budget=40960,
                               capacity={"start": 16, "max": 128, "resolution": 8}, repeats=1, warmup=0)
    (found,) = json.loads((run.path / "run.json").read_text())["capacity"]
    assert found["searched"] == "prompt_tokens" and found["batch_size"] == 1
    assert [v for v, _ in found["probes"]] == [16, 32, 64, 128, 96, 80, 72] and found["capacity"] == 72
    row = next(r for r in read_trials(run.trials_path) if r["trial_id"] == "p72-b1-none-r0")
    # plan's placement for `none` is the whole KV: the same bytes as the analytic prediction
    assert row["plan_kv_device_bytes"] == row["kv_bytes_predicted"] == 74 * KV_PER_TOKEN == row["kv_device_peak_bytes"]
    assert row["plan_link_bytes_per_step"] == 0
    assert row["plan_tpot_s"] is None  # the test run measured no bandwidths


def test_plan_prediction_uses_the_runs_measured_bandwidths(tiny_model):
    import torch

    from kvbench.bench.engines.predict import roofline_bandwidths
    from kvbench.bench.trial import TrialSpec

    env = {"memory_bandwidth": {"memory_gbps": 20.0, "copy_gbps": 10.0},
           "link_bandwidth": {"h2d_pinned_gbps": 50.0}}
    assert roofline_bandwidths(env, torch.device("cpu")) == (20e9, 10e9)
    assert roofline_bandwidths(env, torch.device("cuda")) == (20e9, 50e9)
    assert roofline_bandwidths({"memory_bandwidth": None}, torch.device("cpu")) is None
    s = parse_scenario(tiny_scenario(modes=[{"kind": "full"}, {"kind": "hierarchical", "window": 4},
                                            {"kind": "dynamic"}]))
    runner = TransformersEngine(s, tiny_model, SyntheticSource(tiny_model.shape.vocab_size, seed=0, n_prompts=4),
                                environment=env).predict
    full = runner.plan_prediction(TrialSpec(16, 2, s.modes[0], 0))
    tokens = 16 + 3 - 1
    # full: two layers' history on the device (all of tiny-llama's 2), every layer's history copied each step
    assert full["plan_kv_device_bytes"] == 2 * LAYER_PER_TOKEN * tokens * 2
    # like the measured h2d_bytes ÷ steps: the mean over the 2 decode steps of the history copied then (16, 17
    # tokens: what was cached before each step's token)
    assert full["plan_link_bytes_per_step"] == KV_PER_TOKEN * (16 + 17) / 2 * 2
    # like the measured TPOT: the mean step over those steps (attention over 17, 18 tokens), 3 passes over the KV
    # (torch.cat reads and writes it, attention reads it); on a CPU no link and no overlap: the memory time alone
    mem_s = [(tiny_model.weights_bytes + 3 * 2 * KV_PER_TOKEN * n) / 20e9 for n in (17, 18)]
    assert full["plan_tpot_s"] == pytest.approx(sum(mem_s) / 2)
    hier = runner.plan_prediction(TrialSpec(16, 1, s.modes[1], 0))
    assert hier["plan_link_bytes_per_step"] == KV_PER_TOKEN * ((16 - 4) + (17 - 4)) / 2
    assert runner.plan_prediction(TrialSpec(16, 1, s.modes[2], 0)) == dict.fromkeys(
        ("plan_kv_device_bytes", "plan_link_bytes_per_step", "plan_tpot_s"))


def test_recommendation_of_a_prompt_length_search_goes_by_length():
    import pandas as pd

    frame = pd.DataFrame([
        {"batch_size": 1, "prompt_tokens": 72, "mode_label": "none", "searched": "prompt_tokens", "capacity": 72,
         "throughput_tokens_per_s_median": 213.0, "tokens_match": True},
        {"batch_size": 1, "prompt_tokens": 152, "mode_label": "full", "searched": "prompt_tokens", "capacity": 152,
         "throughput_tokens_per_s_median": 150.0, "tokens_match": True},
        {"batch_size": 2, "prompt_tokens": 32, "mode_label": "none", "searched": "prompt_tokens", "capacity": 32,
         "throughput_tokens_per_s_median": 300.0, "tokens_match": True},
        {"batch_size": 2, "prompt_tokens": 32, "mode_label": "full", "searched": "prompt_tokens", "capacity": 32,
         "throughput_tokens_per_s_median": 290.0, "tokens_match": True}])
    assert capacity_recommendation(frame) == (
        "at batch 1 use `full` for long contexts: it fits 152 prompt tokens, 2.11× `none`'s 72; "
        "at batch 2 no offload needed: `none` fits the longest prompt (32 tokens)")
