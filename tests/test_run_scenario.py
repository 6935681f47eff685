"""The library entrypoint for running (kvbench.bench.run.run_scenario): a whole run in-process, no CLI."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from conftest import ROOT, tiny_scenario
from kvbench.bench.run import RunProgress, run_scenario
from kvbench.errors import BadValue, RunDirError, UserError
from kvbench.results.run_dir import read_trials


class Recording(RunProgress):
    """Keeps every callback: ``events`` as (kind, text)."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []

    def warning(self, text):
        self.events.append(("warning", text))

    def info(self, text):
        self.events.append(("info", text))

    @contextmanager
    def sweep(self, name, total, done):
        self.events.append(("sweep", f"{name} {total} {done}"))
        yield

    def trial_done(self, row):
        self.events.append(("trial", row["trial_id"]))


@pytest.mark.slow
def test_the_smoke_scenario_runs_in_process(tmp_path):
    progress = Recording()
    res = run_scenario(ROOT / "scenarios" / "smoke.yaml", out=tmp_path, progress=progress)
    assert res.swept and not res.interrupted and res.device == "cpu"
    assert (res.written, res.already, res.planned) == (48, 0, 48)
    assert res.run_dir.parent == tmp_path and res.run_dir.name.startswith("smoke-")
    assert sorted(p.name for p in res.run_dir.iterdir() if not p.name.startswith(".")) == [
        "run.json", "samples.csv", "trials.jsonl"]
    assert json.loads((res.run_dir / "run.json").read_text())["status"] == "complete"
    rows = read_trials(res.run_dir / "trials.jsonl")
    assert rows == res.rows and len({r["trial_id"] for r in rows}) == 48
    statuses = {r["mode_label"]: {x["status"] for x in rows if x["mode_label"] == r["mode_label"]} for r in rows}
    assert statuses.pop("hf-offloaded") == {"skipped"}  # CPU: hf-offloaded needs CUDA
    assert list(statuses.values()) == [{"ok"}] * 5
    assert all(r["tokens_match"] is True for r in rows if r["status"] == "ok")
    assert (res.n_ok, res.n_errors) == (40, 0)
    assert len(res.summary) == 2 * 2 * 6 and res.reuse is None and res.capacity is None
    assert res.failures[0].startswith("hf-offloaded: skipped (8 trials): hf-offloaded needs a CUDA device")
    assert all(line.startswith("busy machine: ") for line in res.failures[1:])  # a shared machine may be busy
    kinds = [k for k, _ in progress.events]
    assert kinds.count("trial") == 48 and ("sweep", "smoke 48 0") in progress.events
    assert any(k == "warning" and "modes[5].min_window: 16 tokens is under 256" in t for k, t in progress.events)
    assert ("info", f"results: {res.run_dir}") in progress.events
    # resuming a finished run runs nothing and says so through the result
    again = run_scenario(resume=res.run_dir)
    assert (again.swept, again.interrupted, again.written, again.already) == (False, False, 0, 48)
    assert again.rows == rows and len(again.summary) == 24


def test_user_errors_name_no_flag(write_yaml, tmp_path):
    with pytest.raises(BadValue, match="give a scenario file, or a run directory to resume"):
        run_scenario()
    with pytest.raises(BadValue, match="no results root applies"):
        run_scenario(resume=tmp_path, out=tmp_path)
    with pytest.raises(RunDirError, match="no run.json here"):
        run_scenario(resume=tmp_path)
    bad = write_yaml(tiny_scenario(repeats=0))
    with pytest.raises(UserError) as caught:
        run_scenario(bad, out=tmp_path / "res")
    assert str(bad) in str(caught.value) and "--" not in str(caught.value)
    assert not (tmp_path / "res").exists()


def test_a_tiny_run_then_its_resume(write_yaml, tmp_path):
    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=1, warmup=0))
    res = run_scenario(scenario, out=tmp_path / "res")
    assert (res.swept, res.written, res.n_ok, res.n_errors) == (True, 1, 1, 0)
    assert [r["trial_id"] for r in res.rows] == ["p8-b1-none-r0"] and res.rows[0]["tokens_match"] is True
    assert all(line.startswith("busy machine: ") for line in res.failures)  # nothing failed; a machine may be busy
    again = run_scenario(scenario, resume=res.run_dir)
    assert (again.swept, again.already, again.rows) == (False, 1, res.rows)
