"""`kvbench run` end to end: the smoke scenario on the real model, and --resume after a killed run."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import ROOT, kvbench_cmd, tiny_scenario
from kvbench.cli import app
from kvbench.results.read import read_trials
from kvbench.results.samples import SAMPLE_COLUMNS


def the_run_dir(root: Path) -> Path:
    dirs = [p for p in root.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.mark.model
@pytest.mark.e2e
def test_smoke_scenario_on_the_real_model(tmp_path):
    r = subprocess.run([*kvbench_cmd(), "run", str(ROOT / "scenarios" / "smoke.yaml"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    run = the_run_dir(tmp_path)
    assert run.name.startswith("smoke-")
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "complete" and meta["schema_version"] == 1
    assert meta["scenario"]["model"]["name"] == "smollm2-135m"
    env = meta["environment"]
    assert env["torch"] and env["transformers"].startswith("5.") and env["python"].startswith("3.")
    rows = read_trials(run / "trials.jsonl")
    assert len(rows) == 48 and len({r["trial_id"] for r in rows}) == 48
    ok = [r for r in rows if r["mode"] == "none"]
    assert len(ok) == 8 and all(r["status"] == "ok" and r["tokens_match"] for r in ok)
    for row in ok:
        assert row["n_output_tokens"] == 4 and len(row["itl_s"]) == 3
        assert row["ttft_s"] > 0 and row["tpot_s"] > 0 and row["decode_tokens_per_s"] > 0
        # SmolLM2: 30 layers × 3 kv heads × 64 × 4 bytes (float32) × 2 = 46,080 B per token
        assert row["kv_device_peak_bytes"] == 46_080 * (row["prompt_tokens"] + 3) * row["batch_size"]
        assert row["peak_device_allocated_bytes"] is None
    # the same prompts give the same greedy ids in both repeats of a point only if prompts repeat; here they rotate
    same_point = [r for r in ok if r["prompt_tokens"] == 32 and r["batch_size"] == 1]
    assert same_point[0]["prompt_sha256"] != same_point[1]["prompt_sha256"]
    skipped = [r for r in rows if r["mode"] == "hf-offloaded"]
    assert len(skipped) == 8 and {r["status"] for r in skipped} == {"skipped"}
    for mode in ("full", "hierarchical(window=16)", "hierarchical(window=16,host_max_tokens=16)",
                 "dynamic(min_window=16,max_window=48)"):
        offloaded = [r for r in rows if r["mode_label"] == mode]
        assert len(offloaded) == 8 and all(r["status"] == "ok" and r["tokens_match"] is True for r in offloaded)
        base = {r["prompt_sha256"]: r["output_sha256"] for r in ok}
        assert all(base[r["prompt_sha256"]] == r["output_sha256"] for r in offloaded)
        assert all(r["d2h_bytes"] > 0 and r["kv_host_peak_bytes"] > 0 for r in offloaded)
    assert "smoke: smollm2-135m on cpu" in r.stdout
    assert "hf-offloaded: skipped (8 trials): hf-offloaded needs a CUDA device" in r.stdout
    disk = [r for r in rows if r["mode_label"] == "hierarchical(window=16,host_max_tokens=16)"]
    # 64 + 3 cached tokens, 16 on the device, the host tier capped at 16: 48 on disk (3 blocks of 16) × 46,080 B
    assert all(r["kv_disk_peak_bytes"] == 48 * 46_080 * r["batch_size"] for r in disk if r["prompt_tokens"] == 64)
    dynamic = [r for r in rows if r["mode"] == "dynamic"]
    assert all(r["window_events"][0]["new"] == 48 and r["window_final"] == 48 for r in dynamic)
    assert "modes[5].min_window: 16 tokens is under 256" in r.stderr
    assert "48 trials written to" in r.stdout
    samples = pd.read_csv(run / "samples.csv")
    assert list(samples.columns) == list(SAMPLE_COLUMNS)
    sampled = {row["trial_id"] for row in rows if row["status"] == "ok"}
    assert set(samples["trial_id"]) == sampled and len(sampled) == 40  # the 8 skipped trials never ran
    assert set(samples["phase"]) == {"prefill", "decode"} and (samples["rss_bytes"] > 0).all()
    assert samples["gpu_used_bytes"].isna().all()  # no GPU: empty cells, not 0
    per_trial = samples.groupby("trial_id").size()
    assert all(per_trial[row["trial_id"]] == row["n_samples"] for row in rows if row["status"] == "ok")
    for row in (r for r in rows if r["status"] == "ok"):  # the kernel's peak also sees spikes between samples
        sampled = samples[samples.trial_id == row["trial_id"]].rss_bytes.max()
        assert (row["rss_peak_bytes"] >= sampled if row["rss_peak_source"] == "kernel VmHWM"
                else row["rss_peak_bytes"] == sampled and row["rss_peak_source"] == "sampled every 50 ms")
    # the cache's KV per tier is sampled too: the last sample holds every token the trial cached
    last = samples.groupby("trial_id").last()
    for row in (r for r in rows if r["status"] == "ok"):
        tiers = last.loc[row["trial_id"], ["kv_device_bytes", "kv_host_bytes", "kv_disk_bytes"]].sum()
        assert row["kv_stored_peak_bytes"] == row["kv_bytes_predicted"] and tiers >= row["kv_bytes_predicted"]


def test_bad_scenario_exits_with_the_error(write_yaml, tmp_path):
    bad = write_yaml(tiny_scenario(repeats=0))
    r = CliRunner().invoke(app, ["run", str(bad), "--out", str(tmp_path / "res")])
    assert r.exit_code == 2
    assert f"{bad}: repeats: Input should be greater than 0 (got 0)" in r.stderr
    assert not (tmp_path / "res").exists()


@pytest.mark.e2e
def test_prompts_shorter_than_the_chat_template_are_refused_before_any_trial(write_yaml, tmp_path):
    (tmp_path / "doc.txt").write_text("A long enough document about the weather and the sea. " * 40)
    scenario = write_yaml(tiny_scenario(model={"preset": "tiny-llama", "weights": "random",
                                               "tokenizer": "smollm2-135m"},
                                        workload={"source": "files", "files": "*.txt", "n_prompts": 2},
                                        prompt_tokens=[16, 64], batch_sizes=[1]))
    r = subprocess.run([*kvbench_cmd(), "run", str(scenario), "--out", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert ("prompt_tokens 16, batch 1: workload files '" + str(tmp_path) + "/*.txt': the chat template alone takes 30 tokens around a user "
            "turn; prompt lengths must be above 30 (got 16)") in r.stderr
    assert not any((tmp_path / "res").iterdir())  # no empty run left behind


def test_a_second_writer_on_the_same_run_is_refused(tmp_path):
    from kvbench.results.run_dir import RunDir, RunDirError

    run = RunDir.create(tmp_path, tiny_scenario(), {})  # RunDir.open checks run.json's scenario
    with run.lock():
        with pytest.raises(RunDirError, match="another kvbench run is writing to this directory"):
            with RunDir.open(run.path).lock():
                pass


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.02)
    raise AssertionError(f"{path} never reached {n} lines")


@pytest.mark.e2e
def test_resume_after_kill_and_ctrl_c_loses_and_repeats_nothing(write_yaml, tmp_path):
    scenario = write_yaml(tiny_scenario(prompt_tokens=[64, 256, 512], max_new_tokens=60, batch_sizes=[1, 2],
                                        repeats=3, warmup=0))
    out = tmp_path / "res"
    expected = 3 * 2 * 3

    proc = subprocess.Popen([*kvbench_cmd(), "run", str(scenario), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not out.exists() or not any(out.iterdir()):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        run = the_run_dir(out)
        wait_for_lines(run / "trials.jsonl", 2, proc)
        proc.kill()  # SIGKILL: no chance to clean up
    finally:
        proc.wait()
    before_kill = read_trials(run / "trials.jsonl")
    assert 2 <= len(before_kill) < expected
    assert json.loads((run / "run.json").read_text())["status"] == "running"

    proc = subprocess.Popen([*kvbench_cmd(), "run", "--resume", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_lines(run / "trials.jsonl", len(before_kill) + 2, proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert f"continue with: kvbench run --resume {run}" in stderr
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    after_int = read_trials(run / "trials.jsonl")
    assert after_int[: len(before_kill)] == before_kill and len(after_int) < expected

    r = subprocess.run([*kvbench_cmd(), "run", "--resume", str(run)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = read_trials(run / "trials.jsonl")
    ids = [row["trial_id"] for row in rows]
    assert len(ids) == expected and len(set(ids)) == expected
    assert rows[: len(after_int)] == after_int
    assert all(row["status"] == "ok" for row in rows)
    assert f"({len(after_int)} already there)" in r.stdout
    assert json.loads((run / "run.json").read_text())["status"] == "complete"

    r = subprocess.run([*kvbench_cmd(), "run", "--resume", str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "nothing to run: every trial of tiny is already in" in r.stdout
    assert "model tiny-llama" not in r.stderr  # no model load for a finished run
    assert read_trials(run / "trials.jsonl") == rows
    r = subprocess.run([*kvbench_cmd(), "run", "--resume", str(run), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--out does not apply with --resume: the run stays in {run}" in r.stderr


@pytest.mark.e2e
def test_disk_tier_faults_and_interrupts_leave_no_files(write_yaml, tmp_path):
    kv = tmp_path / "kv"
    kv.mkdir()
    modes = [{"kind": "none"}, {"kind": "hierarchical", "window": 8, "host_max_tokens": 16}]
    # a file size cap stands in for a full disk: the disk tier's files (128 KiB at 512 tokens × batch 2) hit it,
    # trials.jsonl (a few KiB) does not
    scenario = write_yaml(tiny_scenario(prompt_tokens=[512], batch_sizes=[2], modes=modes, repeats=2, warmup=0,
                                        disk_dir="kv"))

    def cap_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    r = subprocess.run([*kvbench_cmd(), "run", str(scenario), "--out", str(tmp_path / "res")], capture_output=True,
                       text=True, timeout=300, preexec_fn=cap_file_size)
    assert r.returncode == 1, r.stderr  # trials failed with status error, the sweep went on
    rows = read_trials(the_run_dir(tmp_path / "res") / "trials.jsonl")
    assert [(row["mode"], row["status"]) for row in rows] == [("none", "ok"), ("hierarchical", "error")] * 2
    assert "DiskTierError: disk tier: cannot grow" in rows[1]["message"]
    assert "File too large" in rows[1]["message"]
    assert list(kv.iterdir()) == []

    # Ctrl-C and SIGTERM in the middle of a disk-tier trial: the private directory goes too
    long = write_yaml(tiny_scenario(prompt_tokens=[64], max_new_tokens=1900, batch_sizes=[1],
                                    modes=modes[1:], repeats=1, warmup=0, disk_dir="kv"), "long.yaml")
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen([*kvbench_cmd(), "run", str(long), "--out", str(tmp_path / "res2")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not any(kv.glob("kvbench-kv-*/*.kv")):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.02)
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 130, stderr
        assert list(kv.iterdir()) == []


def test_env_prints_the_machine_and_says_why_there_is_no_bandwidth():
    runner = CliRunner()
    r = runner.invoke(app, ["env", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "torch 2." in text and "transformers 5." in text and "cpu_count" in text and " GiB" in text
    assert "link bandwidth no CUDA device: host↔device bandwidth not measured" in text
    assert "NVML unavailable" in text  # these machines have no GPU: the reason, not a zero
    r = runner.invoke(app, ["env", "--device", "cpu", "--json"])
    e = json.loads(r.stdout)
    assert e["link_bandwidth"] is None and e["gpus"] is None and e["memory_total_bytes"] > 0
    r = runner.invoke(app, ["env", "--device", "cuda:3"])
    assert r.exit_code == 2 and "device 'cuda:3': no CUDA device is available" in r.stderr
    r = runner.invoke(app, ["env", "--device", "bogus"])
    assert r.exit_code == 2 and "--device: must be auto, cpu, cuda or cuda:N (got 'bogus')" in r.stderr


@pytest.mark.e2e
def test_alert_is_printed_and_recorded(write_yaml, tmp_path):
    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=1, warmup=0,
                                        monitor={"interval_ms": 5, "alert_device_bytes": "1MiB"}))
    r = subprocess.run([*kvbench_cmd(), "run", str(scenario), "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    row = read_trials(the_run_dir(tmp_path) / "trials.jsonl")[0]
    # a CPU run watches the process RSS, far above 1 MiB from the first sample: one alert, at the start
    assert len(row["alerts"]) == 1 and row["alerts"][0]["threshold_bytes"] == 2**20
    assert 2**20 < row["alerts"][0]["device_bytes"] <= row["rss_peak_bytes"]
    assert "alert: p8-b1-none-r0 (prefill): process RSS (CPU run)" in " ".join(r.stderr.split())
    assert "crossed monitor.alert_device_bytes 1.0 MiB" in " ".join(r.stderr.split())


@pytest.mark.e2e
def test_a_full_results_disk_keeps_the_finished_trials_and_says_how_to_resume(write_yaml, tmp_path, monkeypatch):
    import errno

    from typer.testing import CliRunner

    from kvbench.results.run_dir import RunDir

    real_append, calls = RunDir.append, []

    def append(self, row):
        calls.append(row["trial_id"])
        if len(calls) == 3:  # the third trial: its line is written, then syncing it finds the disk full
            real_fsync = os.fsync
            monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
                OSError(errno.ENOSPC, "No space left on device")))
            try:
                return real_append(self, row)
            finally:
                monkeypatch.setattr(os, "fsync", real_fsync)
        return real_append(self, row)

    monkeypatch.setattr(RunDir, "append", append)
    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=4, warmup=0))
    r = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    run = the_run_dir(tmp_path / "out")
    assert "No space left on device; trial p8-b1-none-r2 was measured but not kept (neither its row nor its " \
           "samples); run.json says interrupted (disk full: No space left on device); 2 finished trials are kept: " \
           f"make room, then continue with: kvbench run --resume {run}" in " ".join(r.output.split())
    lines = (run / "trials.jsonl").read_text().splitlines()
    assert [json.loads(x)["trial_id"] for x in lines] == calls[:2]  # the third line was cut back out
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"


@pytest.mark.e2e
def test_text_from_files_and_paths_is_never_read_as_markup(tmp_path):
    """Issue 17 item 3: a description "[/]" crashed `list scenarios` (MarkupError), `[draft]/mini.yaml` printed as
    `/mini.yaml`, a config path `cfg/[/]x.json` crashed `run`."""
    import shutil

    import yaml

    from conftest import tiny_scenario
    from kvbench.models import preset_path

    (tmp_path / "[draft]").mkdir()
    (tmp_path / "desc.yaml").write_text(yaml.safe_dump(tiny_scenario(description="[/] [bold]x")))
    (tmp_path / "[draft]" / "mini.yaml").write_text(yaml.safe_dump(tiny_scenario()))
    cfg = tmp_path / "cfg" / "[" / "]x.json"
    cfg.parent.mkdir(parents=True)
    shutil.copy(preset_path("tiny-llama"), cfg)
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(yaml.safe_dump(tiny_scenario(model={"config": str(cfg), "weights": "random"},
                                                     prompt_tokens=[8], batch_sizes=[1], repeats=1)))
    runner, env = CliRunner(), {"COLUMNS": "200"}  # set in os.environ for each invoke only
    r = runner.invoke(app, ["list", "scenarios", "--dir", str(tmp_path)], env=env)
    assert r.exit_code == 0 and "[/] [bold]x" in r.stdout, r.output
    mini = str(tmp_path / "[draft]" / "mini.yaml")
    r = runner.invoke(app, ["validate", mini], env=env)
    assert r.exit_code == 0 and f"{mini}: ok" in r.stdout, r.output
    r = runner.invoke(app, ["run", str(run_yaml), "--out", str(tmp_path / "res")], env=env)
    assert r.exit_code == 0, r.output
    assert f"model {cfg} (random weights):" in r.stderr and f"tiny: {cfg} (random weights)" in r.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["samples.csv", "trials.jsonl", ".lock"])
def test_resume_never_writes_through_a_symlink_it_did_not_make(tmp_path, name):
    """Issue 17 item 1: a run directory from someone's tarball with a file replaced by a link: resuming cut the
    link's target back to its last newline, or emptied it (.lock). Now it refuses, naming the path."""
    import yaml

    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=1)))
    r = subprocess.run([*kvbench_cmd(), "run", str(scenario), "--out", str(tmp_path / "res")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    run = next((tmp_path / "res").iterdir())
    target = tmp_path / "precious.txt"
    target.write_bytes(b"line one\nno newline at the end")
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(target)
    r = subprocess.run([*kvbench_cmd(), "run", "--resume", str(run)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{run / name} is a symbolic link: kvbench writes, truncates and locks only files it made" in r.stderr
    assert target.read_bytes() == b"line one\nno newline at the end"


@pytest.mark.e2e
def test_report_and_cost_refuse_a_report_directory_that_is_a_symlink(tmp_path):
    import shutil

    golden = next(p for p in sorted((ROOT / "tests" / "data" / "golden").iterdir()) if p.is_dir())
    run = tmp_path / "run"
    shutil.copytree(golden, run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "report").symlink_to(elsewhere, target_is_directory=True)
    for cmd in (["report", str(run)], ["cost", "--gpu-price", "2", str(run)]):
        r = subprocess.run([*kvbench_cmd(), *cmd], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (cmd, r.stdout + r.stderr)
        assert f"{run / 'report'} is a symbolic link" in r.stderr
        assert "cost per 1M" not in r.stdout  # refused before any table
    assert list(elsewhere.iterdir()) == []


def test_a_refused_second_resume_cuts_nothing(write_yaml, tmp_path):
    """Issue 17 item 6: a second `run --resume` while a run was writing cut the writer's partial last lines before
    the lock refused it. Now it takes the lock before it reads the trials: refused, exit 2, every byte as it was."""
    from typer.testing import CliRunner

    from kvbench.results.run_dir import RunDir
    from kvbench.scenario import load_scenario

    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=2, warmup=0))
    run = RunDir.create(tmp_path / "res", load_scenario(scenario).model_dump(mode="json"), {})
    run.append({"trial_id": "p8-b1-none-r0", "status": "ok", "mode": "none", "prompt_tokens": 8, "batch_size": 1})
    run.append_samples([{"trial_id": "p8-b1-none-r0", "phase": "x"}])
    with RunDir.open(run.path).lock():  # the writer, halfway through its next trial's files
        with run.samples_path.open("a") as f:
            f.write("p8-b1-none-r1,pref")
        with run.trials_path.open("a") as f:
            f.write('{"trial_id": "p8-b1-none-r1", "st')
        files = {p.name: p.read_bytes() for p in run.path.iterdir()}
        r = CliRunner().invoke(app, ["run", "--resume", str(run.path)])
        assert r.exit_code == 2, r.output
        assert f"{run.path}: another kvbench run is writing to this directory" in " ".join(r.output.split())
        assert {p.name: p.read_bytes() for p in run.path.iterdir()} == files


def full_disk_on_the_third_trial(monkeypatch, run_json_too: bool) -> None:
    """From the third trial on, samples.csv gets half its bytes and then ENOSPC; run.json too if asked."""
    import errno

    from kvbench.results.run_dir import RunDir

    real_samples, real_update, calls = RunDir.append_samples, RunDir.update, []

    def append_samples(self, samples):
        calls.append(samples[0]["trial_id"])
        if len(calls) < 3:
            return real_samples(self, samples)
        real_samples(self, samples[: len(samples) // 2])  # what reached the disk before it filled
        raise OSError(errno.ENOSPC, "No space left on device")

    def update(self, **fields):
        if run_json_too and len(calls) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_update(self, **fields)

    monkeypatch.setattr(RunDir, "append_samples", append_samples)
    monkeypatch.setattr(RunDir, "update", update)


@pytest.mark.e2e
@pytest.mark.parametrize("run_json_too", [False, True])
def test_a_full_disk_mid_run_keeps_whole_trials_and_says_what_run_json_says(write_yaml, tmp_path, monkeypatch,
                                                                          run_json_too):
    """Issue 17 item 7: with the disk full, the last trial's row was kept with part of its samples (119 of 124,
    no notice) and run.json stayed `running`. Now the trial is dropped whole and said so, run.json says
    `interrupted` with the reason, or the error says it could not be written."""
    from typer.testing import CliRunner


    full_disk_on_the_third_trial(monkeypatch, run_json_too)
    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=4, warmup=0,
                                        monitor={"interval_ms": 5}))
    r = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    run = the_run_dir(tmp_path / "out")
    rows = read_trials(run / "trials.jsonl")
    assert [row["trial_id"] for row in rows] == ["p8-b1-none-r0", "p8-b1-none-r1"]
    samples = pd.read_csv(run / "samples.csv")
    assert samples.groupby("trial_id").size().to_dict() == {row["trial_id"]: row["n_samples"] for row in rows}
    text = " ".join(r.output.split())
    assert (f"cannot write the results in {run}: No space left on device; trial p8-b1-none-r2 was measured but not "
            "kept (neither its row nor its samples)") in text
    meta = json.loads((run / "run.json").read_text())
    if run_json_too:
        assert "run.json could not be marked interrupted either (No space left on device): it still says running" \
            in text
        assert meta["status"] == "running"
    else:
        assert "run.json says interrupted (disk full: No space left on device)" in text
        assert (meta["status"], meta["reason"]) == ("interrupted", "disk full: No space left on device")
    assert f"2 finished trials are kept: make room, then continue with: kvbench run --resume {run}" in text


@pytest.mark.e2e
def test_resume_refuses_rows_of_another_scenario(write_yaml, tmp_path):
    """Issue 17 item 8: rows of another scenario (another name and max_new_tokens) under a run's run.json: resume
    said "nothing to run" and kept them. Now it refuses, naming the file, the line and the mismatch."""
    from typer.testing import CliRunner


    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=1, warmup=0))
    r = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "res")])
    assert r.exit_code == 0, r.output
    run = the_run_dir(tmp_path / "res")
    row = read_trials(run / "trials.jsonl")[0]
    other = {**row, "scenario": "other", "max_new_tokens": 4, "scenario_digest": "0123456789abcdef"}
    (run / "trials.jsonl").write_text(json.dumps(other) + "\n")
    before = (run / "trials.jsonl").read_bytes()
    r = CliRunner().invoke(app, ["run", "--resume", str(run)])
    assert r.exit_code == 2, r.output
    assert (f"error: {run}/trials.jsonl:1: trial 'p8-b1-none-r0' was written under another scenario: scenario "
            "'other' (run.json: 'tiny'); max_new_tokens 4 (run.json: 3); scenario_digest '0123456789abcdef' "
            f"(run.json's scenario: '{row['scenario_digest']}')") in " ".join(r.output.split())
    assert "nothing to run" not in r.output and "Traceback" not in r.output
    assert (run / "trials.jsonl").read_bytes() == before


