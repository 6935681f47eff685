"""The trial runner: timer definitions on a fake clock, the decode loop against transformers' generate,
KV accounting, failure capture, interruption."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_scenario
from kvbench.results.read import read_trials
from kvbench.results.run_dir import RunDir
from kvbench.analysis.latency import latency_metrics, throughputs
from kvbench.bench.engines.decode import greedy_decode, left_pad
from kvbench.bench.engines.transformers import TransformersEngine
from kvbench.bench.executors.local import LocalExecutor
from kvbench.bench.plans.sweep import run_sweep
from kvbench.bench.trial import TrialSpec, plan_trials
from kvbench.scenario import parse_scenario
from kvbench.workloads import SyntheticSource


class FakeClock:
    """Returns the given readings in order."""

    def __init__(self, readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


def test_ttft_tpot_itl_e2e_definitions():
    lat = latency_metrics(10.0, [10.5, 10.7, 10.95, 11.25])
    assert lat["ttft_s"] == pytest.approx(0.5)
    assert lat["itl_s"] == pytest.approx([0.2, 0.25, 0.3])
    assert lat["e2e_s"] == pytest.approx(1.25)
    assert lat["tpot_s"] == pytest.approx(0.75 / 3)  # (e2e - ttft) / (n - 1)
    assert lat["ntpot_s"] == pytest.approx(1.25 / 4) and "tokens_per_chunk" not in lat  # e2e / n
    one = latency_metrics(2.0, [2.4])
    assert one["tpot_s"] is None and one["itl_s"] == [] and one["e2e_s"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="no token was generated"):
        latency_metrics(0.0, [])


def test_a_streamed_chunk_of_several_tokens_is_one_itl_gap_as_vllm_counts_it():
    # 5 tokens in 3 chunks (1, 3, 1): the gaps are between chunks, none of them 0
    lat = latency_metrics(0.0, [0.5, 0.8, 0.8, 0.8, 1.0], chunk_times=[0.5, 0.8, 1.0])
    assert lat["itl_s"] == pytest.approx([0.3, 0.2]) and lat["tokens_per_chunk"] == pytest.approx(5 / 3)
    assert lat["ttft_s"] == 0.5 and lat["e2e_s"] == 1.0 and lat["tpot_s"] == pytest.approx(0.5 / 4)
    assert latency_metrics(0.0, [0.5, 0.8, 0.8, 0.8, 1.0])["itl_s"] == pytest.approx([0.3, 0, 0, 0.2])


def test_throughputs():
    lat = latency_metrics(0.0, [0.5, 1.0, 1.5, 2.0, 2.5])
    tp = throughputs(prompt_tokens=100, batch_size=4, lat=lat, n_out=5)
    assert tp == pytest.approx({"prefill_tokens_per_s": 800.0, "decode_tokens_per_s": 8.0,
                                "throughput_tokens_per_s": 8.0})
    assert throughputs(10, 1, latency_metrics(0.0, [0.5]), 1)["decode_tokens_per_s"] is None


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_decode_loop_on_a_fake_clock_matches_generate(tiny_model):
    from transformers import DynamicCache

    model = tiny_model.model
    prompts = [[11, 12, 13, 14, 15, 16], [21, 22, 23], [31, 32, 33, 34, 35], [41]]
    ids, mask = left_pad(prompts, pad_id=0)
    clock = FakeClock([1.0, 1.3, 1.4, 1.6, 1.7, 1.9])
    out, t0, times = greedy_decode(model, ids, mask, DynamicCache(config=model.config), 5, clock)
    assert out.shape == (4, 5)
    assert (t0, times) == (1.0, [1.3, 1.4, 1.6, 1.7, 1.9])
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    assert out.tolist() == ref[:, ids.shape[1]:].tolist()
    lat = latency_metrics(t0, times)
    assert lat["ttft_s"] == pytest.approx(0.3) and lat["tpot_s"] == pytest.approx(0.15)


def test_plan_orders_and_names_trials():
    s = parse_scenario(tiny_scenario(modes=[{"kind": "none"}, {"kind": "hf-offloaded"}]))
    plan = plan_trials(s)
    assert len(plan) == 2 * 2 * 2 * 2
    assert [t.trial_id for t in plan[:4]] == ["p8-b1-none-r0", "p8-b1-hf-offloaded-r0", "p8-b1-none-r1",
                                             "p8-b1-hf-offloaded-r1"]
    assert len({t.trial_id for t in plan}) == len(plan)


def make_runner(tiny_model, **over):
    s = parse_scenario(tiny_scenario(**over))
    return s, LocalExecutor(s, TransformersEngine(s, tiny_model,
                                                  SyntheticSource(tiny_model.shape.vocab_size, seed=0, n_prompts=4)))


def test_ok_trial_row_and_kv_bytes_equal_the_prediction(tiny_model):
    s, runner = make_runner(tiny_model)
    row = runner.run(TrialSpec(16, 2, s.modes[0], 0))
    assert row["status"] == "ok", row["message"]
    # tiny-llama: 2 layers × 2 kv heads × head_dim 16 × 4 bytes × 2 (K, V) = 512 B/token; (16 + 3 - 1) tokens × 2
    assert row["kv_bytes_predicted"] == 512 * 18 * 2 == row["kv_device_peak_bytes"]
    assert row["kv_host_peak_bytes"] == 0 and row["kv_stored_peak_bytes"] == row["kv_bytes_predicted"]
    assert row["n_output_tokens"] == 3 and len(row["itl_s"]) == 2
    assert row["tpot_s"] == pytest.approx((row["e2e_s"] - row["ttft_s"]) / 2)
    assert len(row["output_ids_head"]) == 2 and len(row["output_ids_head"][0]) == 3
    assert row["peak_device_allocated_bytes"] is None and "CUDA only" in row["notes"]["peak_device_allocated_bytes"]
    assert row["rss_peak_bytes"] > 0
    # samples carry the cache's bytes as of the last step: none at the start, at least the prompt's 16 tokens
    # once decoding (the mark only asks the thread for a sample: it may come a step or two later), every token at
    # the end
    samples = runner.last_samples
    assert (samples[0]["phase"], samples[0]["kv_device_bytes"]) == ("prefill", 0)
    assert 512 * 16 * 2 <= next(x["kv_device_bytes"] for x in samples if x["phase"] == "decode") <= 512 * 18 * 2
    assert (samples[-1]["kv_device_bytes"], samples[-1]["kv_host_bytes"]) == (512 * 18 * 2, 0)
    assert 0 <= row["sampler_cpu_s"] < row["e2e_s"] + 1  # the thread ran (interval 50 ms): its CPU seconds
    again = runner.run(TrialSpec(16, 2, s.modes[0], 0))
    assert again["output_sha256"] == row["output_sha256"]  # same prompts, same greedy ids
    assert runner.run(TrialSpec(16, 2, s.modes[0], 1))["prompt_sha256"] != row["prompt_sha256"]


def test_budget_hf_offloaded_on_cpu_and_failures_are_recorded(tiny_model):
    s, runner = make_runner(tiny_model, budget=10_000, modes=[{"kind": "none"}, {"kind": "hf-offloaded"},
                                                              {"kind": "full"}])
    over = runner.run(TrialSpec(16, 2, s.modes[0], 0))
    assert over["status"] == "over_budget"
    assert over["message"] == "device KV peak 18432 bytes > budget 10000 bytes"
    assert over["output_sha256"]  # measured anyway: it is the reference for tokens_match
    fits = runner.run(TrialSpec(16, 2, s.modes[2], 0))
    # full: one layer's K and V for 18 tokens × batch 2 at most = 9216 bytes
    assert (fits["status"], fits["kv_device_peak_bytes"], fits["tokens_match"]) == ("ok", 9216, True)
    skipped = runner.run(TrialSpec(8, 1, s.modes[1], 0))
    assert skipped["status"] == "skipped"
    assert skipped["message"].endswith("raises AssertionError: Torch not compiled with CUDA enabled")

    class Failing:
        def batch(self, n, b, r):
            if n == 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            raise ValueError("broken source")

    runner.engine.source = Failing()
    oom = runner.run(TrialSpec(8, 1, s.modes[0], 0))
    assert (oom["status"], oom["message"]) == ("oom", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    err = runner.run(TrialSpec(16, 1, s.modes[0], 0))
    assert (err["status"], err["message"]) == ("error", "ValueError: broken source")


def test_offload_modes_keep_device_kv_within_the_budget(tiny_model, tmp_path):
    modes = [{"kind": "none"}, {"kind": "full"}, {"kind": "hierarchical", "window": 4},
             {"kind": "dynamic", "min_window": 0}, {"kind": "full", "host_max_tokens": 16}]
    s, runner = make_runner(tiny_model, budget=14_000, modes=modes, disk_dir=str(tmp_path))
    rows = [runner.run(TrialSpec(16, 2, m, 0)) for m in s.modes]
    assert rows[0]["status"] == "over_budget" and rows[0]["kv_device_peak_bytes"] == 18432
    for row in rows[1:]:
        assert row["status"] == "ok", row["message"]
        assert row["kv_device_peak_bytes"] <= 14_000 and row["tokens_match"] is True
        # every tier together, each token once: exactly the analytic prediction
        assert row["kv_stored_peak_bytes"] == row["kv_bytes_predicted"] == 18432
    # hierarchical(4): 2 layers × 4 tokens × batch 2 × 256 B + one layer's K/V for 18 tokens × batch 2 in attention
    assert rows[2]["kv_device_peak_bytes"] == 2 * 4 * 2 * 256 + 18 * 2 * 256
    dynamic = rows[3]
    assert dynamic["window_events"][0] == {
        "step": 1, "old": 0, "new": dynamic["window_events"][0]["new"],
        "reason": "compute waited for transfers and the budget has room"}
    assert dynamic["window_final"] == dynamic["window_events"][-1]["new"]
    disk = rows[4]
    # 18 tokens cached per layer, host cap 16: one block of 16 on disk (K and V, 2 layers, batch 2, 128 B)
    assert disk["kv_disk_peak_bytes"] == 2 * 2 * 16 * 2 * 128 == disk["disk_write_bytes"]
    assert disk["disk_read_bytes"] > 0 and disk["kv_host_peak_bytes"] > 0
    assert list(tmp_path.iterdir()) == []  # the disk tier is removed after the trial


def test_host_tier_that_cannot_fit_is_refused_before_the_trial(tiny_model, monkeypatch):
    s, runner = make_runner(tiny_model, modes=[{"kind": "full"}, {"kind": "hierarchical", "window": 100}])
    # the host tier of 18 tokens grows to one 256-token capacity: 256 × 512 B × batch 2
    assert runner.engine.predict.host_tier_bytes(TrialSpec(16, 2, s.modes[0], 0)) == 262_144
    assert runner.engine.predict.host_tier_bytes(TrialSpec(16, 2, s.modes[1], 0)) == 0  # all 18 tokens fit the window
    monkeypatch.setattr("kvbench.bench.engines.transformers.host_memory_available",
                        lambda: (100_000, "container memory limit (test)"))
    row = runner.run(TrialSpec(16, 2, s.modes[0], 0))
    assert row["status"] == "skipped"
    assert row["message"] == ("refused before the trial: the host tier needs up to 262144 bytes (0.00 GiB) but "
                              "100000 bytes (0.00 GiB) are left (container memory limit (test))")
    assert runner.run(TrialSpec(16, 2, s.modes[1], 0))["status"] == "ok"


@pytest.mark.e2e
def test_sweep_writes_every_trial_and_ctrl_c_keeps_finished_ones(tiny_model, tmp_path):
    s, runner = make_runner(tiny_model)
    run = RunDir.create(tmp_path, s.model_dump(mode="json"), {"test": True})
    real_run = runner.run
    calls = {"n": 0}

    def interrupting(t):
        calls["n"] += 1
        if calls["n"] == 6:  # 2 warm-ups + 3 recorded trials done, then Ctrl-C
            raise KeyboardInterrupt
        return real_run(t)

    runner.run = interrupting
    res = run_sweep(s, run, runner)
    assert res.interrupted and res.written == 3
    assert json.loads((run.path / "run.json").read_text())["status"] == "interrupted"
    first = read_trials(run.trials_path)
    assert [r["trial_id"] for r in first] == ["p8-b1-none-r0", "p8-b1-none-r1", "p8-b2-none-r0"]

    runner.run = real_run
    res = run_sweep(s, RunDir.open(run.path), runner)
    rows = read_trials(run.trials_path)
    assert not res.interrupted and res.written == 5 and res.skipped_done == 3
    assert rows[:3] == first
    assert sorted(r["trial_id"] for r in rows) == sorted(t.trial_id for t in plan_trials(s))
    assert json.loads((run.path / "run.json").read_text())["status"] == "complete"


def test_reading_trials_never_cuts_and_the_lock_cuts_what_a_killed_writer_left(tmp_path):
    """Issue 17 item 6: reading a run's trials cut a partial last line even when another process was writing it
    (a refused second --resume cost the writer's trial 5 samples rows). Now only :meth:`RunDir.lock` cuts, as it
    takes the lock: a partial last line of either file, and the samples of a trial whose row was never written
    (samples go first, the row commits them: item 7)."""
    run = RunDir.create(tmp_path, tiny_scenario(), {})  # RunDir.open checks run.json and the rows
    kept = "p8-b1-full(window=4,host_max_tokens=16)-r0"  # a comma inside: a quoted csv cell
    row = {"trial_id": kept, "status": "ok", "mode": "full", "prompt_tokens": 8, "batch_size": 1}
    run.append(row)
    run.append_samples([{"trial_id": kept, "phase": "prefill", "t_s": 0.0}, {"trial_id": kept, "phase": "decode"}])
    whole_samples = run.samples_path.read_bytes()
    run.append_samples([{"trial_id": "b", "phase": "prefill", "t_s": 0.0}])  # b's samples, then killed: no row
    with run.samples_path.open("a") as f:
        f.write("b,deco")
    with run.trials_path.open("a") as f:
        f.write('{"trial_id": "b", "stat')
    trials, samples = run.trials_path.read_bytes(), run.samples_path.read_bytes()
    with pytest.warns(UserWarning, match=r"trials.jsonl:2: not valid JSON \(cut off: a run killed mid-write\?\): "
                                         r".*; skipped"):
        assert RunDir.open(run.path).finished_trials() == [row]
    assert (run.trials_path.read_bytes(), run.samples_path.read_bytes()) == (trials, samples)  # nothing cut
    with pytest.warns(UserWarning, match=r"dropped an incomplete last line \(23 bytes\)"):
        with RunDir.open(run.path).lock():
            pass
    assert run.trials_path.read_text() == json.dumps(row) + "\n"
    assert run.samples_path.read_bytes() == whole_samples
    assert len(whole_samples.splitlines()) == 3  # the header and both samples of the kept trial


def test_a_trial_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """Issue 17 item 7: a full disk cut the last trial's samples (119 of 124 rows kept, no notice). Now samples are
    one write cut back when it fails, and a row that cannot be written takes its samples back out."""
    import errno
    import os

    run = RunDir.create(tmp_path, {"name": "x", "max_new_tokens": 3}, {})
    sample = {"trial_id": "a", "phase": "decode", "t_s": 0.5}
    run.append({"trial_id": "a"})
    run.append_samples([sample] * 3)
    trials, samples = run.trials_path.read_bytes(), run.samples_path.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):  # writes half of what it is given, then the disk is full
        if os.readlink(f"/proc/self/fd/{fd}").endswith("samples.csv"):
            if len(data) > 1:
                return real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left on device"):
        run.append_samples([{**sample, "trial_id": "b"}] * 40)
    assert run.samples_path.read_bytes() == samples
    with pytest.raises(OSError, match="No space left on device"):
        run.record_trial({"trial_id": "b"}, [{**sample, "trial_id": "b"}] * 40)
    assert (run.trials_path.read_bytes(), run.samples_path.read_bytes()) == (trials, samples)
    monkeypatch.undo()

    real_fsync = os.fsync

    def full_for_trials(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("trials.jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_for_trials)
    with pytest.raises(OSError, match="No space left on device"):
        run.record_trial({"trial_id": "c"}, [{**sample, "trial_id": "c"}] * 40)
    assert (run.trials_path.read_bytes(), run.samples_path.read_bytes()) == (trials, samples)


def test_a_full_disk_stops_the_sweep_and_marks_run_json_with_the_reason(tiny_model, tmp_path, monkeypatch):
    """Issue 17 item 7: run.json stayed ``running`` after a full disk stopped the run. Now it says ``interrupted``
    with the reason, or the error says it could not."""
    import errno

    from kvbench.results.files import ResultsNotWritten

    s, runner = make_runner(tiny_model, prompt_tokens=[8], batch_sizes=[1], repeats=3, warmup=0)
    run = RunDir.create(tmp_path, s.model_dump(mode="json"), {})
    real, calls = RunDir.append, []

    def append(self, row):
        calls.append(row["trial_id"])
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, row)

    monkeypatch.setattr(RunDir, "append", append)
    with pytest.raises(ResultsNotWritten) as caught:
        run_sweep(s, run, runner)
    assert (caught.value.trial_id, caught.value.status_error) == ("p8-b1-none-r1", None)
    assert str(caught.value) == (f"cannot write the results in {run.path}: No space left on device; trial "
                                 "p8-b1-none-r1 was measured but not kept (neither its row nor its samples); "
                                 "run.json says interrupted (disk full: No space left on device)")
    meta = json.loads((run.path / "run.json").read_text())
    assert (meta["status"], meta["reason"]) == ("interrupted", "disk full: No space left on device")
    assert [r["trial_id"] for r in read_trials(run.trials_path)] == ["p8-b1-none-r0"]

    def no_update(self, **fields):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunDir, "update", no_update)
    calls.clear()
    with pytest.raises(ResultsNotWritten) as caught:
        run_sweep(s, RunDir.open(run.path), runner)
    assert (caught.value.trial_id, caught.value.status_error) == ("p8-b1-none-r2", "No space left on device")
    assert str(caught.value).endswith("run.json could not be marked interrupted either (No space left on device): "
                                      "it still says running")
    monkeypatch.undo()
    assert run_sweep(s, RunDir.open(run.path), runner).written == 1  # made room: the rest runs
    assert [r["trial_id"] for r in read_trials(run.trials_path)] == [f"p8-b1-none-r{i}" for i in range(3)]
    meta = json.loads((run.path / "run.json").read_text())
    assert meta["status"] == "complete" and "reason" not in meta


def test_rows_carry_the_scenario_digest_and_foreign_rows_are_refused(tiny_model, tmp_path):
    """Issue 17 item 8: rows of another scenario (another name, another max_new_tokens) under a run's run.json were
    taken as its finished trials. Rows now carry ``scenario_digest``; reading them refuses another scenario's."""
    from kvbench.results.identity import ForeignRow, scenario_digest

    s, runner = make_runner(tiny_model, prompt_tokens=[8], batch_sizes=[1], repeats=1, warmup=0)
    run = RunDir.create(tmp_path, s.model_dump(mode="json"), {})
    run_sweep(s, run, runner)
    row = read_trials(run.trials_path)[0]
    digest = scenario_digest(s.model_dump(mode="json"))
    assert (row["scenario"], row["scenario_digest"], len(digest)) == ("tiny", digest, 16)
    assert scenario_digest({**s.model_dump(mode="json"), "repeats": 9, "description": "d"}) == digest
    assert scenario_digest({**s.model_dump(mode="json"), "seed": 1}) != digest
    legacy = {k: v for k, v in row.items() if k != "scenario_digest"}  # an older kvbench's row: same scenario
    run.append({**legacy, "trial_id": "legacy"})
    assert len(RunDir.open(run.path).finished_trials()) == 2
    for foreign, why in (
            ({**row, "scenario": "other"}, "scenario 'other' (run.json: 'tiny')"),
            ({**legacy, "max_new_tokens": 5}, "max_new_tokens 5 (run.json: 3)"),
            ({**row, "scenario_digest": "0" * 16}, f"scenario_digest '{'0' * 16}' (run.json's scenario: '{digest}')")):
        lines = run.trials_path.read_text()
        run.append(foreign)
        with pytest.raises(ForeignRow) as caught:
            RunDir.open(run.path).finished_trials()
        assert str(caught.value) == (f"{run.trials_path}:3: trial 'p8-b1-none-r0' was written under another "
                                     f"scenario: {why}; a run keeps only rows of its own scenario: move that line "
                                     "out, or run the other scenario in a new run")
        run.trials_path.write_text(lines)


def test_open_refuses_other_schema_versions(tmp_path):
    run = RunDir.create(tmp_path, {"name": "x"}, {})
    run.update(schema_version=99)
    with pytest.raises(ValueError, match=r"run.json: schema_version 99; this kvbench reads 1"):
        RunDir.open(run.path)
    with pytest.raises(ValueError, match=r"no run.json here"):
        RunDir.open(tmp_path)


def test_summary_keeps_over_budget_measurements_and_counts_only_ok():
    from kvbench.analysis.points import point_table
    from kvbench.results.frame import trials_frame

    base = {"trial_id": "t", "mode": "none", "prompt_tokens": 8, "batch_size": 1, "mode_label": "none",
            "message": "", "tokens_match": True, "tpot_s": 0.1, "ttft_s": 0.5, "decode_tokens_per_s": 10.0,
            "kv_device_peak_bytes": 100, "rss_peak_bytes": 1000}
    rows = [{**base, "status": "over_budget", "message": "device KV peak 100 bytes > budget 50 bytes"},
            {**base, "status": "over_budget", "tpot_s": 0.3}, {**base, "status": "error", "tpot_s": None}]
    r = point_table(trials_frame(rows, "x")).to_dict("records")[0]
    assert (r["trials"], r["n_ok"], r["measured"], r["status"]) == (3, 0, 2, "over_budget")
    assert r["message"] == "device KV peak 100 bytes > budget 50 bytes"
    assert (r["tpot_s_median"], r["tpot_s_min"], r["tpot_s_max"]) == pytest.approx((0.2, 0.1, 0.3))


def test_kv_prediction_and_host_tier_of_sliding_window_models_past_the_window(sliding_models, monkeypatch):
    """conftest.SLIDING_CONFIGS (window 8, 256 B per token and layer): trials of 16 prompt tokens + 3 new, batch 2,
    so 18 tokens cached per layer, past the window: a sliding layer holds the last 7."""
    modes = [{"kind": "none"}, {"kind": "full"}, {"kind": "hierarchical", "window": 4}]
    s = parse_scenario(tiny_scenario(modes=modes))
    mistral, gemma = (LocalExecutor(s, TransformersEngine(s, m, SyntheticSource(256, seed=0, n_prompts=4)))
                      for m in (sliding_models["mistral"], sliding_models["gemma2"]))
    # mistral: 2 sliding layers × 7 tokens × 256 B × batch 2 = 7,168 (not 2 × 18 × 256 × 2 = 18,432)
    # gemma2: that + 2 full layers × 18 tokens × 256 B × batch 2 = 7,168 + 18,432 = 25,600
    for runner, predicted in ((mistral, 7_168), (gemma, 25_600)):
        for m in s.modes:
            row = runner.run(TrialSpec(16, 2, m, 0))
            assert row["status"] == "ok", row["message"]
            assert row["kv_bytes_predicted"] == predicted == row["kv_stored_peak_bytes"]
            assert row["tokens_match"] is True
    # host tier: full-attention layers only; 18 tokens (14 past a window of 4) grow to one 256-token capacity
    assert mistral.engine.predict.host_tier_bytes(TrialSpec(16, 2, s.modes[1], 0)) == 0  # no layer leaves the device
    assert gemma.engine.predict.host_tier_bytes(TrialSpec(16, 2, s.modes[1], 0)) == 256 * 2 * 256 * 2 == 262_144
    assert gemma.engine.predict.host_tier_bytes(TrialSpec(16, 2, s.modes[2], 0)) == 262_144
    # 300 + 3 - 1 = 302 tokens → a 512-token capacity × 2 full layers × 256 B × batch 1
    assert gemma.engine.predict.host_tier_bytes(TrialSpec(300, 1, s.modes[1], 0)) == 512 * 2 * 256 == 262_144
    # a host with almost no memory left refuses gemma's host tier, never mistral's (it has none)
    monkeypatch.setattr("kvbench.bench.engines.transformers.host_memory_available",
                        lambda: (1_000, "container memory limit (test)"))
    assert mistral.run(TrialSpec(16, 2, s.modes[1], 0))["status"] == "ok"
    assert gemma.run(TrialSpec(16, 2, s.modes[1], 0))["status"] == "skipped"
    # the reuse store keeps every layer's whole sequence: 4 layers × 256 B
    assert gemma.engine.store_token_bytes == 4 * 256


def test_disk_fields_say_whether_the_disk_tier_was_synced_and_dropped(tiny_model, tmp_path):
    modes = [{"kind": "none"}, {"kind": "full", "host_max_tokens": 16}, {"kind": "full"}]
    s, runner = make_runner(tiny_model, modes=modes, disk_dir=str(tmp_path))
    assert s.disk.page_cache is False
    keys = ("disk_synced", "disk_page_cache_dropped", "disk_synced_bytes")
    rows = [runner.run(TrialSpec(16, 2, m, 0)) for m in s.modes]
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    assert [rows[0][k] for k in keys] == [None, None, None]  # no disk tier: nothing to say
    assert [rows[2][k] for k in keys] == [None, None, None]
    disk = rows[1]
    # one block of 16 tokens per layer went to disk (K and V, 2 layers, batch 2, 128 B): all of it synced
    assert [disk[k] for k in keys] == [True, True, 2 * 2 * 16 * 2 * 128] and disk["tokens_match"] is True
    assert disk["disk_synced_bytes"] == disk["disk_write_bytes"] and "disk_page_cache_dropped" not in disk["notes"]

    s, runner = make_runner(tiny_model, modes=modes[1:2], disk_dir=str(tmp_path), disk={"page_cache": True})
    row = runner.run(TrialSpec(16, 2, s.modes[0], 0))
    assert row["status"] == "ok" and row["disk_write_bytes"] == 2 * 2 * 16 * 2 * 128
    assert [row[k] for k in keys] == [False, False, 0]
    assert row["notes"]["disk_page_cache_dropped"].startswith("scenario disk.page_cache: true: writes are not synced")
    assert list(tmp_path.iterdir()) == []


class _OrderRunner:
    """A fake executor that logs every release and run: ``("release",)``, ``("run", trial_id)``."""

    def __init__(self, status=lambda t: "ok"):
        self.log, self.status, self.last_samples = [], status, []

    def remember(self, rows):
        pass

    def release(self):
        self.log.append(("release",))

    def run(self, t):
        self.log.append(("run", t.trial_id))
        return {"trial_id": t.trial_id, "status": self.status(t)}


class _LogRun:
    """A fake RunDir: logs ``("write", trial_id)`` for each recorded row."""

    def __init__(self, log):
        self.log = log

    def finished_trials(self):
        return []

    def record_trial(self, row, samples):
        self.log.append(("write", row["trial_id"]))


def test_device_memory_is_released_once_per_shape_before_its_warmup():
    from kvbench.bench.plans.sweep import Recorder

    s = parse_scenario(tiny_scenario(prompt_tokens=[8, 16], batch_sizes=[1], repeats=2, warmup=2,
                                     modes=[{"kind": "none"}, {"kind": "full"}]))
    fake = _OrderRunner()
    record = Recorder(s, _LogRun(fake.log), fake)
    for t in plan_trials(s):
        record(t)

    def shape(n, mode):  # release, two warm-ups (repeat 0's id), then the first recorded trial
        first = f"p{n}-b1-{mode}-r0"
        return [("release",), ("run", first), ("run", first), ("run", first), ("write", first)]

    def again(n, mode):
        return [("run", f"p{n}-b1-{mode}-r1"), ("write", f"p{n}-b1-{mode}-r1")]

    assert fake.log == (shape(8, "none") + shape(8, "full") + again(8, "none") + again(8, "full")
                        + shape(16, "none") + shape(16, "full") + again(16, "none") + again(16, "full"))


def test_capacity_search_releases_before_each_new_shape_only():
    from kvbench.bench.plans.capacity import search_sweep
    from kvbench.bench.plans.sweep import Recorder

    s = parse_scenario(tiny_scenario(prompt_tokens=[8], batch_sizes="auto", repeats=2, warmup=1, budget="1MiB",
                                     modes=[{"kind": "none"}, {"kind": "full"}], capacity={"max": 8}))
    fake = _OrderRunner(lambda t: "ok" if t.batch_size <= 3 else "oom")
    search_sweep(s, Recorder(s, _LogRun(fake.log), fake), TrialSpec, 1000)
    def shape(trial_id):
        return trial_id.rsplit("-r", 1)[0]

    seen, last = set(), None
    for i, event in enumerate(fake.log):
        if event[0] == "release":
            # a release is followed by the warm-up of a shape never run before, its recorded trial, its row
            first = fake.log[i + 1][1]
            assert shape(first) not in seen and first.endswith("-r0")
            assert fake.log[i + 1 : i + 4] == [("run", first), ("run", first), ("write", first)]
        elif event[0] == "run" and shape(event[1]) not in seen:
            assert last == ("release",)  # the first run of a shape (its warm-up) comes right after a release
            seen.add(shape(event[1]))
        last = event
    writes = [e[1] for e in fake.log if e[0] == "write"]
    assert fake.log.count(("release",)) == len(seen) == len({shape(w) for w in writes})  # once per shape
    assert "p8-b3-full-r1" in writes and "p8-b4-full-r0" in writes  # found capacity 3, its repeats ran


def test_trials_do_not_release_device_memory_and_release_empties_the_cuda_cache(tiny_model, monkeypatch):
    from kvbench.bench.engines import decode as decode_module
    from kvbench.bench.engines import transformers as engine_module

    calls = []
    monkeypatch.setattr(engine_module, "release_device_memory", lambda dev: calls.append(str(dev)))
    s, runner = make_runner(tiny_model)
    assert runner.run(TrialSpec(8, 1, s.modes[0], 0))["status"] == "ok"
    assert calls == []  # nothing between a warm-up and the trial after it
    runner.release()
    assert calls == ["cpu"]
    monkeypatch.undo()
    emptied, collected = [], []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(decode_module.gc, "collect", lambda: collected.append(True))
    decode_module.release_device_memory(torch.device("cpu"))
    assert (emptied, collected) == ([], [True])
    decode_module.release_device_memory(torch.device("cuda"))
    assert (emptied, collected) == ([True], [True, True])


def test_run_dir_writes_refuse_a_symlink_made_after_it_was_opened(tmp_path):
    from kvbench.results.run_dir import RunDir, SymlinkRefused

    run = RunDir.create(tmp_path / "res", {"name": "x"}, {})
    target = tmp_path / "precious.txt"
    target.write_text("keep me\npartial")
    for name, write in (("trials.jsonl", lambda: run.append({"trial_id": "t"})),
                        ("samples.csv", lambda: run.append_samples([{"trial_id": "t", "phase": "decode"}])),
                        (".lock", lambda: run.lock().__enter__())):
        (run.path / name).unlink(missing_ok=True)
        (run.path / name).symlink_to(target)
        with pytest.raises(SymlinkRefused, match=rf"{name} is a symbolic link"):
            write()
        (run.path / name).unlink()
    assert target.read_text() == "keep me\npartial"


def _row(trial_id: str) -> dict:
    return {"trial_id": trial_id, "status": "ok", "mode": "none", "prompt_tokens": 8, "batch_size": 1}


def test_the_lock_cuts_reading_only_the_end_of_the_files(tmp_path, monkeypatch):
    """From the second re-attack: taking the lock read trials.jsonl and samples.csv whole (a 20 GB sparse
    trials.jsonl took 21 GB of memory, and was then cut to 0 bytes). Only the last CUT_WINDOW_BYTES are read now,
    with the same cuts as a whole read, and a last line longer than any row is refused, not cut."""
    import os

    import kvbench.results.run_dir as results

    run = RunDir.create(tmp_path, tiny_scenario(), {})
    for i in range(30):
        run.record_trial(_row(f"t{i}"), [{"trial_id": f"t{i}", "phase": "decode", "t_s": 0.01 * j} for j in range(3)])
    whole_trials, whole_samples = run.trials_path.read_bytes(), run.samples_path.read_bytes()
    run.append_samples([{"trial_id": "t30", "phase": "decode", "t_s": 0.5}] * 4)  # killed before its row
    with run.samples_path.open("a") as f:
        f.write("t30,deco")
    with run.trials_path.open("a") as f:
        f.write('{"trial_id": "t30", "st')
    monkeypatch.setattr(results, "CUT_WINDOW_BYTES", 200)  # a few lines of each file
    with pytest.warns(UserWarning, match="dropped an incomplete last line"):
        with RunDir.open(run.path).lock():
            pass
    assert run.trials_path.read_bytes() == whole_trials and run.samples_path.read_bytes() == whole_samples
    # a killed trial's samples larger than the window (the third re-attack: every committed sample was cut)
    run.append_samples([{"trial_id": "t30", "phase": "decode", "t_s": 0.5}] * 100)
    with RunDir.open(run.path).lock():
        pass
    assert run.samples_path.read_bytes() == whole_samples
    monkeypatch.undo()

    with open(run.trials_path, "ab") as f:  # a last "line" of 40 MiB without a line end (sparse)
        f.truncate(len(whole_trials) + (40 << 20))
    with pytest.raises(results.RunDirError, match=r"trials.jsonl: its last line, 41,943,040 bytes without a line "
                                                  r"end, is longer than kvbench writes: .*nothing was cut"):
        with run.lock():
            pass
    assert os.path.getsize(run.trials_path) == len(whole_trials) + (40 << 20)


@pytest.mark.parametrize("name", [".lock", "samples.csv", "trials.jsonl"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_the_lock_refuses_a_fifo_or_a_directory_in_place_of_its_files(tmp_path, name, kind):
    """From the second re-attack: a FIFO as .lock hung `run --resume`; a directory there, or a FIFO or directory as
    samples.csv, gave tracebacks."""
    import os

    from kvbench.results.run_dir import NotRegular

    run = RunDir.create(tmp_path, tiny_scenario(), {})
    run.record_trial(_row("a"), [{"trial_id": "a", "phase": "decode", "t_s": 0.0}])
    (run.path / name).unlink(missing_ok=True)
    os.mkfifo(run.path / name) if kind == "fifo" else (run.path / name).mkdir()
    with pytest.raises(NotRegular, match=f"{run.path / name}: not a regular file"):
        with run.lock():
            pass
