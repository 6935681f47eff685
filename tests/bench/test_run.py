"""The library entrypoint (``kvbench.run_scenario`` and the rest of ``import kvbench``): a whole run in-process,
its report and its costs, no CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager

import pytest

from conftest import ROOT, tiny_scenario
import kvbench
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


def readme_python() -> str:
    """The docs' one Python example of the whole library (docs/commands.md, section "From Python")."""
    text = (ROOT / "docs" / "commands.md").read_text()
    blocks = text.split("```python\n")[1:]
    examples = [b.split("```")[0] for b in blocks if "import kvbench" in b]
    assert len(examples) == 1
    return examples[0]


@pytest.mark.model
@pytest.mark.e2e
def test_the_docs_example_runs_the_smoke_scenario_writes_its_report_and_costs(tmp_path, monkeypatch):
    """The docs' Python example, as written but for its output folders: run, load, report, cost, plan."""
    code = readme_python()
    assert 'out="results"' in code and '"costs"' in code
    code = code.replace('out="results"', f"out={str(tmp_path / 'results')!r}")
    code = code.replace('"costs"', repr(str(tmp_path / "costs")))
    monkeypatch.chdir(ROOT)
    names: dict = {}
    exec(compile(code, "docs/commands.md", "exec"), names)
    res, results, costs, p = names["run"], names["results"], names["costs"], names["p"]
    assert res.swept and not res.interrupted and res.device == "cpu"
    assert (res.written, res.already, res.planned) == (48, 0, 48)
    assert res.run_dir.parent == tmp_path / "results" and res.run_dir.name.startswith("smoke-")
    assert sorted(p.name for p in res.run_dir.iterdir() if not p.name.startswith(".")) == [
        "report", "run.json", "samples.csv", "trials.jsonl"]
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
    # resuming a finished run runs nothing and says so through the result
    again = kvbench.run_scenario(resume=res.run_dir)
    assert (again.swept, again.interrupted, again.written, again.already) == (False, False, 0, 48)
    assert again.rows == rows and len(again.summary) == 24
    # the report and the costs, through the library alone
    assert len(results.trials) == 48 and set(results.trials["trial_id"]) == {r["trial_id"] for r in rows}
    report = sorted(f.name for f in (res.run_dir / "report").iterdir())
    assert {"report.md", "report.html", "summary.csv", "summary.md"} <= set(report)
    assert "| smoke |" in (res.run_dir / "report" / "summary.md").read_text()
    assert sorted(f.name for f in costs.files) == ["cost.csv", "cost.json", "cost.png"]
    usd = costs.table.set_index("mode")["usd_per_million"]
    assert set(usd.index) == {"none", "hf-offloaded", "full", "hierarchical", "dynamic"} and len(usd) == 12
    assert usd["hf-offloaded"].isna().all() and (usd.drop("hf-offloaded") > 0).all()  # skipped on CPU: no cost
    assert p.arch.layers == 32 and p.prompt_tokens == 32768 and p.batch == 8
    assert p.arch.kv_bytes(32768, p.dtype_bytes) == 32768 * 131072  # 32 layers × 2 × 8 kv heads × 128 × 2 bytes


def test_import_kvbench_loads_neither_torch_nor_pandas():
    code = ("import sys, kvbench\nprint(kvbench.__version__, sorted(m for m in ('torch', 'pandas', 'transformers') "
            "if m in sys.modules), callable(kvbench.plan))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{kvbench.__version__} [] True"


def test_plan_through_the_library():
    p = kvbench.plan("llama-3.1-8b", prompt_tokens=4096, batch=8, link_gbps=25.0)
    assert p.arch.layers == 32 and p.dtype_bytes == 2
    assert [m.mode for m in p.modes][:2] == ["none", "full"]
    assert p.arch.kv_bytes(4096, p.dtype_bytes) == 4096 * 131072  # 32 layers × 2 × 8 kv heads × 128 × 2 bytes


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


@pytest.mark.e2e
def test_a_tiny_run_then_its_resume(write_yaml, tmp_path):
    scenario = write_yaml(tiny_scenario(prompt_tokens=[8], batch_sizes=[1], repeats=1, warmup=0,
                                        modes=[{"kind": "none"}, {"kind": "dynamic", "min_window": 16}]))
    progress = Recording()
    res = run_scenario(scenario, out=tmp_path / "res", progress=progress)
    assert (res.swept, res.written, res.n_ok, res.n_errors) == (True, 2, 2, 0)
    assert [r["trial_id"] for r in res.rows] == ["p8-b1-none-r0", "p8-b1-dynamic(min_window=16)-r0"]
    assert all(r["tokens_match"] is True for r in res.rows)
    kinds = [k for k, _ in progress.events]
    assert kinds.count("trial") == 2 and ("sweep", "tiny 2 0") in progress.events
    assert any(k == "warning" and "modes[1].min_window: 16 tokens is under 256" in t for k, t in progress.events)
    assert ("info", f"results: {res.run_dir}") in progress.events
    assert all(line.startswith("busy machine: ") for line in res.failures)  # nothing failed; a machine may be busy
    again = run_scenario(scenario, resume=res.run_dir)
    assert (again.swept, again.already, again.rows) == (False, 2, res.rows)


def test_a_run_json_without_its_scenario_is_refused_for_resume_and_keeps_its_trials(tmp_path):
    from golden_run import copy_run

    run = copy_run(tmp_path, edit_meta=lambda m: m.pop("scenario"))
    before = (run / "trials.jsonl").read_bytes()
    with pytest.raises(RunDirError, match=r"run\.json: no scenario in it: this run cannot be resumed"):
        run_scenario(resume=run)
    assert (run / "trials.jsonl").read_bytes() == before


@pytest.mark.parametrize("planned,done", [(4, True), (3, True), (5, False), (True, False), (-1, False),
                                          ("4", False), (None, False)])
def test_a_request_stream_s_run_is_done_by_a_whole_planned_count(planned, done):
    from kvbench.bench.plans.plan import plan_for
    from kvbench.scenario import parse_scenario

    data = tiny_scenario(workload={"source": "sharegpt", "multi_turn": {"conversations": 2, "turns": 2}})
    data["model"] = {"preset": "tiny-llama", "weights": "random", "tokenizer": "smollm2-135m"}
    del data["prompt_tokens"], data["batch_sizes"]
    plan = plan_for(parse_scenario(data))
    rows = [{"trial_id": f"t{i}", "status": "ok"} for i in range(4)]
    assert plan.done({"status": "complete", "planned": planned}, rows) is done
    assert plan.done({"status": "interrupted", "planned": 4}, rows) is False