@pytest.mark.e2e
def test_a_pickled_checkpoint_is_refused_in_one_line_and_leaves_no_run_dir(write_yaml, tmp_path):
    """Issue 17 item 14: a pickled pytorch_model.bin (tests/data/hostile/pickled-model: a tiny Llama config and a
    dict holding an argparse.Namespace) was refused by torch as an UnpicklingError traceback that left an empty run
    dir marked `running`. Now: exit 2, one line naming the model path, nothing written."""
    model = ROOT / "tests" / "data" / "hostile" / "pickled-model"
    scenario = write_yaml(tiny_scenario(model={"name": str(model), "tokenizer": "smollm2-135m"},
                                        prompt_tokens=[8], batch_sizes=[1], repeats=1))
    r = subprocess.run([*kvbench_cmd(), "run", str(scenario), "--out", str(tmp_path / "res")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: model {model}: cannot load it: UnpicklingError: a pickled checkpoint torch's "
                      "weights-only loader refused (it holds argparse.Namespace); kvbench never unpickles code: give "
                      "the weights as safetensors"], r.stderr
    assert "Traceback" not in r.stderr
    assert list((tmp_path / "res").iterdir()) == []


def test_any_error_before_the_first_trial_refuses_in_one_line_and_leaves_no_run_dir(write_yaml, tmp_path,
                                                                                    monkeypatch):
    """Issue 17 item 14: not only the model's loaders: whatever the preparation raises refuses with exit 2."""
    from typer.testing import CliRunner

    from kvbench.bench.engines.transformers import TransformersEngine

    def broken(self):
        raise KeyError("a tokenizer\nthat breaks")

    monkeypatch.setattr(TransformersEngine, "preflight", broken)
    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=1))
    r = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "res")])
    assert r.exit_code == 2, r.output
    assert (f"error: {scenario}: cannot prepare the run of model tiny-llama (random weights): KeyError: 'a "
            "tokenizer") in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert list((tmp_path / "res").iterdir()) == []


def test_run_refuses_an_empty_out(write_yaml, tmp_path, monkeypatch):
    """Issue 17 item 17: `run --out ''` wrote its run into the current directory; `report --out ''` refused."""
    from typer.testing import CliRunner


    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=1))
    monkeypatch.chdir(tmp_path)
    for empty in ("", " "):
        r = CliRunner().invoke(app, ["run", str(scenario), "--out", empty])
        assert r.exit_code == 2, r.output
        assert "error: --out is empty: give a directory" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenario.yaml"]
